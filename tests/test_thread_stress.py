"""Eight threads on one registry and shared DAGs at once, every result checked.

tests/test_leaks_and_threads.py::test_threads runs eight threads over one
fixed DAG while one of them registers types. This file pushes further:

* every thread registers its own new types (custom and dataclass, opted in or
  not) into the shared registry *while* the others flatten, and the others
  pick those new types up and flatten, unflatten and pickle instances of them
  at once;
* the flatten functions of the shared types hand the GIL to another thread
  (`time.sleep(0)`) in the middle of a flatten / unflatten / flatten_up_to, so
  that threads interleave inside the module's loops, not only between calls;
* every operation of the module runs somewhere at the same time: flatten,
  flatten_with_path, flatten_up_to, unflatten, walk, from_iterable_tree,
  children / node_data / from_node_data_and_children, compose, treedef_tuple,
  ==, hash, repr, pickle, and `gc.collect()` from worker threads; treedefs
  made by one thread are compared with those made by the others;
* every thread also runs its own registry.

Exceptions are collected and the list must be empty. (The module relies on
the GIL; for free-threaded CPython and the ThreadSanitizer run, see
docs/hardening.md.)
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import pickle
import random
import sys
import threading
import time

from jaxlib_patch import pytree as pt

from harness import run_in_threads
from nodes import DNode, Leaf

N_THREADS = 8
ITERATIONS = 250

_yields = itertools.count()


def maybe_yield():
  """Hands the GIL to another thread every few calls."""
  if next(_yields) % 3 == 0:
    time.sleep(0)


class YieldingNode:
  """Opted-in custom node with keys whose functions hand the GIL to another
  thread (nodes.KNode's never do), so that threads interleave inside the
  module's loops."""

  def __init__(self, *children, aux="n"):
    self.children = children
    self.aux = aux


def yielding_node_flatten(node):
  maybe_yield()
  return node.children, node.aux


def yielding_node_flatten_with_keys(node):
  maybe_yield()
  return (
      tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(node.children)),
      node.aux,
  )


def yielding_node_unflatten(aux, children):
  maybe_yield()
  return YieldingNode(*children, aux=aux)


class YieldingBox:
  """A custom node without the flag whose flatten function hands the GIL to
  another thread (nodes.Box's never does)."""

  def __init__(self, *children):
    self.children = children


def yielding_box_flatten(p):
  maybe_yield()
  return p.children, None


def yielding_box_unflatten(_, children):
  return YieldingBox(*children)


REG = pt.PyTreeRegistry()
REG.__module__ = __name__
REG.__name__ = "REG"
REG.register_node(
    YieldingNode,
    yielding_node_flatten,
    yielding_node_unflatten,
    yielding_node_flatten_with_keys,
    preserve_relative_identities=True,
)
REG.register_dataclass_node(
    DNode, ["a", "b"], ["m"], preserve_relative_identities=True
)
REG.register_node(YieldingBox, yielding_box_flatten, yielding_box_unflatten)

# Types registered by the threads, for the others to use: (cls, opted_in).
# Module attributes, so that pickle finds them.
NEW_TYPES = []
NEW_TYPES_LOCK = threading.Lock()


def make_dag():
  """A DAG with sharing at several levels; leaves are distinct objects."""
  leaves = [Leaf() for _ in range(6)]
  p = YieldingNode(leaves[0], leaves[1])
  d = DNode(p, leaves[2], "meta")
  q = YieldingNode(d, p, leaves[3])
  tree = [
      p,
      {"a": q, "b": d},
      YieldingBox(p, d, leaves[4]),
      (q, [d, leaves[5]]),
  ]
  return tree, leaves


def check_dag_output(out, template):
  """`out` (an unflatten result) shares exactly where make_dag's DAG does."""
  p, rest, plain, (q, (d, _)) = out
  assert (
      isinstance(p, YieldingNode)
      and isinstance(q, YieldingNode)
      and isinstance(d, DNode)
  )
  assert rest["a"] is q and rest["b"] is d
  assert plain.children[0] is p and plain.children[1] is d
  assert d.a is p and q.children[0] is d and q.children[1] is p
  # New objects, not the template's.
  assert p is not template[0] and d is not template[1]["b"]


def new_type(k, i, opted_in, dataclass):
  name = f"T{k}_{i}_{int(opted_in)}{int(dataclass)}"
  if dataclass:
    cls = dataclasses.dataclass(eq=False)(
        type(name, (), {"__annotations__": {"x": object, "y": object}})
    )
    REG.register_dataclass_node(
        cls, ["x", "y"], [], preserve_relative_identities=opted_in
    )
  else:
    cls = type(
        name,
        (),
        {
            "__init__": lambda self, x, y: (
                setattr(self, "x", x),
                setattr(self, "y", y),
                None,
            )[-1]
        },
    )
    REG.register_node(
        cls,
        lambda o: (maybe_yield(), ((o.x, o.y), None))[1],
        lambda a, c: cls(*c),
        preserve_relative_identities=opted_in,
    )
  cls.__module__ = __name__
  cls.__qualname__ = name
  setattr(sys.modules[__name__], name, cls)
  return cls


def check_new_type(cls, opted_in):
  """Flattens [o, o] for a type another thread registered."""
  leaf = Leaf()
  o = cls(leaf, Leaf())
  leaves, td = REG.flatten([o, o, o])
  if opted_in:
    assert td.num_leaves == 2 and len(leaves) == 2 and td.num_nodes == 6
    assert "#1=" in repr(td) and repr(td).count("#1#") == 2
    out = td.unflatten(leaves)
    assert out[0] is out[1] is out[2] and out[0] is not o
    assert out[0].x is leaf
  else:
    assert td.num_leaves == 6 and td.num_nodes == 10
    out = td.unflatten(leaves)
    assert out[0] is not out[1]
  back = pickle.loads(pickle.dumps(td))
  assert back == td and hash(back) == hash(td)
  assert td.flatten_up_to(out) == leaves


@dataclasses.dataclass
class Expected:
  """What every thread's operations on the shared DAG must give."""

  tree: object
  leaves: list
  treedef: pt.PyTreeDef
  text: str
  hash: int
  paths: list
  children: list

  @classmethod
  def of(cls, tree, leaves):
    expected_leaves, treedef = REG.flatten(tree)
    assert expected_leaves == leaves and len(leaves) == 6
    return cls(
        tree,
        leaves,
        treedef,
        repr(treedef),
        hash(treedef),
        [p for p, _ in REG.flatten_with_path(tree)[0]],
        treedef.children(),
    )

  def check(self, treedef):
    assert treedef == self.treedef and hash(treedef) == self.hash
    assert repr(treedef) == self.text


class Worker:
  """One thread: its own DAG and registry, and the operations it picks at
  random (ACTIONS), each checking its result."""

  def __init__(self, k, expected, published):
    self.k = k
    self.rng = random.Random(k)
    self.expected = expected
    # One treedef per thread, compared across threads.
    self.published = published
    self.own_tree, self.own_leaves = make_dag()
    self.own_reg = pt.PyTreeRegistry()
    self.own_reg.register_node(
        YieldingNode,
        yielding_node_flatten,
        yielding_node_unflatten,
        preserve_relative_identities=True,
    )

  def flatten_shared(self, i):
    leaves, td = REG.flatten(self.expected.tree)
    self.expected.check(td)
    assert all(a is b for a, b in zip(leaves, self.expected.leaves))
    self.published[self.k] = td

  def round_trip(self, i):
    tree = self.own_tree if i % 2 else self.expected.tree
    leaves, td = REG.flatten(tree)
    out = td.unflatten(leaves)
    check_dag_output(out, tree)
    assert td.flatten_up_to(out) == leaves
    assert REG.flatten(out)[1] == self.expected.treedef

  def flatten_with_path(self, i):
    pairs, td = REG.flatten_with_path(self.expected.tree)
    assert [p for p, _ in pairs] == self.expected.paths
    assert td == self.expected.treedef

  def pickle_round_trip(self, i):
    back = pickle.loads(pickle.dumps(self.expected.treedef))
    assert back == self.expected.treedef and hash(back) == self.expected.hash
    check_dag_output(back.unflatten(self.own_leaves), self.expected.tree)

  def rebuild_from_children(self, i):
    children = self.expected.treedef.children()
    assert children == self.expected.children
    rebuilt = pt.PyTreeDef.from_node_data_and_children(
        REG, self.expected.treedef.node_data(), children
    )
    assert rebuilt == self.expected.treedef
    assert pt.treedef_tuple(REG, children).num_leaves == 6

  def compose(self, i):
    inner = REG.flatten((1, 2))[1]
    composed = self.expected.treedef.compose(inner)
    assert composed.num_leaves == 12
    out = composed.unflatten(range(12))
    assert out[1]["b"] is out[3][1][0]

  def walk(self, i):
    calls = []
    self.expected.treedef.walk(
        lambda c, d: calls.append(d) or c, lambda x: x, self.own_leaves
    )
    # Shared nodes built once: p, d, q, the dict, YieldingBox, the inner
    # list, the tuple and the root list.
    assert len(calls) == 8
    iterable = self.expected.treedef.walk(
        lambda c, d: list(c), lambda x: x, self.own_leaves
    )
    check_dag_output(
        self.expected.treedef.from_iterable_tree(iterable), self.expected.tree
    )

  def register_new_type(self, i):
    # Register a new type; others will use it.
    opted_in = self.rng.random() < 0.7
    cls = new_type(self.k, i, opted_in, self.rng.random() < 0.4)
    with NEW_TYPES_LOCK:
      NEW_TYPES.append((cls, opted_in))
    check_new_type(cls, opted_in)

  def use_new_type(self, i):
    with NEW_TYPES_LOCK:
      choices = list(NEW_TYPES)
    if choices:
      check_new_type(*self.rng.choice(choices))

  def compare_published(self, i):
    for other in self.published:
      if other is not None:
        self.expected.check(other)

  def own_registry(self, i):
    leaves, td = self.own_reg.flatten([self.own_tree[0]] * 3)
    assert td.num_leaves == 2 and td.num_nodes == 6
    out = td.unflatten(leaves)
    assert out[0] is out[1] is out[2]

  def collect(self, i):
    gc.collect(self.rng.choice([0, 1, 2]))

  ACTIONS = (
      flatten_shared,
      round_trip,
      flatten_with_path,
      pickle_round_trip,
      rebuild_from_children,
      compose,
      walk,
      register_new_type,
      use_new_type,
      compare_published,
      own_registry,
      collect,
  )

  def run(self, iterations, counts):
    for i in range(iterations):
      self.ACTIONS[self.rng.randrange(len(self.ACTIONS))](self, i)
      counts[self.k] += 1


def test_thread_stress():
  expected = Expected.of(*make_dag())
  published = [None] * N_THREADS
  counts = [0] * N_THREADS

  def worker(k):
    Worker(k, expected, published).run(ITERATIONS, counts)

  errors = run_in_threads(worker, N_THREADS, timeout=300)
  assert not errors, f"{len(errors)} threads failed:\n" + "\n".join(
      f"thread {k}: {tb}" for k, tb in errors[:3]
  )
  assert counts == [ITERATIONS] * N_THREADS
  # Everyone registered types, and all of them are in the registry.
  assert all(REG.is_node(cls) for cls, _ in NEW_TYPES)
