"""Functions that JAX hands back copy and pickle as on stock.

function_copies.py, run here (with the custom wheels) and with stock JAX,
says how each kind of jitted function answers every name of stock's
``dir()`` and each protocol, how every public function that transforms a
function gives a result that copies, deep-copies and pickles, and the
signature of every public callable. Each is compared with stock's, once in a
process that opts nothing in and once in one with an opt-in.
"""

import json
import os

from absl.testing import absltest
from absl.testing import parameterized
from jax._src import test_util as jtu

import stock_reference
import surface_coverage

SCRIPT = os.path.join(os.path.dirname(__file__), "function_copies.py")

# Keyword parameters the series adds to public functions, and why: a
# signature equals stock's once these are taken out.
ADDED_KEYWORDS = {
    # The opt-in flag of the register functions.
    "preserve_relative_identities",
    # jax.api_util.debug_info: which trees of a traced call keep relative
    # identities in its argument names.
    "identity_scopes",
    # broadcast_prefix, imported by public modules: the full tree's treedef,
    # when the caller flattened it already (one walk of a shared DAG).
    "full_treedef",
}
# The public names the opt-in adds.
ADDED_NAMES = surface_coverage.OPT_IN_API
# Public modules the series adds.
ADDED_MODULES = {"jax.experimental.leaf_files"}
# What the registries' repr says in a default value of a signature.
REGISTRY_REPRS = (
    "<pytree.PyTreeRegistry object>",
    "<jaxlib_patch.pytree.PyTreeRegistry object>",
)


def _ours(*args):
  return json.loads(stock_reference.run_child(SCRIPT, *args))


def _stocks(*args):
  return stock_reference.run_with_stock_jax(SCRIPT, "cloudpickle", *args)


def _stock_signature(signature):
  """A signature as stock's would read, the series' keywords taken out; a
  decorator that takes the flag also has a factory form, whose first
  parameter defaults to None."""
  if isinstance(signature, str):
    return signature
  *parameters, returns = signature
  names = [p[0] for p in parameters]
  factory = "preserve_relative_identities" in names
  out = []
  for k, (name, kind, annotation, default) in enumerate(parameters):
    if name in ADDED_KEYWORDS:
      continue
    if factory and k == 0 and default == "None":
      default = None
    if default in REGISTRY_REPRS:
      default = "<PyTreeRegistry object>"
    out.append([name, kind, annotation, default])
  return out + [returns]


class FunctionCopiesTest(parameterized.TestCase):
  """Ours against stock's, per section of function_copies.py's output."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.runs = {}
    for mode in ("nothing", "opt-in"):
      args = () if mode == "nothing" else ("opt-in",)
      cls.runs[mode] = (_ours(*args), _stocks(*args))

  @parameterized.parameters("nothing", "opt-in")
  def test_the_jit_object_answers_as_stocks(self, mode):
    ours, stock = self.runs[mode]
    self.assertEqual(set(ours["jit"]), set(stock["jit"]))
    for kind, row in stock["jit"].items():
      with self.subTest(kind=kind):
        self.assertEqual(ours["jit"][kind], row)

  @parameterized.parameters("nothing", "opt-in")
  def test_transformed_functions_copy_and_pickle_as_stocks(self, mode):
    ours, stock = self.runs[mode]
    # The scan finds the transformations by their signatures: the common
    # ones among them show that it ran.
    for name in (
        "jax.jit",
        "jax.grad",
        "jax.value_and_grad",
        "jax.vmap",
        "jax.jacfwd",
        "jax.jacrev",
        "jax.hessian",
        "jax.checkpoint",
        "jax.custom_jvp",
        "jax.custom_vjp",
        "jax.pmap",
        "jax.named_call",
    ):
      self.assertIn(name, stock["transformed"])
    self.assertEqual(set(ours["transformed"]), set(stock["transformed"]))
    for name, row in stock["transformed"].items():
      with self.subTest(name=name):
        self.assertEqual(ours["transformed"][name], row)

  def test_public_signatures_are_stocks(self):
    ours, stock = self.runs["nothing"]
    self.assertGreater(len(stock["signatures"]), 1000)
    only_stock = set(stock["signatures"]) - set(ours["signatures"])
    self.assertEqual(only_stock, set())
    # A name only here is the opt-in's, or lives in a module that imports
    # here only (the series adds it, or stock's environment lacks a package
    # it needs).
    modules_here_only = set(ours["modules"]) - set(stock["modules"])
    self.assertLessEqual(ADDED_MODULES, modules_here_only)
    for name in set(ours["signatures"]) - set(stock["signatures"]):
      with self.subTest(name=name):
        self.assertTrue(
            name in ADDED_NAMES or name.rsplit(".", 1)[0] in modules_here_only
        )
    for name, signature in stock["signatures"].items():
      with self.subTest(name=name):
        self.assertEqual(
            _stock_signature(ours["signatures"][name]),
            _stock_signature(signature),
        )

  def test_a_pickled_jitted_function_keeps_ties(self):
    ours, _ = self.runs["opt-in"]
    # [the two places are one object, a new one], per copy.
    self.assertEqual(
        ours["ties"],
        {
            name: [True, True]
            for name in ("original", "copy", "deepcopy", "cloudpickle")
        },
    )


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
