"""Calls of a signature fixed in advance (an AOT-compiled function, an
Exported) with arguments that share otherwise than those it was lowered
with: stock, which has no sharing, runs them, so they read in the lowering's
layout where the leaves allow it, and fail with the places named where they
do not."""

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import export
from jax._src import test_util as jtu

from shared_nodes import Param

ARRAYS = [jnp.arange(3.0) + 10.0 * i for i in range(3)]

# A slot of the arguments: which array it holds, and whether its node is a
# new object around that array at the lowering and at the call (else the
# one node of that array, shared by every slot that holds it so).
SLOTS = st.lists(
    st.tuples(st.integers(0, 2), st.booleans(), st.booleans()),
    min_size=1,
    max_size=4,
)


def weighted_sum(*params):
  # Each position weighs differently, so a slot read from another shows.
  return sum(k * p.value for k, p in enumerate(params, start=1))


def arguments(slots, side):
  nodes = [Param(a) for a in ARRAYS]
  return [Param(ARRAYS[i]) if new[side] else nodes[i] for i, *new in slots]


class FixedSignatureCallsTest(jtu.JaxTestCase):

  @settings(max_examples=25, deadline=None)
  @given(slots=SLOTS)
  def test_compiled_call_with_other_sharing_on_the_same_arrays(self, slots):
    lowered, called = arguments(slots, 0), arguments(slots, 1)
    compiled = jax.jit(weighted_sum).lower(*lowered).compile()
    expected = weighted_sum(*called)
    # The second call is the C++ dispatch's, after the first one's miss.
    for _ in range(2):
      self.assertAllClose(compiled(*called), expected)
    self.assertAllClose(compiled(*lowered), weighted_sum(*lowered))

  @settings(max_examples=25, deadline=None)
  @given(slots=SLOTS)
  def test_exported_call_with_other_sharing_on_the_same_arrays(self, slots):
    lowered, called = arguments(slots, 0), arguments(slots, 1)
    exported = export.export(jax.jit(weighted_sum))(*lowered)
    expected = weighted_sum(*called)
    self.assertAllClose(exported.call(*called), expected)
    # Traced, a new node's array is a tracer of its own: read as one with
    # another place's only where the call ties what the lowering tied.
    if all(not new[1] for _, *new in slots if not new[0]):
      self.assertAllClose(jax.jit(exported.call)(*called), expected)

  def test_exported_from_specs_of_two_objects_called_with_one(self):
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    exported = export.export(jax.jit(weighted_sum))(Param(spec), Param(spec))
    w = Param(ARRAYS[1])
    np.testing.assert_allclose(exported.call(w, w), 3.0 * ARRAYS[1])

  def test_places_of_one_lowered_node_holding_other_arrays_are_refused(self):
    w = Param(ARRAYS[0])
    compiled = jax.jit(weighted_sum).lower(w, w).compile()
    with self.assertRaisesRegex(TypeError, "that is the object at args\\[0\\]"):
      compiled(w, Param(ARRAYS[1]))
    exported = export.export(jax.jit(weighted_sum))(w, w)
    with self.assertRaisesRegex(ValueError, "structural differences"):
      exported.call(w, Param(ARRAYS[1]))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
