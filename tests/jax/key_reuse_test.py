"""jax_debug_key_reuse on a tied key: one opted-in node that holds a key,
passed at two places, is one key inside `jax.jit`, so a function that
draws from both places consumes it twice and the checker says so, as it
says so for the same function called without `jit` (on stock too). Stock's
`jit` gets two inputs and cannot see it; a tie makes the reuse visible.
Two nodes around the same key array are two inputs, as on stock."""

import dataclasses

from absl.testing import absltest
import jax
from jax._src import config
from jax._src import test_util as jtu
from jax.errors import KeyReuseError
import numpy as np


@jax.tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Key:
  key: jax.Array


def draw_twice(a, b):
  return jax.random.normal(a.key, (2,)) + jax.random.normal(b.key, (2,))


class KeyReuseTest(jtu.JaxTestCase):

  def test_a_tied_key_drawn_twice_is_reuse(self):
    key = Key(jax.random.key(0))
    with config.debug_key_reuse(True):
      with self.assertRaises(KeyReuseError):
        draw_twice(key, key)  # Without jit, as on stock.
      with self.assertRaisesRegex(KeyReuseError, "already consumed"):
        jax.jit(draw_twice)(key, key)

  def test_two_nodes_of_one_key_array_are_two_inputs(self):
    raw = jax.random.key(0)
    with config.debug_key_reuse(True):
      out = jax.jit(draw_twice)(Key(raw), Key(raw))
    expected = 2 * jax.random.normal(raw, (2,))
    np.testing.assert_allclose(out, expected, rtol=1e-6)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
