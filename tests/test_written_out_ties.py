"""Written-out ties: what a registry without relative identities remembers.

A flatten with a registry that writes a shared node out at each of its
places (``keeps_relative_identities=False``, JAX's own) records which places
were one object; the treedef's ``unflatten`` builds one object for the
places whose leaves are the very same objects and hands each object built
apart, beside the object of the first place, to the registry's
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


def expected_ties(tree, new_leaves):
  """The pairs of places that unflatten must make one object: one object
  in `tree`, and the very same objects among `new_leaves` under both."""
  located = places(tree)
  return {
      (i, j)
      for (i, (a, sa, ea)), (j, (b, sb, eb)) in itertools.combinations(
          enumerate(located), 2
      )
      if a is b
      and ea - sa == eb - sb
      and all(new_leaves[sa + k] is new_leaves[sb + k] for k in range(ea - sa))
  }


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


@settings(max_examples=200, deadline=None)
@given(dags())
def test_the_same_leaves_unflatten_to_the_same_ties(tree):
  for leaves, treedef in (
      WRITING_OUT.flatten(tree),
      _without_paths(WRITING_OUT.flatten_with_path(tree)),
  ):
    assert treedef == KEEPING.flatten(tree)[1].unshared()
    rebuilt, split = unflatten_observed(treedef, leaves)
    assert ties(rebuilt) == ties(tree)
    assert split == []
    assert WRITING_OUT.flatten(rebuilt)[0] == leaves


def _without_paths(flattened):
  path_leaves, treedef = flattened
  return [leaf for _, leaf in path_leaves], treedef


@settings(max_examples=200, deadline=None)
@given(dags(), st.data())
def test_places_stay_one_object_where_their_leaves_are_the_same(tree, data):
  leaves, treedef = WRITING_OUT.flatten(tree)
  # Some places' leaves replaced by new objects, the rest kept.
  new_leaves = [
      nodes.Leaf() if data.draw(st.booleans(), label=f"replace {k}") else leaf
      for k, leaf in enumerate(leaves)
  ]
  rebuilt, split = unflatten_observed(treedef, new_leaves)
  assert ties(rebuilt) == expected_ties(tree, new_leaves)
  assert WRITING_OUT.flatten(rebuilt)[0] == new_leaves
  # Every object built apart is reported beside its first place's object,
  # both in the result, and nothing else is.
  in_result = {id(entry[0]) for entry in places(rebuilt)}
  for first, copy in split:
    assert first is not copy and type(first) is type(copy)
    assert id(first) in in_result and id(copy) in in_result
  objects_of = {}
  for (original, _, _), (built, _, _) in zip(places(tree), places(rebuilt)):
    objects_of.setdefault(id(original), []).append(built)
  apart = {
      (id(built[0]), id(other))
      for built in objects_of.values()
      for other in {id(b): b for b in built[1:]}.values()
      if other is not built[0]
  }
  assert {(id(a), id(b)) for a, b in split} == apart


@settings(max_examples=100, deadline=None)
@given(dags())
def test_the_record_is_not_part_of_the_structure(tree):
  leaves, treedef = WRITING_OUT.flatten(tree)
  unshared = KEEPING.flatten(tree)[1].unshared()
  assert treedef == unshared and hash(treedef) == hash(unshared)
  again = pickle.loads(pickle.dumps(treedef))
  assert again == treedef
  # A pickled treedef remembers nothing: each place is an object of its own.
  rebuilt, split = unflatten_observed(again, leaves)
  assert ties(rebuilt) == set() and split == []


def test_a_keeping_registry_and_a_stock_layout_section_record_nothing():
  shared = nodes.PNode("p", [nodes.Leaf()])
  pair = [shared, shared]
  _, keeping = KEEPING.flatten(pair)
  assert keeping.has_shared_nodes
  pt.enter_stock_layout()
  try:
    leaves, inside = WRITING_OUT.flatten(pair)
  finally:
    pt.exit_stock_layout()
  # Custom rules get copies on purpose: nothing ties them again.
  rebuilt, split = unflatten_observed(inside, leaves)
  assert rebuilt[0] is not rebuilt[1] and split == []


def test_only_opted_in_objects_are_remembered():
  box = nodes.Box([nodes.Leaf()])
  leaves, treedef = WRITING_OUT.flatten([box, box])
  rebuilt, _ = unflatten_observed(treedef, leaves)
  assert rebuilt[0] is not rebuilt[1]  # As stock: a plain node is per place.


def test_a_place_matches_any_earlier_place_of_the_object():
  shared = nodes.PNode("p", [nodes.Leaf()])
  leaves, treedef = WRITING_OUT.flatten([shared, shared, shared])
  other = nodes.Leaf()
  rebuilt, split = unflatten_observed(treedef, [leaves[0], other, other])
  assert rebuilt[1] is rebuilt[2] and rebuilt[0] is not rebuilt[1]
  assert split == [(rebuilt[0], rebuilt[1])]


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
