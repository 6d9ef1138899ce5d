"""Equinox and Flax NNX training steps give stock JAX's numbers.

The reference numbers come from running `peer_steps.py` under stock jax and
jaxlib 0.10.2, with the interpreter named by JAXLIB_PATCH_STOCK_PYTHON
(tests/run.sh points it at the venv of the module tests).
"""

from absl.testing import absltest
import numpy as np

from jax._src import test_util as jtu

import stock_reference

import peer_steps


class PeerLibrariesTest(stock_reference.StockReferenceTestCase):

  stock_script = peer_steps.__file__
  stock_needs = "equinox and flax"

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.patched = peer_steps.run_all()

  def test_the_two_runs_use_the_two_pytree_modules(self):
    self.assertEqual(self.stock["pytree_module"], "jaxlib._jax.pytree")
    self.assertEqual(self.patched["pytree_module"], "jaxlib_patch.pytree")

  def _assert_same_step(self, name):
    stock, patched = self.stock[name], self.patched[name]
    np.testing.assert_allclose(
        patched["losses"],
        stock["losses"],
        **stock_reference.reference_tolerance(1e-6),
    )
    self.assertEqual(len(patched["params"]), len(stock["params"]))
    for ours, theirs in zip(patched["params"], stock["params"]):
      np.testing.assert_allclose(
          ours, theirs, **stock_reference.reference_tolerance(1e-6, 1e-7)
      )
    # The step did train: the second loss is lower.
    self.assertLess(patched["losses"][1], patched["losses"][0])

  def test_equinox_mlp_training_step_matches_stock(self):
    self._assert_same_step("equinox_mlp")

  def test_flax_nnx_linear_training_step_matches_stock(self):
    self._assert_same_step("nnx_linear")


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
