"""Equinox with `jax.tree_util.preserve_relative_identities(eqx.Module)`:
a transformer language model whose input and output embeddings are one
`eqx.nn.Embedding` object trains to the numbers of the same model tied with
`eqx.nn.Shared` on stock JAX, and Equinox's own tools keep the tie, or say
why not.

The stock numbers come from running `equinox_tied_lm.py` under stock jax and
jaxlib 0.10.2 with the interpreter named by JAXLIB_PATCH_STOCK_PYTHON, as in
peer_libraries_test.py. The opt-in is for the whole process and cannot be
undone, as a user would do it: once, after importing Equinox.
"""

import io

from absl.testing import absltest

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import test_util as jtu

import stock_reference

jax.tree_util.preserve_relative_identities(eqx.Module)

import equinox_tied_lm as lm  # noqa: E402  (defines its modules after the opt-in)

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)


def _serialised_size(tree):
  buffer = io.BytesIO()
  eqx.tree_serialise_leaves(buffer, tree)
  return buffer.tell()


class EquinoxSharingTest(stock_reference.StockReferenceTestCase):

  stock_script = lm.__file__
  stock_needs = "equinox and optax"

  def setUp(self):
    super().setUp()
    self.model = lm.TiedLM(jax.random.key(0))
    self.inputs, self.targets = lm.batch()

  def test_the_tied_table_is_one_leaf(self):
    self.assertTrue(jax.tree_util.has_relative_identities(eqx.nn.Embedding))
    self.assertLen(lm.weights(self.model), len(self.stock["weights"]))

  def _assert_trains_like_eqx_shared_on_stock(self, jit):
    self.assertTrainsLikeStock(
        # The model is made in the training's device context.
        lambda after_step: lm.train(
            lm.TiedLM(jax.random.key(0)), jit, after_step
        ),
        tied=lambda model: (model.embedding, model.unembedding),
        values=lm.weights,
        values_key="weights",
        loss_ratio=0.5,
    )

  def test_filter_jit_training_matches_eqx_shared_on_stock(self):
    self._assert_trains_like_eqx_shared_on_stock(eqx.filter_jit)

  def test_jax_jit_training_matches_eqx_shared_on_stock(self):
    self._assert_trains_like_eqx_shared_on_stock(jax.jit)

  def test_filter_grad_sums_both_uses_into_one_gradient(self):
    grads = eqx.filter_grad(lm.loss)(self.model, self.inputs, self.targets)
    self.assertIs(grads.embedding, grads.unembedding)
    shared = lm.SharedLM(jax.random.key(0))
    shared_grads = eqx.filter_grad(lm.loss)(shared, self.inputs, self.targets)
    self.assertAllClose(
        grads.embedding.weight,
        shared_grads.embeddings.pytree[0].weight,
        rtol=1e-5,
        atol=1e-6,
    )

  def test_filter_vmap_keeps_the_tie(self):
    broadcast = eqx.filter_vmap(lambda model, _: model, in_axes=(None, 0))(
        self.model, self.inputs
    )
    self.assertIs(broadcast.embedding, broadcast.unembedding)
    ensemble = eqx.filter_vmap(lm.TiedLM)(
        jax.random.split(jax.random.key(0), 3)
    )
    self.assertIs(ensemble.embedding, ensemble.unembedding)
    self.assertEqual(ensemble.embedding.weight.shape, (3, lm.VOCAB, lm.DIM))

  def test_filter_vmap_of_one_model_mapped_and_not_is_as_on_stock(self):
    # filter_vmap broadcasts in_axes over each argument apart (Equinox's own
    # tree.map), so the two places are two roles, as on stock: each row of
    # the table against the whole table. One object filling two arguments
    # that a library maps side by side is aliasing, not a split tie: not
    # told (SplitTieWarning is an error in these tests).
    table = jnp.arange(12.0).reshape(3, 4)
    model = eqx.nn.Embedding(weight=table)
    out = eqx.filter_vmap(
        lambda row, whole: whole.weight @ row.weight, in_axes=(0, None)
    )(model, model)
    np.testing.assert_allclose(out, table @ table.T)

  def test_partition_and_combine_keep_the_tie(self):
    params, static = eqx.partition(self.model, eqx.is_array)
    self.assertIs(params.embedding, params.unembedding)
    self.assertIs(static.embedding, static.unembedding)
    rebuilt = eqx.combine(params, static)
    self.assertIs(rebuilt.embedding, rebuilt.unembedding)
    self.assertIs(rebuilt.embedding.weight, self.model.embedding.weight)

  def test_tree_at_on_a_field_of_the_shared_module_changes_both_uses(self):
    zeros = jnp.zeros((lm.VOCAB, lm.DIM))
    for where in (lambda m: m.embedding.weight, lambda m: m.unembedding.weight):
      edited = eqx.tree_at(where, self.model, zeros)
      self.assertIs(edited.embedding, edited.unembedding)
      self.assertIs(edited.embedding.weight, zeros)

  def test_tree_at_on_the_shared_module_itself_raises(self):
    # Equinox finds the node by identity and sees it twice; its message
    # speaks of `None`s, but the call fails rather than untying silently.
    other = eqx.nn.Embedding(lm.VOCAB, lm.DIM, key=jax.random.key(5))
    for where in (lambda m: m.embedding, lambda m: m.unembedding):
      with self.assertRaisesRegex(ValueError, "does not uniquely identify"):
        eqx.tree_at(where, self.model, other)

  def test_serialise_stores_the_table_once_and_deserialise_reties(self):
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, self.model)
    # As many bytes as the model tied with eqx.nn.Shared: the table once.
    self.assertEqual(
        buffer.tell(), _serialised_size(lm.SharedLM(jax.random.key(0)))
    )
    buffer.seek(0)
    restored = eqx.tree_deserialise_leaves(buffer, lm.TiedLM(jax.random.key(7)))
    self.assertIs(restored.embedding, restored.unembedding)
    self.assertArraysEqual(
        restored.embedding.weight, self.model.embedding.weight
    )


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
