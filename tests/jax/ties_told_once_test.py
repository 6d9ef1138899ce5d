"""Where a public function cannot give a tie back, the user is told once,
at their own call, with a cause that applies; values are stock's.

`ravel_pytree` lays a shared node out at each of its places (code ravels
two trees and combines them), so its `unravel` rebuilds a copy per place;
`lax.associative_scan`, `lax.reduce` and `cond` keep a tie unless the
user's function returns the places apart; `custom_vmap` and
`closure_convert` give their function a copy per place, and tell where it
returns its arguments. A library's own maps of one split tie (Equinox's
`filter_vmap` maps the user's arguments three times) are told once for the
user's call.
"""

import dataclasses
import warnings

from absl.testing import absltest
from absl.testing import parameterized

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax import tree_util
from jax._src import test_util as jtu
from jax.flatten_util import ravel_pytree

from shared_nodes import Param

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)

tree_util.preserve_relative_identities(eqx.Module)


class Linear(eqx.Module):
  w: jax.Array


class Pair(eqx.Module):
  a: Linear
  b: Linear


@tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  a: object
  b: object


def _split_ties_told(function):
  """What `function()` returns, and the SplitTieWarnings it gave."""
  with warnings.catch_warnings(record=True) as caught:
    # Python's default: once per line of the user's and message.
    warnings.simplefilter("default")
    result = function()
  told = [
      str(w.message)
      for w in caught
      if issubclass(w.category, tree_util.SplitTieWarning)
  ]
  return result, told


def _custom_vmap_of(f):
  f = jax.custom_batching.custom_vmap(f)
  f.def_vmap(lambda axis_size, in_batched, m: (f(m), in_batched[0]))
  return f


def _converted(f, model):
  converted, consts = jax.closure_convert(f, model)
  return converted(model, *consts)


class TiesToldOnceTest(jtu.JaxTestCase):

  def assert_stocks_values(self, result, expected):
    got = jax.tree.leaves(tree_util.tree_unshare(result))
    want = jax.tree.leaves(expected)
    self.assertLen(got, len(want))
    for a, b in zip(got, want):
      np.testing.assert_allclose(a, b, rtol=1e-6)

  def test_unravel_of_a_tied_tree_is_told_with_its_cause(self):
    p = Param(jnp.arange(3.0))
    model = Model(p, p)
    flat, unravel = ravel_pytree(model)
    np.testing.assert_array_equal(flat, [0, 1, 2, 0, 1, 2])
    result, told = _split_ties_told(lambda: unravel(flat * 2))
    self.assertLen(told, 1)
    self.assertIn("ravel_pytree's unravel split a tie", told[0])
    self.assertIn("at tree.a and tree.b", told[0])
    self.assertIn("tree_retie", told[0])
    self.assertNotIn("Usual causes", told[0])
    self.assert_stocks_values(
        result, Model(Param(2 * p.value), Param(2 * p.value))
    )
    # tree_retie, which the warning names, ties it again.
    retied = tree_util.tree_retie(result, model)
    self.assertIs(retied.a, retied.b)

  def test_unravel_of_an_untied_tree_is_silent(self):
    model = Model(Param(jnp.arange(3.0)), Param(jnp.ones(3)))
    flat, unravel = ravel_pytree(model)
    result, told = _split_ties_told(lambda: unravel(flat))
    self.assertEqual(told, [])
    self.assert_stocks_values(result, model)

  def test_a_scan_whose_fn_splits_the_tie_is_told_and_computes_stocks(self):
    p = Param(jnp.arange(1.0, 6.0))

    def fn(x, y):  # Sums at one place, multiplies at the other.
      return (Param(x[0].value + y[0].value), Param(x[1].value * y[1].value))

    result, told = _split_ties_told(
        lambda: lax.associative_scan(fn, (p, p), reverse=True)
    )
    self.assertLen(told, 1)
    self.assertIn("lax.associative_scan split a tie", told[0])
    self.assertIn("at elems[0] and elems[1]", told[0])
    self.assertIsNot(result[0], result[1])
    q = Param(p.value)
    self.assert_stocks_values(
        result, lax.associative_scan(fn, (p, q), reverse=True)
    )
    np.testing.assert_allclose(result[1].value, [120, 120, 60, 20, 5])

  def test_a_scan_whose_fn_keeps_the_tie_keeps_it_silently(self):
    p = Param(jnp.arange(1.0, 6.0))
    fn = lambda x, y: jax.tree.map(jnp.multiply, x, y)
    result, told = _split_ties_told(lambda: lax.associative_scan(fn, (p, p)))
    self.assertEqual(told, [])
    self.assertIs(result[0], result[1])
    np.testing.assert_allclose(result[0].value, [1, 2, 6, 24, 120])

  @parameterized.named_parameters(
      (name, name, where)
      for name, where in (
          ("reduce", "operands[0] and operands[1]"),
          ("cond", "result.a and result.b"),
          ("switch", "result.a and result.b"),
          ("custom_vmap", "args[0].a and args[0].b"),
          ("closure_convert", "example_args[0].a and example_args[0].b"),
      )
  )
  def test_a_function_returning_the_places_apart_is_told(self, name, where):
    p = Param(jnp.arange(1.0, 4.0))
    model = Model(p, p)
    apart = lambda m: Model(Param(m.a.value * 2), Param(m.b.value * 3))
    calls = {
        "reduce": lambda: lax.reduce(
            (p, p),
            (Param(0.0), Param(0.0)),
            lambda x, y: (
                Param(x[0].value + y[0].value),
                Param(jnp.maximum(x[1].value, y[1].value)),
            ),
            (0,),
        ),
        "cond": lambda: lax.cond(False, lambda m: m, apart, model),
        "switch": lambda: lax.switch(0, [apart, lambda m: m], model),
        "custom_vmap": lambda: _custom_vmap_of(apart)(model),
        "closure_convert": lambda: _converted(apart, model),
    }
    result, told = _split_ties_told(calls[name])
    self.assertLen(told, 1)
    self.assertIn(f"{name} split a tie", told[0])
    self.assertIn(f"at {where}", told[0])
    self.assertNotIn("Usual causes", told[0])
    if name == "reduce":  # Stock's: a sum at one place, a maximum at the other.
      np.testing.assert_allclose(result[0].value, 6.0)
      np.testing.assert_allclose(result[1].value, 3.0)
    else:
      np.testing.assert_allclose(result.a.value, [2.0, 4.0, 6.0])
      self.assertIsNot(result.a, result.b)

  def test_filter_vmap_over_a_spec_that_splits_a_tie_is_told_once(self):
    shared = Linear(jnp.ones((2, 3)))
    mapped = eqx.filter_vmap(
        lambda m: m.a.w.sum() + m.b.w.sum(), in_axes=(Pair(0, None),)
    )
    result, told = _split_ties_told(lambda: mapped(Pair(shared, shared)))
    self.assertLen(told, 1)
    self.assertIn("the Linear at rest[0][0].a and rest[0][0].b", told[0])
    np.testing.assert_allclose(result, [9.0, 9.0])  # 3 mapped + 6 not.

  def test_filter_vmap_called_at_two_lines_is_told_at_each(self):
    shared = Linear(jnp.ones((2, 3)))
    mapped = eqx.filter_vmap(
        lambda m: m.a.w @ m.b.w.T, in_axes=(Pair(0, None),)
    )
    _, first = _split_ties_told(lambda: mapped(Pair(shared, shared)))
    _, second = _split_ties_told(lambda: mapped(Pair(shared, shared)))
    self.assertLen(first, 1)
    self.assertLen(second, 1)

  def test_telling_follows_the_warnings_filters(self):
    tied = lambda: Model(*(2 * [Param(jnp.ones(3))]))
    split = lambda m: jax.tree.map(
        lambda v, s: v + s, m, Model(Param(0.0), Param(1.0))
    )
    category = tree_util.SplitTieWarning
    with warnings.catch_warnings(record=True) as caught:
      # Hidden first, then told at the same line: 'ignore' keeps nothing.
      warnings.simplefilter("ignore", category)
      for _ in range(2):
        split(tied())
      warnings.simplefilter("default", category)
      for _ in range(2):
        split(tied())  # Once for this line.
    self.assertLen([w for w in caught if w.category is category], 1)
    with warnings.catch_warnings():
      warnings.simplefilter("error", category)
      for _ in range(2):  # Every call raises.
        with self.assertRaises(category):
          split(tied())


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
