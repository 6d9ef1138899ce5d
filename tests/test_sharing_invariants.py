"""Property tests: the invariants of docs/semantics.md on random DAGs of opted-in nodes.

``jaxlib_patch.pytree`` records, per flatten, which nodes of classes registered
with ``preserve_relative_identities=True`` are the same object. The trees are
sharing_model.py's random DAGs, and every property is compared with its
independent model of the semantics (``Model``). The queries that relate two
sharings of one tree are test_sharing_query_invariants.py's.

Stock compatibility (on trees without opted-in nodes) is tested in
``test_stock_compat/``; here the stock module only serves as a reference for the
*format* of ``repr``.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from jaxlib_patch import pytree as pt
from nodes import NT, OPTED, DNode, KNode, Leaf, PNode
from sharing_model import (
    LABEL_DEF,
    REGISTRY,
    SETTINGS,
    STOCK_REGISTRY,
    Model,
    children_with_keys,
    copy_tree,
    dags,
    expand_labels,
    flatten,
    identity_signature,
    opted_ids,
)

# ---------------------------------------------------------------------------
# Invariant 1: round trip.
# ---------------------------------------------------------------------------


def leaf_lists(n):
  """Lists of ``n`` leaves: fresh, all the same object, or a mix."""
  shared = Leaf()
  return st.one_of(
      st.just(None).map(lambda _: [Leaf() for _ in range(n)]),
      st.just([shared] * n),
      st.lists(
          st.sampled_from([shared, Leaf(), 7, "x"]), min_size=n, max_size=n
      ),
  )


@SETTINGS
@given(dags(), st.data())
def test_round_trip_any_leaves(x, data):
  """flatten(unflatten(td, L)) == (L, td) for any L of the right length."""
  _, td = flatten(x)
  new_leaves = data.draw(leaf_lists(td.num_leaves))
  again_leaves, again_td = flatten(td.unflatten(new_leaves))
  assert len(again_leaves) == len(new_leaves)
  assert all(a is b for a, b in zip(again_leaves, new_leaves))
  assert again_td == td
  assert hash(again_td) == hash(td)


@SETTINGS
@given(dags())
def test_unflatten_restores_sharing_with_new_objects(x):
  """unflatten(td, flatten(x)[0]) shares where x does, with new nodes."""
  leaves, td = flatten(x)
  out = td.unflatten(leaves)
  assert identity_signature(out) == identity_signature(x)
  model_in, model_out = Model(x), Model(out)
  assert model_out.labels == model_in.labels
  assert len(model_out.objects) == len(model_in.objects)
  # Every opted-in node of the output is a new object.
  assert not opted_ids(out) & opted_ids(x)
  assert all(a is b for a, b in zip(model_out.leaves, model_in.leaves))
  assert len(model_out.leaves) == len(model_in.leaves)


@SETTINGS
@given(dags())
def test_flatten_matches_model(x):
  """Leaves, counts and paths are those of the Python model.

  A shared node's leaves appear once (num_leaves counts them once), under the
  path of the first occurrence; a leaf object repeated through plain
  containers is a separate leaf each time.
  """
  model = Model(x)
  leaves, td = flatten(x)
  assert len(leaves) == len(model.leaves) == td.num_leaves
  assert all(a is b for a, b in zip(leaves, model.leaves))
  assert td.num_nodes == model.num_nodes
  path_leaves, path_td = REGISTRY.flatten_with_path(x)
  assert path_td == td
  assert [p for p, _ in path_leaves] == model.paths
  assert all(a is b for (_, a), b in zip(path_leaves, model.leaves))
  # An unshared copy has every leaf of every occurrence.
  unshared = Model(copy_tree(x, keep_sharing=False))
  assert unshared.refs == 0
  assert (
      flatten(copy_tree(x, keep_sharing=False))[1].num_leaves
      == len(unshared.leaves)
      >= td.num_leaves
  )


# ---------------------------------------------------------------------------
# Invariant 3: partition.
# ---------------------------------------------------------------------------


def check_partition(td):
  """Checks the partition invariant on td and, recursively, its children."""
  children = td.children()
  node_data = td.node_data()
  if node_data is None:  # A leaf.
    assert children == [] and td.num_leaves == 1
  else:
    assert sum(c.num_leaves for c in children) == td.num_leaves
  rebuilt = pt.PyTreeDef.from_node_data_and_children(
      REGISTRY, node_data, children
  )
  assert rebuilt == td
  assert hash(rebuilt) == hash(td)
  assert repr(rebuilt) == repr(td)
  if node_data is not None and node_data[0] is tuple:
    assert pt.treedef_tuple(REGISTRY, children) == td
  for child in children:
    check_partition(child)


@SETTINGS
@given(dags())
def test_partition(x):
  """children() partitions the leaves; node_data+children rebuild td."""
  leaves, td = flatten(x)
  check_partition(td)
  # The root is the tuple (args, kwargs): treedef_tuple of the children is
  # the flatten of the tuple of the children objects.
  args, kwargs = x
  assert pt.treedef_tuple(REGISTRY, td.children()) == flatten((args, kwargs))[1]
  assert sum(c.num_leaves for c in td.children()) == len(leaves)


# ---------------------------------------------------------------------------
# Invariant 4: prefix consistency.
# ---------------------------------------------------------------------------


@SETTINGS
@given(dags())
def test_flatten_up_to_same_sharing(x):
  """flatten_up_to accepts x, any unflatten of td, and prefix leaves."""
  leaves, td = flatten(x)
  up_to = td.flatten_up_to(x)
  assert len(up_to) == len(leaves) and all(
      a is b for a, b in zip(up_to, leaves)
  )
  others = [Leaf() for _ in leaves]
  up_to = td.flatten_up_to(td.unflatten(others))
  assert all(a is b for a, b in zip(up_to, others))
  # td as a prefix: its leaf positions hold whole subtrees.
  subtrees = [[Leaf(), (Leaf(),)] for _ in leaves]
  up_to = td.flatten_up_to(td.unflatten(subtrees))
  assert len(up_to) == len(subtrees)
  assert all(a is b for a, b in zip(up_to, subtrees))


@SETTINGS
@given(dags(), st.data())
def test_flatten_up_to_rejects_broken_sharing(x, data):
  """A shared node replaced at one place by an equal copy: ValueError."""
  model = Model(x)
  _, td = flatten(x)
  if model.refs == 0:
    # Nothing to break; the unshared copy is the same treedef.
    assert flatten(copy_tree(x, keep_sharing=False))[1] == td
    return
  k = data.draw(st.integers(0, model.refs - 1), label="broken reference")
  broken = copy_tree(x, break_reference=k)
  assert Model(broken).refs < model.refs
  with pytest.raises(ValueError, match="tree") as info:
    td.flatten_up_to(broken)
  note(str(info.value))
  # The broken tree is the same tree with a different sharing.
  broken_td = flatten(broken)[1]
  assert broken_td != td
  assert (
      flatten(copy_tree(broken, keep_sharing=False))[1]
      == flatten(copy_tree(x, keep_sharing=False))[1]
  )


@SETTINGS
@given(dags())
def test_flatten_up_to_rejects_extra_sharing(x):
  """Two separate nodes of the treedef given the same object: ValueError."""
  twin = copy_tree(x)
  _, td = flatten((x, twin))
  assert len(td.flatten_up_to((x, twin))) == td.num_leaves
  if not Model(x).objects:
    # No opted-in node: (x, x) is a plain tree, like (x, twin).
    assert td.flatten_up_to((x, x)) is not None
    assert flatten((x, x))[1] == td
    return
  with pytest.raises(ValueError, match="tree"):
    td.flatten_up_to((x, x))
  assert flatten((x, x))[1] != td


# ---------------------------------------------------------------------------
# ==, hash, repr, pickle.
# ---------------------------------------------------------------------------


@SETTINGS
@given(dags())
def test_eq_and_hash(x):
  """Equal treedefs hash alike; the same nodes with other sharing differ."""
  td = flatten(x)[1]
  same = [
      flatten(x)[1],
      flatten(copy_tree(x))[1],
      flatten(td.unflatten([Leaf() for _ in range(td.num_leaves)]))[1],
  ]
  for other in same:
    assert other == td and not (other != td)
    assert hash(other) == hash(td)
  unshared = flatten(copy_tree(x, keep_sharing=False))[1]
  if Model(x).refs:
    assert unshared != td and not (unshared == td)
  else:
    assert unshared == td and hash(unshared) == hash(td)


@SETTINGS
@given(dags())
def test_repr(x):
  """repr labels shared nodes SRFI-38 style; stock's format otherwise."""
  td = flatten(x)[1]
  text = repr(td)
  stock_text = repr(STOCK_REGISTRY.flatten(x)[1])
  if Model(x).refs:
    assert "#1=" in text and "#1#" in text
    assert "#^" not in text
  else:
    assert "#" not in text
    assert text == stock_text
  # Undoing the labels gives exactly what stock prints for the tree.
  assert expand_labels(text) == stock_text
  # Labels are numbered in reading order.
  numbers = [int(n) for n in LABEL_DEF.findall(text)]
  assert numbers == list(range(1, len(numbers) + 1))


@SETTINGS
@given(dags())
def test_pickle_round_trip(x):
  """Pickled treedefs come back equal and with their sharing."""
  leaves, td = flatten(x)
  for protocol in (2, pickle.HIGHEST_PROTOCOL):
    back = pickle.loads(pickle.dumps(td, protocol=protocol))
    assert back == td and hash(back) == hash(td)
    assert repr(back) == repr(td)
    out = back.unflatten(leaves)
    assert identity_signature(out) == identity_signature(x)
  # A child with an external reference pickles too.
  for child in td.children():
    assert pickle.loads(pickle.dumps(child)) == child


# ---------------------------------------------------------------------------
# walk, compose, flatten_with_path, is_leaf.
# ---------------------------------------------------------------------------


class WalkNode:
  """What the walk test's f_node returns: a fresh object per call."""

  def __init__(self, children, data):
    self.children = children
    self.data = data


def walk_labels(result):
  """node labels of a walk result: WalkNode objects labelled by identity."""
  labels, label_of = [], {}

  def go(obj):
    if not isinstance(obj, WalkNode):
      return
    if id(obj) in label_of:
      labels.append(label_of[id(obj)])
      return
    label_of[id(obj)] = len(label_of)
    labels.append(label_of[id(obj)])
    for c in obj.children:
      go(c)

  go(result)
  return labels, len(label_of)


def canonical(labels):
  """Renumbers labels by first appearance, so label sequences compare."""
  first = {}
  return [first.setdefault(label, len(first)) for label in labels]


@SETTINGS
@given(dags())
def test_walk_builds_each_shared_node_once(x):
  """walk calls f_node once per unique node and reuses the result."""
  leaves, td = flatten(x)
  model = Model(x)
  node_calls, leaf_calls = [], []

  def f_node(children, data):
    node_calls.append(data)
    return WalkNode(children, data)

  def f_leaf(leaf):
    leaf_calls.append(leaf)
    return ("leaf", leaf)

  result = td.walk(f_node, f_leaf, leaves)
  assert len(node_calls) == model.unique_nodes
  assert len(leaf_calls) == td.num_leaves
  assert all(a is b for a, b in zip(leaf_calls, leaves))
  labels, distinct = walk_labels(result)
  assert distinct == model.unique_nodes
  assert canonical(labels) == canonical(model.node_labels)
  # A walk that returns the children tuples gives an iterable tree, which
  # from_iterable_tree turns back into x's structure and sharing.
  iterable_tree = td.walk(lambda children, _: children, lambda v: v, leaves)
  rebuilt = td.from_iterable_tree(iterable_tree)
  assert identity_signature(rebuilt) == identity_signature(x)
  rebuilt_leaves, rebuilt_td = flatten(rebuilt)
  assert rebuilt_td == td and len(rebuilt_leaves) == len(leaves)
  assert all(a is b for a, b in zip(rebuilt_leaves, leaves))


@SETTINGS
@given(dags(), dags(max_pool=2, max_children=2, depth=1))
def test_compose(x, inner_tree):
  """compose(inner) equals the flatten of x with each leaf an inner copy."""
  _, td = flatten(x)
  _, inner = flatten(inner_tree)
  composed = td.compose(inner)
  assert composed.num_leaves == td.num_leaves * inner.num_leaves
  copies = [
      inner.unflatten([Leaf() for _ in range(inner.num_leaves)])
      for _ in range(td.num_leaves)
  ]
  expected = flatten(td.unflatten(copies))[1]
  assert composed == expected
  assert repr(composed) == repr(expected)
  check_partition(composed)


@SETTINGS
@given(dags())
def test_leaf_predicate_claims_shared_nodes(x):
  """is_leaf claiming KNode objects: each occurrence is a leaf."""
  leaves, td = REGISTRY.flatten(x, lambda o: type(o) is KNode)
  # Model: a KNode is a leaf, so hide KNode objects behind a leaf wrapper.
  expected = []
  label_of = set()

  def go(o):
    if type(o) is KNode:
      expected.append(o)
      return
    if type(o) in OPTED:
      if id(o) in label_of:
        return
      label_of.add(id(o))
    kids = children_with_keys(o)
    if kids is None:
      expected.append(o)
      return
    for _, c in kids:
      go(c)

  go(x)
  assert len(leaves) == len(expected) == td.num_leaves
  assert all(a is b for a, b in zip(leaves, expected))
  out = td.unflatten(leaves)
  assert td.flatten_up_to(out) == leaves


# ---------------------------------------------------------------------------
# Targeted cases of the same invariants.
# ---------------------------------------------------------------------------


def test_diamond():
  """A holds B and C, which both hold D: D is built once, B and C twice."""
  d = KNode("d", [Leaf()])
  b = PNode("b", [d, Leaf()])
  c = DNode(Leaf(), d, 0)
  a = KNode("a", [b, c])
  leaves, td = flatten([a, a])
  assert len(leaves) == 3 and td.num_leaves == 3
  out = td.unflatten(leaves)
  assert out[0] is out[1]
  assert out[0].children[0].children[0] is out[0].children[1].b
  assert out[0] is not a
  assert repr(td).count("#1=") == 1 and repr(td).count("#2=") == 1
  check_partition(td)


def test_leaf_shared_through_plain_containers_is_not_tracked():
  """A list holding the same leaf twice has two leaves."""
  leaf = Leaf()
  leaves, td = flatten([leaf, leaf, (leaf,)])
  assert leaves == [leaf, leaf, leaf] and td.num_leaves == 3
  assert "#" not in repr(td)
  # A list or tuple that appears twice is flattened twice too.
  inner = [leaf, 1]
  leaves, td = flatten((inner, inner))
  assert len(leaves) == 4
  out = td.unflatten(leaves)
  assert out[0] is not out[1]


def test_shared_leaf_path_is_first_occurrence():
  """flatten_with_path gives a shared node's leaves their first path."""
  p = PNode("p", [Leaf()])
  path_leaves, _ = REGISTRY.flatten_with_path({"b": p, "a": [p]})
  assert len(path_leaves) == 1
  assert path_leaves[0][0] == (
      pt.DictKey("a"),
      pt.SequenceKey(0),
      pt.FlattenedIndexKey(0),
  )


def test_num_leaves_counts_shared_leaves_once():
  """num_leaves of a tree whose only leaf is in a shared node is 1."""
  k = KNode("k", [Leaf()])
  _, td = flatten((k, [k, {"x": k}], NT(k, k)))
  assert td.num_leaves == 1
  # tuple, list, dict, NT, k, its leaf, and 4 references to k.
  assert td.num_nodes == 4 + 2 + 4
  assert sum(c.num_leaves for c in td.children()) == 1
