"""The differential tests' fixture: room for stock's recursion leaks.

Stock jaxlib leaks recursion depth on some error paths. Raising the limit
gives Python's depth back, but on CPython 3.12 and later the C recursion
budget is fixed, so what stock leaks is lost for the rest of the process:
the package is named to run after the module's own deep tests
(test_prefix_broadcast.py's 1,000-level chain)."""

import sys

import pytest

from test_stock_compat.compare import HEADROOM, available_depth


@pytest.fixture(autouse=True, scope="module")
def _compensate_recursion_leaks():
  old_limit = sys.getrecursionlimit()
  before = available_depth()
  sys.setrecursionlimit(old_limit + HEADROOM)
  yield
  leaked = before + HEADROOM - available_depth()
  sys.setrecursionlimit(old_limit + max(leaked, 0))
