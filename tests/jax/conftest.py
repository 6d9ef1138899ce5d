"""Setup of the JAX-level tests: 8 virtual CPU devices, before jax starts."""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8"
  ).strip()
