"""jax.jit on generated calls: the values and the ties of each, cached or not.

The front door sends a call whose arguments hold nothing that could be
shared (leaves under None, builtin containers and dataclasses not opted in,
one keyword argument at most, 32 objects at most) to stock's own dispatch,
and any other call through one flatten of ours. The calls here mix both:
containers, a plain dataclass, opted-in nodes (some held at two places),
positional and keyword arguments, in trees small and past the walk's
budget. Each is made twice, the second time from the C++ cache, and must
compute what the function computes unjitted, with the same ties.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src import test_util as jtu

from shared_nodes import Param


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
  """A dataclass node not opted in: a plain node."""

  first: object
  second: object


Point = collections.namedtuple("Point", "x y")

# The nodes a tree may hold; a leaf is an index into the call's arrays, a
# "shared" leaf the one Param of that array, the same object wherever it
# appears in the call.
LEAVES = st.one_of(
    st.tuples(st.just("array"), st.integers(0, 3)),
    st.tuples(st.just("param"), st.integers(0, 3)),
    st.tuples(st.just("shared"), st.integers(0, 1)),
    st.just(("none",)),
)


def extend(children):
  return st.one_of(
      st.tuples(st.just("list"), st.lists(children, max_size=3)),
      st.tuples(st.just("tuple"), st.lists(children, max_size=3)),
      st.tuples(
          st.just("dict"),
          st.dictionaries(st.sampled_from("pqr"), children, max_size=3),
      ),
      st.tuples(st.just("point"), children, children),
      st.tuples(st.just("pair"), children, children),
      st.tuples(st.just("many"), children),  # Past the walk's budget.
  )


TREES = st.recursive(LEAVES, extend, max_leaves=6)
CALLS = st.tuples(
    st.lists(TREES, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b"]), TREES, max_size=2),
)


def build(spec, arrays, shared):
  kind, *rest = spec
  if kind == "array":
    return arrays[rest[0]]
  if kind == "param":
    return Param(arrays[rest[0]])
  if kind == "shared":
    return shared[rest[0]]
  if kind == "none":
    return None
  sub = lambda child: build(child, arrays, shared)
  if kind == "list":
    return [sub(c) for c in rest[0]]
  if kind == "tuple":
    return tuple(sub(c) for c in rest[0])
  if kind == "dict":
    return {k: sub(c) for k, c in rest[0].items()}
  if kind == "point":
    return Point(sub(rest[0]), sub(rest[1]))
  if kind == "pair":
    return Pair(sub(rest[0]), sub(rest[1]))
  return [sub(rest[0])] * 40  # "many"


def affine(*args, **kwargs):
  # Each leaf maps to one new value, so a shared node maps to one node.
  return jax.tree.map(lambda x: 2.0 * x + 1.0, (args, kwargs))


class JitCallPathsTest(jtu.JaxTestCase):

  @settings(max_examples=60, deadline=None, derandomize=True)
  @given(CALLS)
  def test_generated_calls_compute_the_values_and_ties_unjitted(self, call):
    specs, kwarg_specs = call
    arrays = [jnp.arange(3.0) + 10.0 * i for i in range(4)]
    shared = [Param(jnp.full(3, -1.0)), Param(jnp.full(3, -2.0))]
    args = [build(s, arrays, shared) for s in specs]
    kwargs = {k: build(s, arrays, shared) for k, s in kwarg_specs.items()}
    expected = affine(*args, **kwargs)
    # A function of its own: jit's C++ caches are keyed on the function.
    jitted = jax.jit(lambda *args, **kwargs: affine(*args, **kwargs))
    for _ in range(2):  # Traced, then from the C++ cache.
      out = jitted(*args, **kwargs)
      # Structure equality compares the ties as well as the nodes.
      self.assertEqual(jax.tree.structure(out), jax.tree.structure(expected))
      for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)
    self.assertEqual(jitted._cache_size(), 1)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
