"""Property tests: the invariants of docs/semantics.md on random DAGs of opted-in nodes.

``jaxlib_patch.pytree`` records, per flatten, which nodes of classes registered
with ``preserve_relative_identities=True`` are the same object.  The
hypothesis strategy below builds random object graphs of the classes of
``nodes.py`` in which opted-in nodes are shared:

* three opted-in classes: ``KNode`` (custom, with ``to_iterable_with_keys``),
  ``PNode`` (custom, without keys) and ``DNode`` (a dataclass registered with
  ``register_dataclass_node``);
* mixed with builtin containers (tuple, list, dict, namedtuple, None), a
  custom class registered *without* the flag (``Box``) and leaves (fresh
  objects, the same leaf object several times, ints, strings);
* sharing across the top-level arguments of an ``(args, kwargs)`` tree, nested
  sharing in separate branches, and diamonds (A holds B and C, which both
  hold D).

Every property is compared with an independent Python model of the semantics
in ``docs/semantics.md`` (``Model``), which walks an object graph the way a
flatten should: pre-order, left to right, dict keys sorted, and an opted-in
node already met is a reference (its subtree is not walked again).

Stock compatibility (on trees without opted-in nodes) is tested in
``test_stock_compat/``; here the stock module only serves as a reference for the
*format* of ``repr``.
"""

from __future__ import annotations

import itertools
import pickle
import re
import sys

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from jaxlib._jax import pytree as stock
from jaxlib_patch import pytree as pt
from nodes import NT, OPTED, Box, DNode, KNode, Leaf, PNode, register_all

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# The registry under test; importable as ``<this module>.REGISTRY`` so that
# ``PyTreeRegistry.__reduce__`` (which returns ``__name__``) pickles it by
# reference.
REGISTRY = register_all(pt.PyTreeRegistry(), opt_in=True)
REGISTRY.__module__ = __name__
REGISTRY.__name__ = "REGISTRY"

# The same classes in a stock registry: a reference for repr's format.
STOCK_REGISTRY = register_all(stock.PyTreeRegistry(), opt_in=False)


def flatten(x):
  return REGISTRY.flatten(x)


# ---------------------------------------------------------------------------
# An independent model of the semantics.
# ---------------------------------------------------------------------------


def children_with_keys(x):
  """The ``(key, child)`` pairs of a node, or None if ``x`` is a leaf."""
  t = type(x)
  if x is None:
    return []
  if t is tuple or t is list:
    return [(pt.SequenceKey(i), c) for i, c in enumerate(x)]
  if t is dict:
    return [(pt.DictKey(k), x[k]) for k in sorted(x)]
  if t is NT:
    return [(pt.GetAttrKey(f), getattr(x, f)) for f in NT._fields]
  if t is KNode:
    return [(pt.GetAttrKey(f"c{i}"), c) for i, c in enumerate(x.children)]
  if t is PNode or t is Box:
    return [(pt.FlattenedIndexKey(i), c) for i, c in enumerate(x.children)]
  if t is DNode:
    return [(pt.GetAttrKey("a"), x.a), (pt.GetAttrKey("b"), x.b)]
  return None


def follow(tree, key_path):
  """The object that ``key_path`` (keyed as flatten_with_path keys) names in
  ``tree``."""
  for key in key_path:
    (tree,) = [child for k, child in children_with_keys(tree) if k == key]
  return tree


class Model:
  """What flatten should see in an object graph, computed in Python.

  The walk is pre-order, left to right.  An opted-in node met a second time
  (``is``) is a *reference*: it gets the label of its first occurrence and
  its subtree is not walked again.  Every other node is walked every time.

  Attributes:
    leaves: the leaves, in order (a shared node's leaves appear once).
    paths: the key path of each leaf.
    labels: one entry per opted-in node position: the index, among the
      distinct opted-in objects, of the object at that position.
    node_labels: one entry per node position (leaves excluded): opted-in
      nodes labelled by identity, every other node with a fresh label.
    unique_nodes: the number of node positions that are not references (the
      number of times ``walk`` should call ``f_node``).
    refs: the number of references.
    num_nodes: what ``PyTreeDef.num_nodes`` should be.
    objects: the distinct opted-in objects.
  """

  def __init__(self, x):
    self.leaves, self.paths, self.labels, self.node_labels = [], [], [], []
    self.unique_nodes = self.refs = self.num_nodes = 0
    self.objects = []
    self._label_of = {}
    self._fresh = itertools.count(10**6)
    self._walk(x, ())

  def _walk(self, x, path):
    kids = children_with_keys(x)
    self.num_nodes += 1
    if kids is None:
      self.leaves.append(x)
      self.paths.append(path)
      return
    if type(x) in OPTED:
      label = self._label_of.get(id(x))
      if label is not None:
        self.labels.append(label)
        self.node_labels.append(label)
        self.refs += 1
        return
      label = self._label_of[id(x)] = len(self.objects)
      self.objects.append(x)
      self.labels.append(label)
      self.node_labels.append(label)
    else:
      self.node_labels.append(next(self._fresh))
    self.unique_nodes += 1
    for key, child in kids:
      self._walk(child, path + (key,))


def identity_signature(x):
  """Which opted-in node positions of ``x`` hold the same object.

  Returns ``(n, pairs)``: ``n`` opted-in node positions in a pre-order walk
  that does not re-enter a node already met (re-entering it would only repeat
  the pairs of its first occurrence), and the set of pairs ``(i, j)``,
  ``i < j``, of positions that hold the same object.  Works on any object
  graph made of the classes of this module.
  """
  labels = Model(x).labels
  pairs = frozenset(
      (i, j)
      for i, j in itertools.combinations(range(len(labels)), 2)
      if labels[i] == labels[j]
  )
  return len(labels), pairs


def opted_ids(x):
  return {id(o) for o in Model(x).objects}


def copy_tree(x, *, keep_sharing=True, break_reference=None):
  """A copy of ``x`` with new nodes and the same leaves.

  keep_sharing: an opted-in node shared in ``x`` is one object in the copy
    too; with False every occurrence gets its own copy (no sharing at all).
  break_reference: the index (in ``Model`` order) of one reference that gets
    its own, equal but distinct, copy instead of the shared one.
  """
  memo = {}
  counter = itertools.count()

  def go(x, sharing):
    t = type(x)
    if t in OPTED and sharing and id(x) in memo:
      if next(counter) != break_reference:
        return memo[id(x)]
      return go(x, False)
    kids = children_with_keys(x)
    if kids is None:
      return x
    new = [go(c, sharing) for _, c in kids]
    if x is None:
      out = None
    elif t is tuple:
      out = tuple(new)
    elif t is list:
      out = new
    elif t is dict:
      out = {k.key: c for (k, _), c in zip(kids, new)}
    elif t is NT:
      out = NT(*new)
    elif t is KNode:
      out = KNode(x.tag, new)
    elif t is PNode:
      out = PNode(x.tag, new)
    elif t is DNode:
      out = DNode(new[0], new[1], x.m)
    elif t is Box:
      out = Box(new)
    else:
      raise AssertionError(t)
    if t in OPTED and sharing:
      memo[id(x)] = out
    return out

  return go(x, keep_sharing)


_LABEL_DEF = re.compile(r"#(\d+)=")
_LABEL_REF = re.compile(r"#(\d+)#")


def _node_text_end(text, start):
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  raise AssertionError(f"unbalanced repr: {text!r}")


def expand_labels(text):
  """Undoes SRFI-38 labels: ``#n=X ... #n#`` becomes ``X ... X``."""
  defs = {}
  while m := list(_LABEL_DEF.finditer(text)):
    m = m[-1]  # The last definition has no definition nested inside it.
    end = _node_text_end(text, m.end())
    defs[m.group(1)] = text[m.end() : end]
    text = text[: m.start()] + text[m.end() :]
  while _LABEL_REF.search(text):
    text = _LABEL_REF.sub(lambda m: defs[m.group(1)], text)
  return text


# ---------------------------------------------------------------------------
# The strategy.
# ---------------------------------------------------------------------------

TAGS = st.sampled_from(["k0", "k1", "k2"])


@st.composite
def dags(draw, max_pool=6, max_children=3, depth=2):
  """A random ``(args, kwargs)`` tree whose opted-in nodes are shared.

  A pool of opted-in nodes is built first, each node holding subtrees that
  may refer to earlier pool members (so shared nodes nest, and diamonds
  arise); optionally an explicit diamond is added.  Then the top level refers
  to pool members from several arguments and keyword arguments.
  """
  leaf_pool = [Leaf() for _ in range(3)]
  pool = []

  def leaf():
    kind = draw(st.integers(0, 3))
    if kind == 0:
      return Leaf()
    if kind == 1:  # The same leaf object in several places.
      return draw(st.sampled_from(leaf_pool))
    if kind == 2:
      return draw(st.integers(-2, 2))
    return draw(st.sampled_from(["s", "t"]))

  def subtree(d):
    # The first kinds are the likeliest (hypothesis favours early choices).
    kinds = ["pool"] * 6 if pool else []
    kinds += ["leaf", "leaf", "none"]
    if d > 0:
      kinds += ["tuple", "list", "dict", "nt", "box", "opted"]
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
      return leaf()
    if kind == "none":
      return None
    if kind == "pool":
      return draw(st.sampled_from(pool))
    if kind == "opted":
      return opted(d - 1)
    if kind == "nt":
      return NT(subtree(d - 1), subtree(d - 1))
    kids = [subtree(d - 1) for _ in range(draw(st.integers(0, max_children)))]
    if kind == "tuple":
      return tuple(kids)
    if kind == "list":
      return kids
    if kind == "box":
      return Box(kids)
    return {f"k{i}": c for i, c in enumerate(kids)}

  def opted(d, children=None):
    cls = draw(st.sampled_from(OPTED))
    if children is None:
      n = 2 if cls is DNode else draw(st.integers(0, max_children))
      children = [subtree(d) for _ in range(n)]
    if cls is KNode:
      return KNode(draw(TAGS), children)
    if cls is PNode:
      return PNode(draw(TAGS), children)
    children = (list(children) + [None, None])[:2]
    return DNode(children[0], children[1], draw(st.integers(0, 1)))

  for _ in range(draw(st.integers(2, max_pool))):
    pool.append(opted(depth - 1))
    if draw(st.integers(0, 4)) == 0:  # A diamond: a holds b and c, both hold d.
      d_node = pool[-1]
      b = opted(0, [d_node, leaf()])
      c = opted(0, [leaf(), d_node])
      pool.append(opted(0, [b, c]))

  def argument():  # Often a pool member itself: f(m, m), f(m, x=m).
    if draw(st.booleans()):
      return subtree(depth)
    return draw(st.sampled_from(pool))

  args = tuple(argument() for _ in range(draw(st.integers(1, 4))))
  kwargs = {f"kw{i}": argument() for i in range(draw(st.integers(0, 2)))}
  tree = (args, kwargs)
  note(f"tree = {tree!r}")
  return tree


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
  numbers = [int(n) for n in _LABEL_DEF.findall(text)]
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


# ---------------------------------------------------------------------------
# The queries that relate two sharings of one tree: unshared(),
# expansion_indices(finer), common_sharing(other).
# ---------------------------------------------------------------------------


def expanded_signature(x):
  """The pairs of opted-in node positions of ``x`` that hold one object, in a
  pre-order walk that re-enters shared nodes (stock's positions), so that
  trees that differ only in sharing number their positions alike."""
  objects = []

  def go(x):
    if type(x) in OPTED:
      objects.append(x)
    for _, child in children_with_keys(x) or []:
      go(child)

  go(x)
  return frozenset(
      (i, j)
      for i, j in itertools.combinations(range(len(objects)), 2)
      if objects[i] is objects[j]
  )


def drawn_breakage(x, data):
  """``x`` with one reference (if it has any) replaced by an equal copy."""
  refs = Model(x).refs
  if refs == 0:
    return copy_tree(x)
  k = data.draw(st.integers(0, refs - 1), label="broken reference")
  return copy_tree(x, break_reference=k)


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
  rebuilt = broken_td.unflatten([leaves[i] for i in indices])
  assert expanded_signature(rebuilt) == expanded_signature(broken)
  if broken_td != td:
    with pytest.raises(ValueError, match="PyTree sharing mismatch"):
      broken_td.expansion_indices(td)


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
  rebuilt = common.unflatten([leaves[i] for i in td.expansion_indices(common)])
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
