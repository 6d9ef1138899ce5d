"""Flax NNX with its base classes opted in:
`jax.tree_util.preserve_relative_identities(nnx.Pytree)` (every module,
`nnx.Optimizer` and `nnx.Rngs`) and `(nnx.Variable)` (every parameter). A
model using one `nnx.Linear` in two places trains through plain `jax.jit`
(tree mode) and through `nnx.jit` to the losses of `nnx.jit` on stock JAX,
and NNX's graph machinery agrees with the opt-in.

The stock numbers come from running `nnx_shared_linear.py` under stock jax
and jaxlib 0.10.2 with the interpreter named by JAXLIB_PATCH_STOCK_PYTHON, as
in peer_libraries_test.py. The opt-in is for the whole process, as a user
would do it: once, after importing Flax.
"""

from absl.testing import absltest

import jax
import pytest
from flax import nnx
from jax._src import test_util as jtu

import stock_reference

jax.tree_util.preserve_relative_identities(nnx.Pytree)
jax.tree_util.preserve_relative_identities(nnx.Variable)

import nnx_shared_linear as shared_linear  # noqa: E402

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)


class NnxSharingTest(stock_reference.StockReferenceTestCase):

  stock_script = shared_linear.__file__
  stock_needs = "flax and optax"

  def setUp(self):
    super().setUp()
    self.model = shared_linear.Model(nnx.Rngs(0))
    self.x, self.y = shared_linear.data()

  def test_the_base_classes_opt_in_every_nnx_class(self):
    for cls in (
        nnx.Linear,
        nnx.Optimizer,
        nnx.Rngs,
        nnx.Param,
        nnx.BatchStat,
        shared_linear.Model,
    ):
      self.assertTrue(jax.tree_util.has_relative_identities(cls), cls)
    # Two Linear layers of kernel and bias: the shared one counts once.
    self.assertLen(jax.tree.leaves(self.model), 4)

  def _assert_trains_like_stock(self, train):
    self.assertTrainsLikeStock(
        train,
        tied=lambda model: (model.first, model.last),
        values=shared_linear.parameters,
        values_key="parameters",
        loss_ratio=1,
    )

  def test_plain_jax_jit_tree_mode_trains_like_nnx_jit_on_stock(self):
    self._assert_trains_like_stock(shared_linear.train_tree_mode)

  def test_nnx_jit_graph_mode_trains_like_stock(self):
    self._assert_trains_like_stock(shared_linear.train_graph_mode)

  def test_split_and_merge_agree_with_the_opt_in(self):
    graphdef, state = nnx.split(self.model)
    self.assertLen(jax.tree.leaves(state), 4)  # NNX's own deduplication
    merged = nnx.merge(graphdef, state)
    self.assertIs(merged.first, merged.last)
    # The state is a pytree of opted-in Variables; a jitted identity on it
    # and merging the result give the same sharing.
    merged = nnx.merge(graphdef, jax.jit(lambda s: s)(state))
    self.assertIs(merged.first, merged.last)

  def test_state_holds_the_shared_layer_once(self):
    params = nnx.state(self.model, nnx.Param)
    self.assertLen(jax.tree.leaves(params), 4)
    self.assertEqual(sorted(params.keys()), ["first", "middle"])

  def test_jax_grad_and_nnx_grad_give_the_same_summed_gradient(self):
    tree_grads = jax.grad(shared_linear.loss)(self.model, self.x, self.y)
    self.assertIs(tree_grads.first, tree_grads.last)
    graph_grads = nnx.grad(shared_linear.loss)(self.model, self.x, self.y)
    self.assertAllClose(
        tree_grads.first.kernel[...], graph_grads["first"]["kernel"][...]
    )

  def test_a_variable_shared_by_two_layers_stays_one(self):
    first = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
    second = nnx.Linear(2, 2, rngs=nnx.Rngs(1))
    second.kernel = first.kernel
    pair = jax.jit(lambda pair: pair)((first, second))
    self.assertIs(pair[0].kernel, pair[1].kernel)
    self.assertIsNot(pair[0], pair[1])
    self.assertLen(jax.tree.leaves((first, second)), 3)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
