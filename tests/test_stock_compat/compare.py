"""Running one operation on both modules and comparing what they did."""

import os

from hypothesis import HealthCheck, settings

from test_stock_compat.deviations import DEVIATION_AT
from test_stock_compat.describe import canon, describe_exc
from test_stock_compat.strategies import CALLS, OURS, STOCK

EXAMPLES = int(os.environ.get("PYTREE_EXAMPLES", "300"))
COMPARE_CALLS = os.environ.get("PYTREE_COMPARE_CALLS", "1") != "0"

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    report_multiple_bugs=False,  # shrink one difference per property
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


# ---------------------------------------------------------------------------
# Running one operation on both sides.
# ---------------------------------------------------------------------------


class Ran:
  """What running an operation on one side produced."""

  def __init__(self, value, error, calls):
    self.value, self.error, self.calls = value, error, calls

  @property
  def ok(self):
    return self.error is None

  def describe(self):
    if self.error is not None:
      return describe_exc(self.error)
    return ("ok", canon(self.value))


def run_on(side, fn):
  CALLS.clear()
  try:
    value, error = fn(side), None
  except Exception as ex:  # noqa: BLE001
    value, error = None, ex
  calls = tuple(CALLS)
  CALLS.clear()
  return Ran(value, error, calls)


def both(
    op: str,
    fn,
    *,
    calls: bool = True,
    place: str | None = None,
    ctx: dict | None = None,
):
  """Runs ``fn(side)`` for stock and candidate; asserts identical outcomes.

  ``place`` names the spot in ``DEVIATIONS`` where a documented deliberate
  difference applies (callers pass it only when its condition holds); there
  the candidate must either match stock or do what the table says instead
  (checked with ``ctx``, the inputs the check needs).

  Returns the two ``Ran`` records (stock first) so callers can continue
  with the values each module produced.
  """
  s, o = run_on(STOCK, fn), run_on(OURS, fn)
  sd, od = s.describe(), o.describe()
  if place is None:
    assert sd == od, f"{op}: results differ\n  stock: {sd!r}\n  ours:  {od!r}"
    if calls and COMPARE_CALLS:
      assert s.calls == o.calls, (
          f"{op}: Python callbacks differ\n  stock: {s.calls!r}\n"
          f"  ours:  {o.calls!r}"
      )
    return s, o
  item, instead = DEVIATION_AT[place]
  where = (
      f"{op}: differs from stock beyond deliberate difference {item} "
      f"of docs/semantics.md ({place}: the candidate must "
      f"{instead.text})"
  )
  if sd != od:
    try:
      instead.check(s, o, ctx or {})
    except AssertionError as ex:
      raise AssertionError(
          f"{where}: {ex}\n  stock: {sd!r}\n  ours:  {od!r}"
      ) from None
  if calls and COMPARE_CALLS:
    try:
      (instead.calls or _same_calls)(s, o)
    except AssertionError as ex:
      raise AssertionError(
          f"{where}: Python callbacks: {ex}\n  stock: {s.calls!r}\n"
          f"  ours:  {o.calls!r}"
      ) from None
  return s, o


def _same_calls(s, o):
  assert s.calls == o.calls, "they differ"


def expect_same_error(op: str, fn):
  """Like ``both`` but additionally requires that the operation raises."""
  s, o = both(op, fn)
  assert not s.ok, f"{op}: expected an error, stock returned {s.value!r}"
  return s, o


def check_hash_consistency(a, b):
  """Within one module: a == b must imply hash(a) == hash(b)."""
  try:
    equal = a == b
  except Exception:  # noqa: BLE001  (equality may raise on bad metadata)
    return
  if equal:
    assert hash(a) == hash(b), f"equal treedefs, different hashes: {a!r}"


# ---------------------------------------------------------------------------
# Stock leaks Python recursion depth.
#
# Stock flatten / flatten_with_path leave the interpreter's recursion counter
# raised by one for every nesting level an exception propagates through (a
# raising to_iterable or leaf predicate, unsortable dict keys, ... below the
# root).  This suite provokes many such errors (about a thousand leaked levels
# per run), which would end in spurious RecursionErrors.  The fixture of
# conftest.py gives the interpreter head-room while each test module runs
# and, at the end, leaves the limit raised by exactly the amount leaked, so
# later test modules see the same effective limit as before.
# ---------------------------------------------------------------------------

HEADROOM = 50_000  # Recursion depth a test module may leak.


def available_depth():
  """How many more Python frames can be entered before RecursionError."""
  n = 0

  def dive():
    nonlocal n
    n += 1
    dive()

  try:
    dive()
  except RecursionError:
    pass
  return n
