"""Property tests of the queries that relate two sharings of one tree:
``unshared()``, ``expansion_indices(finer)``, ``expand_leaves(finer,
leaves)``, ``common_sharing(other)``, ``sharing_difference(other)`` and
``sharing_differences(other)``, on sharing_model.py's random DAGs, against
its model; and their errors on other trees and deep ones.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxlib_patch import pytree as pt
from nodes import OPTED, KNode, Leaf
from sharing_model import (
    REGISTRY,
    SETTINGS,
    STOCK_REGISTRY,
    copy_tree,
    dags,
    drawn_breakage,
    expanded_signature,
    flatten,
    follow,
)


@SETTINGS
@given(dags())
def test_unshared_is_stocks_treedef(x):
  """unshared() is the treedef stock flattens the tree to, and
  expansion_indices(unshared) maps stock's leaves onto the unique ones."""
  leaves, td = flatten(x)
  stock_leaves, stock_td = STOCK_REGISTRY.flatten(x)
  unshared = td.unshared()
  assert not unshared.has_shared_nodes
  assert repr(unshared) == repr(stock_td)
  assert unshared == flatten(copy_tree(x, keep_sharing=False))[1]
  indices = td.expansion_indices(unshared)
  assert len(indices) == unshared.num_leaves == stock_td.num_leaves
  assert all(leaves[i] is leaf for i, leaf in zip(indices, stock_leaves))
  # Idempotent, and the identity map on a treedef without sharing.
  assert unshared.unshared() == unshared
  assert unshared.expansion_indices(unshared) == list(range(len(indices)))
  assert td.expansion_indices(td) == list(range(td.num_leaves))


@SETTINGS
@given(dags(), st.data())
def test_expansion_indices_reads_a_less_shared_form(x, data):
  """For a form of the tree with less sharing, the indices give its leaves;
  the other way round is a sharing mismatch."""
  leaves, td = flatten(x)
  broken = drawn_breakage(x, data)
  broken_leaves, broken_td = flatten(broken)
  indices = td.expansion_indices(broken_td)
  assert all(leaves[i] is leaf for i, leaf in zip(indices, broken_leaves))
  expanded = td.expand_leaves(broken_td, leaves)
  assert len(expanded) == len(indices)
  assert all(e is leaves[i] for e, i in zip(expanded, indices))
  rebuilt = broken_td.unflatten(expanded)
  assert expanded_signature(rebuilt) == expanded_signature(broken)
  if broken_td != td:
    with pytest.raises(ValueError, match="PyTree sharing mismatch"):
      broken_td.expansion_indices(td)
    with pytest.raises(ValueError, match="PyTree sharing mismatch"):
      broken_td.expand_leaves(td, broken_leaves)


def test_expand_leaves_refuses_another_count_of_leaves():
  c = KNode("c", [Leaf(), Leaf()])
  leaves, td = flatten((c, c))
  apart = td.unshared()
  assert td.expand_leaves(apart, iter(leaves)) == leaves + leaves
  for count in (len(leaves) - 1, len(leaves) + 1):
    with pytest.raises(ValueError, match=f"expected 2 leaves.*got {count}"):
      td.expand_leaves(apart, [0] * count)
  with pytest.raises(TypeError):
    td.expand_leaves(apart, 3)


@SETTINGS
@given(dags(), st.data())
def test_common_sharing_shares_where_both_do(x, data):
  """common_sharing is the intersection of the two sharings: symmetric,
  idempotent, and readable from either treedef."""
  leaves, td = flatten(x)
  other = drawn_breakage(drawn_breakage(x, data), data)
  _, other_td = flatten(other)
  common = td.common_sharing(other_td)
  assert common == other_td.common_sharing(td)
  assert td.common_sharing(td) == td
  assert common.common_sharing(td) == common
  assert common.unshared() == td.unshared()
  rebuilt = common.unflatten(td.expand_leaves(common, leaves))
  assert expanded_signature(rebuilt) == (
      expanded_signature(x) & expanded_signature(other)
  )
  # Both treedefs can be read in the common form.
  other_td.expansion_indices(common)


@SETTINGS
@given(dags(), st.data())
def test_sharing_difference_finds_the_first_place(x, data):
  """sharing_difference is None exactly for equal treedefs; otherwise it
  names a place where one treedef repeats an earlier node and the other does
  not (or repeats another), the same place whichever asks."""
  _, td = flatten(x)
  other = drawn_breakage(x, data)
  _, other_td = flatten(other)
  assert td.sharing_difference(td) is None
  difference = td.sharing_difference(other_td)
  assert (difference is None) == (td == other_td)
  if difference is not None:
    path, node_type, here, there = difference
    assert node_type in OPTED
    assert here != there
    assert other_td.sharing_difference(td) == (path, node_type, there, here)
    # The paths name the places by the keys of flatten_with_path, and the
    # treedef that repeats a node repeats the object there.
    assert type(follow(x, path)) is node_type
    if here is not None:
      assert follow(x, here) is follow(x, path)
    if there is not None:
      assert follow(other, there) is follow(other, path)
    # The earlier places come before the place itself (pre-order).
    for earlier in (here, there):
      assert earlier is None or earlier != path


@SETTINGS
@given(dags(), st.data())
def test_sharing_differences_finds_every_outermost_place(x, data):
  """sharing_differences lists every place sharing_difference could name
  (here, where up to two references were broken), the first first,
  whichever asks, none inside a differing node."""
  _, td = flatten(x)
  other = drawn_breakage(drawn_breakage(x, data), data)
  _, other_td = flatten(other)
  assert td.sharing_differences(td) == []
  differences = td.sharing_differences(other_td)
  assert (differences == []) == (td == other_td)
  assert (differences[0] if differences else None) == td.sharing_difference(
      other_td
  )
  assert other_td.sharing_differences(td) == [
      (path, node_type, there, here)
      for path, node_type, here, there in differences
  ]
  paths = [path for path, _, _, _ in differences]
  for k, (path, node_type, here, there) in enumerate(differences):
    assert type(follow(x, path)) is node_type and here != there
    if here is not None:
      assert follow(x, here) is follow(x, path)
    # Not inside another differing node, nor named twice.
    assert not any(
        path[: len(outer)] == outer for outer in paths[:k] + paths[k + 1 :]
    )


def test_sharing_queries_reject_other_trees():
  k = KNode("k", [Leaf()])
  _, td = flatten((k, k))
  _, other = flatten((k, [k]))
  with pytest.raises(
      ValueError, match=r"PyTree structures differ at tree\[1\]"
  ):
    td.common_sharing(other)
  with pytest.raises(ValueError, match="structures differ"):
    td.expansion_indices(other)
  with pytest.raises(ValueError, match="structures differ"):
    td.sharing_difference(other)
  child = td.children()[1]
  assert child.has_external_references
  for query in (
      child.unshared,
      lambda: child.expansion_indices(child),
      lambda: td.common_sharing(child),
      lambda: td.sharing_difference(child),
  ):
    with pytest.raises(ValueError, match="outside of it"):
      query()
  with pytest.raises(TypeError):
    td.common_sharing("not a treedef")


def test_sharing_queries_on_deep_trees_raise_recursion_error():
  _, td = flatten((KNode("k", []),) * 2)
  for _ in range(5 * sys.getrecursionlimit()):  # Built without recursion.
    td = pt.treedef_tuple(REGISTRY, [td])
  with pytest.raises(RecursionError):
    td.common_sharing(td)
  unshared = td.unshared()  # Written without recursion.
  assert not unshared.has_shared_nodes
  assert unshared.num_nodes == td.num_nodes


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
