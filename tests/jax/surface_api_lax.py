"""Adapters of the public-surface test: jax.lax's control flow, reductions,
solvers and collectives, jax.scipy.sparse.linalg and jax.experimental.ode.

Every leaf of the arguments has shape (3,), so a loop over `xs` has three
steps and a collective over a vmapped axis three members.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import config as jax_config
from jax.experimental.ode import odeint
from jax.scipy.sparse import linalg
from jax.sharding import PartitionSpec

import surface_nodes as nodes
from surface_programs import (
    DIFF_MODES,
    NO_GRAD,
    NO_JVP,
    ONE_SHOT,
    adapter,
    body,
    linear,
    smooth,
)

# Solvers whose user function must stay linear: no mode that moves values.
LINEAR_MODES = ("keep", "less")


def _float_sum(tree):
  return sum(jnp.sum(x) for x in nodes.places(tree) if nodes.is_float_leaf(x))


def _scan_body(fn):
  """A body whose `y` is its new carry: one object in two roles."""

  def step(carry, x):
    new = fn.tree(carry, g=lambda c: smooth(c) + 0.1 * _float_sum(x))
    return nodes.Pair(new, new)

  return step


@adapter("jax.lax.scan")
def _scan(args, fn, fam):
  return lax.scan(_scan_body(fn), args[0], args[1])


@adapter("jax.lax.scan[reverse_unrolled]")
def _scan_reverse(args, fn, fam):
  return lax.scan(_scan_body(fn), args[0], args[1], reverse=True, unroll=2)


@adapter("jax.lax.scan[scan3]", diffs=NO_GRAD)  # no reverse mode on stock
def _scan3(args, fn, fam):
  with jax_config.scan3(True):
    return lax.scan(_scan_body(fn), args[0], args[1])


@adapter("jax.lax.while_loop", diffs=NO_GRAD)
def _while_loop(args, fn, fam):
  def step(carry):
    i, xs = carry
    return i + 1, fn.tree(xs)

  return lax.while_loop(lambda c: c[0] < 3, step, (0, args))[1]


@adapter("jax.lax.fori_loop")
def _fori_loop(args, fn, fam):
  return lax.fori_loop(0, 3, lambda i, xs: fn.tree(xs), args)


@adapter("jax.lax.fori_loop[dynamic_bounds]", diffs=NO_GRAD)
def _fori_loop_dynamic(args, fn, fam):
  stop = jnp.int32(3) + jnp.int32(0) * jnp.int32(len(args))
  return jax.jit(
      lambda n, *xs: lax.fori_loop(0, n, lambda i, ys: fn.tree(ys), xs)
  )(stop, *args)


@adapter("jax.ensure_compile_time_eval")
def _compile_time_eval(args, fn, fam):
  """Loops and branches on concrete values run as Python here."""
  with jax.ensure_compile_time_eval():
    looped = lax.fori_loop(0, 2, lambda i, xs: fn.tree(xs), args)
    return lax.cond(True, lambda *xs: body(fn, xs), lambda *xs: xs, *looped)


@adapter("jax.lax.cond")
def _cond(args, fn, fam):
  # The branches share differently: the user's, and one that keeps the
  # arguments' sharing.
  keep = lambda *xs: nodes.map_nodes(linear, xs)
  return lax.cond(
      _float_sum(args) > -1e9, lambda *xs: body(fn, xs), keep, *args
  )


@adapter("jax.lax.cond[branches_alike]")
def _cond_alike(args, fn, fam):
  # Both branches the user's: one sharing, so nothing is traced again and
  # the branch check reads the outputs as they share.
  return lax.cond(
      _float_sum(args) > -1e9,
      lambda *xs: body(fn, xs),
      lambda *xs: body(fn, xs),
      *args,
  )


@adapter("jax.lax.switch[branches_alike]")
def _switch_alike(args, fn, fam):
  index = jnp.int32(1) + jnp.int32(0) * _float_sum(args).astype(jnp.int32)
  return lax.switch(index, [lambda *xs: body(fn, xs)] * 3, *args)


@adapter("jax.lax.switch")
def _switch(args, fn, fam):
  branches = [
      lambda *xs: nodes.map_nodes(linear, xs),
      lambda *xs: body(fn, xs),
      lambda *xs: nodes.map_nodes(linear, xs, keep_ties=False),
  ]
  index = jnp.int32(1) + jnp.int32(0) * _float_sum(args).astype(jnp.int32)
  return lax.switch(index, branches, *args)


@adapter("jax.lax.map")
def _map(args, fn, fam):
  return lax.map(lambda xs: body(fn, xs), args)


@adapter("jax.lax.map[batch_size]", cost="heavy")
def _map_batched(args, fn, fam):
  return lax.map(lambda xs: body(fn, xs), args, batch_size=2)


@adapter("jax.lax.associative_scan")
def _associative_scan(args, fn, fam):
  return lax.associative_scan(lambda a, b: fn.zip(jnp.add, a, b), args)


def _summed(reduce, operands, fn, *shape):
  """`reduce` (lax.reduce or lax.reduce_window) of `operands` by addition,
  from scalar zeros: one object per node of `operands`, so that the two
  operands of a node that the tree ties get one init. `shape`: the
  dimensions, or the window and its strides and padding."""
  zeros = nodes.map_nodes(lambda x: jnp.zeros((), x.dtype), operands)
  return reduce(operands, zeros, lambda a, b: fn.zip(jnp.add, a, b), *shape)


@adapter("jax.lax.reduce", n_args=1, diffs=NO_GRAD)
def _reduce(args, fn, fam):
  return _summed(lax.reduce, args[0], fn, (0,))


@adapter("jax.lax.reduce_window", n_args=1, diffs=NO_GRAD)
def _reduce_window(args, fn, fam):
  return _summed(lax.reduce_window, args[0], fn, (2,), (1,), "VALID")


@adapter("jax.lax.custom_root")
def _custom_root(args, fn, fam):
  guess = args[0]
  shift = 0.1 * _float_sum(args[1])
  target = nodes.map_nodes(lambda v: 0.5 * v + shift, guess)
  f = lambda x: nodes.map_nodes(jnp.subtract, x, target, keep_ties=False)
  # Newton's step with the identity Jacobian: exact for this f.
  solve = lambda f, x0: fn.zip(jnp.subtract, x0, f(x0))
  return lax.custom_root(f, guess, solve, lambda g, y: y)


@adapter("jax.lax.custom_linear_solve")
def _custom_linear_solve(args, fn, fam):
  b = nodes.map_nodes(lambda v: v + 0.1 * _float_sum(args[1]), args[0])
  matvec = lambda x: nodes.map_nodes(lambda v: 2.0 * v, x, keep_ties=False)
  solve = lambda mv, rhs: fn.tree(rhs, g=lambda v: v / 2.0)
  return lax.custom_linear_solve(matvec, b, solve, solve)


@adapter("jax.lax.custom_linear_solve[symmetric]")
def _custom_linear_solve_symmetric(args, fn, fam):
  matvec = lambda x: nodes.map_nodes(lambda v: 2.0 * v, x, keep_ties=False)
  solve = lambda mv, rhs: fn.tree(rhs, g=lambda v: v / 2.0)
  return lax.custom_linear_solve(matvec, args, solve, symmetric=True)


@adapter("jax.lax.stop_gradient", fns=False)
def _stop_gradient(args, fn, fam):
  return lax.stop_gradient(args), nodes.map_nodes(jnp.sin, args)


@adapter("jax.lax.optimization_barrier")
def _optimization_barrier(args, fn, fam):
  return body(fn, lax.optimization_barrier(args))


@adapter("jax.lax.platform_dependent")
def _platform_dependent(args, fn, fam):
  return lax.platform_dependent(
      *args,
      cpu=lambda *xs: body(fn, xs),
      default=lambda *xs: nodes.map_nodes(linear, xs),
  )


@adapter("jax.lax.composite", diffs=ONE_SHOT)
def _composite(args, fn, fam):
  return lax.composite(lambda *xs: body(fn, xs), name="tests.user")(*args)


for _name, _collective in (
    ("jax.lax.psum", lambda t: lax.psum(t, "i")),
    ("jax.lax.pmean", lambda t: lax.pmean(t, "i")),
    ("jax.lax.pmax", lambda t: lax.pmax(t, "i")),
    ("jax.lax.pmin", lambda t: lax.pmin(t, "i")),
    ("jax.lax.all_gather", lambda t: lax.all_gather(t, "i")),
    (
        "jax.lax.ppermute",
        lambda t: lax.ppermute(t, "i", [(0, 1), (1, 2), (2, 0)]),
    ),
    ("jax.lax.pshuffle", lambda t: lax.pshuffle(t, "i", [2, 0, 1])),
):

  @adapter(
      _name,
      fns=False,
      diffs=ONE_SHOT
      if _name in ("jax.lax.pmax", "jax.lax.pmin")
      else DIFF_MODES,
  )
  def _in_vmap(args, fn, fam, collective=_collective):
    return jax.vmap(lambda *xs: collective(xs), axis_name="i")(*args)


def _rows(args):
  """Each leaf a (3, 3) array: under a vmap of three, one row per member,
  which scatters and all_to_all split in three."""
  return nodes.map_nodes(lambda x: jnp.outer(x, jnp.arange(1.0, 4.0)), args)


for _name, _collective in (
    ("jax.lax.psum_scatter", lambda t: lax.psum_scatter(t, "i")),
    ("jax.lax.all_to_all", lambda t: lax.all_to_all(t, "i", 0, 0)),
    ("jax.lax.pswapaxes", lambda t: lax.pswapaxes(t, "i", 0)),
):

  @adapter(_name, fns=False)
  def _in_vmap_rows(args, fn, fam, collective=_collective):
    return jax.vmap(lambda *xs: collective(xs), axis_name="i")(*_rows(args))


@adapter("jax.lax.pcast", fns=False, diffs=ONE_SHOT)
def _pcast(args, fn, fam):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  f = jax.shard_map(
      lambda *xs: lax.pcast(xs, "i", to="varying"),
      mesh=mesh,
      in_specs=PartitionSpec(),
      out_specs=PartitionSpec("i"),
  )
  return jax.jit(f)(*args)


@adapter("jax.lax.dce_sink", fns=False)
def _dce_sink(args, fn, fam):
  def program(*xs):
    lax.dce_sink(xs)
    return nodes.map_nodes(jnp.sin, xs)

  return jax.jit(program)(*args)


def _matvec(fn):
  return lambda x: fn.tree(x, g=lambda v: 3.0 * v)


for _name, _solver in (
    ("jax.scipy.sparse.linalg.cg", linalg.cg),
    ("jax.scipy.sparse.linalg.gmres", linalg.gmres),
    ("jax.scipy.sparse.linalg.bicgstab", linalg.bicgstab),
):

  @adapter(_name, n_args=1, fn_modes=LINEAR_MODES, cost="heavy")
  def _solve(args, fn, fam, solver=_solver):
    return solver(_matvec(fn), args[0])[0]


@adapter("jax.scipy.sparse.linalg.cg[x0]", fn_modes=LINEAR_MODES, cost="heavy")
def _cg_x0(args, fn, fam):
  x0 = nodes.map_nodes(lambda v: 0.5 * v, args[0])
  b = nodes.map_nodes(lambda v: v + 0.1 * _float_sum(args[1]), args[0])
  return linalg.cg(_matvec(fn), b, x0=x0)[0]


@adapter("jax.experimental.ode.odeint", diffs=NO_JVP, cost="heavy")
def _odeint(args, fn, fam):
  def dynamics(y, t, extra):
    push = 0.1 * _float_sum(extra)
    return fn.tree(y, g=lambda v: -0.5 * v + push * t)

  return odeint(
      dynamics, args[0], jnp.array([0.0, 0.5]), args[1], rtol=1e-6, atol=1e-6
  )
