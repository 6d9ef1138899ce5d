"""JAX APIs that no rule names compute what stock computes, with the opt-in.

Inside JAX, trees are laid out as stock lays them out; only the entry points
named in docs/jax-integration.md keep relative identities. Each test runs a
program once with opted-in nodes shared (`P`, `Box`) and once with their
twins registered without the opt-in (`PlainP`, `PlainBox`), which stock JAX
treats alike, and requires the same values: a tied gradient equals the sum
of the copies'. The programs are the cases of an issue that used to crash or
(case 1) hand `f` wrong key paths.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax
from jax._src import config as jax_config
from jax._src import test_util as jtu
from jax._src import tree_util as stock_layout
from jax.scipy.sparse.linalg import bicgstab, cg, gmres


@jax.tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class P:
  value: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PlainP:
  value: object


class _Box:
  """Two children, keyed 0 and 1."""

  def __init__(self, a, b):
    self.c = (a, b)


class Box(_Box):
  pass


class PlainBox(_Box):
  pass


for _cls, _opt_in in ((Box, True), (PlainBox, False)):
  jax.tree_util.register_pytree_with_keys(
      _cls,
      lambda b: (
          (
              (jax.tree_util.SequenceKey(0), b.c[0]),
              (jax.tree_util.SequenceKey(1), b.c[1]),
          ),
          None,
      ),
      lambda _, c, cls=_cls: cls(*c),
      preserve_relative_identities=_opt_in,
  )

Pair = collections.namedtuple("Pair", ["carry", "y"])
A, B = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])


def sum_of_firsts_twice(cls):
  """A combiner of two pairs that returns one new node at both places."""

  def combine(a, b):
    node = cls(a[0].value + b[0].value)
    return node, node

  return combine


def checkpointed_loop_over_one_node_twice(cls):
  """A loss through Equinox's checkpointed while_loop whose carry holds the
  node `w` at two places (or `w` and `v`), and whose body returns one new
  node at both."""
  import equinox.internal as eqxi  # pylint: disable=g-import-not-at-top

  def loss(w, v=None):
    def body(carry):
      i, (a, b) = carry
      c = cls(a.value * 1.5 + b.value)
      return i + 1, (c, c)

    _, (a, b) = eqxi.while_loop(
        lambda c: c[0] < 3,
        body,
        (0, (w, w if v is None else v)),
        max_steps=3,
        kind="checkpointed",
    )
    return jnp.sum(a.value * b.value)

  return loss


def leaves(tree):
  """The leaves as stock lays them out: one per place."""
  return stock_layout.tree_leaves(tree)


class NeverWorseThanStockTest(jtu.JaxTestCase):

  def assertSameValues(self, program, splits=False):
    """`program(P, Box)` gives the values of `program(PlainP, PlainBox)`;
    with `splits`, it tells of the tie it splits (values that tell the
    places apart) with a SplitTieWarning, as the user would be told."""
    if splits:
      with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, "split a tie"):
        ours = program(P, Box)
    else:
      ours = program(P, Box)
    theirs = program(PlainP, PlainBox)
    ours, theirs = leaves(ours), leaves(theirs)
    self.assertEqual(len(ours), len(theirs))
    for x, y in zip(ours, theirs):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5)

  def test_tree_map_with_path_hands_f_stocks_key_paths(self):
    def paths(cls, box):
      inner = lambda x: isinstance(x, box) and not isinstance(x.c[0], box)
      b = box(box(1.0, 2.0), box(3.0, 4.0))
      z = lambda: box(box(0.0, 0.0), box(0.0, 0.0))
      out = jax.tree_util.tree_map_with_path(
          lambda path, x, y: jax.tree_util.keystr(path),
          {"a": b, "b": b},
          {"a": z(), "b": z()},
          is_leaf=inner,
      )
      return jax.tree.leaves(out)

    expected = ["['a'][0]", "['a'][1]", "['b'][0]", "['b'][1]"]
    self.assertEqual(paths(PlainP, PlainBox), expected)
    with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, "split a tie"):
      self.assertEqual(paths(P, Box), expected)

  def test_tree_map_with_path_over_a_tied_and_an_untied_tree(self):
    def program(cls, box):
      u = cls(B)
      return jax.tree_util.tree_map_with_path(
          lambda path, u, x: x if u is None else x + u,
          [u, u, None],
          [cls(A), cls(B), cls(A)],
          is_leaf=lambda x: x is None,
      )

    self.assertSameValues(program, splits=True)

  def test_is_leaf_takes_path(self):
    def program(cls, box):
      u = cls(B)
      return jax.tree_util.tree_map_with_path(
          lambda path, u, x: x + u,
          [u, u],
          [cls(A), cls(B)],
          is_leaf=lambda path, x: x is None,
          is_leaf_takes_path=True,
      )

    self.assertSameValues(program, splits=True)

  def _scan_whose_carry_sharing_changes(self, cls, box):
    def body(carry, x):
      first, second = carry
      return Pair((cls(first.value + x), cls(second.value * x)), x), None

    p = cls(A)
    return lax.scan(lambda c, x: body(c, x)[0], (p, p), jnp.arange(3.0))

  def test_scan_body_returns_a_namedtuple_while_the_carry_unties(self):
    self.assertSameValues(self._scan_whose_carry_sharing_changes, splits=True)

  def test_scan3_body_returns_a_namedtuple_while_the_carry_unties(self):
    # Told as scan tells it.
    with jax_config.scan3(True):
      self.assertSameValues(self._scan_whose_carry_sharing_changes, splits=True)

  def test_custom_linear_solve_with_one_node_as_two_operands(self):
    def program(cls, box):
      p = cls(A)
      matvec = lambda x: jax.tree.map(lambda v: 2.0 * v, x)
      solve = lambda mv, b: jax.tree.map(lambda v: v / 2.0, b)
      return lax.custom_linear_solve(matvec, (p, p), solve, solve)

    # The solution is laid out as b, whose tie the solver's copies split:
    # the call says so.
    self.assertSameValues(program, splits=True)

  def test_custom_root_whose_solver_returns_the_copies_of_a_tied_guess(self):
    def program(cls, box):
      p = cls(A)
      f = lambda x: jax.tree.map(lambda v: v - 1.0, x)
      return lax.custom_root(f, (p, p), lambda f, guess: guess, lambda g, y: y)

    # Laid out as the guess, the solution is built by the guess's treedef,
    # which remembers the tie the copies split: the call says so.
    self.assertSameValues(program, splits=True)

  def test_iterative_solvers_with_one_node_as_two_operands(self):
    # The solution is laid out as b, and computed place by place: the
    # solvers (public functions, which call custom_linear_solve themselves)
    # say that it splits b's tie.
    for solver in (cg, gmres, bicgstab):
      with self.subTest(solver.__name__):

        def program(cls, box):
          p = cls(A)
          matvec = lambda x: jax.tree.map(lambda v: 3.0 * v, x)
          return solver(matvec, (p, p))[0]

        self.assertSameValues(program, splits=True)

  def test_solvers_that_return_one_node_twice(self):
    def linear(cls, box):
      r = cls(A)
      matvec = lambda x: x
      return lax.custom_linear_solve(
          matvec, (r, cls(A)), lambda mv, b: (b[0], b[0])
      )

    def root(cls, box):
      f = lambda x: jax.tree.map(lambda v: v - 1.0, x)
      solve = lambda f, guess: (lambda r: (r, r))(cls(jnp.ones(2)))
      return lax.custom_root(f, (cls(A), cls(A)), solve, lambda g, y: y)

    # The solvers are custom rules, given copies; the one object they return
    # at two places comes back as two, and the call says so.
    self.assertSameValues(linear, splits=True)
    self.assertSameValues(root, splits=True)

  def test_jvp_tangents_that_share_more_than_the_primals(self):
    f = lambda ps: ps[0].value * ps[1].value

    def jvp(cls, box):
      t = cls(jnp.ones(2))
      return jax.jvp(f, ((cls(A), cls(B)),), ((t, t),))

    def linearize(cls, box):
      t = cls(jnp.ones(2))
      _, f_jvp = jax.linearize(f, (cls(A), cls(B)))
      return f_jvp((t, t))

    def vjp(cls, box):
      ct = cls(jnp.ones(2))
      _, f_vjp = jax.vjp(lambda ps: ps, (cls(A), cls(B)))
      return f_vjp((ct, ct))

    def transpose(cls, box):
      ct = cls(jnp.ones(2))
      g = jax.linear_transpose(lambda ps: ps, (cls(A), cls(B)))
      return g((ct, ct))

    for program in (jvp, linearize, vjp, transpose):
      with self.subTest(program.__name__):
        self.assertSameValues(program)

  @settings(max_examples=20, deadline=None)
  @given(
      slots=st.lists(st.integers(0, 2), min_size=1, max_size=4),
      has_aux=st.booleans(),
  )
  def test_linearized_function_takes_tangents_that_share_less(
      self, slots, has_aux
  ):
    # Tied primals, a tangent object per place with values of its own.
    def f(ps):
      out = sum(k * jnp.sin(p.value) for k, p in enumerate(ps, start=1))
      return (out, len(ps)) if has_aux else out

    def program(cls, box):
      nodes = [cls(A + i) for i in range(3)]
      _, f_jvp, *_ = jax.linearize(
          f, [nodes[i] for i in slots], has_aux=has_aux
      )
      tangents = [cls(jnp.full(2, k + 1.0)) for k in range(len(slots))]
      return f_jvp(tangents), jax.jit(f_jvp)(tangents)

    self.assertSameValues(program)

  def test_associative_scan_whose_combine_shares_otherwise(self):
    def program(cls, box):
      elems = (cls(jnp.arange(4.0)), cls(jnp.arange(4.0)))
      return lax.associative_scan(sum_of_firsts_twice(cls), elems)

    self.assertSameValues(program)

  def test_reduce_with_a_reducer_returning_one_node_twice(self):
    def reducer_shares(cls, box):
      x = cls(jnp.arange(4.0))
      return lax.reduce(
          (x, cls(jnp.arange(4.0))),
          (cls(0.0), cls(0.0)),
          sum_of_firsts_twice(cls),
          (0,),
      )

    def one_init(cls, box):
      init = cls(0.0)
      add = lambda x, y: (
          cls(x[0].value + y[0].value),
          cls(x[1].value + y[1].value),
      )
      ops = (cls(jnp.arange(4.0)), cls(jnp.arange(4.0)))
      return (
          lax.reduce(ops, (init, init), add, (0,)),
          lax.reduce_window(ops, (init, init), add, (2,), (1,), "VALID"),
      )

    self.assertSameValues(reducer_shares)
    self.assertSameValues(one_init)

  def test_custom_vmap_whose_function_and_rule_return_one_node_twice(self):
    def program(cls, box):
      @jax.custom_batching.custom_vmap
      def f(x):
        o = cls(x.value * 2.0)
        return o, o

      @f.def_vmap
      def rule(axis_size, in_batched, x):
        o = cls(x.value * 2.0)
        b = cls(True)
        return (o, o), (b, b)

      return jax.vmap(f)(cls(jnp.arange(3.0)))

    # custom_vmap gives its outputs back per position; vmap traces it, and
    # the trace tells where its result holds the two objects.
    self.assertSameValues(program, splits=True)

  def test_grad_through_a_loop_whose_carry_holds_one_node_twice(self):
    def program(cls, box):
      def loss(w):
        def body(i, carry):
          a, b = carry
          return cls(a.value * 1.5), cls(b.value + a.value)

        a, b = lax.fori_loop(0, 3, body, (w, w))
        return jnp.sum(a.value * b.value)

      return jax.grad(loss)(cls(A))

    self.assertSameValues(program, splits=True)

  def test_pallas_call_given_one_node_twice(self):
    # Pallas lays every tree out as stock does (patch 0013): the kernel gets
    # a ref per place, in the generic interpreter and in Mosaic's.
    from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top

    def program(cls, box):
      def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref.value[...] * 2.0 + y_ref.c[1].value[...]

      a = cls(jnp.arange(8.0))
      results = []
      for interpret in (True, pltpu.InterpretParams()):
        f = pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
            interpret=interpret,
        )
        results += [f(a, box(a, a)), jax.jit(f)(a, box(a, a))]
      return results

    self.assertSameValues(program)

  def test_jit_of_equinox_checkpointed_while_loop_with_one_node_twice(self):
    # Equinox closure-converts the body on the tied carry and checks, in
    # its custom_vjp's function, that it is called with that tree (0009).
    def program(cls, box):
      loss = checkpointed_loop_over_one_node_twice(cls)
      return jax.jit(loss)(cls(A)), loss(cls(B))

    self.assertSameValues(program)

  # Equinox closure-converts the body on the tied carry and checks, inside
  # its custom_vjp rules too, that the body is called with that tree: the
  # fwd rule fails on the copies it is given and runs again on the ties, and
  # the rules compute with them (as do the custom_vjp its bwd rule calls).
  def test_grad_through_equinox_checkpointed_while_loop(self):
    def program(cls, box):
      return jax.grad(checkpointed_loop_over_one_node_twice(cls))(cls(A))

    self.assertSameValues(program)

  def test_jit_of_grad_through_equinox_checkpointed_while_loop(self):
    def program(cls, box):
      loss = checkpointed_loop_over_one_node_twice(cls)
      return jax.jit(jax.value_and_grad(loss))(cls(B))

    self.assertSameValues(program)

  def test_grad_through_equinox_checkpointed_while_loop_keeps_the_tie(self):
    w = P(A)
    loss = checkpointed_loop_over_one_node_twice(P)
    ga, gb = jax.grad(loss, argnums=(0, 1))(w, w)
    self.assertIs(ga, gb)  # One node, one gradient: the sum of its places'.
    np.testing.assert_allclose(ga.value, jax.grad(loss)(w).value, rtol=1e-6)
    np.testing.assert_allclose(ga.value, [488.28125, 976.5625], rtol=1e-6)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
