"""JAX's registries and their twins agree on every registration.

JAX flattens its own trees with `stock_layout_registry`, `none_leaf_registry`
and `tracing_registry` (stock's layout) and the trees users hand over with
their twins: `default_registry` (the public one), `identity_none_leaf_registry`
and `identity_tracing_registry`. A type registered on one registry object only, as
`jax.Ref` views (`TransformedRef`) are on the tracing registry, must flatten
the same way in its twin, or a view passed to `jax.jit`, `lax.cond`,
`jax.checkpoint` or `shard_map` is taken for a leaf there and refused. The
twins share one table of registrations (`PyTreeRegistry.twin`), so this holds
for every registration, made by anyone, at any time; the first test checks
it over every class alive after importing jax, Equinox, Flax and Optax.
"""

import collections
import dataclasses
import functools
import gc

from absl.testing import absltest
from absl.testing import parameterized

import equinox as eqx
import flax.nnx as nnx
import jax
import jax.numpy as jnp
import optax
import pytest
from jax import tree_util
from jax._src import test_util as jtu
from jax._src import tree_util as internal_tree_util
from jax._src.state.types import TransformedRef
from jax.sharding import PartitionSpec

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)

TWINS = {
    name: (
        getattr(internal_tree_util, stock_layout),
        getattr(internal_tree_util, keeping_identities),
    )
    for name, stock_layout, keeping_identities in (
        ("default", "stock_layout_registry", "default_registry"),
        ("none_leaf", "none_leaf_registry", "identity_none_leaf_registry"),
        ("tracing", "tracing_registry", "identity_tracing_registry"),
    )
}


def every_class():
  """Every class alive in this process, by walking `__subclasses__`."""
  seen, agenda = {object}, [object]
  while agenda:
    cls = agenda.pop()
    subclasses = (
        type.__subclasses__(cls)
        if isinstance(cls, type) and issubclass(cls, type)
        else cls.__subclasses__()
    )
    for sub in subclasses:
      if sub not in seen:
        seen.add(sub)
        agenda.append(sub)
  return seen


def disagreements(registry, twin, classes):
  """The classes that `registry` and `twin` flatten differently."""
  return sorted(
      (
          repr(cls)
          for cls in classes
          if registry.is_node(cls) != twin.is_node(cls)
          or registry.has_relative_identities(cls)
          != twin.has_relative_identities(cls)
      ),
  )


def live_instances(classes, per_class=3):
  """Up to `per_class` objects alive in this process of each of `classes`."""
  found = collections.defaultdict(list)
  for obj in gc.get_objects():
    if type(obj) in classes and len(found[type(obj)]) < per_class:
      found[type(obj)].append(obj)
  return found


def flattens_alike(registry, twin, tree):
  """Whether the stock-layout `registry` lays `tree` out as `twin` does with
  each shared node written out at each place (the same leaves, by identity,
  and the same structure), or both refuse it (an object that contains
  itself: RecursionError in stock's layout, as on stock, ValueError with
  identities)."""
  try:
    leaves, treedef = registry.flatten(tree)
  except Exception:  # pylint: disable=broad-except
    try:
      twin.flatten(tree)
    except Exception:  # pylint: disable=broad-except
      return True
    return False
  twin_leaves, twin_treedef = twin.flatten(tree)
  places = twin_treedef.unshared()
  expanded = twin_treedef.expand_leaves(places, twin_leaves)
  return (
      places == treedef
      and len(expanded) == len(leaves)
      and all(a is b for a, b in zip(expanded, leaves))
  )


class Model(eqx.Module):
  weight: jax.Array
  scale: float = eqx.field(static=True)


@tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
  a: object
  b: object


def library_trees():
  """Trees of the node types of jax and of the libraries imported here."""
  linear = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  return {
      "partial": tree_util.Partial(jnp.add, jnp.ones(2)),
      "ordered dict": collections.OrderedDict(b=1.0, a=jnp.zeros(1)),
      "default dict": collections.defaultdict(list, {"k": [1, 2]}),
      "dataclass": Pair(jnp.ones(1), (2, None)),
      "equinox module": Model(jnp.ones(3), 2.0),
      "nnx state": nnx.state(linear),
      "nnx graphdef and state": nnx.split(linear),
      "optax state": optax.adam(1e-3).init({"w": jnp.ones(2)}),
  }


class RegistryTwinsTest(jtu.JaxTestCase):

  def test_every_class_is_a_node_of_both_twins_or_of_neither(self):
    classes = every_class()
    node_classes = set()
    for name, (registry, twin) in TWINS.items():
      with self.subTest(registries=name):
        self.assertEqual(disagreements(registry, twin, classes), [])
        self.assertFalse(registry.keeps_relative_identities)
        self.assertTrue(twin.keeps_relative_identities)
      node_classes |= {c for c in classes if registry.is_node(c)}
    # The walk reached the registrations made outside register_pytree_node
    # and the libraries' own.
    self.assertIn(TransformedRef, node_classes)
    self.assertIn(Model, node_classes)
    self.assertIn(nnx.State, node_classes)

  def test_every_live_instance_of_a_node_class_flattens_alike_in_twins(self):
    library_trees()  # Objects of the libraries' node classes, alive here.
    classes = every_class()
    checked = set()
    for name, (registry, twin) in TWINS.items():
      nodes = {c for c in classes if registry.is_node(c) or twin.is_node(c)}
      for cls, instances in live_instances(nodes).items():
        for instance in instances:
          with self.subTest(registries=name, cls=repr(cls)):
            self.assertTrue(flattens_alike(registry, twin, instance))
          checked.add(cls)
    # Far more than the few trees built above: jax's, Flax's and Optax's
    # own objects of registered classes.
    self.assertGreater(len(checked), 20, sorted(map(repr, checked)))

  def test_a_registration_on_one_registry_object_reaches_its_twin(self):
    for name, (registry, twin) in TWINS.items():
      for target, other in ((registry, twin), (twin, registry)):
        with self.subTest(registries=name, on_twin=target is twin):

          class Late:

            def __init__(self, x):
              self.x = x

          target.register_node(
              Late, lambda n: ((n.x,), None), lambda _, xs: Late(*xs)
          )
          self.assertTrue(other.is_node(Late))
          self.assertEqual(other.flatten(Late(3))[0], [3])

  @parameterized.parameters(*library_trees())
  def test_an_unshared_tree_flattens_alike_in_both_twins(self, which):
    tree = library_trees()[which]
    for name, (registry, twin) in TWINS.items():
      with self.subTest(registries=name):
        leaves, treedef = registry.flatten(tree)
        twin_leaves, twin_treedef = twin.flatten(tree)
        self.assertEqual(len(leaves), len(twin_leaves))
        for leaf, twin_leaf in zip(leaves, twin_leaves):
          self.assertIs(leaf, twin_leaf)
        self.assertEqual(treedef, twin_treedef)
        self.assertEqual(repr(treedef), repr(twin_treedef))

  def test_a_view_of_a_ref_flattens_to_its_ref_in_both_tracing_twins(self):
    registry, twin = TWINS["tracing"]
    seen = {}

    @jax.jit
    def f():
      ref = jax.new_ref(jnp.zeros(4))
      view = ref.at[1:3]
      for which, r in (("stock layout", registry), ("identities", twin)):
        leaves, treedef = r.flatten(view)
        seen[which] = ([leaf is ref for leaf in leaves], treedef)
      return 0

    f()
    self.assertEqual(seen["stock layout"], seen["identities"])
    self.assertEqual(seen["identities"][0], [True])  # The viewed ref.


def _cond(f):
  return lambda *args: jax.lax.cond(True, f, f, *args)


def _shard_map(f):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  return jax.shard_map(f, mesh=mesh, in_specs=PartitionSpec(), out_specs=None)


def _read_through(transform):
  return lambda view: transform(lambda v: v[...])(view)


TRANSFORMS = {
    "jit": jax.jit,
    "checkpoint": jax.checkpoint,
    "cond": _cond,
    "shard_map": _shard_map,
}


class RefViewsThroughEntryPointsTest(jtu.JaxTestCase):
  """A `jax.Ref` view handed to an entry point, with nothing opted in:
  as on stock, the view reaches the function and writes through it land in
  the ref it views."""

  @parameterized.parameters(*TRANSFORMS)
  def test_a_write_through_a_view_lands_in_its_ref(self, name):
    transform = TRANSFORMS[name]

    def add_to(view):
      view[...] += jnp.arange(1.0, 5.0)

    @jax.jit
    def run():
      ref = jax.new_ref(jnp.zeros(7))
      transform(add_to)(ref.at[2:6])
      return ref[...]

    self.assertArraysEqual(
        run(), jnp.zeros(7).at[2:6].set(jnp.arange(1.0, 5.0))
    )

  @parameterized.parameters("jit", "checkpoint", "cond")
  def test_a_read_through_a_view_sees_its_slice(self, name):
    read = _read_through(TRANSFORMS[name])

    @jax.jit
    def run():
      ref = jax.new_ref(jnp.arange(8.0))
      return read(ref.at[3:7])

    self.assertArraysEqual(run(), jnp.arange(3.0, 7.0))

  def test_cond_writes_through_a_view_in_the_branch_taken(self):
    @functools.partial(jax.jit, static_argnums=0)
    def run(pred):
      ref = jax.new_ref(jnp.zeros(5))
      view = ref.at[1:4]

      def taken(v):
        v[...] += 2.0

      def other(v):
        v[...] -= 1.0

      jax.lax.cond(pred, taken, other, view)
      return ref[...]

    self.assertArraysEqual(run(True), jnp.zeros(5).at[1:4].set(2.0))
    self.assertArraysEqual(run(False), jnp.zeros(5).at[1:4].set(-1.0))


class ExportedNamesTest(absltest.TestCase):

  def test_every_public_name_of_jax_tree_util_names_its_home(self):
    # As jax's own package_structure_test: a name exported from
    # jax.tree_util says so in __module__ (the registry and treedef types
    # and the key classes, which come from jaxlib, aside).
    from_jaxlib = {
        "PyTreeDef",
        "default_registry",
        "KeyEntry",
        "KeyPath",
        "DictKey",
        "GetAttrKey",
        "SequenceKey",
        "FlattenedIndexKey",
    }
    wrong = {
        name: getattr(tree_util, name).__module__
        for name in dir(tree_util)
        if not name.startswith("_")
        and name not in from_jaxlib
        and hasattr(getattr(tree_util, name), "__module__")
        and getattr(tree_util, name).__module__ != "jax.tree_util"
    }
    self.assertEqual(wrong, {})
    self.assertIn("SplitTieError", dir(tree_util))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
