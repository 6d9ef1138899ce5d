"""PyTreeDef.broadcast_flattened_prefix against a brute-force reference.

A tree prefix (vmap's in_axes, jit's shardings, donation flags) gives a value
to every leaf below each of its own leaves. With sharing, the full treedef
holds a shared node's leaves once, so the prefix must give that node one
value wherever it reaches it. The reference expands the DAG into a plain
tree (every occurrence separately), broadcasts the prefix over it the way
stock JAX does, and checks that all copies of each unique leaf got the same
value: then the result must be those values, else SharedPrefixError.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxlib_patch import pytree as pt
from nodes import DNode, KNode, Leaf, PNode, register_all
from sharing_model import REGISTRY, SETTINGS, dags, follow

# The same classes without the flag: flattening with it expands a DAG.
EXPANDING = register_all(pt.PyTreeRegistry(), opt_in=False)
# Prefixes take None as a leaf, as JAX flattens them.
NONE_LEAF = register_all(pt.PyTreeRegistry(enable_none=False), opt_in=True)
VALUES = st.sampled_from([0, 1, None])


class Marker:
  """Stands for one unique leaf of the full treedef."""

  def __init__(self, index):
    self.index = index


def expanded(full):
  """The full treedef's DAG as a plain tree, and for each of its leaves the
  index of the unique leaf of ``full`` it is a copy of."""
  graph = full.unflatten([Marker(i) for i in range(full.num_leaves)])
  markers, tree = EXPANDING.flatten(graph)
  return tree, [m.index for m in markers]


def draw_prefix(draw, tree):
  """(prefix treedef, prefix leaves, broadcast values) for plain ``tree``."""
  is_leaf = tree.num_nodes == 1 and tree.num_leaves == 1
  if is_leaf or draw(st.integers(0, 3)) == 0:
    value = draw(VALUES)
    leaf_def = EXPANDING.flatten(0)[1]
    return leaf_def, [value], [value] * tree.num_leaves
  children, leaves, values = [], [], []
  for child in tree.children():
    child_def, child_leaves, child_values = draw_prefix(draw, child)
    children.append(child_def)
    leaves += child_leaves
    values += child_values
  prefix = pt.PyTreeDef.from_node_data_and_children(
      EXPANDING, tree.node_data(), children
  )
  return prefix, leaves, values


def reference(full, prefix_values, copies):
  """What broadcasting must give, or None if a shared node gets two values."""
  result = [_UNSET] * full.num_leaves
  for value, index in zip(prefix_values, copies):
    if result[index] is _UNSET:
      result[index] = value
    elif result[index] != value or type(result[index]) is not type(value):
      return None
  return result


_UNSET = object()


@SETTINGS
@given(dags(), st.data())
def test_matches_brute_force_on_expanded_tree(x, data):
  _, full = REGISTRY.flatten(x)
  tree, copies = expanded(full)
  prefix, prefix_leaves, values = draw_prefix(data.draw, tree)
  expected = reference(full, values, copies)
  if expected is None:
    with pytest.raises(pt.SharedPrefixError) as info:
      full.broadcast_flattened_prefix(prefix, prefix_leaves)
    first_path, other_path = info.value.paths
    assert first_path != other_path
    # Both paths are keyed as flatten_with_path keys the tree (KNode's
    # children by name) and lead to the one shared node.
    assert follow(x, first_path) is follow(x, other_path)
    first_value, other_value = info.value.values
    assert (first_value, type(first_value)) != (other_value, type(other_value))
  else:
    assert full.broadcast_flattened_prefix(prefix, prefix_leaves) == expected


@SETTINGS
@given(dags(), st.data())
def test_prefix_with_the_same_sharing_gives_its_leaves(x, data):
  """A prefix made by mapping over the full tree (jax.tree.map) shares where
  the full tree does, and gives each unique leaf its own value."""
  _, full = REGISTRY.flatten(x)
  values = data.draw(
      st.lists(VALUES, min_size=full.num_leaves, max_size=full.num_leaves)
  )
  prefix_leaves, prefix = NONE_LEAF.flatten(full.unflatten(values))
  assert full.broadcast_flattened_prefix(prefix, prefix_leaves) == values


def test_conflict_below_a_prefix_leaf_names_both_places():
  p = KNode("p", [Leaf()])
  _, full = REGISTRY.flatten(([p], [p]))
  prefix_leaves, prefix = NONE_LEAF.flatten((0, None))
  with pytest.raises(pt.SharedPrefixError) as info:
    full.broadcast_flattened_prefix(prefix, prefix_leaves)
  assert info.value.paths == (
      (pt.SequenceKey(0), pt.SequenceKey(0)),
      (pt.SequenceKey(1), pt.SequenceKey(0)),
  )
  assert info.value.values == (0, None)
  assert "tree[0][0]" in str(info.value) and "tree[1][0]" in str(info.value)
  assert isinstance(info.value, ValueError)


class Strict:
  """A keyed node that unflattens only from real leaves."""

  def __init__(self, x, rest):
    if x is None:
      raise TypeError("Strict needs a value")
    self.x, self.rest = x, rest


def with_strict(registry):
  register_all(registry, opt_in=True)
  registry.register_node(
      Strict,
      lambda s: ((s.x, s.rest), None),
      lambda _, children: Strict(*children),
      lambda s: (
          ((pt.GetAttrKey("x"), s.x), (pt.GetAttrKey("rest"), s.rest)),
          None,
      ),
  )
  return registry


def test_conflict_paths_use_the_keys_of_keyed_custom_nodes():
  registry = with_strict(pt.PyTreeRegistry())
  none_leaf = with_strict(pt.PyTreeRegistry(enable_none=False))
  p = KNode("p", [Leaf()])
  _, full = registry.flatten(KNode("root", [p, p]))
  prefix_leaves, prefix = none_leaf.flatten(KNode("root", [0, 1]))
  with pytest.raises(pt.SharedPrefixError) as info:
    full.broadcast_flattened_prefix(prefix, prefix_leaves)
  assert info.value.paths == ((pt.GetAttrKey("c0"),), (pt.GetAttrKey("c1"),))
  assert "tree.c0" in str(info.value) and "tree.c1" in str(info.value)
  # Where the tree cannot be rebuilt from placeholders, flat indices do.
  _, full = registry.flatten(Strict(Leaf(), KNode("root", [p, p])))
  prefix_leaves, prefix = none_leaf.flatten(Strict(0, KNode("root", [0, 1])))
  with pytest.raises(pt.SharedPrefixError) as info:
    full.broadcast_flattened_prefix(prefix, prefix_leaves)
  assert info.value.paths[1] == (
      pt.FlattenedIndexKey(1),
      pt.FlattenedIndexKey(1),
  )


def test_equal_values_of_one_type_agree_and_other_types_do_not():
  p = PNode("p", [Leaf(), Leaf()])
  _, full = REGISTRY.flatten((p, {"k": p}))
  leaves, prefix = REGISTRY.flatten((1, {"k": 1}))
  assert full.broadcast_flattened_prefix(prefix, leaves) == [1, 1]
  leaves, prefix = REGISTRY.flatten((1, {"k": 1.0}))
  with pytest.raises(pt.SharedPrefixError):
    full.broadcast_flattened_prefix(prefix, leaves)


def test_reference_reached_through_a_matching_subtree():
  d = DNode(Leaf(), Leaf(), 0)
  _, full = REGISTRY.flatten((d, d))
  td = lambda t: REGISTRY.flatten(t)
  leaves, prefix = td((DNode(0, 1, 0), DNode(0, 1, 0)))
  assert full.broadcast_flattened_prefix(prefix, leaves) == [0, 1]
  leaves, prefix = td((DNode(0, 1, 0), DNode(1, 1, 0)))
  with pytest.raises(pt.SharedPrefixError):
    full.broadcast_flattened_prefix(prefix, leaves)
  leaves, prefix = td((DNode(0, 0, 0), 0))
  assert full.broadcast_flattened_prefix(prefix, leaves) == [0, 0]


def draw_wrong_prefix(draw, tree, path, mistakes):
  """A prefix of plain ``tree`` in places and not in others: a list with one
  child more than the node there.  ``mistakes`` gets those places' child
  paths."""
  is_leaf = tree.num_nodes == 1 and tree.num_leaves == 1
  choice = draw(st.integers(0, 5))
  if choice == 0 or (is_leaf and choice < 4):
    return EXPANDING.flatten(0)
  children = [] if is_leaf else tree.children()
  if is_leaf or choice == 1:
    mistakes.append(path)
    return EXPANDING.flatten([0] * (len(children) + 1))
  prefix_children, leaves = [], []
  for index, child in enumerate(children):
    child_leaves, child_def = draw_wrong_prefix(
        draw, child, (*path, index), mistakes
    )
    prefix_children.append(child_def)
    leaves += child_leaves
  prefix = pt.PyTreeDef.from_node_data_and_children(
      EXPANDING, tree.node_data(), prefix_children
  )
  return leaves, prefix


def is_leaf_def(treedef):
  return treedef.num_nodes == 1 and treedef.num_leaves == 1


@SETTINGS
@given(dags(), st.data())
def test_not_a_prefix_names_a_place_where_the_prefix_is_wrong(x, data):
  _, full = REGISTRY.flatten(x)
  tree, _ = expanded(full)
  mistakes = []
  leaves, prefix = draw_wrong_prefix(data.draw, tree, (), mistakes)
  if not mistakes:
    full.broadcast_flattened_prefix(prefix, leaves)  # raises no structure error
    return
  with pytest.raises(ValueError) as info:
    full.broadcast_flattened_prefix(prefix, leaves)
  if isinstance(info.value, pt.SharedPrefixError):
    return  # A shared node was given two values before the walk got there.
  child_path = info.value.child_path
  assert child_path in mistakes
  # The child path leads through nodes that match to one that does not, in
  # the full tree written out (every shared node at each place it is).
  for index in child_path:
    assert prefix.node_data() == tree.node_data()
    prefix, tree = prefix.children()[index], tree.children()[index]
  assert not is_leaf_def(prefix)
  assert (
      is_leaf_def(tree)
      or prefix.node_data() != tree.node_data()
      or (len(prefix.children()) != len(tree.children()))
  )


def test_not_a_prefix_is_a_plain_value_error():
  _, full = REGISTRY.flatten(([Leaf()], Leaf()))
  leaves, prefix = REGISTRY.flatten(([0, 1], 0))
  with pytest.raises(ValueError) as info:
    full.broadcast_flattened_prefix(prefix, leaves)
  assert type(info.value) is ValueError
  leaves, prefix = REGISTRY.flatten((0, 1))
  with pytest.raises(ValueError, match="Expected 2 prefix leaves"):
    full.broadcast_flattened_prefix(prefix, [0])


def test_external_reference_is_refused():
  p = KNode("p", [Leaf()])
  _, full = REGISTRY.flatten((p, p))
  _, external = full.children()
  leaves, prefix = REGISTRY.flatten(0)
  with pytest.raises(ValueError, match="outside itself"):
    external.broadcast_flattened_prefix(prefix, leaves)


def test_doubly_shared_chain_is_linear():
  """Each level holds the level below twice: 2**depth occurrences of the
  bottom, but depth unique nodes. (Timings are in bench/bench_limits.py;
  here the depth alone would take forever if the work were exponential.)"""
  node = KNode("bottom", [Leaf()])
  for _ in range(1000):
    node = KNode("level", [node, node])
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(max(old, 20000))
  try:
    _, full = REGISTRY.flatten(node)
    leaves, prefix = REGISTRY.flatten(0)
    assert full.broadcast_flattened_prefix(prefix, leaves) == [0]
    same = REGISTRY.flatten(full.unflatten([3]))
    assert full.broadcast_flattened_prefix(same[1], same[0]) == [3]
  finally:
    sys.setrecursionlimit(old)
