"""Reference numbers from stock JAX, computed in a child process.

The JAX-level tests run on the custom wheels; the numbers they compare with
come from running a script of this folder with the interpreter named by
JAXLIB_PATCH_STOCK_PYTHON (stock jax 0.10.2 and the peer libraries; tests/run.sh
sets it), isolated from this environment (-E -s: no PYTHON* variables, no user
site-packages) so that nothing of the custom environment leaks in, with the
script's own folder first on the path so that it imports its helpers
(training.py). The script prints its results as JSON.

A child process never opens an accelerator: a TPU admits one process at a
time, and this one holds it. So a reference is computed on the CPU, and where
this process computes on another backend its numbers are compared at that
backend's float32 tolerance (`reference_tolerance`).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
from jax._src import test_util as jtu

STOCK_PYTHON = "JAXLIB_PATCH_STOCK_PYTHON"


def stock_python(needs):
  """The interpreter named by JAXLIB_PATCH_STOCK_PYTHON; ``needs`` names what
  it must have installed, for the error when the variable is unset."""
  python = os.environ.get(STOCK_PYTHON)
  if not python:
    raise RuntimeError(
        f"{STOCK_PYTHON} must name a Python with {needs} " "installed"
    )
  return python


# float32 on an accelerator differs from the CPU's by up to about 1e-3
# relative (TPU matrix units round inputs to bfloat16 passes; transcendental
# functions differ in the last digits), and training steps carry it on: 20
# steps on a TPU v5e ended 0.5% from the CPU's losses.
ACCELERATOR_RTOL = 1e-2


def child_environment():
  """This process's environment for a child that imports jax: on the CPU, so
  that it runs beside this process whatever holds the accelerator."""
  return dict(os.environ, JAX_PLATFORMS="cpu")


def run_child(*args):
  """What this interpreter, run with `args` in a child process on the CPU
  (a fresh process: opt-ins and once-only warnings start anew), printed;
  CalledProcessError if it failed."""
  return subprocess.run(
      [sys.executable, *args],
      env=child_environment(),
      capture_output=True,
      text=True,
      check=True,
  ).stdout


def reference_tolerance(rtol, atol=0.0):
  """{"rtol", "atol"} to compare this process's numbers with stock's,
  computed on the CPU or by another program: as given on the CPU, at least
  ACCELERATOR_RTOL elsewhere."""
  if jax.default_backend() == "cpu":
    return {"rtol": rtol, "atol": atol}
  return {"rtol": max(rtol, ACCELERATOR_RTOL), "atol": max(atol, 1e-5)}


def assert_values_as_on_copies(result, function, tree):
  """`result`, what `function` gave for `tree`, holds place by place the
  values `function` gives for `tree` laid out as stock lays it out (a copy
  of each shared node per place), the tree stock JAX would have been given."""
  expected = function(jax.tree_util.tree_unshare(tree))
  got = jax.tree.leaves(jax.tree_util.tree_unshare(result))
  want = jax.tree.leaves(expected)
  assert len(got) == len(want), (len(got), len(want))
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6)


def run_with_stock_jax(script, needs, *args):
  """The JSON that ``script`` prints when run with stock jax and the command
  line arguments ``args``; ``needs`` names the packages it imports besides
  jax."""
  python = stock_python(f"stock jax 0.10.2 and {needs}")
  done = subprocess.run(
      [python, "-E", "-s", script, *map(str, args)],
      env=child_environment(),
      capture_output=True,
      text=True,
      check=True,
  )
  return json.loads(done.stdout)


class StockReferenceTestCase(jtu.JaxTestCase):
  """Tests that compare with ``self.stock``: the JSON that the script
  ``stock_script`` prints under stock JAX, run once for the class;
  ``stock_needs`` names the packages it imports besides jax."""

  stock_script = None
  stock_needs = None

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.stock = run_with_stock_jax(cls.stock_script, cls.stock_needs)

  def assertTrainsLikeStock(self, train, tied, values, values_key, loss_ratio):
    """``train(after_step=...)`` keeps the tie between the two places
    ``tied(model)`` names after every step, gives the stock run's losses,
    lowers the loss below ``loss_ratio`` times the first, and ends with the
    stock run's numbers (``values(model)`` beside ``stock[values_key]``)."""

    def tie_holds(model):
      self.assertIs(*tied(model))

    # optax's bias correction mixes Python floats with int32 counts, which
    # the strict promotion that JaxTestCase sets refuses. Stock trained on
    # the CPU, and so does this run wherever it is: Adam moves a weight whose
    # gradient is only rounding by a whole step, so an accelerator's
    # rounding ends 20 steps away by more than any tolerance that would
    # still catch a gradient counted once instead of twice.
    with (
        jax.numpy_dtype_promotion("standard"),
        jax.default_device(jax.local_devices(backend="cpu")[0]),
    ):
      losses, model = train(after_step=tie_holds)
    np.testing.assert_allclose(losses, self.stock["losses"], rtol=1e-5)
    self.assertLess(losses[-1], losses[0] * loss_ratio)
    ours = values(model)
    self.assertLen(ours, len(self.stock[values_key]))
    for mine, theirs in zip(ours, self.stock[values_key]):
      np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
