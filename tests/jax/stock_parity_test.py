"""jax.tree_util behaves as stock where stock's own tests look:
iterable-leaf warnings, GC referents, treedefs of the default and dispatch
registries, malformed pickled treedefs."""

import gc
import warnings

from absl.testing import absltest
from absl.testing import parameterized

import jax
from jax import tree_util
from jax._src import test_util as jtu
from jax._src import tree_util as tree_util_internal

from shared_nodes import Child


def _generator():
  yield 1


class Point:

  def __init__(self, x):
    self.x = x


tree_util.register_pytree_node(
    Point, lambda p: ((p.x,), None), lambda _, xs: Point(*xs)
)


class IterableLeafWarningTest(jtu.JaxTestCase):

  @parameterized.named_parameters(
      ("generator", _generator),
      ("zip", lambda: zip([1], [2])),
      ("map", lambda: map(abs, [1])),
      ("dict_values", lambda: {"a": 1}.values()),
      ("list_iterator", lambda: iter([1])),
  )
  def test_tree_functions_warn(self, make):
    for fn in (
        jax.tree.leaves,
        jax.tree.structure,
        tree_util.tree_flatten_with_path,
    ):
      with self.assertWarnsRegex(
          DeprecationWarning,
          "Python iterable type '.*' is treated as a leaf in PyTree.",
      ):
        fn([make()])

  def test_no_warning_when_is_leaf_claims_it(self):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      leaves = jax.tree.leaves(
          {"v": {"a": 1}.values()},
          is_leaf=lambda x: type(x).__name__ == "dict_values",
      )
    self.assertEmpty(caught)
    self.assertLen(leaves, 1)

  def test_no_warning_for_other_leaves(self):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      jax.tree.leaves(
          [range(3), {1, 2}, "ab", {"a": 1}.keys(), jax.numpy.ones(2)]
      )
    self.assertEmpty(caught)


class GcReferentsTest(jtu.JaxTestCase):

  def test_treedef_referents(self):
    key = "k" + str(1)  # made at run time: not an interned constant
    treedef = jax.tree.structure({key: 1, "j": Point(2)})
    referents = gc.get_referents(treedef)
    self.assertTrue(any(r is key for r in referents))
    self.assertIn(tree_util.default_registry, referents)
    self.assertIn(tree_util.PyTreeDef, referents)
    self.assertFalse(any(isinstance(r, list) for r in referents))

  def test_registry_referents(self):
    referents = gc.get_referents(tree_util.default_registry)
    self.assertIn(Point, referents)
    self.assertIn(Child, referents)


class RegistriesCompareTest(jtu.JaxTestCase):

  def test_default_and_dispatch_treedefs_are_equal(self):
    tree = [Point(1), {"a": (2, None)}, Point((3, 4))]
    leaves1, treedef1 = tree_util.default_registry.flatten(tree)
    leaves2, treedef2 = tree_util_internal.dispatch_registry.flatten(tree)
    self.assertEqual(treedef1, treedef2)
    self.assertEqual(leaves1, leaves2)

  def test_different_trees_differ(self):
    _, treedef1 = tree_util.default_registry.flatten([Point(1), 2])
    _, treedef2 = tree_util_internal.dispatch_registry.flatten([Point(1)])
    self.assertNotEqual(treedef1, treedef2)

  def test_sharing_is_not_stock_structure(self):
    # The dispatch registry knows nothing of sharing: [s, s] flattens to two
    # nodes there, one node and a reference here.
    s = Child(1)
    _, ours = tree_util.default_registry.flatten([s, s])
    _, stock = tree_util_internal.dispatch_registry.flatten([s, s])
    self.assertNotEqual(ours, stock)
    _, unshared = tree_util.default_registry.flatten([s, Child(2)])
    self.assertEqual(unshared, stock)


class StockEntryPointsTest(jtu.JaxTestCase):

  def test_parse_arguments_takes_the_default_registry(self):
    # jax's own jax_jit_test calls jaxlib's C++ with tree_util's registry.
    from jax._src.lib import jax_jit

    signature, dynamic = jax_jit.parse_arguments(
        [1, 2], [], (), [0], [], tree_util.default_registry
    )
    self.assertEqual(dynamic, [2])
    self.assertIn("static args (positional + keyword): [1]", str(signature))
    # Its treedefs are the given registry's, as with stock's own registry.
    self.assertEqual(
        signature.dynamic_arg_treedefs,
        [tree_util.default_registry.flatten(0)[1]],
    )
    self.assertIs(
        jax_jit.PyArgSignature, jax._src.lib._stock_jax_jit.PyArgSignature
    )

  def test_custom_jax_over_a_stock_jaxlib_says_which_jaxlib(self):
    import subprocess
    import sys

    # As if jaxlib were stock: the jaxlib_patch module cannot be imported.
    code = "import sys; sys.modules['jaxlib_patch'] = None; import jax"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    self.assertNotEqual(result.returncode, 0)
    self.assertIn(
        "ImportError: This jax (with relative identities", result.stderr
    )
    self.assertIn("install the jaxlib wheel of the same version", result.stderr)


class MalformedPickleTest(jtu.JaxTestCase):

  def test_every_malformed_state_is_a_value_error(self):
    registry, leaf = tree_util.default_registry, (0, 0, None, None, 1, 1)
    states = [
        (registry,),
        5,
        (registry, [leaf], 3),  # wrong shapes
        (registry, [leaf, (2, 2, None, None, 1, 2)]),  # wrong arities
        (registry, [leaf, leaf]),
        (registry, []),
        (registry, [leaf, leaf, (5, 2, ["a"], None, 2, 3)]),
        (registry, [leaf, (5, 1, "a", None, 1, 2)]),
        (registry, [("0", 0, None, None, 1, 1)]),  # a kind not an int
        (registry, [leaf, (6, 0, None, None, 0, 1, "1")]),  # nor a distance
    ]
    for state in states:
      with self.assertRaisesRegex(ValueError, "Malformed pickled PyTreeDef"):
        tree_util.PyTreeDef.__new__(tree_util.PyTreeDef).__setstate__(state)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
