"""Reference numbers from stock JAX, computed in a child process.

The JAX-level tests run on the custom wheels; the numbers they compare with
come from running a script of this folder with the interpreter named by
JAXLIB_PATCH_STOCK_PYTHON (stock jax 0.10.2 and the peer libraries; tests/run.sh
sets it), isolated (-I) so that nothing of the custom environment leaks in.
The script prints its results as JSON.
"""

import json
import os
import subprocess

STOCK_PYTHON = "JAXLIB_PATCH_STOCK_PYTHON"


def run_with_stock_jax(script, needs):
  """The JSON that ``script`` prints when run with stock jax; ``needs`` names
  the packages it imports besides jax, for the error when the variable is
  unset."""
  python = os.environ.get(STOCK_PYTHON)
  if not python:
    raise RuntimeError(
        f"{STOCK_PYTHON} must name a Python with stock jax 0.10.2 and {needs} "
        "installed")
  done = subprocess.run([python, "-I", script], capture_output=True,
                        text=True, check=True)
  return json.loads(done.stdout)
