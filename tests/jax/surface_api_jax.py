"""Adapters of the public-surface test: jax's transformations, the grad
family, callbacks and custom rules.

Each adapter is `call(args, fn, fam)`: `args` the arguments a sharing
pattern built, `fn` the user's function (`surface_programs.UserFn`, None
where the API takes none), `fam` the node classes (opted in or not).
"""

import contextlib
import io
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.experimental import sparse
from jax.sharding import NamedSharding, PartitionSpec

import surface_nodes as nodes
from surface_programs import (
    NO_GRAD,
    NO_JVP,
    ONE_SHOT,
    adapter,
    body,
    cotangents,
    linear,
    scalar_of,
    summed,
    tangents_like,
)

# For the variants whose cotangents share more than the function's result:
# a result that shares nothing, so that they share strictly more. (Where a
# result and its cotangents tie one node alike, the cotangent is one value
# for one output node, by design, where stock reads one per place.)
SHARES_NOTHING = ("less",)


def _user(fn):
  return lambda *xs: body(fn, xs)


def _argnums(args):
  return tuple(range(len(args)))


@adapter("jax.jit")
def _jit(args, fn, fam):
  return jax.jit(_user(fn))(*args)


@adapter("jax.disable_jit")
def _disable_jit(args, fn, fam):
  with jax.disable_jit():
    return jax.jit(_user(fn))(*args)


@adapter("jax.jit[aot]", diffs=ONE_SHOT)
def _jit_aot(args, fn, fam):
  return jax.jit(_user(fn)).lower(*args).compile()(*args)


@adapter("jax.jit[kwargs]")
def _jit_kwargs(args, fn, fam):
  f = jax.jit(lambda a, *, b: body(fn, (a, b)))
  return f(args[0], b=args[1])


# jax's derivatives, and jax.experimental.sparse's, which take the same
# trees (sparse arrays among their leaves).
for _name, _transform in (
    ("jax.grad", jax.grad),
    ("jax.jacfwd", jax.jacfwd),
    ("jax.jacrev", jax.jacrev),
    ("jax.jacobian", jax.jacobian),
    ("jax.experimental.sparse.grad", sparse.grad),
    ("jax.experimental.sparse.jacfwd", sparse.jacfwd),
    ("jax.experimental.sparse.jacrev", sparse.jacrev),
    ("jax.experimental.sparse.jacobian", sparse.jacobian),
):

  @adapter(_name, diffs=ONE_SHOT)
  def _derivative(args, fn, fam, transform=_transform):
    return summed(transform(scalar_of(fn), argnums=_argnums(args))(*args), args)


for _name, _transform in (
    ("jax.value_and_grad", jax.value_and_grad),
    ("jax.experimental.sparse.value_and_grad", sparse.value_and_grad),
):

  @adapter(_name, diffs=ONE_SHOT)
  def _value_and_grad(args, fn, fam, transform=_transform):
    value, grads = transform(scalar_of(fn), argnums=_argnums(args))(*args)
    return value, summed(grads, args)


@adapter("jax.hessian", n_args=1, diffs=ONE_SHOT)
def _hessian(args, fn, fam):
  return summed(jax.hessian(scalar_of(fn))(*args), args[0], depth=2)


@adapter("jax.vjp", diffs=ONE_SHOT)
def _vjp(args, fn, fam):
  out, f_vjp = jax.vjp(_user(fn), *args)
  return out, summed(f_vjp(cotangents(out, fam)), args)


@adapter(
    "jax.vjp[cotangents_share_more]", diffs=ONE_SHOT, fn_modes=SHARES_NOTHING
)
def _vjp_tied(args, fn, fam):
  out, f_vjp = jax.vjp(_user(fn), *args)
  return out, summed(f_vjp(cotangents(out, fam, tie_all=True)), args)


@adapter("jax.fwd_and_bwd", diffs=ONE_SHOT)
def _fwd_and_bwd(args, fn, fam):
  fwd, bwd = jax.fwd_and_bwd(_user(fn), argnums=_argnums(args))
  out, residuals = fwd(*args)
  return out, summed(bwd(residuals, cotangents(out, fam)), args)


@adapter("jax.jvp", diffs=ONE_SHOT)
def _jvp(args, fn, fam):
  return jax.jvp(_user(fn), args, tangents_like(args))


@adapter("jax.jvp[tangents_share_more]", diffs=ONE_SHOT)
def _jvp_tied(args, fn, fam):
  return jax.jvp(_user(fn), args, cotangents(args, fam, tie_all=True))


@adapter("jax.linearize", diffs=ONE_SHOT)
def _linearize(args, fn, fam):
  out, f_jvp = jax.linearize(_user(fn), *args)
  return out, f_jvp(*tangents_like(args))


@adapter("jax.linearize[tangents_share_more]", diffs=ONE_SHOT)
def _linearize_tied(args, fn, fam):
  out, f_jvp = jax.linearize(_user(fn), *args)
  return out, f_jvp(*cotangents(args, fam, tie_all=True))


def _linear_user(fn):
  return lambda *xs: fn.tree(xs, g=linear)


@adapter("jax.linear_transpose", diffs=ONE_SHOT)
def _linear_transpose(args, fn, fam):
  out = _linear_user(fn)(*args)
  transpose = jax.linear_transpose(_linear_user(fn), *args)
  return summed(transpose(cotangents(out, fam)), args)


@adapter(
    "jax.linear_transpose[cotangents_share_more]",
    diffs=ONE_SHOT,
    fn_modes=SHARES_NOTHING,
)
def _linear_transpose_tied(args, fn, fam):
  out = _linear_user(fn)(*args)
  transpose = jax.linear_transpose(_linear_user(fn), *args)
  return summed(transpose(cotangents(out, fam, tie_all=True)), args)


@adapter("jax.vmap")
def _vmap(args, fn, fam):
  return jax.vmap(_user(fn))(*args)


@adapter("jax.vmap[in_axes_tree]")
def _vmap_axes(args, fn, fam):
  in_axes = nodes.map_nodes(lambda _: 0, args)
  return jax.vmap(_user(fn), in_axes=in_axes, out_axes=0)(*args)


@adapter("jax.pmap", diffs=ONE_SHOT, cost="heavy")
def _pmap(args, fn, fam):
  return jax.pmap(_user(fn))(*args)


@adapter("jax.shard_map", diffs=("none", "grad"), cost="heavy")
def _shard_map(args, fn, fam):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  f = jax.shard_map(
      _user(fn), mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec()
  )
  return jax.jit(f)(*args)


@adapter("jax.smap", diffs=ONE_SHOT, cost="heavy")
def _smap(args, fn, fam):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  mapped = jax.smap(_user(fn), in_axes=None, out_axes=0, axis_name="i")
  f = jax.shard_map(
      mapped, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec("i")
  )
  return jax.jit(f)(*args)


@adapter("jax.checkpoint")
def _checkpoint(args, fn, fam):
  return jax.checkpoint(_user(fn))(*args)


@adapter("jax.remat[nothing_saveable]")
def _remat(args, fn, fam):
  policy = jax.checkpoint_policies.nothing_saveable
  return jax.remat(_user(fn), policy=policy)(*args)


@adapter("jax.named_call")
def _named_call(args, fn, fam):
  return jax.named_call(_user(fn), name="user_function")(*args)


@adapter("jax.eval_shape", diffs=ONE_SHOT)
def _eval_shape(args, fn, fam):
  return jax.eval_shape(_user(fn), *args)


@adapter("jax.make_jaxpr", diffs=ONE_SHOT)
def _make_jaxpr(args, fn, fam):
  return jax.make_jaxpr(_user(fn), return_shape=True)(*args)[1]


@adapter("jax.device_put", fns=False)
def _device_put(args, fn, fam):
  return jax.device_put(args)


@adapter("jax.device_put[device]", fns=False, diffs=ONE_SHOT)
def _device_put_device(args, fn, fam):
  return jax.device_put(args, jax.devices()[1])


@adapter("jax.device_get", fns=False, diffs=ONE_SHOT)
def _device_get(args, fn, fam):
  return jax.device_get(jax.jit(lambda *xs: xs)(*args))


@adapter("jax.block_until_ready", fns=False, diffs=ONE_SHOT)
def _block_until_ready(args, fn, fam):
  return jax.block_until_ready(jax.jit(lambda *xs: xs)(*args))


@adapter("jax.copy_to_host_async", fns=False, diffs=ONE_SHOT)
def _copy_to_host_async(args, fn, fam):
  out = jax.jit(lambda *xs: xs)(*args)
  jax.copy_to_host_async(out)
  return out


@adapter("jax.lax.with_sharding_constraint", fns=False)
def _with_sharding_constraint(args, fn, fam):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  sharding = NamedSharding(mesh, PartitionSpec())
  return jax.jit(lambda *xs: jax.lax.with_sharding_constraint(xs, sharding))(
      *args
  )


@adapter("jax.reshard", fns=False, diffs=ONE_SHOT)
def _reshard(args, fn, fam):
  mesh = jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])
  return jax.reshard(args, NamedSharding(mesh, PartitionSpec()))


def _spec(args):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)


@adapter("jax.pure_callback", diffs=ONE_SHOT)
def _pure_callback(args, fn, fam):
  return jax.jit(
      lambda *xs: jax.pure_callback(lambda *ys: fn.numpy(ys), _spec(xs), *xs)
  )(*args)


@adapter("jax.pure_callback[vmap]", diffs=ONE_SHOT)
def _pure_callback_vmap(args, fn, fam):
  call = lambda *xs: jax.pure_callback(
      lambda *ys: fn.numpy(ys), _spec(xs), *xs, vmap_method="sequential"
  )
  return jax.vmap(call)(*args)


@adapter("jax.experimental.io_callback", diffs=ONE_SHOT)
def _io_callback(args, fn, fam):
  return jax.jit(
      lambda *xs: io_callback(lambda *ys: fn.numpy(ys), _spec(xs), *xs)
  )(*args)


@adapter("jax.debug.callback", fns=False, diffs=("none", "grad", "jvp"))
def _debug_callback(args, fn, fam):
  seen = []

  def program(*xs):
    jax.debug.callback(lambda *ys: seen.append(ys), *xs)
    return jax.tree.map(jnp.sin, xs)

  out = jax.jit(program)(*args)
  jax.effects_barrier()
  return out, tuple(seen)


@adapter("jax.debug.print", fns=False, diffs=ONE_SHOT)
def _debug_print(args, fn, fam):
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    jax.jit(lambda *xs: jax.debug.print("{} {}", *xs[:2]))(*args)
    jax.effects_barrier()
  return text.getvalue()


@adapter("jax.debug.log", fns=False, diffs=ONE_SHOT)
def _debug_log(args, fn, fam):
  text = io.StringIO()
  handler = logging.StreamHandler(text)
  logger = logging.getLogger("jax._src.debugging")
  level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  try:
    jax.jit(lambda *xs: jax.debug.log("{} {}", *xs[:2]))(*args)
    jax.effects_barrier()
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
  return text.getvalue()


@adapter("jax.custom_jvp")
def _custom_jvp(args, fn, fam):
  f = jax.custom_jvp(_user(fn))
  f.defjvp(lambda primals, tangents: jax.jvp(_user(fn), primals, tangents))
  return f(*args)


@adapter("jax.custom_vjp", diffs=NO_JVP)
def _custom_vjp(args, fn, fam):
  f = jax.custom_vjp(_user(fn))
  # The residuals are the primals themselves, sharing as they were given.
  f.defvjp(
      lambda *xs: (_user(fn)(*xs), xs),
      lambda xs, ct: jax.vjp(_user(fn), *xs)[1](ct),
  )
  return f(*args)


@adapter("jax.custom_vjp[symbolic_zeros]", diffs=NO_JVP)
def _custom_vjp_symbolic(args, fn, fam):
  f = jax.custom_vjp(_user(fn))

  def fwd(*wrapped):
    xs = jax.custom_derivatives.custom_vjp_primal_tree_values(wrapped)
    return _user(fn)(*xs), xs

  def bwd(xs, ct):
    ct = jax.tree.map(
        lambda c: jnp.zeros(c.shape, c.dtype)
        if isinstance(c, jax.custom_derivatives.SymbolicZero)
        else c,
        ct,
        is_leaf=lambda c: isinstance(c, jax.custom_derivatives.SymbolicZero),
    )
    return jax.vjp(_user(fn), *xs)[1](ct)

  f.defvjp(fwd, bwd, symbolic_zeros=True)
  return f(*args)


@adapter("jax.custom_gradient", diffs=NO_JVP)
def _custom_gradient(args, fn, fam):
  @jax.custom_gradient
  def f(*xs):
    out, f_vjp = jax.vjp(_user(fn), *xs)
    return out, f_vjp

  return f(*args)


@adapter("jax.closure_convert")
def _closure_convert(args, fn, fam):
  def run(*xs):
    scale = jnp.sum(nodes.places(xs)[0])
    inner = lambda *ys: fn.tree(ys, g=lambda y: y * scale)
    converted, consts = jax.closure_convert(inner, *xs)
    return converted(*xs, *consts)

  return run(*args)


@adapter(
    "jax.custom_derivatives.linear_call",
    diffs=("none", "grad", "vjp"),
    fn_modes=("keep", "less"),
)
def _linear_call(args, fn, fam):
  residual = jax.lax.stop_gradient(jnp.sum(nodes.places(args)[0]))
  scale = lambda r, x: fn.tree(x, g=lambda v: v * (1.0 + 0.1 * r))
  return jax.custom_derivatives.linear_call(scale, scale, residual, args)


@adapter("jax.custom_batching.custom_vmap")
def _custom_vmap(args, fn, fam):
  @jax.custom_batching.custom_vmap
  def f(*xs):
    return fn.tree(xs)

  @f.def_vmap
  def rule(axis_size, in_batched, *xs):
    out = fn.tree(xs)
    return out, nodes.map_nodes(lambda _: True, out)

  return jax.vmap(f)(*args)


@adapter("jax.custom_batching.sequential_vmap", diffs=NO_GRAD)
def _sequential_vmap(args, fn, fam):
  return jax.vmap(jax.custom_batching.sequential_vmap(_user(fn)))(*args)


@adapter("jax.tree_util.Partial")
def _partial(args, fn, fam):
  partial = jax.tree_util.Partial(_user(fn), args[0])
  return jax.jit(lambda p, *rest: p(*rest))(partial, *args[1:])
