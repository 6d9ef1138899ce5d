"""jax.tree_util with relative identities: registration and tree operations."""

import collections
import dataclasses
import pickle
import re
import warnings


import jax
import jax.numpy as jnp

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jax import tree_util
from jax._src import test_util as jtu
from jax._src import tree_util as tree_util_internal

from shared_nodes import Child, Parent, Param


class KeyedNode:
  """Registered with register_pytree_with_keys(..., flag)."""

  def __init__(self, a, b):
    self.a = a
    self.b = b


tree_util.register_pytree_with_keys(
    KeyedNode,
    lambda n: (
        ((tree_util.GetAttrKey("a"), n.a), (tree_util.GetAttrKey("b"), n.b)),
        None,
    ),
    lambda _, ch: KeyedNode(*ch),
    preserve_relative_identities=True,
)


@tree_util.register_pytree_with_keys_class(preserve_relative_identities=True)
class KeyedClass:

  def __init__(self, a):
    self.a = a

  def tree_flatten_with_keys(self):
    return ((tree_util.GetAttrKey("a"), self.a),), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


@tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
  """A classic (not opted-in) dataclass node."""

  first: object
  second: object


@tree_util.register_pytree_node_class
class PlainNode:
  """A classic (not opted-in) node: plain tree semantics."""

  def __init__(self, x):
    self.x = x

  def tree_flatten(self):
    return (self.x,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def _shared_instances():
  """One instance of each opted-in class, and its leaf."""
  return [
      ("register_pytree_node", Child(np.float32(1.0))),
      ("register_pytree_node_class", Parent(np.float32(1.0), None)),
      ("register_pytree_with_keys", KeyedNode(np.float32(1.0), None)),
      ("register_pytree_with_keys_class", KeyedClass(np.float32(1.0))),
      ("register_dataclass", Param(np.float32(1.0))),
  ]


def _by_functions(register):
  """Registration of a class without children by `register`
  (register_pytree_node or register_pytree_with_keys) and two functions."""
  return lambda cls, flag: register(
      cls,
      lambda o: ((), None),
      lambda _, __: cls(),
      preserve_relative_identities=flag,
  )


_REGISTRATIONS = {
    "register_pytree_node": _by_functions(tree_util.register_pytree_node),
    "register_pytree_node_class": (
        lambda cls, flag: tree_util.register_pytree_node_class(
            preserve_relative_identities=flag
        )(cls)
    ),
    "register_pytree_with_keys": _by_functions(
        tree_util.register_pytree_with_keys
    ),
    "register_pytree_with_keys_class": (
        lambda cls, flag: tree_util.register_pytree_with_keys_class(
            cls, preserve_relative_identities=flag
        )
    ),
    "register_dataclass": lambda cls, flag: tree_util.register_dataclass(
        cls, data_fields=[], meta_fields=[], preserve_relative_identities=flag
    ),
}


def _fresh_class():
  class Fresh:

    def tree_flatten(self):
      return (), None

    def tree_flatten_with_keys(self):
      return (), None

    @classmethod
    def tree_unflatten(cls, aux, children):
      return cls()

  return Fresh


class RegistrationTest(jtu.JaxTestCase):

  @parameterized.named_parameters((name, name) for name in _REGISTRATIONS)
  def test_flag_is_keyword_only_bool(self, api):
    for bad in (1, 0, "yes", np.bool_(True)):
      cls = _fresh_class()
      # The C++ registries' one check and message, for every function.
      with self.assertRaisesRegex(
          TypeError,
          r"^preserve_relative_identities must be a bool, or None to follow "
          r"the class's bases, got \S+: " + re.escape(repr(bad)) + "$",
      ):
        _REGISTRATIONS[api](cls, bad)
      # A rejected registration registers nothing, in any registry.
      for registry in tree_util_internal._all_registries:
        self.assertEqual(registry.flatten(cls())[1].num_leaves, 1)

  @parameterized.named_parameters((name, name) for name in _REGISTRATIONS)
  def test_flag_true_shares_and_false_does_not(self, api):
    for flag in (True, False):
      cls = _fresh_class()
      _REGISTRATIONS[api](cls, flag)
      obj = cls()
      treedef = tree_util.tree_structure([obj, obj])
      out = tree_util.tree_unflatten(treedef, [])
      self.assertIsNot(out[0], obj)
      self.assertEqual(out[0] is out[1], flag)
      self.assertEqual(
          treedef == tree_util.tree_structure([cls(), cls()]), not flag
      )

  @parameterized.named_parameters(
      (f"{name}_base_{when}", name, when)
      for name in _REGISTRATIONS
      for when in ("before", "after")
  )
  def test_an_explicit_false_keeps_a_subclass_out_of_its_bases_opt_in(
      self, api, when
  ):
    # None (the default) follows the base's opt-in, False stays out, True is
    # in; the base opted in before or after the registrations.
    base = type("Base", (), {})
    if when == "before":
      tree_util.preserve_relative_identities(base)
    classes = {}
    for flag in (None, False, True):
      classes[flag] = type(f"Sub{flag}", (_fresh_class(), base), {})
      _REGISTRATIONS[api](classes[flag], flag)
    if when == "after":
      tree_util.preserve_relative_identities(base)
    for flag, cls in classes.items():
      kept = flag is not False
      self.assertEqual(tree_util.has_relative_identities(cls), kept)
      obj = cls()
      first, second = jax.jit(lambda pair: pair)((obj, obj))
      self.assertEqual(first is second, kept, flag)

  def test_flag_defaults_to_false(self):
    node = PlainNode(np.float32(1.0))
    leaves, treedef = tree_util.tree_flatten([node, node])
    self.assertLen(leaves, 2)
    out = tree_util.tree_unflatten(treedef, leaves)
    self.assertIsNot(out[0], out[1])

  @parameterized.named_parameters(
      (name, obj) for name, obj in _shared_instances()
  )
  def test_each_registration_api_shares(self, obj):
    leaves, treedef = tree_util.tree_flatten((obj, [obj]))
    self.assertLen(leaves, 1)
    out = tree_util.tree_unflatten(treedef, leaves)
    self.assertIs(out[0], out[1][0])
    self.assertIsNot(out[0], obj)
    self.assertIsInstance(out[0], type(obj))

  def test_decorator_forms_return_the_class(self):
    class Empty:
      """The methods register_pytree_node_class reads, for both forms."""

      def tree_flatten(self):
        return (), None

      @classmethod
      def tree_unflatten(cls, aux, children):
        return cls()

    @tree_util.register_pytree_node_class
    class Bare(Empty):
      pass

    @tree_util.register_pytree_node_class()
    class Called(Empty):
      pass

    @tree_util.register_dataclass
    @dataclasses.dataclass
    class BareDataclass:
      x: int

    self.assertTrue(
        all(isinstance(c, type) for c in (Bare, Called, BareDataclass))
    )
    for cls in (Bare, Called):
      obj = cls()
      out = tree_util.tree_map(lambda x: x, [obj, obj])
      self.assertIsNot(out[0], out[1])  # registered without the flag

  def test_stock_dispatch_registry_stays_stock(self):
    from jaxlib._jax import pytree as stock_pytree  # pylint: disable=g-import-not-at-top

    self.assertIsInstance(
        tree_util_internal.dispatch_registry, stock_pytree.PyTreeRegistry
    )
    for registry in (
        tree_util_internal.default_registry,
        tree_util_internal.stock_layout_registry,
        tree_util_internal.none_leaf_registry,
        tree_util_internal.tracing_registry,
    ):
      self.assertNotIsInstance(registry, stock_pytree.PyTreeRegistry)
    # Opted-in classes are plain nodes to the stock registry.
    c = Child(1.0)
    leaves, _ = tree_util_internal.dispatch_registry.flatten([c, c])
    self.assertLen(leaves, 2)


class TreeOpsTest(jtu.JaxTestCase):

  def test_tree_map_one_call_per_unique_leaf(self):
    child = Child(np.arange(3.0))
    parent = Parent(child, child)
    calls = []
    out = jax.tree.map(lambda x: calls.append(x) or x * 2, parent)
    self.assertLen(calls, 1)
    self.assertIs(out.left, out.right)
    self.assertIsNot(out, parent)
    self.assertIsNot(out.left, child)
    np.testing.assert_array_equal(out.left.x, np.arange(3.0) * 2)

  def test_tree_map_several_trees(self):
    child = Child(1.0)
    parent = Parent(child, child)
    other_child = Child(10.0)
    out = jax.tree.map(
        lambda a, b: a + b, parent, Parent(other_child, other_child)
    )
    self.assertIs(out.left, out.right)
    self.assertEqual(out.left.x, 11.0)
    # The other tree holds two objects where the first shares one: mapped
    # where both share (nowhere here), as stock does.
    split = (jax.tree_util.SplitTieWarning, "jax.tree.map split a tie")
    with self.assertWarnsRegex(*split):
      out = jax.tree.map(
          lambda a, b: a + b, parent, Parent(Child(1.0), Child(2.0))
      )
    self.assertIsNot(out.left, out.right)
    self.assertEqual((out.left.x, out.right.x), (2.0, 3.0))
    # The result is laid out as the first tree, which holds two objects;
    # the other tree's tie is one the values split: told.
    with self.assertWarnsRegex(*split):
      out = jax.tree.map(
          lambda a, b: a + b, Parent(Child(1.0), Child(2.0)), parent
      )
    self.assertIsNot(out.left, out.right)
    self.assertEqual((out.left.x, out.right.x), (2.0, 3.0))
    # Where the values agree, the other tree's tie is neither kept (it is
    # not the result's layout) nor told.
    x = np.arange(2.0)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      out = jax.tree.map(
          lambda a, b: a + b, Parent(Child(x), Child(x)), Parent(child, child)
      )
    self.assertIsNot(out.left, out.right)

  def test_leaves_and_structure(self):
    child = Child(1.0)
    shared = Parent(child, child)
    unshared = Parent(Child(1.0), Child(1.0))
    self.assertEqual(jax.tree.leaves(shared), [1.0])
    self.assertEqual(jax.tree.leaves(unshared), [1.0, 1.0])
    td_shared = jax.tree.structure(shared)
    td_unshared = jax.tree.structure(unshared)
    self.assertNotEqual(td_shared, td_unshared)
    self.assertEqual(
        td_shared, jax.tree.structure((lambda c: Parent(c, c))(Child(2.0)))
    )
    self.assertEqual(
        hash(td_shared),
        hash(jax.tree.structure((lambda c: Parent(c, c))(Child(2.0)))),
    )
    self.assertEqual(td_shared.num_leaves, 1)
    self.assertIn("#1=", repr(td_shared))
    self.assertIn("#1#", repr(td_shared))
    self.assertNotIn("#", repr(td_unshared))

  def test_shared_leaf_through_plain_containers_is_not_tracked(self):
    x = np.arange(2.0)
    self.assertLen(jax.tree.leaves([x, x]), 2)
    inner = [x]
    self.assertLen(jax.tree.leaves((inner, inner)), 2)

  def test_flatten_with_path_uses_first_occurrence(self):
    p = Param(np.float32(3.0))
    tree = {"a": [p, 1.0], "b": p, "c": KeyedNode(p, 2.0)}
    paths_and_leaves, treedef = jax.tree.flatten_with_path(tree)
    paths = [tree_util.keystr(path) for path, _ in paths_and_leaves]
    self.assertEqual(paths, ["['a'][0].value", "['a'][1]", "['c'].b"])
    self.assertEqual(treedef, jax.tree.structure(tree))
    out = jax.tree.map_with_path(lambda path, x: tree_util.keystr(path), tree)
    self.assertIs(out["a"][0], out["b"])
    self.assertIs(out["b"], out["c"].a)
    self.assertEqual(out["b"].value, "['a'][0].value")

  def test_is_leaf_wins(self):
    child = Child(1.0)
    leaves = jax.tree.leaves(
        [child, child], is_leaf=lambda x: isinstance(x, Child)
    )
    self.assertEqual(leaves, [child, child])

  def test_cycle_is_value_error_naming_type(self):
    a = KeyedNode(None, None)
    a.b = a
    with self.assertRaisesRegex(ValueError, "KeyedNode"):
      jax.tree.leaves(a)

  def test_a_cycle_given_to_a_transformation_is_the_same_value_error(self):
    a = KeyedNode(jnp.ones(2), None)
    a.b = a
    first = lambda node: node.a
    for name, transformation in (
        ("jit", jax.jit(first)),
        ("grad", jax.grad(lambda node: jnp.sum(node.a))),
        ("value_and_grad", jax.value_and_grad(lambda node: jnp.sum(node.a))),
        ("checkpoint", jax.checkpoint(first)),
        ("vmap", jax.vmap(first)),
    ):
      with (
          self.subTest(name),
          self.assertRaisesRegex(ValueError, "KeyedNode.*that contains itself"),
      ):
        transformation(a)

  def test_pickle_treedef_keeps_sharing(self):
    child = Child(1.0)
    treedef = jax.tree.structure({"p": Parent(child, child), "q": [child]})
    restored = pickle.loads(pickle.dumps(treedef))
    self.assertEqual(restored, treedef)
    out = restored.unflatten([5.0])
    self.assertIs(out["p"].left, out["q"][0])

  def test_broadcast_and_transpose_like_ops(self):
    p = Param(1.0)
    tree = Pair(p, p)
    out = jax.tree.broadcast(0, tree)
    self.assertIs(out.first, out.second)
    self.assertEqual(out.first.value, 0)
    out = jax.tree.broadcast(Pair(Param(7), Param(7)), tree)
    self.assertEqual(out.first.value, 7)
    with self.assertRaisesRegex(ValueError, "more than once"):
      jax.tree.broadcast(Pair(Param(7), Param(8)), tree)

  def test_treedef_children_partition_the_leaves(self):
    p = Param(np.ones(2))
    treedef = jax.tree.structure((p, [p, Param(2.0)], {"k": p}))
    children = treedef.children()
    self.assertEqual(sum(c.num_leaves for c in children), treedef.num_leaves)
    self.assertEqual(tree_util.treedef_tuple(children), treedef)

  @parameterized.parameters(
      ((1, [2.0, None], {"a": (3,), "b": np.arange(2)}),),
      (collections.OrderedDict(z=1, a=[2, 3]),),
      (Pair(1.0, [PlainNode(2.0), PlainNode(2.0)]),),
      ([PlainNode(1.0)] * 3,),
  )
  def test_classic_trees_like_stock(self, tree):
    from jaxlib._jax import pytree as stock_pytree  # pylint: disable=g-import-not-at-top
    # A tree without opted-in nodes flattens as with the stock registry
    # (which knows the same classes: jax registers them in both).
    stock = tree_util_internal.dispatch_registry
    self.assertIsInstance(stock, stock_pytree.PyTreeRegistry)
    leaves, treedef = jax.tree.flatten(tree)
    stock_leaves, stock_treedef = stock.flatten(tree)
    self.assertEqual(len(leaves), len(stock_leaves))
    for a, b in zip(leaves, stock_leaves):
      self.assertIs(a, b)
    self.assertEqual(repr(treedef), repr(stock_treedef))
    self.assertEqual(treedef.num_nodes, stock_treedef.num_nodes)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
