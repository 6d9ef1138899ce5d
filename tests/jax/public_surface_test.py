"""JAX's public surface with opted-in nodes computes what stock computes.

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
pattern, the user function's mode and the differentiation.
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


def _ours(case):
  """The case's result with the opt-in, computed once per session. A user
  function that returns less sharing than it was given splits a tie, and
  the call tells of it: recorded here (whether each returned tree keeps
  the tie or the call told is not judged yet: a known gap)."""
  if case.id not in _OURS:
    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always", tree_util.SplitTieWarning)
      _OURS[case.id] = surface_table.run_case(case, nodes.OPTED)
    for warning in told:
      assert issubclass(warning.category, tree_util.SplitTieWarning), warning
      assert "split a tie" in str(warning.message), warning
  return _OURS[case.id]


@pytest.mark.parametrize("case", _params(surface_table.CASES))
def test_same_as_twins_not_opted_in(case):
  twin = surface_oracle.reference(surface_table.run_case(case, nodes.PLAIN))
  surface_oracle.check(_ours(case), twin)


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
