"""jax.jit with relative identities: slow path, C++ fast path, and caching."""

import functools
import inspect


import jax

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import jax.numpy as jnp
from jax import tree_util
from jax._src import test_util as jtu
from jax.sharding import NamedSharding, PartitionSpec as P

from shared_nodes import Child, Parent, Param


@tree_util.register_pytree_node_class(preserve_relative_identities=True)
class Module:
  """A module whose method is jitted (``self`` is a dynamic argument)."""

  def __init__(self, w, b):
    self.w = w
    self.b = b

  def tree_flatten(self):
    return (self.w, self.b), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)

  @jax.jit
  def __call__(self, x):
    assert self.w is self.b
    return self.w.value * x + self.b.value


def shared_parent(x=1.0):
  child = Child(jnp.asarray(x, jnp.float32))
  return Parent(child, child), child


def unshared_parent(x=1.0):
  return Parent(
      Child(jnp.asarray(x, jnp.float32)), Child(jnp.asarray(x, jnp.float32))
  )


class JitSharingTest(jtu.JaxTestCase):

  def test_spec_example_traced_and_cached_calls(self):
    seen = []

    @jax.jit
    def f(parent):
      seen.append(parent.left is parent.right)
      return parent

    parent, child = shared_parent()
    with (
        jtu.count_jit_tracing_cache_miss() as traces,
        jtu.count_pjit_cpp_cache_miss() as slow_calls,
    ):
      for _ in range(4):
        out = f(parent)
        self.assertIs(out.left, out.right)
        self.assertIsNot(out, parent)
        self.assertIsNot(out.left, child)
        self.assertArraysEqual(out.left.x, child.x)
    self.assertEqual(seen, [True])
    self.assertEqual(traces(), 1)
    self.assertEqual(slow_calls(), 1)  # the other three took the fast path
    self.assertEqual(f._cache_size(), 1)

  def test_no_retrace_for_same_sharing_one_for_new(self):
    traces = []

    @jax.jit
    def f(p):
      traces.append(p.left is p.right)
      return p.left.x + 2 * p.right.x

    self.assertEqual(f(shared_parent(1.0)[0]), 3.0)
    self.assertEqual(f(shared_parent(2.0)[0]), 6.0)  # new objects, same sharing
    self.assertEqual(traces, [True])
    self.assertEqual(f(unshared_parent(1.0)), 3.0)  # new sharing: one retrace
    self.assertEqual(traces, [True, False])
    self.assertEqual(f(shared_parent(3.0)[0]), 9.0)
    self.assertEqual(f(unshared_parent(3.0)), 9.0)
    self.assertEqual(traces, [True, False])
    self.assertEqual(f._cache_size(), 2)

  def test_unshared_inputs_shared_outputs(self):
    @jax.jit
    def f(x):
      child = Child(x * 2)
      return Parent(child, child), child

    for _ in range(3):
      out, child = f(jnp.float32(1.0))
      self.assertIs(out.left, out.right)
      self.assertIs(out.left, child)
      self.assertEqual(child.x, 2.0)

  def test_sharing_across_args_and_kwargs(self):
    seen = []

    @jax.jit
    def f(a, b, *, c):
      seen.append((a is b, b is c))
      return (a, c)

    child = Child(jnp.arange(3.0))
    for _ in range(3):
      out_a, out_c = f(child, child, c=child)
      self.assertIs(out_a, out_c)
    self.assertEqual(seen, [(True, True)])
    traced = f.trace(child, child, c=child)
    self.assertLen(traced.jaxpr.in_avals, 1)  # one parameter for the one leaf
    out_a, out_c = f(child, Child(child.x), c=child)
    self.assertIs(out_a, out_c)
    self.assertEqual(seen[-1], (False, False))

  def test_fast_path_gives_slow_path_results(self):
    @jax.jit
    def f(tree):
      p, q = tree["p"], tree["q"]
      return {"sum": p.left.x + q.value, "p": p, "q": [q, q], "r": p.right}

    parent, _ = shared_parent(2.0)
    q = Param(jnp.ones(2))
    first = f({"p": parent, "q": q})
    second = f({"p": parent, "q": q})
    for out in (first, second):
      self.assertIs(out["p"].left, out["p"].right)
      self.assertIs(out["r"], out["p"].left)
      self.assertIs(out["q"][0], out["q"][1])
      self.assertArraysEqual(out["sum"], jnp.full(2, 3.0))
    self.assertEqual(jax.tree.structure(first), jax.tree.structure(second))

  def test_static_args_with_sharing(self):
    traces = []

    @functools.partial(jax.jit, static_argnums=(1,), static_argnames=("mode",))
    def f(p, scale, mode="add"):
      traces.append((scale, mode))
      assert p.left is p.right
      if mode == "add":
        return Parent(p.left, Child(p.left.x + scale))
      return p

    parent, _ = shared_parent(1.0)
    out = f(parent, 2)
    self.assertEqual(out.right.x, 3.0)
    f(parent, 2)
    f(shared_parent(5.0)[0], 2)
    self.assertLen(traces, 1)
    f(parent, 3)
    out = f(parent, 3, mode="keep")
    self.assertIs(out.left, out.right)
    out = f(parent, 3, mode="keep")
    self.assertIs(out.left, out.right)
    self.assertLen(traces, 3)
    f(parent, 2.0)  # static args are told apart by type, like stock jax.jit
    self.assertLen(traces, 4)
    with self.assertRaisesRegex(ValueError, "Non-hashable static arguments"):
      f(parent, [2])
    with self.assertRaisesRegex(ValueError, "Non-hashable static arguments"):
      f.lower(parent, [2])

  def test_static_arg_between_two_uses_of_a_shared_node(self):
    # Removing the static argument from the arguments' treedef must keep the
    # reference of the second use aimed at the first (issue: a crash).
    def f(a, n, b):
      assert a is b
      return a.value * n + b.value

    p = Param(jnp.ones(3))
    expected = jnp.full(3, 3.0)
    by_argnums = jax.jit(f, static_argnums=1)
    for _ in range(2):  # traced, then the C++ fast path
      self.assertArraysEqual(by_argnums(p, 2, p), expected)
    self.assertArraysEqual(jax.jit(f, static_argnums=-2)(p, 2, p), expected)
    # Keyword arguments are sorted: "n" lands between "a" and "b".
    by_argnames = jax.jit(f, static_argnames="n")
    self.assertArraysEqual(by_argnames(a=p, n=2, b=p), expected)
    self.assertArraysEqual(by_argnames(p, n=2, b=p), expected)
    compiled = by_argnums.lower(p, 2, p).compile()
    self.assertArraysEqual(compiled(p, p), expected)
    self.assertLen(by_argnums.trace(p, 2, p).jaxpr.in_avals, 1)
    donating = jax.jit(f, static_argnums=1, donate_argnums=(0, 2))
    q = Param(jnp.ones(3))
    self.assertArraysEqual(donating(q, 2, q), expected)
    self.assertTrue(q.value.is_deleted())

  def test_lower_trace_eval_shape(self):
    def f(p):
      return Parent(p.right, p.left), p.left.x * 2

    parent, _ = shared_parent(3.0)
    jf = jax.jit(f)
    traced = jf.trace(parent)
    self.assertLen(traced.jaxpr.in_avals, 1)
    # The tree of avals is laid out as args_info and in_tree: tied.
    (tied,), _ = traced.args_info
    self.assertIs(tied.left, tied.right)
    (avals,), _ = traced.in_avals
    self.assertIs(avals.left, avals.right)
    self.assertEqual(jax.tree.structure(traced.in_avals), traced.in_tree)
    shapes = jf.eval_shape(parent)
    self.assertIs(shapes[0].left, shapes[0].right)
    self.assertEqual(shapes[1].shape, ())
    shapes = jax.eval_shape(jf, parent)
    self.assertIs(shapes[0].left, shapes[0].right)
    compiled = jf.lower(parent).compile()
    for _ in range(3):  # AOT calls: slow path, then the C++ fast path
      out, doubled = compiled(parent)
      self.assertIs(out.left, out.right)
      self.assertEqual(doubled, 6.0)
    with self.assertRaisesRegex(TypeError, "sharing"):
      compiled(unshared_parent(3.0))

  def test_disable_jit_calls_with_the_original_objects(self):
    parent, _ = shared_parent()

    @jax.jit
    def f(p, *, q):
      return p is parent and q is parent

    with jax.disable_jit():
      self.assertTrue(f(parent, q=parent))

  def test_jitted_method_and_public_surface(self):
    p = Param(jnp.float32(2.0))
    m = Module(p, p)
    self.assertEqual(m(jnp.float32(3.0)), 8.0)
    self.assertEqual(m(jnp.float32(4.0)), 10.0)

    def g(x, y=1):
      """Docstring of g."""
      return x + y

    jg = jax.jit(g)
    self.assertIs(jg.__wrapped__, g)
    self.assertEqual(jg.__name__, "g")
    self.assertEqual(jg.__doc__, "Docstring of g.")
    self.assertEqual(inspect.signature(jg), inspect.signature(g))
    self.assertEqual(jg(1.0), 2.0)
    self.assertEqual(jg._cache_size(), 1)
    jg.clear_cache()
    self.assertEqual(jg._cache_size(), 0)
    with jtu.count_jit_tracing_cache_miss() as traces:
      jg(1.0)
    self.assertEqual(traces(), 1)
    self.assertIsInstance(jax.jit(g).lower(1.0).as_text(), str)  # temporary

  def test_jit_of_jit_and_under_transformations(self):
    parent, _ = shared_parent(2.0)
    inner = jax.jit(lambda p: Parent(p.right, p.left))
    outer = jax.jit(lambda p: inner(p))
    out = outer(parent)
    self.assertIs(out.left, out.right)
    g = jax.grad(lambda p: inner(p).left.x * inner(p).right.x)(parent)
    self.assertIs(g.left, g.right)
    self.assertEqual(g.left.x, 4.0)  # d(x * x)/dx: both uses are one leaf
    out = jax.vmap(inner)(
        Parent(Child(jnp.arange(3.0)), Child(jnp.arange(3.0)))
    )
    self.assertIsNot(out.left, out.right)

  def test_prng_keys_in_shared_nodes(self):
    key = Param(jax.random.key(0))

    @jax.jit
    def f(a, b):
      assert a is b
      new = Param(jax.random.split(a.value)[0])
      return new, new

    for _ in range(3):
      x, y = f(key, key)
      self.assertIs(x, y)
      self.assertTrue(jax.dtypes.issubdtype(x.value.dtype, jax.dtypes.prng_key))

  def test_debug_nans_on_cached_calls(self):
    f = jax.jit(lambda p: p.left.x / p.right.x)
    one, _ = shared_parent(1.0)
    zero, _ = shared_parent(0.0)
    self.assertTrue(np.isnan(f(zero)))
    with jax.debug_nans(True):
      self.assertEqual(f(one), 1.0)  # fills the fast path's cache
      with self.assertRaises(FloatingPointError):
        f(zero)  # the fast path's NaN check (the C++ post hook)

  def test_donate_shared_args(self):
    f = jax.jit(lambda a, b: a.value + b.value, donate_argnums=(0, 1))
    p = Param(jnp.ones(3))
    self.assertArraysEqual(f(p, p), jnp.full(3, 2.0))
    self.assertTrue(p.value.is_deleted())

    g = jax.jit(lambda a, b: a.value + b.value, donate_argnums=0)
    p = Param(jnp.ones(3))
    with self.assertRaisesRegex(ValueError, "donate"):
      g(p, p)
    self.assertFalse(p.value.is_deleted())
    q = Param(jnp.ones(3))
    g(q, p)
    self.assertTrue(q.value.is_deleted())
    self.assertFalse(p.value.is_deleted())

    h = jax.jit(lambda a, *, b: a.value + b.value, donate_argnames=("a", "b"))
    p = Param(jnp.ones(3))
    h(p, b=p)
    self.assertTrue(p.value.is_deleted())

  def test_shardings_on_eight_devices(self):
    if jax.device_count() < 8:
      self.skipTest(
          "needs 8 devices (XLA_FLAGS="
          "--xla_force_host_platform_device_count=8)"
      )
    mesh = jax.make_mesh((8,), ("x",))
    split = NamedSharding(mesh, P("x"))
    replicated = NamedSharding(mesh, P())
    p = Param(jnp.arange(16.0))
    model = Parent(p, p)

    f = jax.jit(
        lambda m: Parent(m.right, m.left),
        in_shardings=(Parent(Param(split), Param(split)),),
        out_shardings=split,
    )
    self.assertLen(f.trace(model).jaxpr.in_avals, 1)
    for _ in range(3):
      out = f(model)
      self.assertIs(out.left, out.right)
      self.assertEqual(out.left.value.sharding, split)
      self.assertLen(out.left.value.addressable_shards, 8)
      self.assertLen(jax.tree.leaves(out), 1)

    g = jax.jit(lambda a, b: (a, b), in_shardings=(split, split))
    a, b = g(p, p)
    self.assertIs(a, b)
    with self.assertRaisesRegex(ValueError, "in_shardings"):
      jax.jit(lambda a, b: a, in_shardings=(split, replicated))(p, p)
    with self.assertRaisesRegex(ValueError, "out_shardings"):
      jax.jit(
          lambda a: Parent(a, a),
          out_shardings=Parent(Param(split), Param(replicated)),
      )(p)

  def test_shard_map_over_shared_args(self):
    if jax.device_count() < 8:
      self.skipTest("needs 8 devices")
    mesh = jax.make_mesh((8,), ("x",))
    p = Param(jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("x"))))
    f = jax.shard_map(
        lambda a, b: (a, b), mesh=mesh, in_specs=P("x"), out_specs=P("x")
    )
    a, b = f(p, p)
    self.assertIs(a, b)
    self.assertEqual(a.value.shape, (16,))
    g = jax.shard_map(
        lambda a, b: (a, b), mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")
    )
    with self.assertRaisesRegex(ValueError, "shared pytree node"):
      g(p, p)

  def test_device_put_dag(self):
    p = Param(jnp.arange(8.0))
    model = Parent(p, p)
    out = jax.device_put(model)
    self.assertIs(out.left, out.right)
    self.assertLen(jax.tree.leaves(out), 1)
    if jax.device_count() >= 8:
      mesh = jax.make_mesh((8,), ("x",))
      split = NamedSharding(mesh, P("x"))
      out = jax.device_put(model, split)
      self.assertIs(out.left, out.right)
      self.assertEqual(out.left.value.sharding, split)
      out = jax.device_put(model, Parent(Param(split), Param(split)))
      self.assertIs(out.left, out.right)
      with self.assertRaisesRegex(ValueError, "more than once"):
        jax.device_put(
            model, Parent(Param(split), Param(NamedSharding(mesh, P())))
        )

  @parameterized.parameters(1, 2, 10)
  def test_many_references_one_leaf(self, n):
    p = Param(jnp.float32(1.0))
    layers = [p] * n

    @jax.jit
    def f(layers):
      return sum(layer.value for layer in layers), layers

    total, out = f(layers)
    self.assertEqual(total, float(n))
    self.assertTrue(all(layer is out[0] for layer in out))
    self.assertLen(f.trace(layers).jaxpr.in_avals, 1)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
