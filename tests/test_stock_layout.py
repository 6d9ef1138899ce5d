"""Registries without relative identities, and sharing where leaves agree.

A registry made with ``keeps_relative_identities=False`` records which types
opted in but lays every tree out as stock jaxlib does: JAX's own code
flattens with such registries, so that code nobody taught about sharing sees
what it sees on stock. ``sharing_where_leaves_agree`` narrows a treedef's
sharing to the shared nodes whose places hold the same leaves, which is how
a map over trees that share differently keeps the ties its values cannot
tell apart. Checked on generated trees, and against stock jaxlib.
"""

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxlib._jax import pytree as stock_pt

import nodes
from jaxlib_patch import pytree as pt

KEEPING = nodes.register_all(pt.PyTreeRegistry(), True)
STOCK_LAYOUT = nodes.register_all(
    pt.PyTreeRegistry(keeps_relative_identities=False), True
)
STOCK = nodes.register_all(stock_pt.PyTreeRegistry(), False)


@st.composite
def shared_trees(draw):
  """Lists of opted-in nodes drawn from a small pool, so that some repeat
  (also inside each other), with int leaves."""
  pool = []
  for i in range(draw(st.integers(1, 5))):
    children = draw(
        st.lists(
            st.one_of(st.integers(0, 9), st.sampled_from(pool))
            if pool
            else st.integers(0, 9),
            max_size=3,
        )
    )
    pool.append(nodes.PNode(f"t{i}", children))
  return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6))


def test_the_flag_is_a_keyword_and_a_query():
  assert KEEPING.keeps_relative_identities
  assert not STOCK_LAYOUT.keeps_relative_identities
  assert not STOCK_LAYOUT.flatten([1])[1].keeps_relative_identities
  assert KEEPING.flatten([1])[1].keeps_relative_identities
  assert STOCK_LAYOUT.has_relative_identities(nodes.PNode)


@settings(max_examples=150, deadline=None)
@given(shared_trees())
def test_stock_layout_is_the_unshared_tree_and_stocks(tree):
  leaves, treedef = KEEPING.flatten(tree)
  stock_leaves, stock_treedef = STOCK_LAYOUT.flatten(tree)
  assert not stock_treedef.has_shared_nodes
  assert stock_treedef == treedef.unshared()
  assert hash(stock_treedef) == hash(treedef.unshared())
  assert stock_leaves == [
      leaves[i] for i in treedef.expansion_indices(stock_treedef)
  ]
  reference_leaves, reference = STOCK.flatten(tree)
  assert stock_leaves == reference_leaves
  assert stock_treedef.num_nodes == reference.num_nodes
  # flatten_up_to takes the shared tree as stock does: one place each.
  assert stock_treedef.flatten_up_to(tree) == reference.flatten_up_to(tree)
  assert stock_treedef.unflatten(stock_leaves) is not None


@settings(max_examples=150, deadline=None)
@given(shared_trees(), st.data())
def test_sharing_where_leaves_agree(tree, data):
  leaves, treedef = KEEPING.flatten(tree)
  unshared = treedef.unshared()
  places = treedef.expansion_indices(unshared)
  # The tree's own leaves agree at every copy: all its sharing stays.
  assert treedef.sharing_where_leaves_agree(places) == treedef
  # All places told apart: no leaf stays shared (a node without leaves has
  # nothing to tell its places apart, and stays one).
  apart = treedef.sharing_where_leaves_agree(list(range(len(places))))
  assert apart.num_leaves == unshared.num_leaves
  # Any classes: the result shares only where the treedef does, and a node
  # stays shared exactly where its places' classes agree.
  classes = data.draw(
      st.lists(st.integers(0, 2), min_size=len(places), max_size=len(places))
  )
  kept = treedef.sharing_where_leaves_agree(classes)
  kept_places = kept.expansion_indices(unshared)
  treedef.expansion_indices(kept)  # Raises unless kept is coarser.
  for k, leaf in enumerate(kept_places):
    first = kept_places.index(leaf)
    assert classes[k] == classes[first] and places[k] == places[first]


def test_leaf_classes_of_the_wrong_count_are_a_value_error():
  shared = nodes.PNode("s", [1, 2])
  _, treedef = KEEPING.flatten([shared, shared])
  try:
    treedef.sharing_where_leaves_agree([0, 0])
  except ValueError as e:
    assert "2 leaf classes given for a tree of 4 leaves" in str(e)
  else:
    raise AssertionError("no ValueError")


@settings(max_examples=100, deadline=None)
@given(shared_trees())
def test_a_stock_layout_section_lays_out_every_registry_as_stock(tree):
  leaves, treedef = KEEPING.flatten(tree)
  pt.enter_stock_layout()
  try:
    inside_leaves, inside = KEEPING.flatten(tree)
    # flatten_up_to takes the shared tree as stock takes it, too.
    assert inside.flatten_up_to(tree) == inside_leaves
  finally:
    pt.exit_stock_layout()
  assert inside == STOCK_LAYOUT.flatten(tree)[1] == treedef.unshared()
  assert inside_leaves == STOCK_LAYOUT.flatten(tree)[0]
  assert KEEPING.flatten(tree) == (leaves, treedef)  # Ended.


def test_stock_layout_sections_nest_per_thread_and_must_match():
  shared = nodes.PNode("p", [1])
  pair = [shared, shared]
  pt.enter_stock_layout()
  pt.enter_stock_layout()
  pt.exit_stock_layout()
  assert not KEEPING.flatten(pair)[1].has_shared_nodes  # Still in one.
  seen = []
  thread = threading.Thread(
      target=lambda: seen.append(KEEPING.flatten(pair)[1].has_shared_nodes)
  )
  thread.start()
  thread.join()
  assert seen == [True]  # Another thread is not in it.
  pt.exit_stock_layout()
  assert KEEPING.flatten(pair)[1].has_shared_nodes
  with pytest.raises(ValueError, match="without a matching enter"):
    pt.exit_stock_layout()


def _tied_treedefs_met(use):
  """How much `use()` moves this thread's count of tied treedefs met,
  run inside a stock-layout section."""
  before = pt.tied_treedefs_met()
  pt.enter_stock_layout()
  try:
    use()
  finally:
    pt.exit_stock_layout()
  return pt.tied_treedefs_met() - before


@settings(max_examples=100, deadline=None)
@given(shared_trees(), shared_trees())
def test_tied_treedefs_met_count_unflattens_and_comparisons_of_ties(a, b):
  leaves, tied = KEEPING.flatten(a)
  _, other = KEEPING.flatten(b)
  ties = int(tied.has_shared_nodes)
  both = ties + int(other.has_shared_nodes)
  # Each use of a treedef with shared nodes counts once, whatever it
  # answers; the copies' treedef (stock's layout) never counts.
  assert _tied_treedefs_met(lambda: tied.unflatten(leaves)) == ties
  assert _tied_treedefs_met(lambda: tied == other) == both
  assert _tied_treedefs_met(lambda: other != tied) == both
  copies = tied.unshared()
  assert _tied_treedefs_met(lambda: copies == copies) == 0
  # Outside a section, nothing is counted.
  before = pt.tied_treedefs_met()
  tied.unflatten(leaves)
  assert (tied == copies) == (not ties)
  assert pt.tied_treedefs_met() == before


def test_tied_treedefs_met_are_counted_per_thread():
  shared = nodes.PNode("p", [1])
  leaves, tied = KEEPING.flatten([shared, shared])
  seen = []
  before = pt.tied_treedefs_met()
  thread = threading.Thread(
      target=lambda: seen.append(
          _tied_treedefs_met(lambda: tied.unflatten(leaves))
      )
  )
  thread.start()
  thread.join()
  assert seen == [1]
  assert pt.tied_treedefs_met() == before
