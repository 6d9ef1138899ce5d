"""The inputs of the hand-written stock-compatibility cases (error_cases.py):
treedefs of one side, node data and children to build from, registries
registered twice, pickled states, and the objects both sides are handed
(``I``), one set for both so that their identities and callback logs
compare.

A side is ``strategies.STOCK`` or ``strategies.OURS``: the module and its
registries.
"""

import sys
import warnings

import numpy as np

from test_stock_compat.strategies import (
    DataNode,
    DataOnly,
    Empty,
    Junk,
    KeyedNode,
    MetaOnly,
    Pair,
    PlainNode,
    RegA,
    SentinelLeaf,
    rega_flatten,
    rega_unflatten,
)
from test_stock_compat.compare import available_depth
from test_stock_compat.inputs import f_leaf, f_node, leaf_pool


def treedef_of(side, tree, flavour="full"):
  return side.regs[flavour].flatten(tree)[1]


def from_node_data(side, node_data, children, flavour="full"):
  return side.mod.PyTreeDef.from_node_data_and_children(
      side.regs[flavour], node_data, children
  )


def children_of(side, tree=(1, [2, 3])):
  return treedef_of(side, tree).children()


class _BadAux:
  """Metadata whose ==, hash and str all raise."""

  def __eq__(self, other):
    raise KeyError("eq failed")

  def __hash__(self):
    raise KeyError("hash failed")

  def __str__(self):
    raise IndexError("str failed")


class _NotImplementedAux:

  def __eq__(self, other):
    return NotImplemented

  __hash__ = object.__hash__


class _WeirdEqAux:

  def __eq__(self, other):
    return 5

  __hash__ = object.__hash__


class _RaisingKey:
  """A dict key whose comparison raises a custom error."""

  def __init__(self, v):
    self.v = v

  def __lt__(self, other):
    raise FloatingPointError("no ordering")

  def __hash__(self):
    return hash(self.v)

  def __eq__(self, other):
    return self is other


def fresh_registry(side, **flags):
  return side.mod.PyTreeRegistry(**flags)


def register_twice(side, first, second):
  reg = fresh_registry(side)
  calls = {
      "node": lambda: reg.register_node(RegA, rega_flatten, rega_unflatten),
      "dataclass": lambda: reg.register_dataclass_node(RegA, ["p"], ["q"]),
  }
  calls[first]()
  return calls[second]()


def uninitialized_treedef(side):
  return side.mod.PyTreeDef.__new__(side.mod.PyTreeDef)


LEAF_ENTRY = (0, 0, None, None, 1, 1)


def setstate_then_repr(side, entries):
  """__setstate__ of (registry, entries), then the treedef's repr."""
  treedef = uninitialized_treedef(side)
  treedef.__setstate__((side.regs["full"], entries))
  return repr(treedef)


def setstate_initialized(side):
  """__setstate__ on a treedef that already holds a tree (nanobind warns)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    return treedef_of(side, 1).__setstate__(
        treedef_of(side, (1,)).__getstate__()
    )


def walk(side, tree, f_node, f_leaf, leaves):
  return treedef_of(side, tree).walk(f_node, f_leaf, leaves)


def deeper_than_recursion_limit(side, method):
  """``method`` on nested lists deeper than the recursion limit.

  The limit is lowered to leave only a few hundred frames (this module runs
  with a raised limit), so that stock, which recurses on the C stack, stays
  far from the end of it.
  """
  tree = 1
  for _ in range(3000):
    tree = [tree]
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(old - available_depth() + 500)
  try:
    return getattr(side.regs["full"], method)(tree)
  finally:
    sys.setrecursionlimit(old)


class I:  # noqa: E742
  """Inputs of the hand-written cases, shared by both sides (so that
  objects and callback logs can be compared by identity)."""

  rega = RegA()
  raising_keys = {_RaisingKey(1): 1, _RaisingKey(2): 2}
  leaf0 = SentinelLeaf(0)
  pool2 = leaf_pool(2)
  k1a = KeyedNode((1,), "a")
  k1b = KeyedNode((1,), "b")
  k12a = KeyedNode((1, 2), "a")
  k10 = KeyedNode((1,), 0)
  p1a = PlainNode([1], "a")
  d12t = DataNode(1, 2, "t")
  d12u = DataNode(1, 2, "u")
  bad1 = KeyedNode((), _BadAux())
  bad2 = KeyedNode((), _BadAux())
  bad_child1 = KeyedNode((1,), _BadAux())
  bad_child2 = KeyedNode((1,), _BadAux())
  arr1 = KeyedNode((), np.arange(3))
  arr2 = KeyedNode((), np.arange(3))
  ni1 = KeyedNode((), _NotImplementedAux())
  ni2 = KeyedNode((), _NotImplementedAux())
  weird1 = KeyedNode((), _WeirdEqAux())
  weird2 = KeyedNode((), _WeirdEqAux())
  unhashable = KeyedNode((), [1])
  nested = [Pair(None, ()), {}, Empty(), MetaOnly("m", 2), DataOnly(())]
  walk_tree = {"b": KeyedNode((1,), "m"), "a": DataNode(None, 2, 3)}
  fit_tree = [KeyedNode((1, 2), "m"), DataNode(1, 2, "t")]
  raising_junk = Junk(("raise", "x"), ("raise", "y"))
