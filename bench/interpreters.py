"""The two interpreters that the side-by-side benchmarks run children under:
stock jax and jaxlib, and the patched wheels."""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def add_arguments(parser):
  """--stock-python (default $JAXLIB_PATCH_STOCK_PYTHON, else the test venv)
  and --patched-python (default the venv of the custom wheels)."""
  parser.add_argument(
      "--stock-python",
      default=os.environ.get(
          "JAXLIB_PATCH_STOCK_PYTHON", str(ROOT / ".venv-test/bin/python")
      ),
      help="interpreter with stock jax and jaxlib",
  )
  parser.add_argument(
      "--patched-python",
      default=str(ROOT / ".venv-jax/bin/python"),
      help="interpreter with the custom wheels",
  )
