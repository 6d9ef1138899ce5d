"""The differential tests' fixture: room for stock's recursion leaks."""

import sys

import pytest

from stock_compat.compare import HEADROOM, available_depth


@pytest.fixture(autouse=True, scope="module")
def _compensate_recursion_leaks():
  old_limit = sys.getrecursionlimit()
  before = available_depth()
  sys.setrecursionlimit(old_limit + HEADROOM)
  yield
  leaked = before + HEADROOM - available_depth()
  sys.setrecursionlimit(old_limit + max(leaked, 0))
