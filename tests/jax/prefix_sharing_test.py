"""Prefix specs over shared nodes: one value per shared node, or SharedPrefixError.

Every API that broadcasts a tree prefix over a value (vmap's in_axes and
out_axes, jit's shardings and donation, device_put, shard_map's specs, pmap,
jax.tree.broadcast, with_sharding_constraint) must give a shared node one
value wherever the spec reaches it, also through a spec leaf that covers a
subtree holding the node. Two values for one node raise SharedPrefixError
naming the spec and both places.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P
from jax._src import test_util as jtu
from jax._src.tree_util import SharedPrefixError, prefix_errors

from shared_nodes import Param


def both(a, b):
  return a[0].value + b[0].value


def needs_eight_devices(test):
  """Skips `test` where jax's backend has fewer than the 8 devices its
  mesh or pmap spans (conftest.py gives the CPU 8; one TPU chip is one)."""
  if jax.device_count() < 8:
    test.skipTest(
        f"needs 8 devices; {jax.default_backend()} has {jax.device_count()}"
    )


class PrefixSharingTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.p = Param(jnp.arange(8.0))

  @property
  def mesh(self):
    needs_eight_devices(self)
    return jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

  @property
  def split(self):
    return NamedSharding(self.mesh, P("x"))

  @property
  def whole(self):
    return NamedSharding(self.mesh, P())

  def assertConflict(self, spec_name, first, other, call):
    with self.assertRaises(SharedPrefixError) as info:
      call()
    message = str(info.exception)
    self.assertIn(spec_name, message)
    self.assertIn(f"at {first} and", message)
    self.assertIn(f"same node at {other}", message)
    return info.exception

  def test_vmap_in_axes_below_a_spec_leaf(self):
    p = self.p
    e = self.assertConflict(
        "vmap in_axes",
        "args[0][0]",
        "args[1][0]",
        lambda: jax.vmap(both, in_axes=(0, None))([p], [p]),
    )
    self.assertEqual(e.values, (0, None))
    np.testing.assert_allclose(
        jax.vmap(both, in_axes=(0, 0))([p], [p]), 2 * p.value
    )

  def test_vmap_in_axes_none_first_is_a_sharing_error(self):
    q, r = Param(jnp.ones(2)), Param(jnp.zeros(2))
    self.assertConflict(
        "vmap in_axes",
        "args[0][0]",
        "args[1]['k']",
        lambda: jax.vmap(lambda a, b: a[0].value, in_axes=(None, 0))(
            [q, r], {"k": q}
        ),
    )

  def test_vmap_out_axes(self):
    def f(x):
      n = Param(x)
      return [n], [n]

    self.assertConflict(
        "vmap out_axes",
        "vmap out_axes[0][0]",
        "vmap out_axes[1][0]",
        lambda: jax.vmap(f, out_axes=(0, 1))(jnp.ones((3, 2))),
    )
    out = jax.vmap(f, out_axes=(1, 1))(jnp.ones((3, 2)))
    self.assertIs(out[0][0], out[1][0])

  def test_donation_of_one_position_only(self):
    q, r = Param(jnp.ones(2)), Param(jnp.zeros(2))
    f = lambda a, b: a[0].value + b["k"].value
    self.assertConflict(
        "donate_argnums/donate_argnames",
        "args[0][0]",
        "args[1]['k']",
        lambda: jax.jit(f, donate_argnums=0)([q, r], {"k": q}),
    )
    self.assertFalse(q.value.is_deleted())
    self.assertConflict(
        "donate_argnums/donate_argnames",
        "args[0][0]",
        "args[1]['k']",
        lambda: jax.jit(f, donate_argnums=1)([q, r], {"k": q}),
    )
    self.assertFalse(q.value.is_deleted())
    np.testing.assert_allclose(
        jax.jit(f, donate_argnums=(0, 1))([q, r], {"k": q}), 2.0
    )

  def test_jit_in_shardings(self):
    p = self.p
    self.assertConflict(
        "in_shardings",
        "args[0][0]",
        "args[1][0]",
        lambda: jax.jit(both, in_shardings=(self.split, self.whole))([p], [p]),
    )
    np.testing.assert_allclose(
        jax.jit(both, in_shardings=(self.split, self.split))([p], [p]),
        2 * p.value,
    )

  def test_jit_out_shardings(self):
    def f(x):
      n = Param(x)
      return [n], [n]

    x = jnp.arange(8.0)
    self.assertRaises(
        SharedPrefixError,
        lambda: jax.jit(f, out_shardings=(self.split, self.whole))(x),
    )
    out = jax.jit(f, out_shardings=(self.split, self.split))(x)
    self.assertIs(out[0][0], out[1][0])

  def test_device_put(self):
    p = self.p
    self.assertConflict(
        "device_put",
        "device_put device[0][0]",
        "device_put device[1][0]",
        lambda: jax.device_put(([p], [p]), (self.split, self.whole)),
    )
    a, b = jax.device_put(([p], [p]), (self.split, self.split))
    self.assertIs(a[0], b[0])

  def test_with_sharding_constraint(self):
    p = self.p

    @jax.jit
    def f(a, b):
      return jax.lax.with_sharding_constraint((a, b), (self.split, self.whole))

    self.assertRaises(SharedPrefixError, lambda: f([p], [p]))

  def test_shard_map_in_specs(self):
    p = self.p
    g = jax.shard_map(
        both, mesh=self.mesh, in_specs=(P("x"), P()), out_specs=P("x")
    )
    with self.assertRaises(SharedPrefixError) as info:
      g([p], [p])
    self.assertIn("shard_map in_specs", str(info.exception))

  def test_shard_map_out_specs(self):
    def f(x):
      n = Param(x)
      return [n], [n]

    g = jax.shard_map(
        f, mesh=self.mesh, in_specs=P("x"), out_specs=(P("x"), P())
    )
    with self.assertRaises(SharedPrefixError) as info:
      g(jnp.arange(8.0))
    self.assertIn("shard_map out_specs", str(info.exception))

  def test_pmap_in_axes(self):
    needs_eight_devices(self)
    p = Param(jnp.ones((8, 2)))
    self.assertConflict(
        "pmap in_axes",
        "args[0][0]",
        "args[1][0]",
        lambda: jax.pmap(both, in_axes=(0, None))([p], [p]),
    )

  def test_pmap_flat_in_axes_with_shared_arguments(self):
    needs_eight_devices(self)
    # Three arguments, three unique leaves, yet the arguments are not leaves:
    # the spec must not be taken as one axis per leaf.
    shared = Param(jnp.ones((8, 2)))
    pair = (Param(jnp.zeros((8, 2))), Param(jnp.zeros((2,))))
    f = lambda a, b, c: a.value + b.value + c[0].value + c[1].value
    out = jax.pmap(f, in_axes=(0, 0, (0, None)))(shared, shared, pair)
    np.testing.assert_allclose(out, 2.0)
    self.assertConflict(
        "pmap in_axes",
        "args[0]",
        "args[1]",
        lambda: jax.pmap(f, in_axes=(0, None, 0))(shared, shared, pair),
    )

  def test_tree_broadcast(self):
    p = self.p
    with self.assertRaises(SharedPrefixError):
      jax.tree.broadcast((0, 1), ([p], [p]))
    a, b = jax.tree.broadcast((0, 0), ([p], [p]))
    self.assertIs(a[0], b[0])

  def test_nested_sharing_is_linear(self):
    # Each level holds the level below twice: 2**40 occurrences of the bottom.
    node = Param(jnp.ones(3))
    for _ in range(40):
      node = Param((node, node))
    in_axes = jax.tree.map(lambda _: 0, node)
    out = jax.vmap(lambda n: n, in_axes=(in_axes,))(node)
    self.assertIs(out.value[0], out.value[1])
    broadcast = jax.tree.broadcast(0, node)
    self.assertIs(broadcast.value[0], broadcast.value[1])
    self.assertEqual(jax.tree.leaves(broadcast), [0])


@st.composite
def shared_trees(draw):
  """A list whose items hold a few Params, some of them at several places."""
  params = [
      Param(draw(st.sampled_from([[1.0], [1.0, 2.0], {"w": 1.0, "b": 2.0}])))
      for _ in range(draw(st.integers(1, 3)))
  ]
  param = st.sampled_from(params)
  item = st.one_of(
      param,
      st.tuples(param, st.just(3.0)).map(list),
      param.map(lambda p: {"k": p}),
  )
  return draw(st.lists(item, min_size=2, max_size=5))


@st.composite
def prefixes_of(draw, tree):
  """A prefix of `tree` (which shares nothing), wrong in some places."""
  if isinstance(tree, float):
    return draw(st.sampled_from([0, 1]))
  choice = draw(st.sampled_from(["leaf", "same", "same", "wrong"]))
  if choice == "leaf":
    return draw(st.sampled_from([0, 1]))
  if choice == "wrong":
    if isinstance(tree, list):
      return [0] * (len(tree) + 1)
    if isinstance(tree, dict):
      return {**dict.fromkeys(tree, 0), "extra": 0}
    return [0]  # For a Param.
  if isinstance(tree, list):
    return [draw(prefixes_of(child)) for child in tree]
  if isinstance(tree, dict):
    return {key: draw(prefixes_of(child)) for key, child in tree.items()}
  return Param(draw(prefixes_of(tree.value)))


class PrefixErrorsTest(jtu.JaxTestCase):
  """prefix_errors over shared nodes finds an error where stock's walk of the
  stock layout (every occurrence written out) finds one, and words it as
  stock does, at the place where the prefix is wrong."""

  @settings(max_examples=200, deadline=None)
  @given(data=st.data())
  def test_generated_prefixes_report_an_error_of_the_stock_layout(self, data):
    full = data.draw(shared_trees())
    expanded = jax.tree_util.tree_unshare(full)
    prefix = data.draw(prefixes_of(expanded))
    stock = [str(error("in_axes")) for error in prefix_errors(prefix, expanded)]
    ours = [
        error("in_axes")
        for error in prefix_errors(
            prefix, full, full_treedef=jax.tree.structure(full)
        )
    ]
    if full is expanded:  # Nothing shared: stock's own walk, every error.
      self.assertEqual([str(error) for error in ours], stock)
      return
    self.assertLessEqual(len(ours), 1)
    if ours and isinstance(ours[0], SharedPrefixError):
      return  # One node given two values: the stock layout cannot see it.
    self.assertEqual(bool(ours), bool(stock), (prefix, full))
    if ours:
      self.assertIn(str(ours[0]), stock)

  def test_wrong_prefix_below_nested_sharing_is_found_in_linear_time(self):
    # 2**40 occurrences of the bottom node: a walk of the objects would not
    # end; the error is found through the treedef.
    node, prefix = Param([1.0, 2.0]), Param([0])
    for _ in range(40):
      node, prefix = Param((node, node)), Param((prefix, prefix))
    (error,) = prefix_errors(
        prefix, node, full_treedef=jax.tree.structure(node)
    )
    message = str(error("in_axes"))
    self.assertIn("different lengths of list at key path", message)
    self.assertIn("in_axes" + ".value[0]" * 40 + ".value", message)
    with self.assertRaisesRegex(ValueError, "different lengths of list"):
      jax.tree.broadcast(prefix, node)


class SharingMessagesTest(jtu.JaxTestCase):
  """Errors about sharing name places as the rest of their message does."""

  def test_aot_call_with_other_sharing_names_args(self):
    p = Param(jnp.arange(3.0))
    compiled = jax.jit(lambda a, b: a.value + b.value).lower(p, p).compile()
    with self.assertRaises(TypeError) as info:
      compiled(p, Param(jnp.arange(3.0)))
    message = str(info.exception)
    self.assertIn("at args[1], seen", message)
    self.assertIn("that is the object at args[0]", message)
    self.assertNotIn("key path [0]", message)

  def test_aot_call_with_other_sharing_names_the_arguments(self):
    p, q = Param(jnp.arange(3.0)), Param(jnp.ones(3))
    compiled = (
        jax.jit(lambda a, b: a[0].value + b.value).lower((p, 1), p).compile()
    )
    with self.assertRaises(TypeError) as info:
      compiled((p, 1), q)
    message = str(info.exception)
    self.assertIn("at args[1], seen", message)
    self.assertIn("that is the object at args[0][0]", message)
    self.assertNotIn("key path", message)

  def test_jit_in_shardings_conflict_in_the_users_words(self):
    p = Param(jnp.ones(8))
    mesh = jax.make_mesh((1,), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    with self.assertRaises(SharedPrefixError) as info:
      jax.jit(lambda a, b: a.value + b.value, in_shardings=(sharding, None))(
          p, p
      )
    message = str(info.exception)
    # The user wrote jax.jit and None (pjit and UnspecifiedValue inside).
    self.assertTrue(message.startswith("jit in_shardings gives "), message)
    self.assertIn("and None to the same node at args[1]", message)
    self.assertNotIn("Unspecified", message)

  def test_tree_broadcast_conflict_names_the_full_tree(self):
    p = Param(jnp.ones(2))
    with self.assertRaises(SharedPrefixError) as info:
      jax.tree.broadcast((1, 2), (p, p))
    self.assertIn(
        "gives 1 to the pytree node at full_tree[0] and 2 to the same node "
        "at full_tree[1]",
        str(info.exception),
    )

  def test_conflict_names_children_of_keyed_nodes_by_their_keys(self):
    # Every Equinox and NNX module is registered with keys: the places are
    # named as tree_flatten_with_path names them, not by flat index.
    class Tied:

      def __init__(self, embedding, unembedding):
        self.embedding, self.unembedding = embedding, unembedding

    jax.tree_util.register_pytree_with_keys(
        Tied,
        lambda t: (
            (
                (jax.tree_util.GetAttrKey("embedding"), t.embedding),
                (jax.tree_util.GetAttrKey("unembedding"), t.unembedding),
            ),
            None,
        ),
        lambda _, children: Tied(*children),
        preserve_relative_identities=True,
    )
    p = Param(jnp.ones(3))
    with self.assertRaises(SharedPrefixError) as info:
      jax.vmap(lambda t: t.embedding.value, in_axes=(Tied(0, None),))(
          Tied(p, p)
      )
    self.assertIn(
        "vmap in_axes gives 0 to the pytree node at args[0].embedding and "
        "None to the same node at args[0].unembedding",
        str(info.exception),
    )

  def test_pmap_out_axes_conflict_names_out_axes(self):
    needs_eight_devices(self)

    def f(x):
      n = Param(x)
      return [n], [n]

    with self.assertRaises(SharedPrefixError) as info:
      jax.pmap(f, out_axes=(0, None))(jnp.ones((8, 2)))
    self.assertIn("pmap out_axes", str(info.exception))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
