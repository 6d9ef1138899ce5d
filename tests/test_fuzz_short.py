"""A short, deterministic run of the fuzzer, and what the fuzzer found.

`fuzz/pytree_fuzz.py` drives registries and treedefs through random
sequences of operations with misbehaving callbacks (see its docstring and
docs/hardening.md). Here it runs a fixed set of programs of a fixed seed (a
few seconds) in worker processes, so that a crash is reported, not fatal, and
the run must have no findings: no crash, no exception of a type other than
ValueError, TypeError, RecursionError, KeyError or the callbacks' own (so no
InternalError of the module), no broken invariant.

Below the campaign: one minimal reproducer per finding, each run in a child
process, so that a crash fails one test (see docs/hardening.md; all fixed
as of 898e7ff).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxlib_patch import pytree as pt

from harness import child_env, run_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZER = os.path.join(ROOT, "fuzz", "pytree_fuzz.py")


def run_campaign(tmp_path, *args):
  report = tmp_path / "report.json"
  proc = subprocess.run(
      [
          sys.executable,
          FUZZER,
          "--seed",
          "0",
          "--programs",
          "500",
          "--json",
          str(report),
          *args,
      ],
      capture_output=True,
      text=True,
      timeout=900,
      env=child_env(),
  )
  print(proc.stdout[-5000:])
  assert report.exists(), f"the fuzzer did not finish:\n{proc.stderr[-5000:]}"
  data = json.loads(report.read_text())
  summary = data["summary"]
  assert summary["module"] == os.path.realpath(pt.__file__)
  return summary, data


def describe(summary, data):
  lines = [f"{summary['findings']} findings, {summary['crashes']} crashes"]
  for f in data["findings"][:5]:
    lines.append(
        f"finding in {f['op']} (seed {f['seed']}, program "
        f"{f['program']}): {f['exception']}\n{f['traceback']}"
    )
  for c in data["crashes"][:5]:
    lines.append(
        f"crash in program {c['program']} at {c['site']}; replay "
        f"with: python fuzz/pytree_fuzz.py --seed {c['seed']} "
        f"--program {c['program']} --verbose"
    )
  return "\n".join(lines)


def test_short_campaign_past_the_known_findings(tmp_path):
  """500 programs, without the generators of the cases tested one by one
  below (docs/hardening.md lists them)."""
  summary, data = run_campaign(tmp_path, "--skip-known")
  assert summary["executions"] > 10_000, summary
  assert summary["programs"] == 500, summary
  assert summary["findings"] == 0 and summary["crashes"] == 0, describe(
      summary, data
  )
  # The campaign does reach the module's error paths.
  for outcome in ("ok", "ValueError", "TypeError", "Boom", "RecursionError"):
    assert summary["outcomes"].get(outcome, 0) > 0, summary["outcomes"]


def test_short_campaign(tmp_path):
  """500 programs with every generator."""
  summary, data = run_campaign(tmp_path)
  assert summary["findings"] == 0 and summary["crashes"] == 0, describe(
      summary, data
  )


# ---------------------------------------------------------------------------
# What the fuzzer's findings showed must hold, each in a child process (a
# crash there fails the test instead of the run).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("trigger", ["hash raises", "eq removes the key"])
@pytest.mark.parametrize("value", ["leaf", "node"])
def test_f1_flatten_up_to_dict_value_lookup_fails(trigger, value):
  """flatten_up_to raises the key's exception, as stock does, when a dict key's
  __hash__ raises or its __eq__ removes it from the dict mid-lookup: no
  missing value may reach the leaves or the work list (docs/hardening.md,
  F1)."""
  run_child(f"""
from jaxlib_patch import pytree as pt

class Boom(Exception):
  pass

ARMED = []

class K:
  def __init__(self, k):
    self.k = k
  def __hash__(self):
    if {trigger!r} == "hash raises" and ARMED:
      raise Boom("hash")
    return hash(self.k)
  def __eq__(self, other):
    if {trigger!r} == "eq removes the key" and ARMED and self is KEY:
      ARMED.clear()
      del TREE[self]
    return isinstance(other, K) and other.k == self.k
  def __lt__(self, other):
    return self.k < other.k

reg = pt.PyTreeRegistry()
value = "leaf" if {value!r} == "leaf" else ["a", "b"]
# The treedef is made from an equal dict with other key objects, so that
# flatten_up_to compares the keys with __eq__.
_, td = reg.flatten({{K(1): value}})
KEY = K(1)
TREE = {{KEY: value}}
ARMED.append(True)
try:
  leaves = td.flatten_up_to(TREE)
except (Boom, KeyError, ValueError) as e:
  print("raised", type(e).__name__)
else:
  print("returned", [repr(x) for x in leaves])  # Reads every leaf.
""")


@pytest.mark.parametrize("source", ["__getstate__", "walk"])
@pytest.mark.parametrize(
    "use", ["repr", "unflatten", "flatten_up_to", "node_data"]
)
def test_f2_handed_out_dict_keys_are_copies(source, use):
  """__getstate__() and walk's f_node hand out copies of a treedef's dict
  keys, as stock does: clearing what they gave leaves repr, unflatten,
  flatten_up_to and node_data intact (docs/hardening.md, F2)."""
  out = run_child(f"""
from jaxlib_patch import pytree as pt
reg = pt.PyTreeRegistry()
_, td = reg.flatten({{"a": 1, "b": 2}})
before = repr(td)
if {source!r} == "__getstate__":
  keys = td.__getstate__()[1][-1][2]
else:
  seen = []
  td.walk(lambda c, d: seen.append(d), lambda x: x, [1, 2])
  keys = seen[-1]
keys.clear()
keys.append(object())
if {use!r} == "repr":
  assert repr(td) == before, repr(td)
elif {use!r} == "unflatten":
  assert td.unflatten([1, 2]) == {{"a": 1, "b": 2}}
elif {use!r} == "flatten_up_to":
  assert td.flatten_up_to({{"a": 1, "b": 2}}) == [1, 2]
else:
  assert td.node_data() == (dict, ["a", "b"])
print("ok")
""")
  assert out.strip().endswith("ok")


def test_f2_setstate_copies_the_callers_dict_keys():
  """__setstate__ copies the caller's list of dict keys, so changing that
  list afterwards cannot change the treedef (docs/hardening.md, F2). It once
  kept it: `nb::list(fields[2])` in serialization.cc did not copy, because
  `fields[2]` is a nanobind accessor, whose conversion to `nb::list` is an
  unchecked borrow (the explicit `list(handle)` constructor, which copies,
  is not chosen). Clearing the list afterwards made repr read past its end
  (a crash)."""
  out = run_child("""
from jaxlib_patch import pytree as pt
reg = pt.PyTreeRegistry()
registry, entries = reg.flatten({"a": 1, "b": 2})[1].__getstate__()
entries = [tuple(e) for e in entries]
keys = entries[-1][2]
td = pt.PyTreeDef.__new__(pt.PyTreeDef)
td.__setstate__((registry, entries))
before = repr(td)
keys.clear()
keys.append(object())
assert repr(td) == before, repr(td)
assert td.unflatten([1, 2]) == {"a": 1, "b": 2}
print("ok")
""")
  assert out.strip().endswith("ok")


@pytest.mark.parametrize("fields", [("only",), ("a", "b", "c"), None, "ab"])
@pytest.mark.parametrize(
    "op", ["flatten_with_path", "flatten_one_level_with_keys"]
)
def test_f3_namedtuple_fields_that_do_not_match(fields, op):
  """With keys, a tuple subclass whose `_fields` is not a tuple of one name
  per item (a wrong length, or a str of the right length such as "ab")
  raises ValueError, as stock does ("A namedtuple's _fields attribute should
  have the same size as the tuple."), never IndexError/TypeError or names
  paired with the wrong items (docs/hardening.md, F3)."""
  out = run_child(f"""
from jaxlib_patch import pytree as pt
class X(tuple):
  _fields = {fields!r}
reg = pt.PyTreeRegistry()
try:
  getattr(reg, {op!r})(X((1, 2)))
except ValueError as e:
  print("ValueError", e)
""")
  assert out.startswith("ValueError"), out


def test_f3_namedtuple_field_name_that_is_not_a_str():
  """A field name that is not a str becomes a GetAttrKey holding its str(),
  as in stock, and the key pickles (docs/hardening.md, F3). It once held an
  int: `key.name` was 1 (stock: '1') and pickling
  the key raised RuntimeError: std::bad_cast. `FieldKey` in flatten.cc
  called `nb::str(fields[i])` on a nanobind accessor, whose conversion to
  `nb::str` is an unchecked borrow, not `str()`."""
  out = run_child("""
import pickle
from jaxlib_patch import pytree as pt
class X(tuple):
  _fields = ("a", 1)
reg = pt.PyTreeRegistry()
try:
  pairs, _ = reg.flatten_with_path(X((1, 2)))
except ValueError as e:
  print("ValueError", e)
else:
  key = pairs[1][0][0]
  assert key.name == "1", repr(key.name)
  assert pickle.loads(pickle.dumps(key)) == key
  assert reg.flatten_one_level_with_keys(X((1, 2)))[0][1][0].name == "1"
  print(repr(key), str(key))
""")
  assert out.startswith("ValueError") or "name='1'" in out, out


def test_f3_forged_namedtuple_arity():
  """A sharing mismatch under a (forged, unpickled) namedtuple node with more
  children than its type has fields raises ValueError, whose message names
  the path, never IndexError from building that path (docs/hardening.md,
  F3)."""
  out = run_child("""
import collections
from jaxlib_patch import pytree as pt
class N:
  pass
reg = pt.PyTreeRegistry()
reg.register_node(N, lambda n: ((), None), lambda a, c: N(),
                  preserve_relative_identities=True)
NT1 = collections.namedtuple("NT1", "x")
NT2 = collections.namedtuple("NT2", "a b")
n = N()
registry, nodes = reg.flatten(NT2(n, n))[1].__getstate__()
nodes = [tuple(e) for e in nodes]
nodes[-1] = nodes[-1][:2] + (NT1,) + nodes[-1][3:]
td = pt.PyTreeDef.__new__(pt.PyTreeDef)
try:
  td.__setstate__((registry, nodes))
  td.flatten_up_to(tuple.__new__(NT1, (N(), N())))
except ValueError as e:
  print("ValueError", e)
""")
  assert out.startswith("ValueError"), out
