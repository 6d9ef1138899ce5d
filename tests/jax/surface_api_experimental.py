"""Adapters of the public-surface test: the public functions of
jax.experimental (and jax.flatten_util) that take the user's trees or
functions.

Each adapter is `call(args, fn, fam)`, as in `surface_api_jax.py`.
"""

import jax
import jax.numpy as jnp
from jax.experimental import checkify
from jax.experimental import multihost_utils
from jax.experimental import sparse
from jax.experimental.compute_on import compute_on2
from jax.experimental.layout import Layout, with_layout_constraint
from jax.flatten_util import ravel_pytree

from surface_programs import (
    NO_GRAD,
    ONE_SHOT,
    adapter,
    body,
    linear,
)


def _user(fn):
  return lambda *xs: body(fn, xs)


@adapter("jax.flatten_util.ravel_pytree", fns=False)
def _ravel_pytree(args, fn, fam):
  flat, unravel = ravel_pytree(args)
  return unravel(linear(flat))


@adapter("jax.experimental.checkify.checkify")
def _checkify(args, fn, fam):
  def checked(*xs):
    checkify.check(jnp.all(jnp.isfinite(jax.tree.leaves(xs)[0])), "finite")
    return body(fn, xs)

  error, out = checkify.checkify(checked)(*args)
  error.throw()
  return out


@adapter(
    "jax.experimental.multihost_utils.broadcast_one_to_all",
    fns=False,
    diffs=ONE_SHOT,  # Through NumPy: not differentiable.
)
def _broadcast_one_to_all(args, fn, fam):
  return multihost_utils.broadcast_one_to_all(args)


@adapter(
    "jax.experimental.multihost_utils.process_allgather",
    fns=False,
    diffs=ONE_SHOT,
)
def _process_allgather(args, fn, fam):
  # One process: each leaf gains a leading axis of one.
  return jax.tree.map(lambda x: x[0], multihost_utils.process_allgather(args))


@adapter(
    "jax.experimental.multihost_utils.assert_equal", fns=False, diffs=ONE_SHOT
)
def _assert_equal(args, fn, fam):
  multihost_utils.assert_equal(args)
  return args


def _one_device_mesh():
  return jax.make_mesh((1,), ("i",), devices=jax.devices()[:1])


@adapter(
    "jax.experimental.multihost_utils.host_local_array_to_global_array",
    fns=False,
    diffs=ONE_SHOT,
)
def _host_local_to_global(args, fn, fam):
  mesh = _one_device_mesh()
  spec = jax.sharding.PartitionSpec()
  global_args = multihost_utils.host_local_array_to_global_array(
      args, mesh, spec
  )
  return multihost_utils.global_array_to_host_local_array(
      global_args, mesh, spec
  )


@adapter("jax.experimental.sparse.sparsify")
def _sparsify(args, fn, fam):
  return sparse.sparsify(_user(fn))(*args)


@adapter("jax.experimental.compute_on.compute_on2", diffs=NO_GRAD)
def _compute_on2(args, fn, fam):
  placed = compute_on2(
      _user(fn),
      compute_type="device_host",
      out_memory_spaces=jax.memory.Space.Device,
  )
  return jax.jit(placed)(*args)


@adapter("jax.experimental.layout.with_layout_constraint", fns=False)
def _with_layout_constraint(args, fn, fam):
  return jax.jit(lambda xs: with_layout_constraint(xs, Layout((0,))))(args)
