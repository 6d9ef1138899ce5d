"""Setup of the JAX-level tests, before jax starts: 8 virtual CPU devices,
and float32 matrix products at full precision."""

import os

_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8"
  ).strip()
# Stock's references are computed on the CPU in float32; a TPU multiplies
# float32 matrices in bfloat16 passes unless asked, which a few training
# steps grow past any tolerance that could still catch a wrong gradient.
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")


def pytest_configure(config):
  # A tie split where a test does not expect it is a failure: a test that
  # splits one on purpose asserts the warning (or sets jax_split_ties), so
  # that a new one stands out.
  config.addinivalue_line(
      "filterwarnings", "error::jax.tree_util.SplitTieWarning"
  )
  # Likewise a tie that opting in a library's base class makes of objects
  # code meant as copies: a test that means its ties acknowledges them.
  config.addinivalue_line(
      "filterwarnings", "error::jax.tree_util.TiedByOptInWarning"
  )
