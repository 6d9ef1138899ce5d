"""One object in two roles: custom rules, loop carries, reducers, callbacks.

JAX's own code, its libraries and users' rules put one object in two roles
(a custom rule's arguments and residuals, a solver's `p = r`, a scan's carry
and xs, a reducer's two arguments, a callback's result). Opting a class in
must not change what such a program computes: each test compares it with
the same program on a twin class that is not opted in (stock semantics),
with the two copies' gradients added up.
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax._src import config as jax_config
from jax._src import test_util as jtu
from jax.experimental import io_callback
from jax.experimental.ode import odeint
from jax.scipy.sparse.linalg import bicgstab, cg

import stock_reference
import training
from shared_nodes import Param


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PlainParam:
  """Param's twin, registered without the opt-in: stock semantics."""

  value: object


def _g(a, b):
  return jnp.sum(a.value * b.value)


def _vjp_rule_by_vjp():
  @jax.custom_vjp
  def f(a, b):
    return _g(a, b)

  f.defvjp(
      lambda a, b: (_g(a, b), (a, b)),
      lambda r, ct: jax.vjp(_g, *r)[1](ct),
  )
  return f


def _vjp_rule_by_tree_map():
  @jax.custom_vjp
  def f(a, b):
    return _g(a, b)

  f.defvjp(
      lambda a, b: (_g(a, b), (b, a)),
      lambda r, ct: jax.tree.map(lambda x: ct * x, r),
  )
  return f


def _jvp_rule():
  @jax.custom_jvp
  def f(a, b):
    return _g(a, b)

  @f.defjvp
  def f_jvp(primals, tangents):
    (a, b), (ta, tb) = primals, tangents
    return _g(a, b), _g(ta, b) + _g(a, tb)

  return f


def _gradient_rule():
  @jax.custom_gradient
  def f(a, b):
    cls = type(a)
    return _g(a, b), lambda ct: (cls(ct * b.value), cls(ct * a.value))

  return f


# Programs of two arguments that play different roles; `k` varies them.
# Each returns a scalar, differentiable in both arguments.
def custom_vjp_by_vjp(a, b, k):
  return _vjp_rule_by_vjp()(a, b) * k


def custom_vjp_by_tree_map(a, b, k):
  return _vjp_rule_by_tree_map()(a, b) * k


def custom_jvp_rule(a, b, k):
  return _jvp_rule()(a, b) + k * jnp.sum(a.value)


def custom_gradient_rule(a, b, k):
  return _gradient_rule()(a, b) * k


def scan_carry_and_xs(a, b, k):
  cls = type(a)
  carry, ys = lax.scan(
      lambda c, x: (cls(c.value * k + x.value), x.value * c.value[0]), a, b
  )
  return jnp.sum(carry.value) + jnp.sum(ys)


def loop_updates_two_slots_apart(a, b, k):
  cls = type(a)
  p, r = lax.fori_loop(
      0,
      3,
      lambda i, c: (cls(c[0].value * k + c[1].value), cls(c[1].value * k)),
      (a, b),
  )
  return jnp.sum(p.value * r.value)


def while_updates_two_slots_apart(a, b, k):
  cls = type(a)

  def body(c):
    i, p, r = c
    return i + 1, cls(p.value + k * r.value), cls(r.value * 0.5)

  _, p, r = lax.while_loop(lambda c: c[0] < 2, body, (0, a, b))
  return jnp.sum(p.value) + jnp.sum(r.value)


def cond_branches_share_differently(a, b, k):
  cls = type(a)
  x, y = lax.cond(
      k > 0,
      lambda a, b: (a, a),
      lambda a, b: (a, cls(b.value * k)),
      a,
      b,
  )
  return jnp.sum(x.value * y.value)


def odeint_params(a, b, k):
  ys = odeint(
      lambda y, t, p, q: -0.1 * k * p.value * q.value * y,
      jnp.ones_like(a.value),
      jnp.array([0.0, 0.5]),
      a,
      b,
  )
  return jnp.sum(ys[-1])


def linear_solve_guess_and_rhs(a, b, k):
  cls = type(a)
  matrix = jnp.diag(jnp.arange(1.0, a.value.shape[0] + 1)) * (1 + k**2)
  x, _ = cg(lambda x: cls(matrix @ x.value), b, x0=a, maxiter=20)
  return jnp.sum(x.value)


# Reverse mode does not go through while_loop (on stock neither): these are
# differentiated in forward mode.
FORWARD_ONLY = {while_updates_two_slots_apart}

# The programs that forward mode differentiates (no custom_vjp in them).
FORWARD_CAPABLE = [
    custom_jvp_rule,
    scan_carry_and_xs,
    loop_updates_two_slots_apart,
    while_updates_two_slots_apart,
    cond_branches_share_differently,
    linear_solve_guess_and_rhs,
]

PROGRAMS = [
    custom_vjp_by_vjp,
    custom_vjp_by_tree_map,
    custom_jvp_rule,
    custom_gradient_rule,
    scan_carry_and_xs,
    loop_updates_two_slots_apart,
    while_updates_two_slots_apart,
    cond_branches_share_differently,
    odeint_params,
    linear_solve_guess_and_rhs,
]


# The programs that update the two roles apart in a loop carry, or whose
# branches return them one object and two: they split the tie on purpose,
# and the user is told (split_ties_test.py, ties_told_once_test.py), which
# these value checks allow.
SPLIT_ON_PURPOSE = {
    loop_updates_two_slots_apart,
    while_updates_two_slots_apart,
    cond_branches_share_differently,
}


def _shared_and_stock(program, value, k, jit, splits=False):
  """The program on one opted-in object in both roles, and on two copies of
  a twin class that is not opted in, with its two gradients added; with
  `splits`, under jax_split_ties='allow'."""
  if splits:
    with jax_config.split_ties("allow"):
      return _shared_and_stock(program, value, k, jit)
  shared = lambda p: program(p, p, k)
  stock = lambda p1, p2: program(p1, p2, k)
  if jit:
    shared, stock = jax.jit(shared), jax.jit(stock)
  if program in FORWARD_ONLY:
    grad, stock_grad = jax.jacfwd, partial(jax.jacfwd, argnums=(0, 1))
  else:
    grad, stock_grad = jax.grad, partial(jax.grad, argnums=(0, 1))
  g = grad(shared)(Param(value))
  g1, g2 = stock_grad(stock)(PlainParam(value), PlainParam(value))
  return (
      shared(Param(value)),
      g.value,
      stock(PlainParam(value), PlainParam(value)),
      g1.value + g2.value,
  )


class OneObjectTwoRolesTest(jtu.JaxTestCase):

  @parameterized.named_parameters((p.__name__, p) for p in PROGRAMS)
  def test_program_computes_as_on_stock(self, program):
    value = jnp.array([0.5, 1.0, 1.5])
    out, grad, stock_out, stock_grad = _shared_and_stock(
        program, value, 0.7, jit=False, splits=program in SPLIT_ON_PURPOSE
    )
    self.assertAllClose(out, stock_out, rtol=1e-5)
    self.assertAllClose(grad, stock_grad, rtol=1e-4, atol=1e-5)

  @settings(max_examples=40, deadline=None)
  @given(
      # Mixed in reverse mode, or in forward mode where while_loop is.
      programs=st.one_of(
          st.lists(
              st.sampled_from([p for p in PROGRAMS if p not in FORWARD_ONLY]),
              min_size=1,
              max_size=3,
          ),
          st.lists(st.sampled_from(FORWARD_CAPABLE), min_size=1, max_size=3),
      ),
      values=st.lists(st.floats(0.125, 2.0, width=32), min_size=2, max_size=4),
      k=st.sampled_from([-0.5, 0.3, 1.2]),
      jit=st.booleans(),
  )
  def test_generated_programs_compute_as_on_stock(
      self, programs, values, k, jit
  ):
    def program(a, b, k):
      # A sum of the chosen programs, each seeing the two roles.
      return sum(p(a, b, k) for p in programs)

    if FORWARD_ONLY.intersection(programs):
      FORWARD_ONLY.add(program)
    out, grad, stock_out, stock_grad = _shared_and_stock(
        program,
        jnp.array(values),
        k,
        jit,
        splits=bool(SPLIT_ON_PURPOSE.intersection(programs)),
    )
    # Two programs (one object in two roles, two objects): an accelerator
    # rounds them apart by more than the CPU does.
    self.assertAllClose(
        out, stock_out, **stock_reference.reference_tolerance(1e-4, 1e-5)
    )
    self.assertAllClose(
        grad, stock_grad, **stock_reference.reference_tolerance(1e-3, 1e-4)
    )


class IssueCasesTest(jtu.JaxTestCase):
  """The cases of the bug report, each against its stock numbers."""

  def setUp(self):
    super().setUp()
    self.v = Param(jnp.array([1.0, 2.0]))

  def test_custom_vjp_rule_of_totals_does_not_double(self):
    f = _vjp_rule_by_vjp()
    self.assertAllClose(
        jax.grad(lambda v: f(v, v))(self.v).value, jnp.array([2.0, 4.0])
    )

  def test_custom_vjp_rule_of_per_position_values(self):
    f = _vjp_rule_by_tree_map()
    self.assertAllClose(
        jax.grad(lambda v: f(v, v))(self.v).value, jnp.array([2.0, 4.0])
    )

  def test_custom_rule_sees_one_copy_per_position(self):
    seen = []

    @jax.custom_vjp
    def f(a, b):
      return _g(a, b)

    def fwd(a, b):
      seen.append(a is b)
      return _g(a, b), (a, b)

    def bwd(r, ct):
      a, b = r
      seen.append(a is b)
      # One object for both positions: still a cotangent per position.
      same = Param(ct * a.value)
      return same, same

    f.defvjp(fwd, bwd)
    grad = jax.grad(lambda v: f(v, v))(self.v)
    self.assertEqual(seen, [False, False])
    self.assertAllClose(grad.value, 2 * self.v.value)

  @settings(max_examples=30, deadline=None)
  @given(
      slots=st.lists(st.integers(0, 2), min_size=1, max_size=5),
      split=st.integers(0, 5),
      jit=st.booleans(),
  )
  def test_custom_vjp_function_sees_its_arguments_as_given(
      self, slots, split, jit
  ):
    # Ties within and across the two arguments: the function sees them, the
    # fwd rule a copy per position; the gradients add up over positions.
    objects = [Param(jnp.full(2, i + 1.0)) for i in range(3)]

    def arguments(objs):
      return [objs[i] for i in slots[:split]], [objs[i] for i in slots[split:]]

    seen = {"f": [], "fwd": []}

    @jax.custom_vjp
    def f(x, y):
      seen["f"].append(jax.tree.structure((x, y)))
      return sum(jnp.sum(p.value) for p in x + y)

    def fwd(x, y):
      seen["fwd"].append(jax.tree.structure((x, y)))
      return sum(jnp.sum(p.value) for p in x + y), None

    def bwd(_, ct):
      x, y = arguments([Param(ct * jnp.ones(2))] * 3)
      return [Param(p.value) for p in x], [Param(p.value) for p in y]

    f.defvjp(fwd, bwd)
    call = jax.jit(f) if jit else f
    value = call(*arguments(objects))
    grads = jax.grad(lambda objs: call(*arguments(objs)))(objects)

    given = jax.tree.structure(arguments(objects))
    self.assertEqual(seen["f"][0], given)
    copies = jax.tree.structure(jax.tree_util.tree_unshare(arguments(objects)))
    self.assertEqual(seen["fwd"], [copies])
    self.assertAllClose(value, 2.0 * sum(i + 1.0 for i in slots))
    for i, g in enumerate(grads):
      self.assertAllClose(g.value, jnp.full(2, float(slots.count(i))))

  @settings(max_examples=30, deadline=None)
  @given(
      slots=st.lists(st.integers(0, 2), min_size=2, max_size=5),
      split=st.integers(0, 5),
      rule=st.sampled_from(["fwd", "bwd"]),
      jit=st.booleans(),
  )
  def test_rule_failing_on_its_copies_runs_on_the_ties(
      self, slots, split, rule, jit
  ):
    # A function traced on the caller's arguments takes one input per object,
    # and fails on the rule's copies of an object passed twice. A fwd rule
    # that fails so runs again on the ties, and the rules compute with them:
    # the gradient is that of the traced function, one per object. A bwd
    # rule whose fwd ran on the copies cannot: its error names the first
    # object passed at two places, as the arguments' key paths.
    objects = [Param(jnp.full(2, i + 1.0)) for i in range(3)]
    x, y = [objects[i] for i in slots[:split]], [
        objects[i] for i in slots[split:]
    ]
    traced = jax.make_jaxpr(
        lambda *leaves: sum(jnp.sum(v * (k + 1)) for k, v in enumerate(leaves))
    )(*jax.tree.leaves((x, y)))

    traced_on = jax.tree.structure((x, y))

    def run_traced(x, y):
      # As a closure-converted function (Equinox's) checks its arguments
      # against those it was traced on: the copies are another structure.
      if jax.tree.structure((x, y)) != traced_on:
        raise ValueError("called with other arguments than it was traced on")
      leaves = jax.tree.leaves((x, y))
      return jax.core.eval_jaxpr(traced.jaxpr, traced.consts, *leaves)[0]

    def plain(x, y):
      return sum(jnp.sum(p.value) for p in x + y)

    @jax.custom_vjp
    def f(x, y):
      return run_traced(x, y)

    def fwd(x, y):
      return (run_traced if rule == "fwd" else plain)(x, y), (x, y)

    def bwd(res, ct):
      # The cotangent of each object's leaves, through the traced function.
      _, pullback = jax.vjp(run_traced, *res)
      return pullback(ct)

    f.defvjp(fwd, bwd)
    call = jax.jit(f) if jit else f
    places = [(0, i, p) for i, p in enumerate(x)]
    places += [(1, i, p) for i, p in enumerate(y)]
    first = {}
    tie = None
    for arg, i, node in places:
      if id(node) in first:
        tie = first[id(node)], f"args[{arg}][{i}]"
        break
      first[id(node)] = f"args[{arg}][{i}]"

    if tie is None or rule == "fwd":
      grads = jax.grad(call, argnums=(0, 1))(x, y)
      expected = jax.grad(run_traced, argnums=(0, 1))(x, y)
      self.assertEqual(jax.tree.structure(grads), jax.tree.structure(expected))
      for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        self.assertAllClose(g, e)
      return
    with self.assertRaises(ValueError) as caught:  # the structure check
      jax.grad(call, argnums=(0, 1))(x, y)
    self.assertIn(
        f"The caller passed the Param at {tie[0]} and {tie[1]} as one "
        "object; custom_vjp bwd rule bwd got a copy of it at each place",
        "\n".join(getattr(caught.exception, "__notes__", [])),
    )

  def test_equinox_filter_custom_vjp_does_not_double(self):
    import equinox as eqx

    @eqx.filter_custom_vjp
    def f(ab):
      a, b = ab
      return _g(a, b)

    def f_fwd(perturbed, ab):
      del perturbed
      return f(ab), ab

    def f_bwd(residuals, ct, perturbed, ab):
      del perturbed, ab
      # A rule correct on stock: the total, through jax.vjp of the residuals.
      return jax.vjp(lambda r: _g(*r), residuals)[1](ct)[0]

    f.def_fwd(f_fwd)
    f.def_bwd(f_bwd)
    grad = jax.grad(lambda v: f((v, v)))(self.v)
    stock = jax.grad(lambda p1, p2: f((p1, p2)), argnums=(0, 1))(
        PlainParam(self.v.value), PlainParam(self.v.value)
    )
    self.assertAllClose(grad.value, stock[0].value + stock[1].value)
    self.assertAllClose(grad.value, 2 * self.v.value)

  def test_custom_root_with_one_object_in_two_places(self):
    def solve_for(cls):
      def f(x):
        return cls(x.value**2 - 2.0)

      def solve(f, x0):
        del f
        return cls(jnp.sqrt(2.0) * jnp.ones_like(x0.value))

      def tangent_solve(g, y):
        return cls(y.value / g(cls(jnp.ones_like(y.value))).value)

      return lambda x0: jnp.sum(
          lax.custom_root(f, x0, solve, tangent_solve).value
      )

    x0 = jnp.ones(2)
    self.assertAllClose(
        solve_for(Param)(Param(x0)), solve_for(PlainParam)(PlainParam(x0))
    )

  def test_scan_with_one_object_as_carry_and_xs(self):
    shared = Param(jnp.ones(3))
    carry, ys = lax.scan(
        lambda c, x: (Param(c.value + x.value), x.value * c.value[0]),
        shared,
        shared,
    )
    self.assertAllClose(carry.value, jnp.full(3, 4.0))
    self.assertAllClose(ys, jnp.array([1.0, 2.0, 3.0]))

  def test_reduce_over_opted_in_nodes(self):
    reducer = lambda x, y: Param(x.value + y.value)
    operand, init = Param(jnp.arange(4.0)), Param(jnp.array(0.0))
    out = lax.reduce(operand, init, reducer, (0,))
    self.assertAllClose(out.value, 6.0)
    jaxpr = jax.make_jaxpr(lambda o: lax.reduce(o, init, reducer, (0,)))(
        operand
    )
    (reduce_eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "reduce"]
    self.assertLen(reduce_eqn.params["jaxpr"].jaxpr.invars, 2)

  def test_odeint_with_one_object_as_state_and_argument(self):
    y0 = Param(jnp.ones(2))
    dynamics = lambda y, t, a: Param(-a.value * y.value)
    ts = jnp.array([0.0, 1.0])
    ys = odeint(dynamics, y0, ts, y0)
    stock = odeint(
        lambda y, t, a: PlainParam(-a.value * y.value),
        PlainParam(jnp.ones(2)),
        ts,
        PlainParam(jnp.ones(2)),
    )
    self.assertAllClose(ys.value, stock.value)

  @parameterized.parameters(cg, bicgstab)
  def test_solver_with_p_equal_r(self, solver):
    a = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    x, _ = solver(lambda x: Param(a @ x.value), Param(jnp.array([1.0, 2.0])))
    stock, _ = solver(
        lambda x: PlainParam(a @ x.value), PlainParam(jnp.array([1.0, 2.0]))
    )
    self.assertAllClose(x.value, stock.value, atol=1e-6)

  def test_lbfgs_on_opted_in_params(self):
    def run(cls):
      params = {"w": cls(jnp.array([1.0, -2.0])), "b": cls(jnp.array(0.5))}
      loss = lambda p: jnp.sum((p["w"].value - 3.0) ** 2) + p["b"].value ** 2
      params = training.lbfgs_steps(params, loss, 3)
      return [params["w"].value, params["b"].value]

    for got, want in zip(run(Param), run(PlainParam)):
      self.assertAllClose(got, want, rtol=1e-5)

  def test_body_keeps_deliberate_sharing(self):
    p = Param(jnp.ones(2))

    def body(i, carry):
      new = Param(carry[0].value * 2)
      return new, new

    a, b = lax.fori_loop(0, 3, body, (p, p))
    self.assertIs(a, b)
    self.assertAllClose(a.value, jnp.full(2, 8.0))


class CallbackResultsTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    s = jax.ShapeDtypeStruct((2,), jnp.float32)
    self.s, self.t = Param(s), Param(s)
    one = Param(np.ones(2, np.float32))
    two = Param(np.full(2, 2.0, np.float32))
    self.one, self.two = one, two

  def _call(self, api, result, spec):
    # Waited for: an accelerator raises a callback's error when the result
    # is awaited, not at the call.
    return jax.block_until_ready(jax.jit(lambda: api(lambda: result, spec))())

  @parameterized.parameters(io_callback, jax.pure_callback)
  def test_result_sharing_less_than_its_spec_is_an_error(self, api):
    with self.assertRaisesRegex(Exception, "must share the nodes"):
      self._call(api, (self.one, self.two, self.two), (self.s, self.s, self.t))

  @parameterized.parameters(io_callback, jax.pure_callback)
  def test_result_sharing_as_its_spec(self, api):
    a, b, c = self._call(
        api, (self.one, self.one, self.two), (self.s, self.s, self.t)
    )
    self.assertIs(a, b)
    self.assertAllClose(c.value, np.full(2, 2.0))

  @parameterized.parameters(io_callback, jax.pure_callback)
  def test_result_sharing_more_than_its_spec_is_read_as_stock(self, api):
    u = Param(jax.ShapeDtypeStruct((2,), jnp.float32))
    a, b, c = self._call(
        api, (self.one, self.two, self.two), (self.s, self.t, u)
    )
    self.assertIsNot(b, c)
    self.assertAllClose(a.value, np.ones(2))
    self.assertAllClose(b.value, np.full(2, 2.0))
    self.assertAllClose(c.value, np.full(2, 2.0))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
