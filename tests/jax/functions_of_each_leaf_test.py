"""Public functions that map the tree the user hands over leaf by leaf, or
hand it on as given, and give a tree back (patches 0010 and 0011):
each keeps the ties of the tree it was given and computes stock's values.

Every case runs on generated trees (lists of a few opted-in `Param`s, some
at several places, some holding another: leaves of shape (4,)), and is
judged twice: the result has
the given tree's sharing (its treedef, which records which places are one
object, equals the given tree's), and its values at each place are those
of the same function on `tree_unshare(tree)`, the copy per place that
stock JAX sees. A function that splits a tie fails the first; one that
reads places as one where stock reads them apart fails the second.
`SplitTieWarning` is an error in these tests (conftest.py).
"""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
from jax import lax
from jax import tree_util
from jax._src import test_util as jtu
from jax._src import config
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import checkify
from jax.experimental.compute_on import compute_on2
from jax.experimental.layout import Layout, with_layout_constraint
from jax.experimental.xla_metadata import set_xla_metadata
from jax.sharding import PartitionSpec

import stock_reference

LENGTH = 4


@tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Param:
  value: object


def _checkified(tree):
  return checkify.checkify(lambda t: jax.tree.map(lambda x: x + 1, t))(tree)[1]


def _checkified_under_jit(tree):
  return jax.jit(checkify.checkify(lambda t: t))(tree)[1]


def _callback_receives(transform, tree):
  """The tree jax.debug.callback gives its callback, under `transform`."""
  received = []

  def f(t):
    jax.debug.callback(received.append, t)
    return sum(jnp.sum(x) for x in jax.tree.leaves(t))

  transform(f)(tree)
  jax.effects_barrier()
  return received[-1]


def _in_shard_map(collective):
  mesh = jax.make_mesh((1,), ("i",))
  return jax.shard_map(
      lambda t: collective(t, "i"),
      mesh=mesh,
      in_specs=PartitionSpec(),
      out_specs=PartitionSpec(),
  )


def _mapped(batch_size):
  return lambda tree: lax.map(
      lambda t: jax.tree.map(jnp.sin, t), tree, batch_size=batch_size
  )


def _scanned(reverse):
  return lambda tree: lax.associative_scan(
      lambda a, b: jax.tree.map(jnp.add, a, b), tree, reverse=reverse
  )


_sine_composite = lax.composite(
    lambda t: jax.tree.map(jnp.sin, t), name="test.sine"
)


def _reduced(reduce, *shape):
  """`reduce` by addition from zeros that share as the tree does."""
  return lambda tree: reduce(
      tree,
      jax.tree.map(lambda x: jnp.zeros((), x.dtype), tree),
      lambda a, b: jax.tree.map(jnp.add, a, b),
      *shape,
  )


def _scanned_by_scan3(tree):
  with config.scan3(True):
    carry, _ = lax.scan(
        lambda c, x: (jax.tree.map(lambda v: v * x, c), None),
        tree,
        jnp.arange(1.0, 4.0),
    )
  return carry


def _one_device_sharding():
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  return jax.sharding.NamedSharding(mesh, PartitionSpec())


CASES = {
    "associative_scan": _scanned(False),
    "associative_scan_reversed": _scanned(True),
    "associative_scan_under_jit": jax.jit(_scanned(False)),
    "composite": _sine_composite,
    "composite_under_jit": jax.jit(_sine_composite),
    "reduce": _reduced(lax.reduce, (0,)),
    "reduce_window": _reduced(lax.reduce_window, (2,), (1,), "VALID"),
    "scan3_carry": _scanned_by_scan3,
    "compute_on2": jax.jit(
        compute_on2(
            lambda t: jax.tree.map(jnp.sin, t),
            compute_type="device_host",
            out_memory_spaces=jax.memory.Space.Device,
        )
    ),
    "reshard": lambda tree: jax.reshard(tree, _one_device_sharding()),
    "with_layout_constraint": jax.jit(
        lambda t: with_layout_constraint(t, Layout((0,)))
    ),
    "checkify": _checkified,
    "checkify_under_jit": _checkified_under_jit,
    "debug_callback": functools.partial(_callback_receives, lambda f: f),
    "debug_callback_under_jit": functools.partial(_callback_receives, jax.jit),
    "debug_callback_under_grad": functools.partial(
        _callback_receives, jax.grad
    ),
    "psum": _in_shard_map(lax.psum),
    "pmean": _in_shard_map(lax.pmean),
    "pmax": _in_shard_map(lax.pmax),
    "checkpoint_name": lambda tree: checkpoint_name(tree, "block"),
    "set_xla_metadata": lambda tree: set_xla_metadata(tree, stage="one"),
    "checkpoint_name_under_grad": lambda tree: jax.grad(
        lambda t: sum(
            jnp.sum(x) for x in jax.tree.leaves(checkpoint_name(t, "b"))
        )
    )(tree),
    "map_in_batches": _mapped(2),
    "map_in_batches_and_a_remainder": _mapped(3),
    "stop_gradient": lax.stop_gradient,
    "device_get": jax.device_get,
}


def _leaf(seed):
  return jnp.arange(LENGTH, dtype=jnp.float32) + seed


@st.composite
def shared_trees(draw):
  """A list whose items hold a few Params, at least one at several places;
  a Param may hold an earlier one, once or twice (a DAG)."""
  params = [Param(_leaf(draw(st.integers(0, 9))))]
  for _ in range(draw(st.integers(0, 2))):
    inner = draw(st.sampled_from(params))
    params.append(
        draw(
            st.sampled_from(
                [
                    Param(_leaf(draw(st.integers(0, 9)))),
                    Param((inner, inner)),
                    Param({"w": inner, "b": _leaf(1)}),
                ]
            )
        )
    )
  param = st.sampled_from(params)
  item = st.one_of(
      param,
      st.tuples(param, st.just(_leaf(5))).map(list),
      param.map(lambda p: {"k": p}),
  )
  tree = draw(st.lists(item, min_size=2, max_size=5))
  hypothesis.assume(jax.tree.structure(tree).has_shared_nodes)
  return tree


class FunctionsOfEachLeafTest(jtu.JaxTestCase):

  def check(self, function, tree):
    result = function(tree)
    self.assertEqual(jax.tree.structure(result), jax.tree.structure(tree))
    stock_reference.assert_values_as_on_copies(result, function, tree)

  @parameterized.named_parameters((name, name) for name in CASES)
  @hypothesis.settings(max_examples=8, deadline=None)
  @hypothesis.given(tree=shared_trees())
  def test_keeps_the_ties_and_computes_stocks_values(self, name, tree):
    self.check(CASES[name], tree)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
