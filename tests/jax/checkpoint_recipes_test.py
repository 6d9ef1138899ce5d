"""Checkpoints of trees that share, and moving them between stock and patched
JAX: the recipes of the guide ("Checkpoints and moving between stock and
patched JAX") with Orbax's StandardCheckpointer and PyTreeCheckpointer and
Equinox's leaf serialisation.

A checkpoint written from a tree that shares holds a shared node once, under
the path of its first occurrence. Restored against a target with the same
sharing it comes back whole; restored without a target (Orbax rebuilds the
tree from its metadata) a later path of the shared node is missing. The
stock layout (`tree_unshare`) is what stock JAX writes and reads: saved that
way, a checkpoint restores completely without a target and in stock JAX,
and `tree_retie` ties what comes back by a template's sharing, checking that
the copies agree.
"""

import dataclasses
import pathlib
import tempfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl.testing import absltest
from absl.testing import parameterized
from jax import tree_util
from jax._src import test_util as jtu

tree_util.preserve_relative_identities(eqx.Module)

import equinox_tied_lm  # noqa: E402

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)


@tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Param:
  value: jax.Array


def _abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _checkpointers():
  return [
      ("standard", ocp.StandardCheckpointer),
      ("pytree", ocp.PyTreeCheckpointer),
  ]


class OrbaxRecipesTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.folder = pathlib.Path(tempfile.mkdtemp())
    p, q = Param(jnp.arange(3.0)), Param(jnp.ones(2))
    self.tree = {"a": p, "b": p, "c": q}

  def _save(self, checkpointer, name, tree):
    path = self.folder / name
    checkpointer.save(path, tree)
    if hasattr(checkpointer, "wait_until_finished"):
      checkpointer.wait_until_finished()
    return path

  def _restore(self, checkpointer, path, target=None):
    if target is None:
      return checkpointer.restore(path)
    if isinstance(checkpointer, ocp.StandardCheckpointer):
      return checkpointer.restore(path, target)
    return checkpointer.restore(
        path,
        args=ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        ),
    )

  @parameterized.named_parameters(_checkpointers())
  def test_restore_with_a_target_gives_every_key_and_the_sharing(self, make):
    with make() as checkpointer:
      path = self._save(checkpointer, "shared", self.tree)
      restored = self._restore(checkpointer, path, _abstract(self.tree))
    self.assertEqual(set(restored), {"a", "b", "c"})
    self.assertIs(restored["a"], restored["b"])
    self.assertArraysEqual(restored["a"].value, self.tree["a"].value)

  @parameterized.named_parameters(_checkpointers())
  def test_stock_layout_restores_every_key_without_a_target(self, make):
    with make() as checkpointer:
      path = self._save(
          checkpointer, "stock", tree_util.tree_unshare(self.tree)
      )
      restored = self._restore(checkpointer, path)
    # Without a target Orbax gives nested dicts, as on stock JAX.
    self.assertEqual(set(restored), {"a", "b", "c"})
    tied = tree_util.tree_retie(
        {k: Param(v["value"]) for k, v in restored.items()}, self.tree
    )
    self.assertIs(tied["a"], tied["b"])
    self.assertArraysEqual(tied["b"].value, self.tree["a"].value)

  @parameterized.named_parameters(_checkpointers())
  def test_the_no_target_recipe_refuses_a_tied_checkpoint(self, make):
    # Restored without a target, a tied checkpoint lacks "b"; the guide's
    # recipe (rebuild, then tree_retie by the model) says so, not the model.
    with make() as checkpointer:
      path = self._save(checkpointer, "tied", self.tree)
      restored = self._restore(checkpointer, path)
    self.assertEqual(set(restored), {"a", "c"})
    rebuilt = {k: Param(v["value"]) for k, v in restored.items()}
    with self.assertRaisesRegex(ValueError, "PyTree structures differ"):
      tree_util.tree_retie(rebuilt, self.tree)

  @parameterized.named_parameters(_checkpointers())
  def test_stock_checkpoint_into_a_tied_model_and_back(self, make):
    # A stock checkpoint of the untied model: two copies of the shared node.
    with make() as checkpointer:
      stock_path = self._save(
          checkpointer, "from-stock", tree_util.tree_unshare(self.tree)
      )
      template = tree_util.tree_unshare(_abstract(self.tree))
      restored = self._restore(checkpointer, stock_path, template)
      tied = tree_util.tree_retie(restored, self.tree)
      self.assertIs(tied["a"], tied["b"])
      # Back: what stock reads is the stock layout again.
      back_path = self._save(
          checkpointer, "to-stock", tree_util.tree_unshare(tied)
      )
      back = self._restore(checkpointer, back_path, template)
    self.assertIsNot(back["a"], back["b"])
    for key in "abc":
      self.assertArraysEqual(back[key].value, self.tree[key].value)

  def test_copies_that_differ_cannot_be_tied(self):
    untied = {
        "a": Param(jnp.arange(3.0)),
        "b": Param(jnp.zeros(3)),
        "c": Param(jnp.ones(2)),
    }
    with self.assertRaisesRegex(ValueError, r"tree_retie: the leaf at \['b'\]"):
      tree_util.tree_retie(untied, self.tree)


class EquinoxRecipesTest(jtu.JaxTestCase):

  def test_serialise_the_stock_layout_and_retie(self):
    model = equinox_tied_lm.TiedLM(jax.random.key(0))
    path = pathlib.Path(tempfile.mkdtemp()) / "model.eqx"
    eqx.tree_serialise_leaves(path, tree_util.tree_unshare(model))
    loaded = eqx.tree_deserialise_leaves(path, tree_util.tree_unshare(model))
    tied = tree_util.tree_retie(loaded, model)
    self.assertIs(tied.embedding, tied.unembedding)
    for ours, saved in zip(jax.tree.leaves(tied), jax.tree.leaves(model)):
      self.assertArraysEqual(ours, saved)

  def test_the_stock_layout_has_stocks_leaves(self):
    # What stock Equinox writes for the same (untied) model: every copy.
    model = equinox_tied_lm.TiedLM(jax.random.key(0))
    stock_layout = jax.tree.leaves(tree_util.tree_unshare(model))
    self.assertLen(stock_layout, len(jax.tree.leaves(model)) + 1)
    self.assertArraysEqual(stock_layout[0], model.embedding.weight)
    self.assertArraysEqual(stock_layout[-1], model.unembedding.weight)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
