"""Custom rules that cannot run on copies of a tied argument.

A custom_vjp's rules get a copy of a shared node per place. A fwd rule that
raises what a structure that does not fit raises (a ValueError or a
TypeError) on the copies, after using a structure traced on the caller's
tied arguments (as Equinox's checkpointed while_loop does), runs again on
the arguments as given, and that call's rules compute with the ties, as
jax.vjp does; any other error is raised as it is, the rule run once. A
custom function's result keeps the ties it was returned with.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax._src import test_util as jtu

from never_worse_than_stock_test import checkpointed_loop_over_one_node_twice
from shared_nodes import Param


def product_with_fwd(fwd):
  """A custom_vjp of the sum of two Params' product, with `fwd` as its fwd
  rule and a bwd rule that is never reached."""

  @jax.custom_vjp
  def f(a, b):
    return jnp.sum(a.value * b.value)

  f.defvjp(fwd, lambda res, ct: (None, None))
  return f


def product_twice(a, b):
  """One new object, at two places of the result."""
  out = Param(a.value * b.value)
  return out, out


class RulesOnTiesTest(jtu.JaxTestCase):

  def test_custom_vjp_inside_rules_that_run_on_the_ties_keeps_them(self):
    # Equinox's checkpointed while_loop passes the tied carry, in its bwd
    # rule, through a custom_vjp identity of its own before calling the
    # closure-converted body: that call's result must stay tied, and its
    # cotangent, one per object, must not be counted once per place.
    p = Param(jnp.array([1.0, 2.0]))
    traced = jax.make_jaxpr(lambda a, b: jnp.sum(a.value * b.value))(p, p)
    traced_on = jax.tree.structure((p, p))
    seen = []

    def run_traced(a, b):
      # As a closure-converted function checks its arguments against the
      # ones it was traced on: the copies are another structure.
      if jax.tree.structure((a, b)) != traced_on:
        raise ValueError("called with other arguments than it was traced on")
      return jax.core.eval_jaxpr(
          traced.jaxpr, traced.consts, *jax.tree.leaves((a, b))
      )[0]

    @jax.custom_vjp
    def identity(pair):
      return pair

    identity.defvjp(lambda pair: (pair, None), lambda _, ct: (ct,))

    @jax.custom_vjp
    def f(a, b):
      return run_traced(a, b)

    def bwd(res, ct):
      def through_identity(a, b):
        a, b = identity((a, b))
        seen.append(a is b)
        return run_traced(a, b)

      _, pullback = jax.vjp(through_identity, *res)
      return pullback(ct)

    f.defvjp(lambda a, b: (run_traced(a, b), (a, b)), bwd)
    for call in (f, jax.jit(f)):
      ga, gb = jax.grad(call, argnums=(0, 1))(p, p)
      self.assertIs(ga, gb)
      self.assertAllClose(ga.value, 2 * p.value)
    self.assertEqual(seen, [True, True])

  def test_fwd_rule_failing_on_its_own_runs_once(self):
    # An error that no structure traced on the ties caused is the rule's
    # own: raised as it is, the rule's side effects run once.
    self.assertFwdRunsOnce(
        lambda a, b: "one object" if a is b else "copies", "copies"
    )

  def test_fwd_rule_using_a_tied_structure_then_failing_runs_once(self):
    # A rule that used a structure traced on the ties, then failed with an
    # error that no misfit of structure raises (neither a ValueError nor a
    # TypeError), is not rerun: its side effects happen once and its error
    # is raised as on stock.
    p = Param(jnp.ones(2))
    traced_on = jax.tree.structure((p, p))
    leaves = jax.tree.leaves((p, p))
    self.assertFwdRunsOnce(
        lambda a, b: (
            jax.tree.unflatten(traced_on, leaves)[0] is not None,
            traced_on == traced_on,
        ),
        (True, True),
        p,
    )

  def assertFwdRunsOnce(self, note, expected, p=None):
    """A custom_vjp whose fwd rule notes `note(a, b)` and raises an error
    of its own, differentiated at (p, p) plain and under jit: the error is
    raised as it is, and the rule ran once, noting `expected`."""
    p = Param(jnp.ones(2)) if p is None else p
    notes = []

    def fwd(a, b):
      notes.append(note(a, b))
      raise RuntimeError("fwd's own error")

    f = product_with_fwd(fwd)
    for call in (f, jax.jit(f)):
      notes.clear()
      with self.assertRaisesRegex(RuntimeError, "^fwd's own error$"):
        jax.grad(call, argnums=(0, 1))(p, p)
      self.assertEqual(notes, [expected])

  def test_fwd_rule_failing_on_copies_and_ties_raises_as_on_copies(self):
    # A rule that met a structure traced on the ties runs again on them;
    # for one that fails anyway, that changes nothing: its first error is
    # raised, with the note that names the tie.
    p = Param(jnp.ones(2))
    traced_on = jax.tree.structure((p, p))
    calls = []

    def fwd(a, b):
      calls.append(jax.tree.structure((a, b)) == traced_on)
      raise ValueError(f"fwd got {'one object' if a is b else 'copies'}")

    f = product_with_fwd(fwd)
    with self.assertRaisesRegex(ValueError, "^fwd got copies$") as caught:
      jax.grad(f, argnums=(0, 1))(p, p)
    self.assertEqual(calls, [False, True])  # On the copies, then the ties.
    self.assertIn(
        "The caller passed the Param at args[0] and args[1] as one object",
        "\n".join(caught.exception.__notes__),
    )

  def assertResultKeepsTheTie(self, twice, p):
    """`twice(p, p)` returns one object at two places, under jit too, and
    the gradient through both places is the sum of theirs."""
    for call in (twice, jax.jit(twice)):
      x, y = call(p, p)
      self.assertIs(x, y)
      self.assertAllClose(x.value, p.value**2)
    loss = lambda w: sum(jnp.sum(o.value) for o in twice(w, w))
    self.assertAllClose(jax.grad(loss)(p).value, 4 * p.value)
    self.assertAllClose(jax.jit(jax.grad(loss))(p).value, 4 * p.value)

  def test_custom_vjp_result_keeps_the_tie_of_its_function(self):
    # The function sees its arguments as given; one object it returns at two
    # places is one object in the result, as under jit. Differentiated, the
    # rules run on copies and the places' cotangents add up.
    twice = jax.custom_vjp(product_twice)

    def bwd(res, g):
      a, b = res
      total = g[0].value + g[1].value
      return Param(total * b.value), Param(total * a.value)

    twice.defvjp(lambda a, b: (twice(a, b), (a, b)), bwd)
    self.assertResultKeepsTheTie(twice, Param(jnp.array([1.0, 2.0])))

  def test_custom_jvp_result_keeps_the_tie_of_its_function(self):
    # The same for custom_jvp, whose rule gives the primal result under
    # differentiation: one object there is one value, with one tangent.
    twice = jax.custom_jvp(product_twice)

    @twice.defjvp
    def _(primals, tangents):
      (a, b), (ta, tb) = primals, tangents
      tangent = Param(ta.value * b.value + a.value * tb.value)
      return product_twice(a, b), (tangent, tangent)

    p = Param(jnp.array([1.0, 2.0]))
    self.assertResultKeepsTheTie(twice, p)
    t = Param(jnp.ones(2))
    (x, y), (tx, ty) = jax.jvp(twice, (p, p), (t, t))
    self.assertIs(x, y)
    self.assertIs(tx, ty)
    self.assertAllClose(tx.value, 2 * p.value)

  def test_equinox_checkpointed_loop_splits_no_tie(self):
    # Its custom_vjp's result, the final carry, keeps the carry's tie, and so
    # do the custom_jvp identities of its derivative, so Equinox's own
    # combining of them with the tied static parts splits none.
    loss = checkpointed_loop_over_one_node_twice(Param)
    w = Param(jnp.array([1.0, 2.0]))
    with warnings.catch_warnings():
      warnings.simplefilter("error", jax.tree_util.SplitTieWarning)
      value = jax.jit(loss)(w)
      grads = [jax.grad(loss)(w), jax.jit(jax.grad(loss))(w)]
    np.testing.assert_allclose(value, (2.5**3) ** 2 * (1 + 4), rtol=1e-6)
    for g in grads:
      np.testing.assert_allclose(g.value, [488.28125, 976.5625], rtol=1e-6)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
