"""jax.jit called with each kind of argument a user passes, on whichever jax
imports: prints, per kind, the jitted function's C++ cache size and its
count of C++ cache misses after a few calls, and what the calls returned.

jit_call_kinds_test.py runs this script (it imports nothing of it, so that
the flags below stay out of its own process) on the custom wheels and on stock
jax 0.10.2 (each in a child process of its own, with two virtual CPU
devices) and requires the same cache size and misses on both: a kind that
stock's C++ fast path takes and ours sends to Python shows as fewer entries.
Every kind has a jitted function of its own (a new lambda), so that no
kind's entries land in another's cache, stock's global one included.

A kind is (name, function, a list of calls, static_argnums,
static_argnames); a call is (args, kwargs). Each call is made CALLS times.
"""

import os

# Before jax starts: two devices for the sharded array; the CPU only, so
# that both sides see the same backend.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import collections
import dataclasses
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import test_util as jtu

CALLS = 3


def _register_model(cls):
  """`cls` as a dataclass node, opted in where this jax has the opt-in."""
  register = jax.tree_util.register_dataclass
  if "preserve_relative_identities" in inspect.signature(register).parameters:
    return register(preserve_relative_identities=True)(cls)
  return register(cls)


@dataclasses.dataclass
class Layer:
  w: jax.Array


# An opted-in class on the custom wheels, a plain dataclass node on stock.
Layer = _register_model(Layer)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  left: Layer
  right: Layer


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
  w: jax.Array
  b: jax.Array


Point = collections.namedtuple("Point", ["x", "y"])


def scaled(scale, x):
  return scale * x


def kinds():
  """Every kind of call: (name, function, calls, static_argnums,
  static_argnames)."""
  x = jnp.arange(8, dtype=jnp.float32)
  y = jnp.ones(8, jnp.float32)
  typed_key = jax.random.key(0)
  raw_key = jax.random.PRNGKey(0)
  weak = jax.jit(lambda: 1.5)()  # A weak-typed float32 scalar.
  assert weak.weak_type
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
  sharded = jax.device_put(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  )
  assert len(sharded.sharding.device_set) == 2
  layer = Layer(w=x)
  # New functions at each use: a kind's entries stay in its own cache.
  tree_map_double = lambda: lambda *a, **k: jax.tree.map(
      lambda t: t * 2, (a, k)
  )
  uniform = lambda: lambda k: (k, jax.random.uniform(k, (3,)))
  return [
      ("one array", lambda a: a + 1, [((x,), {})], (), ()),
      ("two arrays", lambda a, b: a * b, [((x, y), {})], (), ()),
      ("numpy array", lambda a: a + 1, [((np.arange(4.0),), {})], (), ()),
      ("numpy scalar", lambda a: a + 1, [((np.float32(2.0),), {})], (), ()),
      ("numpy int scalar", lambda a: a + 1, [((np.int32(2),), {})], (), ()),
      ("python float", lambda a: a + 1, [((2.0,), {})], (), ()),
      ("python int", lambda a: a + 1, [((2,), {})], (), ()),
      ("python bool", lambda a: jnp.logical_not(a), [((True,), {})], (), ()),
      ("python complex", lambda a: a * 2, [((1 + 2j,), {})], (), ()),
      ("array beside scalars", lambda a, s, t: a * s + t, [((x, 2.0, 3), {})],
       (), ()),
      ("bfloat16", lambda a: a + 1, [((jnp.ones(4, jnp.bfloat16),), {})], (),
       ()),
      ("complex64", lambda a: a * 2j, [((jnp.ones(4, jnp.complex64),), {})],
       (), ()),
      ("typed key", uniform(), [((typed_key,), {})], (), ()),
      ("typed key beside an array",
       lambda k, a: a + jax.random.uniform(k), [((typed_key, x), {})], (), ()),
      ("typed keys, two", lambda k, j: jax.random.uniform(k) +
       jax.random.uniform(j), [((typed_key, jax.random.key(1)), {})], (), ()),
      ("raw key", uniform(), [((raw_key,), {})], (), ()),
      ("raw key beside an array",
       lambda k, a: a + jax.random.uniform(k), [((raw_key, x), {})], (), ()),
      ("typed key in a dict", lambda d: jax.random.uniform(d["k"]),
       [(({"k": typed_key},), {})], (), ()),
      ("None", lambda a: a, [((None,), {})], (), ()),
      ("array beside None", lambda a, n: a + 1, [((x, None), {})], (), ()),
      ("keyword argument", lambda a: a + 1, [((), {"a": x})], (), ()),
      ("array and keyword argument", lambda a, b: a * b, [((x,), {"b": y})],
       (), ()),
      ("typed key as keyword", lambda k: jax.random.uniform(k),
       [((), {"k": typed_key})], (), ()),
      ("static argnum", lambda a, n: a * n, [((x, 3), {}), ((x, 4), {})], (1,),
       ()),
      ("static argname", lambda a, n: a * n,
       [((x,), {"n": 3}), ((x,), {"n": 4})], (), ("n",)),
      ("static argnum, typed key", lambda k, n: jax.random.uniform(k, (n,)),
       [((typed_key, 2), {})], (1,), ()),
      ("list", tree_map_double(), [(([x, y],), {})], (), ()),
      ("tuple", tree_map_double(), [(((x, y),), {})], (), ()),
      ("dict", tree_map_double(), [(({"a": x, "b": y},), {})], (), ()),
      ("namedtuple", tree_map_double(), [((Point(x, y),), {})], (), ()),
      ("dataclass", tree_map_double(), [((Params(w=x, b=y),), {})], (), ()),
      ("tree_util.Partial", lambda p, a: p(a),
       [((jax.tree_util.Partial(scaled, y), x), {})], (), ()),
      ("sharded array", lambda a: a * 2, [((sharded,), {})], (), ()),
      ("weak-typed array", lambda a: a * 2, [((weak,), {})], (), ()),
      ("no arguments", lambda: jnp.arange(3.0), [((), {})], (), ()),
      ("opted-in model, shared layer", tree_map_double(),
       [((Model(left=layer, right=layer),), {})], (), ()),
      ("opted-in layer beside an array", lambda m, a: m.w * a,
       [((layer, x), {})], (), ()),
  ]


def output_leaves(out):
  """The leaves of an output in stock's layout, a shared node's once per
  place (`tree_unshare`, where this jax has it), so that both sides' lists
  compare."""
  unshare = getattr(jax.tree_util, "tree_unshare", lambda tree: tree)
  return jax.tree.leaves(unshare(out))


def plain(leaf):
  """A leaf of an output as JSON: keys as their data, complex as pairs."""
  if isinstance(leaf, jax.Array) and jnp.issubdtype(
      leaf.dtype, jax.dtypes.prng_key
  ):
    leaf = jax.random.key_data(leaf)
  value = np.asarray(leaf)
  if np.iscomplexobj(value):
    value = np.stack([value.real, value.imag], axis=-1)
  return [str(np.asarray(leaf).dtype), value.astype(np.float64).tolist()]


def run_kind(function, calls, static_argnums, static_argnames):
  """The cache size, the C++ cache misses, and each call's first and last
  outputs (the first from the slow path, the last from the fast one where
  the kind takes it)."""
  jitted = jax.jit(
      function, static_argnums=static_argnums, static_argnames=static_argnames
  )
  outputs = []
  with jtu.count_pjit_cpp_cache_miss() as misses:
    for args, kwargs in calls:
      first = last = None
      for k in range(CALLS):
        out = jax.block_until_ready(jitted(*args, **kwargs))
        leaves = [plain(leaf) for leaf in output_leaves(out)]
        if k == 0:
          first = leaves
        last = leaves
      outputs.append({"first": first, "last": last})
  return {
      "cache_size": jitted._cache_size(),
      "misses": misses(),
      "outputs": outputs,
  }


def main():
  results = {}
  for name, function, calls, static_argnums, static_argnames in kinds():
    results[name] = run_kind(function, calls, static_argnums, static_argnames)
  print(json.dumps({"calls": CALLS, "kinds": results}))


if __name__ == "__main__":
  main()
