"""Written-out ties: what a registry without relative identities remembers.

A flatten with a registry that writes a shared node out at each of its
places (``keeps_relative_identities=False``, JAX's own) records which places
were one object. The treedef's ``unflatten`` builds the tree as stock does,
an object per place, and hands each object built for a later place of an
object, beside the one built for its first place, to the registry's
``tie_split_observer``. Nothing else of the treedef sees the record:
equality, hashing and pickling are stock's.
"""

import itertools
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nodes
from harness import isolated
from jaxlib_patch import pytree as pt
from sharing_model import OPTED, children_with_keys, dags

KEEPING = nodes.register_all(pt.PyTreeRegistry(), True)
WRITING_OUT = KEEPING.twin(keeps_relative_identities=False)
# Pickles of its treedefs name it, as jax names its registries.
WRITING_OUT.__module__, WRITING_OUT.__name__ = __name__, "WRITING_OUT"


def places(tree):
  """Each opted-in node's place in stock's layout, pre-order: (the object,
  the index of its first leaf among stock's leaves, and of the leaf after
  its last)."""
  found = []
  leaves_so_far = 0

  def walk(x):
    nonlocal leaves_so_far
    kids = children_with_keys(x)
    if kids is None:
      leaves_so_far += 1
      return
    start = leaves_so_far
    entry = [x, start, None] if type(x) in OPTED else None
    if entry is not None:
      found.append(entry)
    for _, child in kids:
      walk(child)
    if entry is not None:
      entry[2] = leaves_so_far

  walk(tree)
  return [tuple(entry) for entry in found]


def ties(tree):
  located = places(tree)
  return {
      (i, j)
      for (i, (a, _, _)), (j, (b, _, _)) in itertools.combinations(
          enumerate(located), 2
      )
      if a is b
  }


def unflatten_observed(treedef, leaves):
  seen = []
  WRITING_OUT.tie_split_observer = seen.append
  try:
    return treedef.unflatten(leaves), [p for pairs in seen for p in pairs]
  finally:
    del WRITING_OUT.tie_split_observer


def expected_pairs(tree, rebuilt):
  """(object at the first place, object at a later place) of each later
  place of each object of `tree`, in `rebuilt`."""
  first_place = {}
  pairs = []
  for (original, _, _), (built, _, _) in zip(places(tree), places(rebuilt)):
    if id(original) in first_place:
      pairs.append((first_place[id(original)], built))
    else:
      first_place[id(original)] = built
  return pairs


@settings(max_examples=200, deadline=None)
@given(dags(), st.data())
def test_unflatten_builds_as_stock_and_reports_every_later_place(tree, data):
  for leaves, treedef in (
      WRITING_OUT.flatten(tree),
      _without_paths(WRITING_OUT.flatten_with_path(tree)),
  ):
    assert treedef == KEEPING.flatten(tree)[1].unshared()
    # The same leaves, or some of them new: either way an object per place.
    new_leaves = [
        nodes.Leaf() if data.draw(st.booleans(), label=f"new {k}") else leaf
        for k, leaf in enumerate(leaves)
    ]
    assert treedef.has_written_out_ties == bool(ties(tree))
    rebuilt, split = unflatten_observed(treedef, new_leaves)
    assert ties(rebuilt) == set()
    assert WRITING_OUT.flatten(rebuilt)[0] == new_leaves
    # In post-order, as the flatten met the places; the pairs themselves
    # are those of stock's places.
    expected = expected_pairs(tree, rebuilt)
    assert len(split) == len(expected)
    as_ids = lambda pairs: {(id(a), id(b)) for a, b in pairs}
    assert as_ids(split) == as_ids(expected)


def _without_paths(flattened):
  path_leaves, treedef = flattened
  return [leaf for _, leaf in path_leaves], treedef


@settings(max_examples=100, deadline=None)
@given(dags())
def test_the_record_is_not_part_of_the_structure(tree):
  leaves, treedef = WRITING_OUT.flatten(tree)
  unshared = KEEPING.flatten(tree)[1].unshared()
  assert treedef == unshared and hash(treedef) == hash(unshared)
  again = pickle.loads(pickle.dumps(treedef))
  assert again == treedef
  # A pickled treedef remembers nothing: nothing is reported.
  rebuilt, split = unflatten_observed(again, leaves)
  assert ties(rebuilt) == set() and split == []


def test_a_keeping_registry_and_a_stock_layout_section_record_nothing():
  shared = nodes.PNode("p", [nodes.Leaf()])
  pair = [shared, shared]
  _, keeping = KEEPING.flatten(pair)
  assert keeping.has_shared_nodes and not keeping.has_written_out_ties
  pt.enter_stock_layout()
  try:
    leaves, inside = WRITING_OUT.flatten(pair)
  finally:
    pt.exit_stock_layout()
  # Custom rules get copies on purpose: nothing is reported.
  assert not inside.has_written_out_ties
  assert WRITING_OUT.flatten(pair)[1].has_written_out_ties
  rebuilt, split = unflatten_observed(inside, leaves)
  assert rebuilt[0] is not rebuilt[1] and split == []


def test_only_opted_in_objects_are_remembered():
  box = nodes.Box([nodes.Leaf()])
  leaves, treedef = WRITING_OUT.flatten([box, box])
  rebuilt, split = unflatten_observed(treedef, leaves)
  assert rebuilt[0] is not rebuilt[1] and split == []


def test_a_failing_observer_fails_the_unflatten():
  shared = nodes.PNode("p", [nodes.Leaf()])
  _, treedef = WRITING_OUT.flatten([shared, shared])

  def refuse(pairs):
    raise RuntimeError(f"{len(pairs)} split")

  WRITING_OUT.tie_split_observer = refuse
  try:
    with pytest.raises(RuntimeError, match="1 split"):
      treedef.unflatten([nodes.Leaf(), nodes.Leaf()])
  finally:
    del WRITING_OUT.tie_split_observer


@isolated
def test_wrong_leaf_counts_are_stocks_errors():
  shared = nodes.PNode("p", [nodes.Leaf()])
  _, treedef = WRITING_OUT.flatten([shared, shared])
  with pytest.raises(ValueError, match="Too few leaves for PyTreeDef"):
    treedef.unflatten([1])
  with pytest.raises(ValueError, match="Too many leaves for PyTreeDef"):
    treedef.unflatten([1, 2, 3])
