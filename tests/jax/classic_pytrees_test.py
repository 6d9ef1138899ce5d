"""Pytrees without opted-in nodes: transformations behave as they always did."""

import collections
import dataclasses
import functools


import jax

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import jax.numpy as jnp
from jax import lax
from jax import tree_util
from jax._src import test_util as jtu

Point = collections.namedtuple("Point", ["x", "y"])


@tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
  w: jax.Array
  b: jax.Array
  name: str = dataclasses.field(default="linear", metadata=dict(static=True))


@tree_util.register_pytree_node_class
class Box:

  def __init__(self, content):
    self.content = content

  def tree_flatten(self):
    return (self.content,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def _tree():
  return {
      "point": Point(jnp.arange(3.0), jnp.ones(3)),
      "layers": [
          Linear(jnp.eye(3), jnp.zeros(3)),
          Linear(2 * jnp.eye(3), jnp.ones(3), name="second"),
      ],
      "box": Box((jnp.float32(2.0), None)),
      "scalar": jnp.float32(0.5),
  }


def _apply(tree, x):
  for layer in tree["layers"]:
    x = x @ layer.w + layer.b
  p = tree["point"]
  return jnp.sum(x * p.x + p.y) * tree["box"].content[0] + tree["scalar"]


def _apply_np(tree, x):
  tree = jax.tree.map(np.asarray, tree)
  for layer in tree["layers"]:
    x = x @ layer.w + layer.b
  p = tree["point"]
  return np.sum(x * p.x + p.y) * tree["box"].content[0] + tree["scalar"]


class ClassicPytreesTest(jtu.JaxTestCase):

  def test_tree_ops(self):
    tree = _tree()
    leaves, treedef = jax.tree.flatten(tree)
    self.assertLen(leaves, 8)
    self.assertNotIn("#", repr(treedef))
    out = jax.tree.unflatten(treedef, leaves)
    self.assertEqual(out["layers"][1].name, "second")
    self.assertIsNone(out["box"].content[1])

  def test_repeated_objects_stay_independent(self):
    box = Box(jnp.ones(2))
    point = Point(jnp.ones(2), jnp.zeros(2))
    tree = [box, box, point, point]
    self.assertLen(jax.tree.leaves(tree), 6)
    for out in (
        jax.tree.map(lambda x: x, tree),
        jax.jit(lambda t: t)(tree),
        jax.jit(lambda t: t)(tree),
    ):
      self.assertIsNot(out[0], out[1])
      self.assertLen(jax.tree.leaves(out), 6)

  def test_jit(self):
    tree, x = _tree(), jnp.ones(3)
    traces = []

    @jax.jit
    def f(tree, x):
      traces.append(None)
      return _apply(tree, x), tree

    expected = _apply_np(tree, np.ones(3))
    for _ in range(3):
      value, out = f(tree, x)
      self.assertAllClose(value, expected)
      self.assertEqual(jax.tree.structure(out), jax.tree.structure(tree))
    self.assertLen(traces, 1)
    f(_tree(), x)
    self.assertLen(traces, 1)
    changed = _tree()
    changed["layers"][0].name = "renamed"  # static field: new trace
    f(changed, x)
    self.assertLen(traces, 2)

  def test_jit_static_args_kwargs_and_donation(self):
    @functools.partial(
        jax.jit, static_argnums=1, static_argnames="mode", donate_argnums=0
    )
    def f(x, n, *, mode, y):
      return (x * n if mode == "mul" else x + n) + y

    x = jnp.ones(3)
    self.assertAllClose(f(x, 2, mode="mul", y=1.0), jnp.full(3, 3.0))
    self.assertTrue(x.is_deleted())
    x = jnp.ones(3)
    self.assertAllClose(f(x, 2, mode="add", y=1.0), jnp.full(3, 4.0))
    self.assertEqual(f._cache_size(), 2)

  def test_jit_cache_tells_positional_from_keyword_args(self):
    f = jax.jit(lambda *args, **kwargs: (args, kwargs))
    x = jnp.ones(2)
    for _ in range(2):  # traced, then cached
      args, kwargs = f((x,), {"a": x})
      self.assertEqual(
          jax.tree.structure((args, kwargs)),
          jax.tree.structure((((x,), {"a": x}), {})),
      )
      args, kwargs = f(x, a=x)
      self.assertEqual(
          jax.tree.structure((args, kwargs)),
          jax.tree.structure(((x,), {"a": x})),
      )
    self.assertEqual(f._cache_size(), 2)

  def test_jit_prng_keys(self):
    f = jax.jit(lambda k: jax.random.split(k))
    key = jax.random.key(0)
    first = f(key)
    self.assertArraysEqual(
        jax.random.key_data(first), jax.random.key_data(f(key))
    )
    self.assertEqual(first.shape, (2,))

  def test_grad(self):
    tree, x = _tree(), jnp.ones(3)
    g = jax.grad(_apply)(tree, x)
    self.assertEqual(jax.tree.structure(g), jax.tree.structure(tree))
    eps = 1e-3
    w = tree["layers"][0].w
    bumped = _tree()
    bumped["layers"][0].w = w.at[0, 0].add(eps)
    numeric = (_apply(bumped, x) - _apply(tree, x)) / eps
    self.assertAllClose(g["layers"][0].w[0, 0], numeric, atol=1e-1, rtol=1e-2)

  def test_vjp_and_jacrev_of_dataclass_outputs(self):
    # jax.vjp records the output treedef from one registry and checks the
    # cotangent's from another: dataclass nodes compare equal across them.
    f = lambda x: Linear(x * 2, x * 3)
    _, pullback = jax.vjp(f, jnp.float32(1.0))
    (ct,) = pullback(Linear(jnp.float32(1.0), jnp.float32(1.0)))
    self.assertAllClose(ct, 5.0)
    jac = jax.jacrev(f)(jnp.float32(1.0))
    self.assertAllClose(jac.w, 2.0)
    self.assertAllClose(jac.b, 3.0)

  def test_vmap(self):
    tree = _tree()
    xs = jnp.arange(12.0).reshape(4, 3)
    out = jax.vmap(_apply, in_axes=(None, 0))(tree, xs)
    expected = np.stack([_apply_np(tree, np.asarray(x)) for x in xs])
    self.assertAllClose(out, expected)
    with self.assertRaisesRegex(ValueError, "vmap in_axes"):
      jax.vmap(_apply, in_axes=((0, 0), 0))(tree, xs)

  @parameterized.parameters(False, True)
  def test_scan(self, jit):
    def body(carry, x):
      count, total = carry
      return (count + 1, total + x), total

    scan = lambda xs: lax.scan(body, (0, jnp.float32(0.0)), xs)
    if jit:
      scan = jax.jit(scan)
    (count, total), partials = scan(jnp.arange(4.0))
    self.assertEqual(count, 4)
    self.assertEqual(total, 6.0)
    self.assertAllClose(partials, jnp.array([0.0, 0.0, 1.0, 3.0]))
    with self.assertRaisesRegex(TypeError, "pytree structure"):
      lax.scan(lambda c, x: ((c, c), x), jnp.float32(0.0), jnp.arange(2.0))

  def test_while_cond_fori(self):
    p = Point(jnp.float32(0.0), jnp.float32(1.0))
    out = lax.while_loop(lambda p: p.x < 5, lambda p: Point(p.x + p.y, p.y), p)
    self.assertEqual(out.x, 5.0)
    out = lax.fori_loop(0, 3, lambda i, p: Point(p.x + i, p.y), p)
    self.assertEqual(out.x, 3.0)
    out = lax.cond(False, lambda p: p, lambda p: Point(p.y, p.x), p)
    self.assertEqual(out, Point(1.0, 0.0))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
