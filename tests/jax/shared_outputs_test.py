"""Outputs that share nodes: custom rules, vjp/transpose, callbacks, export.

A shared node in a function's output is one output (one leaf set, one
cotangent). Rules written for stock JAX see each of its occurrences as an
output of its own; they must still count its cotangent exactly once. A
custom_jvp or custom_vjp function that returns one object at two places
returns them apart (its rules read outputs per position), and says so.
"""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax._src import test_util as jtu

from shared_nodes import Param


@jax.custom_vjp
def dup(a):
  return (a, a)


def _dup_fwd(a):
  return (a, a), None


def _dup_bwd(_, g):
  # Correct in stock JAX, where the two outputs are two objects.
  return (Param(g[0].value + g[1].value),)


dup.defvjp(_dup_fwd, _dup_bwd)


@jax.custom_jvp
def dup_jvp(a):
  return (a, a)


@dup_jvp.defjvp
def _dup_jvp_rule(primals, tangents):
  (a,), (t,) = primals, tangents
  return (a, a), (t, t)


_TOLD_APART = (
    r"jax.custom_(jvp|vjp) split a tie: the Param at result\[0\] "
    r"and result\[1\] is one object"
)


class SharedOutputsTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.w = Param(jnp.array([1.0, 2.0]))

  def test_custom_vjp_counts_a_shared_output_once(self):
    with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, _TOLD_APART):
      one = lambda w: jnp.sum(dup(w)[0].value * 3.0)
      plain = lambda w: jnp.sum((lambda a: (a, a))(w)[0].value * 3.0)
      self.assertAllClose(jax.grad(one)(self.w).value, jnp.array([3.0, 3.0]))
      self.assertAllClose(jax.grad(plain)(self.w).value, jnp.array([3.0, 3.0]))
      both = lambda w: (
          jnp.sum(dup(w)[0].value * 3.0) + jnp.sum(dup(w)[1].value * 5.0)
      )
      self.assertAllClose(jax.grad(both)(self.w).value, jnp.array([8.0, 8.0]))

  def test_custom_vjp_bwd_sees_each_output_position_as_stock_does(self):
    with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, _TOLD_APART):
      seen = []

      @jax.custom_vjp
      def f(a):
        return (a, a)

      def bwd(_, g):
        seen.append(g)
        return (Param(g[0].value + g[1].value),)

      f.defvjp(lambda a: ((a, a), None), bwd)
      jax.grad(lambda w: jnp.sum(f(w)[1].value * 2.0))(self.w)
      (g,) = seen
      # The rule sees its two output positions apart, and the cotangent of
      # each (only the second is used), as on stock.
      self.assertIsNot(g[0], g[1])
      self.assertAllClose(g[0].value, jnp.zeros(2))
      self.assertAllClose(g[1].value, jnp.array([2.0, 2.0]))

  def test_custom_jvp_of_a_shared_output(self):
    with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, _TOLD_APART):
      out, tangent = jax.jvp(
          lambda w: dup_jvp(w)[0], (self.w,), (Param(jnp.ones(2)),)
      )
      self.assertAllClose(tangent.value, jnp.ones(2))
      grad = jax.grad(lambda w: jnp.sum(dup_jvp(w)[0].value * 3.0))(self.w)
      self.assertAllClose(grad.value, jnp.array([3.0, 3.0]))

  def test_vjp_and_linear_transpose_of_a_shared_output(self):
    g = Param(jnp.array([1.0, 1.0]))
    _, vjp = jax.vjp(lambda w: (w, w), self.w)
    (ct,) = vjp((g, g))
    self.assertAllClose(ct.value, g.value)
    (ct,) = jax.linear_transpose(lambda w: (w, w), self.w)((g, g))
    self.assertAllClose(ct.value, g.value)

  def test_pure_callback_result_must_share_as_its_spec(self):
    spec = Param(jax.ShapeDtypeStruct((3,), jnp.float32))

    def unshared(x):
      return Param(np.asarray(x)), Param(np.asarray(x))

    def apart(x):
      return Param(np.asarray(x)), Param(np.asarray(x) + 1)

    def shared(x):
      n = Param(np.asarray(x))
      return n, n

    # Waited for: an accelerator raises the callback's error then.
    call = lambda cb: jax.block_until_ready(
        jax.jit(lambda x: jax.pure_callback(cb, (spec, spec), x))(
            jnp.arange(3.0)
        )
    )
    a, b = call(shared)
    self.assertIs(a, b)
    # Two objects with equal leaves: nothing tells the places apart.
    a, b = call(unshared)
    self.assertIs(a, b)
    with self.assertRaisesRegex(Exception, "must share the nodes"):
      call(apart)

  def test_export_serialization_refuses_sharing(self):
    p = Param(jnp.arange(3.0))
    exp = jax.export.export(jax.jit(lambda a, b: a.value + b.value))(p, p)
    self.assertAllClose(exp.call(p, p), 2 * p.value)
    with self.assertRaisesRegex(ValueError, "in_tree has shared pytree nodes"):
      exp.serialize()

  def test_tree_transpose_with_a_shared_inner_treedef(self):
    p, q = Param(jnp.ones(2)), Param(jnp.zeros(2))
    outer = jax.tree.structure((0, 0))
    inner = jax.tree.structure((p, p))
    # The inner treedef's shared node holds the outer structure in its leaf.
    a, b = jax.tree.transpose(outer, inner, ((p, p), (q, q)))
    self.assertIs(a, b)
    self.assertAllClose(a.value[0], p.value)
    self.assertAllClose(a.value[1], q.value)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
