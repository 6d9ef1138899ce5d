"""No reference leaks, collectable cycles, and thread safety.

* Tens of thousands of flatten / unflatten / pickle round trips (and as many
  failing calls) leave the reference counts of the objects involved (a leaf,
  an aux data object, the registered types, the registry, the user's
  functions) exactly where they were, and the number of objects tracked by
  the garbage collector flat.
* A cycle registry -> flatten function -> aux -> treedef -> registry is
  collected by the garbage collector.
* Eight threads flattening, unflattening, comparing and pickling shared DAGs
  at once (while another registers new types) all get correct results.
"""

from __future__ import annotations

import gc
import pickle
import sys
import threading
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxlib._jax import pytree as stock
from jaxlib_patch import pytree as pt

from harness import (
    by_address,
    clear_as_the_collector_does,
    isolated,
    run_in_threads,
)
from nodes import (
    Box,
    DNode,
    KNode,
    PNode,
    Leaf,
    box_flatten,
    knode_flatten,
    knode_flatten_with_keys,
    knode_unflatten,
    register_all,
)

# ---------------------------------------------------------------------------
# Classes and the registry (module level: pickle finds them by name).
# ---------------------------------------------------------------------------


class Aux:
  """Aux data: hashable; equal by name (so a pickled copy is equal)."""

  def __init__(self, name="aux"):
    self.name = name

  def __eq__(self, other):
    return isinstance(other, Aux) and other.name == self.name

  def __hash__(self):
    return hash(self.name)

  def __repr__(self):
    return f"Aux({self.name!r})"


class Bomb:
  """Opted-in; its flatten function raises."""


class BombError(Exception):
  pass


def bomb_flatten(_):
  raise BombError("flatten")


class Fragile:
  """Opted-in; its unflatten function raises."""


def fragile_flatten(f):
  return (Leaf(),), None


def fragile_unflatten(aux, children):
  raise BombError("unflatten")


REG = register_all(pt.PyTreeRegistry(), opt_in=True)
REG.__module__ = __name__
REG.__name__ = "REG"
REG.register_node(
    Bomb, bomb_flatten, knode_unflatten, preserve_relative_identities=True
)
REG.register_node(
    Fragile,
    fragile_flatten,
    fragile_unflatten,
    preserve_relative_identities=True,
)


def make_tree(leaf, aux):
  """A DAG: m shared by two args and a kwarg; a diamond below m."""
  d = DNode(leaf, None, aux)
  b = KNode(aux, [d, leaf])
  c = KNode(aux, [leaf, d])
  m = KNode(aux, [b, c, Box([leaf, leaf])])
  return ((m, m, [leaf, leaf]), {"kw": m, "other": DNode(d, None, aux)})


def check_shared_output(out):
  """The output of unflatten shares exactly where make_tree's does."""
  (m0, m1, _), kwargs = out
  assert m0 is m1 is kwargs["kw"]
  b, c, _ = m0.children
  assert b.children[0] is c.children[1] is kwargs["other"].a


# ---------------------------------------------------------------------------
# Measurement.
# ---------------------------------------------------------------------------

WATCHED_FUNCTIONS = [
    knode_flatten,
    knode_unflatten,
    knode_flatten_with_keys,
    box_flatten,
    bomb_flatten,
    fragile_unflatten,
]


def refcounts(*objects):
  return [sys.getrefcount(o) for o in objects]


def measure(leaf, aux):
  gc.collect()
  watched = (
      leaf,
      aux,
      KNode,
      DNode,
      Box,
      Bomb,
      Fragile,
      REG,
      *WATCHED_FUNCTIONS,
  )
  counts = refcounts(*watched)
  del watched
  return counts, len(gc.get_objects())


def assert_flat(work, leaf, aux, iterations, warmup=300, slack=30):
  """Runs work(leaf, aux, n): refcounts exactly equal, few new gc objects."""
  work(leaf, aux, warmup)
  before, objects_before = measure(leaf, aux)
  work(leaf, aux, iterations)
  after, objects_after = measure(leaf, aux)
  assert after == before, "reference counts moved (leak or over-release)"
  assert (
      abs(objects_after - objects_before) <= slack
  ), f"{objects_after - objects_before} objects more tracked by the gc"


# ---------------------------------------------------------------------------
# Leaks.
# ---------------------------------------------------------------------------


def round_trips(leaf, aux, n):
  """Five operations per iteration, every result checked."""
  x = make_tree(leaf, aux)
  for _ in range(n):
    leaves, td = REG.flatten(x)
    out = td.unflatten(leaves)
    path_leaves, td2 = REG.flatten_with_path(out)
    back = pickle.loads(pickle.dumps(td, pickle.HIGHEST_PROTOCOL))
    up_to = back.flatten_up_to(out)
    assert td == td2 == back and hash(td) == hash(back)
    assert len(path_leaves) == len(leaves) == len(up_to) == 7
    assert up_to[0] is leaf
  check_shared_output(out)


def test_round_trips_do_not_leak():
  """20,000 x (flatten, unflatten, flatten_with_path, pickle, flatten_up_to)."""
  assert_flat(round_trips, Leaf(), Aux(), 20_000)


def treedef_operations(leaf, aux, n):
  """The other treedef operations: children, rebuild, compose, walk, repr,
  the sharing queries."""
  x = make_tree(leaf, aux)
  leaves, td = REG.flatten(x)
  inner = REG.flatten(KNode(aux, [leaf]))[1]
  for _ in range(n):
    children = td.children()
    rebuilt = pt.PyTreeDef.from_node_data_and_children(
        REG, td.node_data(), children
    )
    composed = td.compose(inner)
    walked = td.walk(lambda c, d: c, lambda v: v, leaves)
    assert rebuilt == td and pt.treedef_tuple(REG, children) == td
    assert composed.num_leaves == td.num_leaves
    assert walked[0][0] is walked[0][1]
    assert "#1=" in repr(td)
    # walk's result (children tuples) is an iterable tree.
    check_shared_output(td.from_iterable_tree(walked))
    unshared = td.unshared()
    assert len(td.expansion_indices(unshared)) == unshared.num_leaves
    assert td.common_sharing(unshared) == unshared


def test_treedef_operations_do_not_leak():
  """children / from_node_data_and_children / compose / walk / repr."""
  assert_flat(treedef_operations, Leaf(), Aux(), 10_000)


def error_paths(leaf, aux, n):
  """Failing calls: flatten raising, sharing mismatch, cycles, bad counts."""
  x = make_tree(leaf, aux)
  _, td = REG.flatten(x)
  m = x[0][0]
  broken = ((m, KNode(aux, m.children), [leaf, leaf]), x[1])
  cyclic = KNode(aux, [leaf])
  cyclic.children = (leaf, [cyclic])
  fragile = Fragile()
  fragile_td = REG.flatten([fragile, fragile, m])[1]
  bad_state = (
      REG,
      [
          (0, 0, None, None, 1, 1),
          (6, 0, None, KNode, 0, 1, 1),
          (2, 2, None, None, 1, 3),
      ],
  )
  for _ in range(n):
    with pytest.raises(BombError):
      REG.flatten([m, m, leaf, Bomb()])
    with pytest.raises(BombError):
      REG.flatten_with_path({"a": m, "b": (m, Bomb())})
    with pytest.raises(ValueError, match="tree"):
      td.flatten_up_to(broken)
    with pytest.raises(ValueError, match="KNode"):
      REG.flatten([m, cyclic])
    with pytest.raises(ValueError):
      td.unflatten([leaf])
    with pytest.raises(ValueError, match="sharing mismatch"):
      td.unshared().expansion_indices(td)
    with pytest.raises(BombError):
      fragile_td.unflatten([leaf] * fragile_td.num_leaves)
    with pytest.raises(ValueError):
      pt.PyTreeDef.__new__(pt.PyTreeDef).__setstate__(bad_state)
  cyclic.children = ()


def test_error_paths_do_not_leak():
  """7 failing calls per iteration, 5,000 iterations."""
  assert_flat(error_paths, Leaf(), Aux(), 5_000)


class Inner:
  """Its flatten function flattens a tree of its own (nested flatten), and
  raises after it if the node is `failing`."""

  def __init__(self, children, failing=False):
    self.children = children
    self.failing = failing


def inner_flatten(node, registry):
  leaves, _ = registry.flatten([node.children, [Leaf(), Leaf()]])
  assert len(leaves) == len(node.children) + 2
  if node.failing:
    raise ValueError("failing on purpose")
  return node.children, None


def buffer_registries():
  """The module's registry and stock's, each with Inner registered."""
  registries = []
  for module in (pt, stock):
    registry = module.PyTreeRegistry()
    registry.register_node(
        Inner,
        lambda node, registry=registry: inner_flatten(node, registry),
        lambda _, children: Inner(list(children)),
    )
    registries.append(registry)
  return registries


LEAF_BUFFER_REGISTRIES = buffer_registries()

# Lists of leaves and of Inner nodes (each holding leaves of its own), some
# failing, at the sizes that move the thread's kept leaf buffer: empty, small,
# and past the size it had.
BUFFER_TREES = st.lists(
    st.one_of(
        st.integers(0, 300).map(lambda n: [Leaf() for _ in range(n)]),
        st.tuples(st.integers(0, 40), st.booleans()).map(
            lambda nf: Inner([Leaf() for _ in range(nf[0])], nf[1])
        ),
    ),
    max_size=6,
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(BUFFER_TREES, min_size=1, max_size=4))
def test_the_leaf_buffer_across_nested_and_failing_flattens(trees):
  # Each flatten collects its leaves in the thread's kept buffer, or its own
  # when a flatten function flattens inside it. The leaves must come out in
  # stock's order, and a failing flatten must release every one it took.
  ours, theirs = LEAF_BUFFER_REGISTRIES
  for tree in trees:
    fails = any(isinstance(t, Inner) and t.failing for t in tree)
    leaves_before = [x for t in tree for x in getattr(t, "children", t)]
    counts = [sys.getrefcount(x) for x in leaves_before]
    if fails:
      with pytest.raises(ValueError, match="failing on purpose"):
        ours.flatten(tree)
      with pytest.raises(ValueError, match="failing on purpose"):
        theirs.flatten(tree)
    else:
      leaves, treedef = ours.flatten(tree)
      expected, _ = theirs.flatten(tree)
      assert len(leaves) == len(expected) == treedef.num_leaves
      assert all(a is b for a, b in zip(leaves, expected))
      del leaves, expected, treedef
    assert [sys.getrefcount(x) for x in leaves_before] == counts


def test_the_leaf_buffer_past_the_size_a_thread_keeps():
  # A flatten of more leaves than a thread keeps room for (131,072) frees
  # its buffer instead of keeping it; the next flattens, small and large,
  # start from what is kept.
  registry = pt.PyTreeRegistry()
  leaf = Leaf()
  count = sys.getrefcount(leaf)
  for size in (3, (1 << 17) + 1, 5, 1 << 17, (1 << 18) + 1, 0, 1000):
    leaves, treedef = registry.flatten([leaf] * size)
    assert len(leaves) == treedef.num_leaves == size
    assert all(x is leaf for x in leaves)
    del leaves, treedef
    assert sys.getrefcount(leaf) == count


def test_the_leaf_buffer_at_each_edge_of_its_room_from_a_new_thread():
  # A new thread has no buffer kept: the first 16 leaves stay in the
  # flatten's own room, then the buffer starts at 64 and doubles. Every size
  # around those edges, in order, each flatten after a larger one too.
  results = []

  def flatten_each():
    registry = pt.PyTreeRegistry()
    for size in (0, 1, 15, 16, 17, 79, 80, 81, 143, 144, 145, 17, 300, 5):
      tree = [Leaf() for _ in range(size)]
      counts = [sys.getrefcount(x) for x in tree]
      leaves, treedef = registry.flatten(tree)
      results.append(
          len(leaves) == treedef.num_leaves == size
          and all(a is b for a, b in zip(leaves, tree))
      )
      del leaves, treedef
      results.append([sys.getrefcount(x) for x in tree] == counts)

  thread = threading.Thread(target=flatten_each)
  thread.start()
  thread.join()
  assert len(results) == 28 and all(results), results


# ---------------------------------------------------------------------------
# Garbage collection of cycles.
# ---------------------------------------------------------------------------


def make_cycle():
  """registry -> flatten fn -> aux -> treedef -> registry (and aux).

  Returns weak references to the aux object and to the registered class.
  """
  registry = pt.PyTreeRegistry()

  class Holder:
    """Aux data that refers back to the treedef holding it."""

  class ClosureNode:
    """Registered with a flatten function that closes over the aux data, so
    that the registry is where the cycle starts (nodes.KNode's functions
    close over nothing)."""

    def __init__(self, x):
      self.x = x

  aux = Holder()

  def flatten(node):  # A closure over aux: the registry holds aux.
    return (node.x,), aux

  registry.register_node(
      ClosureNode,
      flatten,
      lambda a, ch: ClosureNode(*ch),
      preserve_relative_identities=True,
  )
  node = ClosureNode(Leaf())
  _, td = registry.flatten([node, node])
  aux.treedef = td  # aux -> treedef -> aux (node data) and -> registry.
  aux.registry = registry
  aux.children = td.children()
  return weakref.ref(aux), weakref.ref(ClosureNode)


def test_gc_collects_registry_treedef_aux_cycle():
  """After del + gc.collect(), nothing of the cycle is left alive."""
  gc.collect()
  aux_ref, type_ref = make_cycle()
  assert aux_ref() is not None  # Only the cycle keeps it alive.
  gc.collect()
  assert aux_ref() is None
  assert type_ref() is None


def test_gc_collects_treedef_in_its_own_aux():
  """A treedef whose node data holds the treedef itself is collected."""
  gc.collect()

  def build():
    aux = Aux()
    _, td = REG.flatten(KNode(aux, [Leaf()]))
    aux.td = td
    return weakref.ref(aux)

  ref = build()
  gc.collect()
  assert ref() is None


def cleared_treedef_operations(td, other):
  """Every PyTreeDef operation that reads `td`'s nodes, by name."""
  return {
      "unflatten": lambda: td.unflatten([1, 2]),
      "walk": lambda: td.walk(lambda *a: 0, lambda x: x, [1, 2]),
      "flatten_up_to": lambda: td.flatten_up_to(PNode("n", [1, 2])),
      "from_iterable_tree": lambda: td.from_iterable_tree((1, 2)),
      "node_data": td.node_data,
      "compose": lambda: td.compose(other),
      "composed into": lambda: other.compose(td),
      "treedef_tuple": lambda: pt.treedef_tuple(REG, [other, td]),
      "from_node_data_and_children": lambda: td.from_node_data_and_children(
          REG, (tuple, None), [other, td]
      ),
      "broadcast_flattened_prefix": lambda: other.broadcast_flattened_prefix(
          td, [1]
      ),
      "serialize_using_proto": td.serialize_using_proto,
      "pickle": lambda: pickle.dumps(td),
      "unshared": td.unshared,
      "common_sharing": lambda: td.common_sharing(other),
      "sharing_difference": lambda: other.sharing_difference(td),
      "sharing_differences": lambda: other.sharing_differences(td),
      "expansion_indices": lambda: td.expansion_indices(other),
  }


@isolated
def test_a_treedef_during_and_after_tp_clear_is_empty_and_raises():
  """tp_clear (the collector's, on a cycle through node data) leaves an
  empty treedef whose operations raise ValueError; code that dropping its
  node data runs (a weak reference's callback) finds it so already, never
  half-dropped nodes."""
  seen = []

  def use_it(_):
    td = by_address(address)
    seen.append((td.num_leaves, td.num_nodes, repr(td)))
    for name, operation in cleared_treedef_operations(td, other).items():
      try:
        operation()
        seen.append(f"{name}: no error")
      except ValueError as e:
        seen.append(str(e))

  data = Aux()
  watch = weakref.ref(data, use_it)
  _, td = REG.flatten(PNode(data, [1, 2]))
  _, other = REG.flatten((1, 2))
  del data
  address = id(td)
  clear_as_the_collector_does(td)
  assert watch() is None
  assert seen[0] == (0, 0, "PyTreeDef()")
  cleared = "This PyTreeDef was cleared by the garbage collector."
  assert seen[1:] == [cleared] * len(cleared_treedef_operations(td, other))
  for name, operation in cleared_treedef_operations(td, other).items():
    with pytest.raises(ValueError, match="cleared by the garbage collector"):
      operation()
  assert td == td and hash(td) == hash(td) and td != other


# ---------------------------------------------------------------------------
# Threads.
# ---------------------------------------------------------------------------


def test_threads():
  """8 threads x 300 iterations on shared DAGs; every result is checked."""
  leaf, aux = Leaf(), Aux()
  shared_x = make_tree(leaf, aux)
  expected_leaves, expected_td = REG.flatten(shared_x)
  expected_repr = repr(expected_td)

  def worker(k):
    own_leaf = Leaf()
    own_x = make_tree(own_leaf, aux)
    for i in range(300):
      x = shared_x if i % 2 else own_x
      leaves, td = REG.flatten(x)
      assert td == expected_td and hash(td) == hash(expected_td)
      assert repr(td) == expected_repr
      assert leaves[0] is (leaf if i % 2 else own_leaf)
      out = td.unflatten(leaves)
      check_shared_output(out)
      back = pickle.loads(pickle.dumps(td))
      assert back == expected_td
      assert back.flatten_up_to(out) == leaves
      path_leaves, _ = REG.flatten_with_path(out)
      assert [v for _, v in path_leaves] == leaves
      if k == 0 and i % 10 == 0:
        # Meanwhile, a new opted-in type in the same registry.
        cls = type(f"New{i}", (), {})
        REG.register_node(
            cls,
            lambda o: ((), None),
            lambda a, c: cls(),
            preserve_relative_identities=True,
        )
        obj = cls()
        assert REG.flatten([obj, obj])[1].num_nodes == 3

  errors = run_in_threads(worker, 8, timeout=120)
  assert errors == []


def test_threads_calling_one_jitted_function():
  # Eight threads call one jitted function at once, on plain trees and on
  # nodes whose treedefs keep changing, while types are registered: each
  # call reaches the dispatch its arguments call for, with its own leaves,
  # though every thread replaces the memo and the last treedef.
  registry = register_all(pt.PyTreeRegistry(), opt_in=True)
  leaf = lambda *args, **kwargs: ("leaf", args, kwargs)
  main = lambda dispatch_args, *_: ("main", dispatch_args.leaves)
  jitted = pt.jit.make_jit_function(
      lambda *args: args, lambda *_: main, registry, [], [], leaf
  )

  def worker(k):
    for i in range(300):
      plain = [i, (None, {"k": float(i)})][: 1 + i % 2]
      assert jitted(plain) == ("leaf", (plain,), {})
      tail = [k] * (i % 3)
      assert jitted(PNode("n", [i]), tail) == ("main", [i, *tail])
      if k == 0 and i % 50 == 0:
        registry.register_node(
            type(f"Registered{i}", (), {}),
            lambda o: ((), None),
            lambda aux, children: None,
        )

  assert run_in_threads(worker, 8, timeout=120) == []
