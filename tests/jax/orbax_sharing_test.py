"""Orbax checkpoints of shared trees: Orbax's
`StandardCheckpointer` flattens the tree with JAX, so a layer that appears
20 times is one set of leaves: it is written once and restored, against a
target tree with the same sharing, as one object.

Equinox and Flax NNX are opted in here as their users would (once, for the
process), so the models of equinox_sharing_test.py and nnx_sharing_test.py
checkpoint the same way.
"""

import dataclasses
import pathlib
import tempfile

from absl.testing import absltest

import equinox as eqx
import jax
from flax import nnx
from jax import tree_util
from jax._src import test_util as jtu
import orbax.checkpoint as ocp
import pytest

tree_util.preserve_relative_identities(eqx.Module)
tree_util.preserve_relative_identities(nnx.Pytree)
tree_util.preserve_relative_identities(nnx.Variable)

import equinox_tied_lm  # noqa: E402
import nnx_shared_linear  # noqa: E402

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)

WIDTH = 128
COPIES = 20


@tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
  weight: jax.Array
  bias: jax.Array


tree_util.preserve_relative_identities(Layer)


def _layer(seed):
  weight_key, bias_key = jax.random.split(jax.random.key(seed))
  # Random numbers: Orbax compresses, and constant arrays would hide a copy.
  return Layer(
      jax.random.normal(weight_key, (WIDTH, WIDTH)),
      jax.random.normal(bias_key, (WIDTH,)),
  )


def _abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class OrbaxSharingTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.folder = pathlib.Path(tempfile.mkdtemp())
    self.checkpointer = ocp.StandardCheckpointer()

  def tearDown(self):
    self.checkpointer.close()
    super().tearDown()

  def _save(self, name, tree):
    path = self.folder / name
    self.checkpointer.save(path, tree)
    self.checkpointer.wait_until_finished()
    return path

  def _bytes_on_disk(self, path):
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

  def test_a_layer_shared_20_times_is_stored_once(self):
    layer = _layer(0)
    shared = self._bytes_on_disk(self._save("shared", [layer] * COPIES))
    one = self._bytes_on_disk(self._save("one", [layer]))
    separate = self._bytes_on_disk(
        self._save("separate", [_layer(seed) for seed in range(COPIES)])
    )
    array_bytes = (WIDTH + 1) * WIDTH * 4
    self.assertLess(shared, one + array_bytes // 10)  # metadata only
    self.assertGreater(separate, COPIES * array_bytes * 0.9)

  def test_restore_rebuilds_the_sharing(self):
    layer = _layer(0)
    path = self._save("shared", [layer] * COPIES)
    restored = self.checkpointer.restore(path, _abstract([layer] * COPIES))
    for copy in restored[1:]:
      self.assertIs(copy, restored[0])
    self.assertArraysEqual(restored[0].weight, layer.weight)

  def test_equinox_tied_model_round_trips_with_the_tie(self):
    model = equinox_tied_lm.TiedLM(jax.random.key(0))
    path = self._save("equinox", model)
    restored = self.checkpointer.restore(path, _abstract(model))
    self.assertIs(restored.embedding, restored.unembedding)
    for ours, saved in zip(jax.tree.leaves(restored), jax.tree.leaves(model)):
      self.assertArraysEqual(ours, saved)

  def test_nnx_model_state_round_trips_with_the_sharing(self):
    model = nnx_shared_linear.Model(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    path = self._save("nnx", state)
    restored = nnx.merge(
        graphdef, self.checkpointer.restore(path, _abstract(state))
    )
    self.assertIs(restored.first, restored.last)
    self.assertArraysEqual(restored.first.kernel[...], model.first.kernel[...])


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
