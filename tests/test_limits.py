"""Limits: very deep and very wide trees, and a treedef with 100,000 references.

* Depth. tests/test_bad_input.py checks that flattening a 100,000-deep tree
  raises RecursionError in the main thread with a huge recursion limit. Here:
  the same in threads with small stacks (256 KiB, 512 KiB, 1 MiB) and in the
  main thread, for flatten, flatten_with_path and flatten with a predicate;
  small trees still flatten in a thread with a 256 KiB stack; every other
  operation on a 100,000-deep *treedef* (made by `__setstate__`, since
  flatten refuses such depth) works without recursion, in the main thread
  and in a 256 KiB thread: unflatten, walk, from_iterable_tree,
  flatten_up_to, ==, hash, repr, pickle, children, node_data,
  from_node_data_and_children, compose. Each case runs in a child process,
  so a crash fails the case instead of the test run.
* Width. A 1,000,000-leaf tree flattens, unflattens and flattens up to in
  memory proportional to its size: the peak RSS growth is at most 15 times
  that of a 100,000-leaf tree (about 10 is expected), with and without
  shared opted-in nodes.
* Sharing. In a treedef with 100,000 references to one shared node, the
  node data is compared (and printed) once, not once per reference.

How the time grows (linear, not quadratic, in depth and in references) is
measured by bench/bench_limits.py: the suite asserts no timings.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest

from jaxlib_patch import pytree as pt

from harness import run_child

PRELUDE = """
import json, pickle, sys, threading
from jaxlib_patch import pytree as pt
assert pt.__file__ == {module!r}, pt.__file__

class Node:
  def __init__(self, *children):
    self.children = children

REG = pt.PyTreeRegistry()
REG.__module__ = "__main__"
REG.__name__ = "REG"
REG.register_node(Node, lambda n: (n.children, None),
                  lambda aux, ch: Node(*ch), preserve_relative_identities=True)

def deep(kind, depth):
  tree = 1
  for _ in range(depth):
    tree = [tree] if kind == "list" else (
        {{"a": tree}} if kind == "dict" else Node(tree))
  return tree

# FREEING: a 100,000-deep Python object is freed in the main thread only.
# That is the interpreter's own limit, not the module's: CPython 3.13.0
# crashes freeing a 100,000-deep list in a thread with a 256 KiB stack
# (module or not), where 3.11 and 3.12 do not. The threads only run the
# operations under test on such objects, and may make them.
def in_thread(fn, stack_size):
  result = []
  if stack_size:
    threading.stack_size(stack_size)
  try:
    t = threading.Thread(target=lambda: result.append(fn()))
    t.start()
    t.join()
  finally:
    threading.stack_size(0)
  assert result, "the thread raised"
  return result[0]
""".format(module=pt.__file__)


# ---------------------------------------------------------------------------
# Depth.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("stack_kib", [0, 256, 512, 1024])
@pytest.mark.parametrize("kind", ["list", "dict", "opted-in"])
def test_deep_tree_raises_recursion_error_in_any_thread(kind, stack_kib):
  """100,000 levels: RecursionError (never a crash), in the main thread or a
  thread with a small stack, with the recursion limit raised very high."""
  out = run_child(PRELUDE + f"""
old = sys.getrecursionlimit()
sys.setrecursionlimit(10**7)
tree = deep({kind!r}, 100_000)  # Made and freed in the main thread: FREEING.
def attempt():
  outcomes = []
  for call in (lambda: REG.flatten(tree),
               lambda: REG.flatten_with_path(tree),
               lambda: REG.flatten(tree, lambda x: False),
               lambda: REG.flatten_with_path(tree, lambda p, x: False)):
    try:
      leaves, _ = call()
      outcomes.append("ok" if len(leaves) == 1 else "wrong")
    except RecursionError:
      outcomes.append("RecursionError")
  return outcomes
if {stack_kib}:
  outcomes = in_thread(attempt, {stack_kib} * 1024)
else:
  outcomes = attempt()
sys.setrecursionlimit(old)
assert sys.getrecursionlimit() == old
print(json.dumps(outcomes))
""")
  outcomes = json.loads(out.splitlines()[-1])
  assert all(o in ("ok", "RecursionError") for o in outcomes), outcomes


def test_small_trees_flatten_in_a_thread_with_a_256_kib_stack():
  """A thread with a 256 KiB stack can flatten small trees.

  (Finding F4 in docs/hardening.md, fixed in 951b98d: the C-stack guard kept
  max(stack / 4, 256 KiB) free, so in a thread whose whole stack was 256 KiB
  every flatten -- even of the single leaf `1` -- raised RecursionError.
  Stock jaxlib flattens these, and crashes at depth 1,000 instead.)
  """
  out = run_child(PRELUDE + """
def attempt():
  results = {}
  shared = Node(1, 2)
  for name, tree in [("leaf", 1), ("list", [1, (2, 3)]),
                     ("dag", [shared, {"a": shared}]),
                     ("depth 50", deep("list", 50))]:
    try:
      leaves, td = REG.flatten(tree)
      REG.flatten_with_path(tree)
      results[name] = "ok"
    except RecursionError as e:
      results[name] = f"RecursionError: {e}"
  return results
print(json.dumps(in_thread(attempt, 256 * 1024)))
""")
  results = json.loads(out.splitlines()[-1])
  assert results == {
      "leaf": "ok",
      "list": "ok",
      "dag": "ok",
      "depth 50": "ok",
  }, results


DEEP_TREEDEF = """
DEPTH = 100_000

def deep_treedef(kind):
  # Post-order: the innermost leaf first, then DEPTH nodes of one child.
  if kind == "list":
    nodes = [(0, 0, None, None, 1, 1)]
    nodes += [(4, 1, None, None, 1, i + 2) for i in range(DEPTH)]
  else:
    # A chain of opted-in nodes, each also holding a reference to the
    # innermost one, X = Node(leaf): L_i = Node(L_(i-1), X), L_0 = X.
    nodes = [(0, 0, None, None, 1, 1), (6, 1, None, Node, 1, 2)]
    for i in range(1, DEPTH + 1):
      nodes.append((6, 0, None, Node, 0, 1, 2 * i - 1))  # The reference.
      nodes.append((6, 2, None, Node, 1, 2 * i + 2))     # L_i.
  td = pt.PyTreeDef.__new__(pt.PyTreeDef)
  td.__setstate__((REG, nodes))
  return td
"""


@pytest.mark.parametrize("where", ["main", "thread 256 KiB"])
@pytest.mark.parametrize("kind", ["list", "opted-in"])
def test_deep_treedef_operations(kind, where):
  """Every operation but flatten on a 100,000-deep treedef: no recursion."""
  out = run_child(PRELUDE + DEEP_TREEDEF + f"""
sys.setrecursionlimit(10**7)
INNER = REG.flatten((1, 2))[1]  # For compose; flatten itself is tested above.
def attempt():
  td = deep_treedef({kind!r})
  assert td.num_leaves == 1
  results = {{}}
  kept = []  # What the operations return, some of it 100,000 deep: FREEING.
  def check(name, fn):
    try:
      kept.append(fn())
      results[name] = "ok"
    except RecursionError:
      results[name] = "RecursionError"
  out = []
  def unflatten():
    x = td.unflatten(["leaf"])
    depth = 0
    while isinstance(x, (list, Node)):
      x = x[0] if isinstance(x, list) else x.children[0]
      depth += 1
    assert x == "leaf", x
    assert depth == DEPTH + ({kind!r} == "opted-in"), depth
    out.append(td.unflatten(["leaf"]))
  check("unflatten", unflatten)
  check("walk", lambda: td.walk(lambda c, d: c, lambda x: x, ["leaf"]))
  check("flatten_up_to", lambda: td.flatten_up_to(out[0]) == ["leaf"] or
        1 / 0)
  iterable = td.walk(lambda c, d: list(c), lambda x: x, ["leaf"])
  check("from_iterable_tree", lambda: td.from_iterable_tree(iterable))
  other = deep_treedef({kind!r})
  check("==", lambda: (td == other and not td != other) or 1 / 0)
  check("hash", lambda: hash(td) == hash(other) or 1 / 0)
  check("repr", lambda: len(repr(td)) > 2 * DEPTH or 1 / 0)
  check("pickle", lambda: pickle.loads(pickle.dumps(td)) == td or 1 / 0)
  check("children", lambda: sum(c.num_nodes for c in td.children()) ==
        td.num_nodes - 1 or 1 / 0)
  check("rebuild", lambda: pt.PyTreeDef.from_node_data_and_children(
      REG, td.node_data(), td.children()) == td or 1 / 0)
  check("compose", lambda: td.compose(INNER).num_leaves == 2 or 1 / 0)
  # The 100,000-deep objects go back to the main thread: FREEING.
  return results, (out, iterable, kept)
results, deep_objects = (in_thread(attempt, 256 * 1024) if {where!r} != "main"
                         else attempt())
del deep_objects
print(json.dumps(results))
""")
  results = json.loads(out.splitlines()[-1])
  # These operations are iterative: they must all work at any depth.
  assert results == {name: "ok" for name in results}, results
  assert len(results) == 11


# ---------------------------------------------------------------------------
# Width: memory proportional to size.
# ---------------------------------------------------------------------------

MEMORY = """
import gc, json, sys
from jaxlib_patch import pytree as pt
assert pt.__file__ == {module!r}, pt.__file__

def status_kib(field):
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise LookupError(field)

def reset_peak():
  # Resets VmHWM (Linux >= 4.0). Not ru_maxrss: that one starts from the
  # parent's RSS, inherited across fork and exec.
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    pass

n, kind = {n}, {kind!r}
reg = pt.PyTreeRegistry()
class P:
  def __init__(self, kids):
    self.kids = kids
reg.register_node(P, lambda p: (p.kids, None), lambda a, k: P(k),
                  preserve_relative_identities=True)
leaf = object()   # One leaf object n times: the tree is only its lists.
if kind == "plain":
  tree = [[leaf] * 1000 for _ in range(n // 1000)]
else:
  # n / 10 opted-in nodes of 10 leaves, each met twice.
  nodes = [P([leaf] * 10) for _ in range(n // 10)]
  tree = [[node, node] for node in nodes]
gc.collect()
reset_peak()
before = status_kib("VmRSS")
leaves, td = reg.flatten(tree)
out = td.unflatten(leaves)
up = td.flatten_up_to(out)
assert len(leaves) == len(up) == td.num_leaves == n
peak = status_kib("VmHWM")
print(json.dumps({{"n": n, "growth_kib": peak - before}}))
"""


@pytest.mark.skipif(
    not os.path.exists("/proc/self/status"), reason="needs Linux's /proc"
)
@pytest.mark.parametrize("kind", ["plain", "shared"])
def test_memory_is_proportional_to_size(kind):
  growth = {}
  for n in (100_000, 1_000_000):
    out = run_child(MEMORY.format(module=pt.__file__, n=n, kind=kind))
    growth[n] = json.loads(out.splitlines()[-1])["growth_kib"]
  # Peak RSS growth of flatten + unflatten + flatten_up_to (leaves, treedef,
  # output tree, leaves again): about 10x for 10x the leaves.
  assert growth[100_000] > 0, growth
  ratio = growth[1_000_000] / growth[100_000]
  print(
      f"{kind}: {growth} KiB, ratio {ratio:.1f}, "
      f"{growth[1_000_000] * 1024 / 1_000_000:.0f} bytes per leaf"
  )
  assert ratio <= 15, growth


# ---------------------------------------------------------------------------
# Sharing: 100,000 references to one node.
# ---------------------------------------------------------------------------


class Aux:
  """Aux data that counts how often it is compared and printed."""

  eq_calls = 0
  str_calls = 0

  def __eq__(self, other):
    Aux.eq_calls += 1
    return isinstance(other, Aux)

  def __hash__(self):
    return 0

  def __repr__(self):
    Aux.str_calls += 1
    return "Aux"


class Shared:
  """Opted-in custom node whose node data is the counting ``Aux`` itself, so
  that every comparison and print of it by the module is counted
  (nodes.KNode's is a tuple, which compares identical items without calling
  their ``__eq__``)."""

  def __init__(self, aux, *children):
    self.aux = aux
    self.children = children


REG = pt.PyTreeRegistry()
REG.__module__ = __name__
REG.__name__ = "REG"
REG.register_node(
    Shared,
    lambda s: (s.children, s.aux),
    lambda aux, ch: Shared(aux, *ch),
    preserve_relative_identities=True,
)


def shared_treedefs(n):
  tree = [Shared(Aux(), 1, 2)] * n
  leaves, td = REG.flatten(tree)
  _, td2 = REG.flatten([Shared(Aux(), 1, 2)] * n)
  return tree, leaves, td, td2


def test_references_are_compared_and_printed_once():
  """Node data of a shared node: compared once by ==, printed once by repr,
  whatever the number of references."""
  for n in (10, 100_000):
    _, _, td, td2 = shared_treedefs(n)
    assert td.num_nodes == n + 3 and td.num_leaves == 2
    Aux.eq_calls = Aux.str_calls = 0
    assert td == td2
    assert Aux.eq_calls == 1
    text = repr(td)
    assert Aux.str_calls == 1
    assert text.count("#1#") == n - 1
    hash(td)
    assert Aux.eq_calls == 1  # hash does not look at node data.


def test_pickle_of_many_references_round_trips():
  _, leaves, td, _ = shared_treedefs(100_000)
  back = pickle.loads(pickle.dumps(td))
  assert back == td and hash(back) == hash(td)
  out = back.unflatten(leaves)
  assert all(x is out[0] for x in out)
