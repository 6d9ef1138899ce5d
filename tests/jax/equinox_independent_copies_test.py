"""What the Equinox opt-in changes for code written for stock JAX's trees:
the model of `eqx.nn.Shared`'s docstring holds one `eqx.nn.Linear` object at
two places and means two layers that "update independently during training"
(stock JAX expands it into two copies). With `eqx.Module` opted in, the two
places are one layer: one summed gradient, one update, different losses.
A copy of the layer at the second place (or `tree_unshare` of the whole
model) keeps them independent, and trains to stock's numbers.

docs/guide.md says this under "Equinox". The stock losses come from running
`equinox_shared_docstring.py` under stock JAX (stock_reference.py).
"""

from absl.testing import absltest

import equinox as eqx
import jax
import numpy as np
import pytest
from jax._src import test_util as jtu

import stock_reference

jax.tree_util.preserve_relative_identities(eqx.Module)

import equinox_shared_docstring as docstring  # noqa: E402

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)


class IndependentCopiesTest(stock_reference.StockReferenceTestCase):

  stock_script = docstring.__file__
  stock_needs = "equinox and optax"

  def test_one_object_at_two_places_trains_as_one_layer(self):
    def still_one(model):
      self.assertIs(model.linear, model.submodel.linear)

    model = docstring.Model(jax.random.key(0))
    self.assertLen(jax.tree.leaves(model), 2)  # one weight, one bias
    losses, _ = docstring.train(model, after_step=still_one)
    # The same start; from the first update on, not stock's two layers.
    np.testing.assert_allclose(
        losses[0],
        self.stock["losses"][0],
        **stock_reference.reference_tolerance(1e-6),
    )
    for ours, stock in zip(losses[1:], self.stock["losses"][1:]):
      self.assertGreater(abs(ours - stock), 1e-3)

  def _assert_trains_as_stock(self, model):
    self.assertLen(jax.tree.leaves(model), 4)  # two layers
    losses, trained = docstring.train(model)
    np.testing.assert_allclose(
        losses,
        self.stock["losses"],
        **stock_reference.reference_tolerance(1e-6),
    )
    self.assertIsNot(trained.linear, trained.submodel.linear)
    self.assertFalse(
        np.allclose(trained.linear.weight, trained.submodel.linear.weight)
    )

  def test_a_copy_at_the_second_place_trains_as_stock(self):
    self._assert_trains_as_stock(
        docstring.Model(jax.random.key(0), copy_linear=True)
    )

  def test_tree_unshare_of_the_model_trains_as_stock(self):
    model = docstring.Model(jax.random.key(0))
    self._assert_trains_as_stock(jax.tree_util.tree_unshare(model))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
