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

A kind is (name, function, its calls, static_argnums, static_argnames); a
call is (args, kwargs). Each call is made CALLS times.
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


def twice(leaf):
  """2 * leaf, and a typed key's draw (keys take no arithmetic)."""
  if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    return jax.random.uniform(leaf, (3,))
  return leaf * 2


def scaled(scale, x):
  return scale * x


def call(*args, **kwargs):
  """One call of a kind, as its arguments."""
  return args, kwargs


def kind(name, function, *calls, static_argnums=(), static_argnames=()):
  return name, function, calls, static_argnums, static_argnames


def kinds():
  """Every kind of call: (name, function, calls, static_argnums,
  static_argnames)."""
  x = jnp.arange(8, dtype=jnp.float32)
  y = jnp.ones(8, jnp.float32)
  key = jax.random.key(0)
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
  double = lambda: lambda *a, **k: jax.tree.map(twice, (a, k))
  uniform = lambda: lambda k, *a: (k, jax.random.uniform(k, (3,)), a)
  return [
      kind("one array", double(), call(x)),
      kind("two arrays", double(), call(x, y)),
      kind("numpy array", double(), call(np.arange(4.0))),
      kind("numpy scalar", double(), call(np.float32(2.0))),
      kind("numpy int scalar", double(), call(np.int32(2))),
      kind("python float", double(), call(2.0)),
      kind("python int", double(), call(2)),
      kind("python bool", lambda b: jnp.logical_not(b), call(True)),
      kind("python complex", double(), call(1 + 2j)),
      kind("array beside scalars", double(), call(x, 2.0, 3)),
      kind("bfloat16", double(), call(jnp.ones(4, jnp.bfloat16))),
      kind("complex64", double(), call(jnp.ones(4, jnp.complex64) * 1j)),
      kind("typed key", uniform(), call(key)),
      kind("typed key beside an array", uniform(), call(key, x)),
      kind("typed keys, two", uniform(), call(key, jax.random.key(1))),
      kind("raw key", uniform(), call(raw_key)),
      kind("raw key beside an array", uniform(), call(raw_key, x)),
      kind("typed key in a dict", double(), call({"k": key})),
      kind("None", double(), call(None)),
      kind("array beside None", double(), call(x, None)),
      kind("keyword argument", double(), call(a=x)),
      kind("array and keyword argument", double(), call(x, b=y)),
      kind("typed key as keyword", double(), call(k=key)),
      kind(
          "static argnum",
          lambda a, n: a * n,
          call(x, 3),
          call(x, 4),
          static_argnums=(1,),
      ),
      kind(
          "static argname",
          lambda a, n: a * n,
          call(x, n=3),
          call(x, n=4),
          static_argnames=("n",),
      ),
      kind(
          "static argnum, typed key",
          lambda k, n: jax.random.uniform(k, (n,)),
          call(key, 2),
          static_argnums=(1,),
      ),
      kind("list", double(), call([x, y])),
      kind("tuple", double(), call((x, y))),
      kind("dict", double(), call({"a": x, "b": y})),
      kind("namedtuple", double(), call(Point(x, y))),
      kind("dataclass", double(), call(Params(w=x, b=y))),
      kind(
          "tree_util.Partial",
          lambda p, a: p(a),
          call(jax.tree_util.Partial(scaled, y), x),
      ),
      kind("sharded array", double(), call(sharded)),
      kind("weak-typed array", double(), call(weak)),
      kind("no arguments", lambda: jnp.arange(3.0), call()),
      kind("opted-in model, shared layer", double(), call(Model(layer, layer))),
      kind("opted-in layer beside an array", double(), call(layer, x)),
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
