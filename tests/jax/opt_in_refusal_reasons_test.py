"""The reasons `jax.tree_util.preserve_relative_identities` gives when it
refuses a class: each names what is wrong with that class.

`object` is refused because every class derives from it, not because it is a
type of leaves (the message once said "a type of array or scalar leaves (or
a base of one, <class 'str'>)", naming whichever leaf type came first).
preserve_relative_identities_test.py checks which classes are refused; this
file checks the words.
"""

import dataclasses
import numbers

from absl.testing import absltest

import jax
import numpy as np
from jax import tree_util
from jax._src import test_util as jtu


class RefusalReasonsTest(jtu.JaxTestCase):

  def _reason(self, cls):
    with self.assertRaises(ValueError) as caught:
      tree_util.preserve_relative_identities(cls)
    self.assertFalse(tree_util.has_relative_identities(cls))
    return str(caught.exception)

  def test_object_is_refused_as_the_base_of_every_class(self):
    reason = self._reason(object)
    self.assertIn("<class 'object'> is the base of every class", reason)
    self.assertIn("every pytree node type and every type of leaf", reason)
    self.assertNotIn("a type of array or scalar leaves", reason)

  def test_a_leaf_type_is_refused_as_one(self):
    for leaf_type in (np.ndarray, int, float):
      reason = self._reason(leaf_type)
      self.assertIn(
          f"{leaf_type} is a type of array or scalar leaves, which are never "
          "pytree nodes",
          reason,
      )
      self.assertNotIn("a base of", reason)

  def test_a_base_of_leaf_types_names_one_it_is_the_base_of(self):
    for base in (numbers.Number, jax.Array):
      reason = self._reason(base)
      self.assertRegex(
          reason,
          rf"{base} is a base of <class '[\w.]+'>, a type of array or scalar "
          "leaves, which are never pytree nodes",
      )

  def test_registering_a_registered_class_again_with_the_flag_says_how(self):
    @dataclasses.dataclass
    class Registered:
      x: object

    tree_util.register_dataclass(Registered)
    with self.assertRaisesRegex(
        ValueError,
        r"Duplicate custom dataclass PyTreeDef type registration for .*"
        r"call preserve_relative_identities\(cls\) on the registry "
        r"\(jax\.tree_util\.preserve_relative_identities\(cls\) in JAX\)",
    ):
      tree_util.register_dataclass(
          Registered, preserve_relative_identities=True
      )
    self.assertFalse(tree_util.has_relative_identities(Registered))
    tree_util.preserve_relative_identities(Registered)  # What it says works.
    self.assertTrue(tree_util.has_relative_identities(Registered))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
