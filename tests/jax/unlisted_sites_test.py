"""Ties told at a public function nobody listed.

The functions here stand for a public function JAX might add tomorrow: they
are built the way JAX's own are (a `traceback_util.api_boundary`, trees
flattened with the registries of `jax._src.tree_util`, which write a shared
node out at each place, and functions traced through
`api_util.flatten_fun_nokwargs`) and appear on no list of sites. On
generated trees that tie opted-in nodes, each returns stock's values (a
copy per place, as stock builds them) and warns once per place where its
result, or the arguments it traces the user's function on, hold a tied
node as two objects, naming the places in the caller's terms: nothing
splits in silence.
"""

import warnings

import hypothesis
import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from jax import tree_util
from jax._src import api_util
from jax._src import config as jax_config
from jax._src import core
from jax._src import linear_util as lu
from jax._src import test_util as jtu
from jax._src import traceback_util
from jax._src import tree_util as internal_tree_util
from jax._src.interpreters import partial_eval as pe

from functions_of_each_leaf_test import shared_trees
import stock_reference
from shared_nodes import Param


@traceback_util.api_boundary
def each_leaf(function, tree):
  """`function` of each leaf, as JAX's per-leaf functions compute it."""
  leaves, treedef = internal_tree_util.tree_flatten(tree)
  return treedef.unflatten([function(leaf) for leaf in leaves])


@traceback_util.api_boundary
def traced(function, tree):
  """`function(tree)` traced to a jaxpr and evaluated, as JAX's
  transformations trace the user's functions."""
  leaves, in_tree = internal_tree_util.tree_flatten((tree,))
  debug = api_util.debug_info("traced", function, (tree,), {})
  flat, out_tree = api_util.flatten_fun_nokwargs(
      lu.wrap_init(function, debug_info=debug), in_tree
  )
  avals = [core.shaped_abstractify(leaf) for leaf in leaves]
  jaxpr = pe.trace_to_jaxpr_dynamic(flat, avals)[0]
  out = core.eval_jaxpr(jaxpr, (), *leaves)
  return out_tree().unflatten(out)


def _leaf(seed):
  return jnp.arange(3, dtype=jnp.float32) + seed


def _told(run):
  """What `run()` returns, and the SplitTieWarnings it gave (every one:
  every generated example calls from the same line)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = run()
  return result, [
      w for w in caught if issubclass(w.category, tree_util.SplitTieWarning)
  ]


class UnlistedSitesTest(jtu.JaxTestCase):

  @parameterized.named_parameters(
      ("each_leaf", lambda tree: each_leaf(lambda x: x * 2, tree)),
      ("each_leaf_as_it_is", lambda tree: each_leaf(lambda x: x, tree)),
      (
          "traced",
          lambda tree: traced(lambda t: jax.tree.map(lambda x: x * 2, t), tree),
      ),
  )
  @hypothesis.settings(max_examples=15, deadline=None)
  @hypothesis.given(tree=shared_trees())
  def test_a_split_is_told_once_with_the_places(self, run, tree):
    result, told = _told(lambda: run(tree))
    stock_reference.assert_values_as_on_copies(result, run, tree)
    kept = jax.tree.structure(result) == jax.tree.structure(tree)
    # Kept, or told: never an untied result in silence.
    self.assertTrue(kept or told)
    for warning in told:
      self.assertRegex(
          str(warning.message),
          r"split a tie: the Param at \S+ and \S+ is one object",
      )
      self.assertEqual(warning.filename, __file__)
    places = [str(w.message).split(" is one object")[0] for w in told]
    self.assertEqual(len(places), len(set(places)))  # Once per place.

  def test_the_places_are_named_in_the_callers_terms(self):
    p = Param(_leaf(0))
    with self.assertWarnsRegex(
        tree_util.SplitTieWarning,
        r"each_leaf split a tie: the Param at result\['a'\] and "
        r"result\['b'\] is one object",
    ):
      result = each_leaf(lambda x: x + 1, {"a": p, "b": p})
    self.assertIsNot(result["a"], result["b"])
    with self.assertWarnsRegex(
        tree_util.SplitTieWarning,
        r"traced split a tie: the Param at args\[0\]\[0\] and "
        r"args\[0\]\[1\] is one object in what it was given, and two "
        r"objects in the arguments it traces your function on",
    ):
      traced(lambda pair: pair, [p, p])

  def test_raise_and_allow(self):
    p = Param(_leaf(0))
    with jax_config.split_ties("raise"):
      with self.assertRaisesRegex(
          tree_util.SplitTieError, "each_leaf split a tie"
      ):
        each_leaf(lambda x: x + 1, [p, p])
    with jax_config.split_ties("allow"):
      with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = each_leaf(lambda x: x + 1, [p, p])
    self.assertIsNot(result[0], result[1])

  def test_a_result_that_is_not_a_tree_is_returned_untold(self):
    # A result whose flatten fails (here: an opted-in node that holds
    # itself) cannot have its places named; the call still returns it.
    p = Param(_leaf(0))
    looped = Param(None)
    looped.value = looped

    @traceback_util.api_boundary
    def with_a_loop(tree):
      leaves, treedef = internal_tree_util.tree_flatten(tree)
      return treedef.unflatten([leaf + 1 for leaf in leaves]), looped

    (result, loop), told = _told(lambda: with_a_loop([p, p]))
    self.assertIs(loop, looped)
    self.assertIsNot(result[0], result[1])
    self.assertEmpty(told)

  def test_a_tree_returned_to_jax_itself_is_not_told(self):
    # A public function called by JAX's own code hands its result to JAX,
    # which may split the places on purpose; the user's call is the outer.
    p = Param(_leaf(0))
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      out = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t))([p, p])
    self.assertIs(out[0], out[1])


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
