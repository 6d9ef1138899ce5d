"""Random DAGs of opted-in nodes, and an independent model of the semantics
of docs/semantics.md to check a flatten of them against: what the sharing
property tests draw (test_sharing_invariants.py,
test_sharing_query_invariants.py, test_prefix_broadcast.py).

The hypothesis strategy ``dags`` builds random object graphs of the classes
of ``nodes.py`` in which opted-in nodes are shared:

* three opted-in classes: ``KNode`` (custom, with ``to_iterable_with_keys``),
  ``PNode`` (custom, without keys) and ``DNode`` (a dataclass registered with
  ``register_dataclass_node``);
* mixed with builtin containers (tuple, list, dict, namedtuple, None), a
  custom class registered *without* the flag (``Box``) and leaves (fresh
  objects, the same leaf object several times, ints, strings);
* sharing across the top-level arguments of an ``(args, kwargs)`` tree, nested
  sharing in separate branches, and diamonds (A holds B and C, which both
  hold D).

``Model`` walks an object graph the way a flatten should: pre-order, left to
right, dict keys sorted, and an opted-in node already met is a reference (its
subtree is not walked again).
"""

from __future__ import annotations

import itertools
import re

from hypothesis import HealthCheck, note, settings
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


LABEL_DEF = re.compile(r"#(\d+)=")
LABEL_REF = re.compile(r"#(\d+)#")


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
  while m := list(LABEL_DEF.finditer(text)):
    m = m[-1]  # The last definition has no definition nested inside it.
    end = _node_text_end(text, m.end())
    defs[m.group(1)] = text[m.end() : end]
    text = text[: m.start()] + text[m.end() :]
  while LABEL_REF.search(text):
    text = LABEL_REF.sub(lambda m: defs[m.group(1)], text)
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
