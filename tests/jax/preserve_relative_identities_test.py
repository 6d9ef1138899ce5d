"""jax.tree_util.preserve_relative_identities(cls): opting in classes that
are registered already (as libraries register theirs), with their subclasses,
and the query has_relative_identities.

Opting in cannot be undone, so every test makes its own class hierarchy.
"""

import ast
import gc
import pickle
import textwrap
import warnings

from absl.testing import absltest

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util
from jax._src import test_util as jtu
from jax._src import tree_util as tree_util_internal

import stock_reference


def make_hierarchy():
  """A library-like hierarchy: a base class that is no pytree node, and
  subclasses that register themselves when defined (like an
  ``__init_subclass__`` hook does), without the flag."""

  class Module:

    def __init_subclass__(cls, **kwargs):
      super().__init_subclass__(**kwargs)
      tree_util.register_pytree_with_keys(
          cls,
          lambda m: (
              tuple(
                  (tree_util.GetAttrKey(k), v)
                  for k, v in sorted(vars(m).items())
              ),
              tuple(sorted(vars(m))),
          ),
          lambda names, values: cls._build(names, values),
      )

    @classmethod
    def _build(cls, names, values):
      obj = object.__new__(cls)
      for name, value in zip(names, values):
        setattr(obj, name, value)
      return obj

  class Linear(Module):

    def __init__(self, w):
      self.w = w

  class Model(Module):

    def __init__(self, first, second):
      self.first = first
      self.second = second

  return Module, Linear, Model


class PreserveRelativeIdentitiesTest(jtu.JaxTestCase):

  def test_opts_in_registered_subclasses_and_later_ones(self):
    Module, Linear, Model = make_hierarchy()
    layer = Linear(jnp.ones(2))
    self.assertLen(jax.tree.leaves(Model(layer, layer)), 2)
    self.assertFalse(tree_util.has_relative_identities(Linear))

    tree_util.preserve_relative_identities(Module)

    for cls in (Module, Linear, Model):
      self.assertTrue(tree_util.has_relative_identities(cls))
    model = Model(layer, layer)
    self.assertLen(jax.tree.leaves(model), 1)
    out = jax.tree.map(lambda w: w * 2, model)
    self.assertIs(out.first, out.second)

    class Conv(Module):  # registered after the call

      def __init__(self, k):
        self.k = k

    self.assertTrue(tree_util.has_relative_identities(Conv))
    conv = Conv(jnp.zeros(3))
    self.assertLen(jax.tree.leaves([conv, conv]), 1)

  def test_base_class_itself_is_not_registered(self):
    Module, _, _ = make_hierarchy()
    tree_util.preserve_relative_identities(Module)
    module = Module()
    self.assertFalse(tree_util.default_registry.is_node(Module))
    self.assertEqual(jax.tree.leaves([module, module]), [module, module])

  def test_each_registry_name_means_one_registry(self):
    # The public registry is jax._src.tree_util's of the same name, and every
    # registry pickles by reference to the one name it is known by.
    self.assertIs(
        tree_util.default_registry, tree_util_internal.default_registry
    )
    keeps = {
        "default_registry": True,
        "stock_layout_registry": False,
        "identity_none_leaf_registry": True,
        "none_leaf_registry": False,
        "identity_tracing_registry": True,
        "tracing_registry": False,
    }
    for name, keeps_identities in keeps.items():
      registry = getattr(tree_util_internal, name)
      self.assertEqual(registry.__name__, name)
      self.assertIs(pickle.loads(pickle.dumps(registry)), registry)
      self.assertEqual(registry.keeps_relative_identities, keeps_identities)

  def test_every_registry_of_ours_and_not_the_dispatch_one(self):
    Module, Linear, _ = make_hierarchy()
    tree_util.preserve_relative_identities(Module)
    layer = Linear(1.0)
    for registry in tree_util_internal._identity_registries:
      # Every registry of ours records the opt-in; those that keep relative
      # identities (the entry points') flatten the layer once, the others
      # (JAX's own, in stock's layout) at each place.
      self.assertTrue(registry.has_relative_identities(Linear))
      self.assertEqual(
          registry.flatten([layer, layer])[1].has_shared_nodes,
          registry.keeps_relative_identities,
      )
    self.assertTrue(
        tree_util_internal.default_registry.keeps_relative_identities
    )
    self.assertFalse(
        tree_util_internal.stock_layout_registry.keeps_relative_identities
    )
    self.assertNotIn(
        tree_util_internal.dispatch_registry,
        tree_util_internal._identity_registries,
    )
    leaves, _ = tree_util_internal.dispatch_registry.flatten([layer, layer])
    self.assertEqual(leaves, [1.0, 1.0])

  def test_jit_grad_vmap_after_the_call(self):
    Module, Linear, Model = make_hierarchy()
    tree_util.preserve_relative_identities(Module)
    layer = Linear(jnp.arange(3.0))
    model = Model(layer, layer)

    out = jax.jit(lambda m: m)(model)
    self.assertIs(out.first, out.second)

    grads = jax.grad(lambda m: jnp.sum(m.first.w * 2 + m.second.w))(model)
    self.assertIs(grads.first, grads.second)
    self.assertAllClose(grads.first.w, np.full(3, 3.0))

    out = jax.vmap(lambda m: m)(
        Model(Linear(jnp.ones((2, 3))), Linear(jnp.ones((2, 3))))
    )
    self.assertIsNot(out.first, out.second)
    shared_in = Linear(jnp.ones((2, 3)))
    out = jax.vmap(lambda m: m)(Model(shared_in, shared_in))
    self.assertIs(out.first, out.second)

  def test_treedefs_and_jit_caches_made_before_stay_valid(self):
    Module, Linear, Model = make_hierarchy()
    layer = Linear(jnp.ones(2))
    model = Model(layer, layer)
    leaves, before = jax.tree.flatten(model)
    traces = []

    @jax.jit
    def f(m):
      traces.append(None)
      return m.first.w + m.second.w

    self.assertAllClose(f(model), np.full(2, 2.0))
    self.assertAllClose(f(model), np.full(2, 2.0))
    self.assertLen(traces, 1)

    # Tracing f rebuilt the model with a Linear at each place: the opt-in
    # says a tree that came out of such a call keeps them apart.
    with self.assertWarnsRegex(
        UserWarning, r"after JAX rebuilt trees that hold Linear at several"
    ):
      tree_util.preserve_relative_identities(Module)

    # The old treedef still describes two separate layers.
    rebuilt = jax.tree.unflatten(before, leaves)
    self.assertIsNot(rebuilt.first, rebuilt.second)
    self.assertEqual(before, jax.tree.structure(Model(Linear(1), Linear(2))))
    # A tree without sharing still hits the cache made before the call.
    self.assertAllClose(
        f(Model(Linear(jnp.ones(2)), Linear(jnp.ones(2)))), np.full(2, 2.0)
    )
    self.assertLen(traces, 1)
    # The shared tree has a new structure now: one new trace.
    self.assertAllClose(f(model), np.full(2, 2.0))
    self.assertLen(traces, 2)
    out = jax.jit(lambda m: m)(model)
    self.assertIs(out.first, out.second)

  def test_an_opt_in_after_a_transformation_rebuilt_instances_says_so(self):
    Module, Linear, Model = make_hierarchy()
    layer = Linear(jnp.ones(2))
    out = jax.jit(lambda m: m)(Model(layer, layer))
    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always")
      tree_util.preserve_relative_identities(Module)
    (told,) = told
    # A category of its own, a UserWarning, filterable as the others.
    self.assertIs(told.category, tree_util.LateOptInWarning)
    self.assertTrue(issubclass(told.category, UserWarning))
    self.assertEqual(told.filename, __file__)  # The line that opted in.
    message = str(told.message)
    # The base named as TiedByOptInWarning names it: by its module.
    self.assertIn(
        f"preserve_relative_identities({Module.__module__}."
        f"{Module.__qualname__}) comes after",
        message,
    )
    self.assertIn("hold Linear at several places", message)
    self.assertIn("Opt the class in before making or transforming", message)
    self.assertIsNot(out.first, out.second)  # As said: kept apart.
    again = jax.jit(lambda m: m)(Model(layer, layer))
    self.assertIs(again.first, again.second)  # Made again: one object.

  def test_an_opt_in_before_any_tree_holds_two_instances_is_silent(self):
    # Instances flattened, or rebuilt one per tree, or classes opted in
    # before anything ran: nothing was kept apart, nothing is said.
    for build in (
        lambda Linear, Model: jax.tree.leaves(Model(Linear(1.0), Linear(1.0))),
        lambda Linear, Model: jax.jit(lambda l: l)(Linear(jnp.ones(2))),
        lambda Linear, Model: None,
    ):
      Module, Linear, Model = make_hierarchy()
      build(Linear, Model)
      with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree_util.preserve_relative_identities(Module)

  def test_libraries_opted_in_after_import_or_after_a_transformation(self):
    # In a fresh process, as a user's script: opting in Equinox's and Flax
    # NNX's base classes right after importing them (and Optax) is silent,
    # though the libraries build their own wrappers at import; opting in
    # after eqx.filter_jit returned a model that held one layer twice
    # names the layer's class, and the model stays two objects.
    script = textwrap.dedent("""
        import warnings
        import jax  # A TPU runtime may warn here, of its own set-up.
        warnings.simplefilter("error")
        import equinox as eqx
        import optax
        from flax import nnx
        jax.tree_util.preserve_relative_identities(nnx.Pytree)
        jax.tree_util.preserve_relative_identities(nnx.Variable)

        class Pair(eqx.Module):
          a: eqx.nn.Linear
          b: eqx.nn.Linear

        layer = eqx.nn.Linear(2, 2, key=jax.random.key(0))
        model = eqx.filter_jit(lambda m: m)(Pair(layer, layer))
        warnings.simplefilter("default")
        with warnings.catch_warnings(record=True) as told:
          jax.tree_util.preserve_relative_identities(eqx.Module)
        print(repr(([str(w.message) for w in told], model.a is model.b)))
    """)
    (told,), tied = ast.literal_eval(stock_reference.run_child("-c", script))
    self.assertIn(
        "preserve_relative_identities(equinox.Module) comes after", told
    )
    self.assertIn("hold Linear at several places", told)
    self.assertFalse(tied)

  def test_query_of_builtins_and_plain_classes(self):
    for cls in (tuple, list, dict, type(None), int, object):
      self.assertFalse(tree_util.has_relative_identities(cls))

  def test_bad_arguments(self):
    _, Linear, _ = make_hierarchy()
    for bad in (Linear(1), "Module", None):
      with self.assertRaisesRegex(TypeError, "expects a class"):
        tree_util.preserve_relative_identities(bad)
      with self.assertRaisesRegex(TypeError, "expects a class"):
        tree_util.has_relative_identities(bad)
    for builtin in (tuple, list, dict, type(None)):
      with self.assertRaisesRegex(ValueError, "builtin pytree node"):
        tree_util.preserve_relative_identities(builtin)

  def test_types_that_are_never_nodes_are_refused(self):
    import collections

    # Leaves: opting their type in would do nothing, and said nothing.
    for leaf_type in (jax.Array, np.ndarray, np.float32, int, float):
      with self.assertRaisesRegex(ValueError, "never pytree nodes"):
        tree_util.preserve_relative_identities(leaf_type)
      self.assertFalse(tree_util.has_relative_identities(leaf_type))
    # object would opt in every class registered from then on.
    with self.assertRaisesRegex(ValueError, "object"):
      tree_util.preserve_relative_identities(object)
    Point = collections.namedtuple("Point", "x y")
    with self.assertRaisesRegex(ValueError, "builtin pytree node"):
      tree_util.preserve_relative_identities(Point)
    self.assertFalse(tree_util.has_relative_identities(Point))

  def test_same_api_in_both_modules(self):
    self.assertIs(
        tree_util.preserve_relative_identities,
        tree_util_internal.preserve_relative_identities,
    )
    self.assertIs(
        tree_util.has_relative_identities,
        tree_util_internal.has_relative_identities,
    )

  def test_registries_keep_opted_in_classes_for_gc(self):
    Module, _, _ = make_hierarchy()
    tree_util.preserve_relative_identities(Module)
    self.assertIn(Module, gc.get_referents(tree_util.default_registry))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
