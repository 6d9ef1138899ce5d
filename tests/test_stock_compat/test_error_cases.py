"""Hand-written cases, mostly error paths (error_cases.py), and the recursion
depth that errors leak: the same outcomes as stock."""

import pytest

from test_stock_compat.strategies import OURS, STOCK
from test_stock_compat.deviations import DEVIATION_AT
from test_stock_compat.compare import available_depth, both, expect_same_error
from test_stock_compat.inputs import make_leaf_predicate
from test_stock_compat.error_case_inputs import I
from test_stock_compat.error_cases import ERROR_CASES


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_hand_written_case(name):
  """Each hand-written case (mostly error paths) has the same outcome, or
  the one DEVIATIONS documents for it."""
  place = f"case:{name}"
  both(name, ERROR_CASES[name], place=place if place in DEVIATION_AT else None)


def _leak_of(fn, repeat=20):
  """Recursion levels leaked by calling fn (expected to raise) repeat times."""
  before = available_depth()
  for _ in range(repeat):
    try:
      fn()
    except Exception:  # noqa: BLE001
      pass
  return before - available_depth()


NESTED_ERRORS = {
    "flatten_nested_unsortable": lambda s: s.regs["full"].flatten(
        [[{1: 1, "a": 2}]]
    ),
    "flatten_nested_raising_to_iterable": lambda s: s.regs["full"].flatten(
        [[I.raising_junk]]
    ),
    "flatten_nested_raising_predicate": lambda s: s.regs["full"].flatten(
        [(1, (2,))], make_leaf_predicate("raises")
    ),
    "flatten_with_path_nested_unsortable": lambda s: s.regs[
        "full"
    ].flatten_with_path([[{1: 1, "a": 2}]]),
}


@pytest.mark.parametrize("name", sorted(NESTED_ERRORS))
def test_recursion_depth_leak_not_worse_than_stock(name):
  """Errors raised below the root must not leak more interpreter recursion
  depth in the candidate than in stock (stock leaks one level per nesting
  level; the candidate may leak less, never more).  Both must raise."""
  expect_same_error(name, NESTED_ERRORS[name])
  stock_leak = _leak_of(lambda: NESTED_ERRORS[name](STOCK))
  ours_leak = _leak_of(lambda: NESTED_ERRORS[name](OURS))
  assert ours_leak <= stock_leak, (name, ours_leak, stock_leak)
