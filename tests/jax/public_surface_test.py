"""JAX's public surface with opted-in nodes computes what stock computes,
and keeps the ties it was given or says so.

A generated differential test (issue 31): each public function of jax,
jax.lax, jax.tree_util, jax.tree, jax.scipy.sparse.linalg,
jax.experimental.ode and the custom-rule APIs that takes pytrees or user
functions is called through a small adapter (`surface_api_*.py`) on
arguments that share opted-in nodes in one of several patterns, with user
functions that return the sharing they were given, less or more, and
differentiated where the API allows (`surface_programs.py`). The oracle is
the same program on twins registered without the opt-in, which JAX treats
as stock does, read in stock's layout (`surface_oracle.py`: a tied
gradient is the sum of its copies'; the public tree functions list a tied
node's leaves once); for one case of each adapter, stock JAX itself in a
child process (`surface_stock.py`). Test ids name the API, the sharing
pattern, the user function's mode and the differentiation. Where the user
function returns the ties it was given, every returned tree laid out as the
arguments keeps their ties, or the call told of the split
(`test_ties_kept_or_told`).
"""

import json
import os
import re
import subprocess
import warnings

import pytest
from jax import tree_util

import stock_reference
import surface_coverage
import surface_nodes as nodes
import surface_oracle
import surface_table

HERE = os.path.dirname(os.path.abspath(__file__))

# Known failures of the patched JAX, by a regular expression over case ids:
# each is a finding to fix, not a difference to accept (strict: a case that
# starts passing must lose its mark).
KNOWN_FAILURES: dict[str, str] = {}


def _marks(case):
  return [
      pytest.mark.xfail(strict=True, reason=reason)
      for pattern, reason in KNOWN_FAILURES.items()
      if re.fullmatch(pattern, case.id)
  ]


def _params(cases):
  return [pytest.param(c, id=c.id, marks=_marks(c)) for c in cases]


_OURS = {}


def _run_ours(case):
  """The case's arguments, result with the opt-in and the splits it told
  of, computed once per session. A user function that returns less sharing
  than it was given splits a tie, and the call tells of it."""
  if case.id not in _OURS:
    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always", tree_util.SplitTieWarning)
      args, result = surface_table.run_case_with_args(case, nodes.OPTED)
    for warning in told:
      assert issubclass(warning.category, tree_util.SplitTieWarning), warning
      assert "split a tie" in str(warning.message), warning
      # The operation named is the one the user called: no name of JAX's
      # internals (a private module or function, jax._cpp_pjit).
      operation = str(warning.message).split(" split a tie")[0]
      assert not re.search(r"(^|\.)_", operation), warning.message
    _OURS[case.id] = args, result, told
  return _OURS[case.id]


def _ours(case):
  return _run_ours(case)[1]


@pytest.mark.parametrize("case", _params(surface_table.CASES))
def test_same_as_twins_not_opted_in(case):
  twin = surface_oracle.reference(surface_table.run_case(case, nodes.PLAIN))
  surface_oracle.check(_ours(case), twin)


# The cases whose user functions return the ties they were given, on
# arguments that share: each returned tree laid out as the arguments (or as
# one of them) keeps their ties, or the call told of the split. Not judged:
# APIs whose result is by definition made of trees flattened one by one.
SEPARATE_SCOPES = {
    "jax.tree_util.treedef_tuple": "joins treedefs of arguments flattened "
    "one by one: a node in two of them is in none's sharing",
}
TIED_CASES = [
    c
    for c in surface_table.CASES
    if c.pattern != "distinct"
    and c.fn_mode in ("keep", "-")
    and c.diff == "none"  # A derivative's ties are test_same_as_twins'.
    and c.api not in SEPARATE_SCOPES
]


@pytest.mark.parametrize("case", _params(TIED_CASES))
def test_ties_kept_or_told(case):
  args, result, told = _run_ours(case)
  surface_oracle.check_ties(result, args, told, as_given=case.fn_mode == "-")


def _stock_sample():
  """One case per adapter, drawn by the fixed seed of the table, that
  shares a node if the adapter has one that does."""
  by_api = {}
  for case in surface_table.CASES:
    best = by_api.get(case.api)
    if best is None or (
        best.pattern == "distinct" and case.pattern != "distinct"
    ):
      by_api[case.api] = case
  return [by_api[api] for api in sorted(by_api)]


STOCK_SAMPLE = _stock_sample()


@pytest.fixture(scope="module")
def stock_results():
  python = stock_reference.stock_python("stock jax 0.10.2")
  done = subprocess.run(
      [python, "-E", "-s", os.path.join(HERE, "surface_stock.py")],
      input=json.dumps([c.id for c in STOCK_SAMPLE]),
      env=stock_reference.child_environment(),
      capture_output=True,
      text=True,
      check=True,
      cwd=HERE,
  )
  return json.loads(done.stdout)


@pytest.mark.parametrize("case", _params(STOCK_SAMPLE))
def test_same_as_stock_jax(case, stock_results):
  stock = stock_results[case.id]
  assert "error" not in stock, f"the program fails on stock: {stock}"
  surface_oracle.check(surface_table.run_case(case, nodes.PLAIN), stock)
  surface_oracle.check(_ours(case), stock)


def test_every_public_function_is_an_adapter_or_excluded_with_a_reason():
  missing, stale = surface_coverage.unclassified(surface_table.ADAPTERS)
  assert not missing, (
      "public functions with no adapter and no reason to have none: "
      f"{missing}"
  )
  assert not stale, f"classified names that are not public functions: {stale}"
