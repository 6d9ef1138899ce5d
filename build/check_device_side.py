"""One side of check_device.py's comparisons with stock JAX, run as a child
under the interpreter of that side (custom or stock), before the check's own
process opens the device: a TPU admits one process at a time.

    python check_device_side.py --table-mib MIB --calls N --batches N

Prints one JSON line: the jax it ran on, the device memory that
``jax.device_put`` of 8 references to one ``--table-mib`` table takes, and
the per-call time of one tied-LM training step (``equinox_tied_lm.py``):
the table tied by identity on the custom jax, with ``eqx.nn.Shared`` on
stock's (None where Equinox or optax is missing).
"""

import argparse
import gc
import importlib.metadata
import inspect
import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT / "build"),
    str(ROOT / "bench"),
    str(ROOT / "tests" / "jax"),
]

# pylint: disable=wrong-import-position
import jax
import numpy as np

import children
from check_device_checks import Param, bytes_in_use, per_call, tied_lm_step

REFERENCES = 8


def can_opt_in():
  return (
      "preserve_relative_identities"
      in inspect.signature(jax.tree_util.register_pytree_node).parameters
  )


def shared_table_memory(mib):
  """Bytes of device memory and device buffers that `jax.device_put` of
  REFERENCES references to one Param over a `mib` MiB table makes (Param
  opted in where this jax can). Without memory statistics (the CPU), the
  bytes are those of the distinct buffers."""
  options = {"preserve_relative_identities": True} if can_opt_in() else {}
  jax.tree_util.register_pytree_node(
      Param, lambda p: ((p.value,), None), lambda _, xs: Param(*xs), **options
  )
  host = np.ones(int(mib * 2**20) // 4, np.float32)
  device = jax.devices()[0]
  gc.collect()
  before, memory = len(jax.live_arrays()), bytes_in_use(device)
  out = jax.block_until_ready(jax.device_put([Param(host)] * REFERENCES))
  buffers = len(jax.live_arrays()) - before
  distinct = len({id(p.value) for p in out})
  grown = (
      bytes_in_use(device) - memory
      if memory is not None
      else distinct * host.nbytes
  )
  return {"bytes": grown, "buffers": buffers, "table_bytes": host.nbytes}


def tied_step_seconds(args):
  """The per-call time of one training step of the tied LM: tied by identity
  where this jax can, else with eqx.nn.Shared; None without Equinox."""
  try:
    import equinox as eqx
    import optax  # noqa: F401  (equinox_tied_lm trains with it)
  except ImportError:
    return None, None
  import equinox_tied_lm as lm

  if can_opt_in():
    jax.tree_util.preserve_relative_identities(eqx.Module)
    # The tie of TiedLM is meant: acknowledged, as its user would.
    warnings.filterwarnings("ignore", category=jax.tree_util.TiedByOptInWarning)
    model, how = lm.TiedLM, "tied by identity"
  else:
    model, how = lm.SharedLM, "eqx.nn.Shared"
  return per_call(tied_lm_step(eqx, jax, lm, model), args), how


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--table-mib", type=float, required=True)
  parser.add_argument("--calls", type=int, required=True)
  parser.add_argument("--batches", type=int, required=True)
  args = parser.parse_args()
  step_s, step_how = tied_step_seconds(args)
  children.print_result(
      {
          "jax": importlib.metadata.version("jax"),
          "backend": jax.default_backend(),
          "table": shared_table_memory(args.table_mib),
          "step_s": step_s,
          "step_how": step_how,
      }
  )


if __name__ == "__main__":
  main()
