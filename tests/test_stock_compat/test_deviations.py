"""The table of deliberate differences against docs/semantics.md."""

import inspect
import os
import re

from test_stock_compat import (
    test_flatten,
    test_registry,
    test_serialization,
    test_treedefs,
)
from test_stock_compat.deviations import DEVIATIONS, Instead
from test_stock_compat.error_cases import ERROR_CASES

# The property tests by name: the places of the table that are not
# hand-written cases name one of them.
PROPERTY_TESTS = {
    name: test
    for module in (
        test_flatten,
        test_registry,
        test_serialization,
        test_treedefs,
    )
    for name, test in vars(module).items()
    if name.startswith("test_") and hasattr(test, "hypothesis")
}


def _documented_items():
  """Item numbers of docs/semantics.md's list of deliberate differences."""
  path = os.path.join(
      os.path.dirname(os.path.abspath(__file__)),
      os.pardir,
      os.pardir,
      "docs",
      "semantics.md",
  )
  with open(path, encoding="utf-8") as f:
    text = f.read()
  title = "## Deliberate differences from stock jaxlib"
  assert title in text, f"{title!r} not found in {path}"
  section = text.split(title, 1)[1].split("\n## ", 1)[0]
  return {int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)}


def test_deviations_table():
  """DEVIATIONS covers exactly the documented items, each with at least one
  place, and every place exists: a hand-written case, or an operation named
  (as a string literal) in the body of the property test of that name."""
  assert set(DEVIATIONS) == _documented_items()
  for item, deviation in DEVIATIONS.items():
    assert deviation.places, item
    for place, instead in deviation.places.items():
      assert isinstance(instead, Instead), place
      if place.startswith("case:"):
        assert place[len("case:") :] in ERROR_CASES, place
        continue
      test_name, op = place.split("/", 1)
      test = PROPERTY_TESTS.get(test_name)
      assert test is not None, place
      body = inspect.getsource(getattr(test, "hypothesis").inner_test)
      assert f'"{op}"' in body, place
