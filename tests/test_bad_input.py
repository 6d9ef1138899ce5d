"""Bad input gives a clear Python exception, never a crash.

Each test that could crash the interpreter (a segfault, an abort) runs in a
forked child process (``harness.isolated``), so that a crash fails that one
test with the signal's name instead of killing the whole test run.
"""

from __future__ import annotations

import pickle
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import isolated, progress
from jaxlib_patch import pytree as pt
from nodes import Box, DNode, Leaf, PNode, register_all

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# What a rejected input may raise.  Never SystemError (a C-API misuse, or the
# module's InternalError: a bug), never a crash.
CLEAN = (ValueError, TypeError)


# ---------------------------------------------------------------------------
# Classes and the registry.
# ---------------------------------------------------------------------------


class AuxNode:
  """Opted-in custom node with keys whose node data is exactly ``aux``: the
  tests hand the module aux data that misbehaves itself (nodes.KNode wraps
  its tag in a tuple, whose comparison and hash would stand in between)."""

  def __init__(self, *children, aux=None):
    self.children = children
    self.aux = aux


class Boom(Exception):
  """Raised by misbehaving user callbacks."""


class RaisingIterator:
  """Iterates over two children (or (key, child) pairs), then raises Boom."""

  def __init__(self, pairs=False):
    self.i = 0
    self.pairs = pairs

  def __iter__(self):
    return self

  def __next__(self):
    self.i += 1
    if self.i > 2:
      raise Boom("mid-way")
    return (pt.FlattenedIndexKey(self.i), Leaf()) if self.pairs else Leaf()


class Junk:
  """Opted-in node whose flatten functions return ``self.result``."""

  def __init__(self, result):
    self.result = result


def junk_result(node):
  result = node.result
  if isinstance(result, type) and issubclass(result, BaseException):
    raise result("from the flatten function")
  if callable(result):
    return result()
  return result


REG = register_all(pt.PyTreeRegistry(), opt_in=True)
REG.__module__ = __name__
REG.__name__ = "REG"
REG.register_node(
    AuxNode,
    lambda n: (n.children, n.aux),
    lambda aux, ch: AuxNode(*ch, aux=aux),
    lambda n: (
        tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(n.children)),
        n.aux,
    ),
    preserve_relative_identities=True,
)
REG.register_node(
    Junk,
    junk_result,
    lambda aux, ch: Junk(None),
    junk_result,
    preserve_relative_identities=True,
)


def shared_treedef():
  """A treedef with sharing: [n, {'k': n}, DNode(d), d] with d a DNode."""
  n = AuxNode(Leaf(), PNode("o", [Leaf()]))
  d = DNode(Leaf(), None, 3)
  return REG.flatten([n, {"k": n}, DNode(d, None, 0), d])[1]


# ---------------------------------------------------------------------------
# Registration flag.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [1, 0, "yes", None, 1.0, [True]])
def test_flag_must_be_a_bool(flag):
  """preserve_relative_identities=<not a bool> is a TypeError."""
  reg = pt.PyTreeRegistry()

  class T:
    pass

  with pytest.raises(TypeError):
    reg.register_node(
        T,
        lambda t: ((), None),
        lambda _, c: T(),
        preserve_relative_identities=flag,
    )
  with pytest.raises(TypeError):
    reg.register_dataclass_node(T, [], [], preserve_relative_identities=flag)
  # Nothing was registered.
  assert reg.flatten(T())[1].num_leaves == 1
  # A bool is accepted; the flag is keyword-only.
  reg.register_node(
      T,
      lambda t: ((), None),
      lambda _, c: T(),
      preserve_relative_identities=False,
  )
  with pytest.raises(TypeError):
    pt.PyTreeRegistry().register_node(
        T, lambda t: ((), None), lambda _, c: T(), None, True
    )


# ---------------------------------------------------------------------------
# Leaf counts.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [-3, -1, 1, 5])
def test_wrong_leaf_count(delta):
  """unflatten and walk with too few/many leaves: ValueError."""
  td = shared_treedef()
  n = td.num_leaves + delta
  if n < 0:
    n = 0
  with pytest.raises(ValueError):
    td.unflatten([Leaf()] * n)
  with pytest.raises(ValueError):
    td.walk(lambda c, d: c, lambda x: x, [Leaf()] * n)
  with pytest.raises(TypeError):
    td.unflatten(42)


# ---------------------------------------------------------------------------
# Misbehaving flatten / unflatten functions.
# ---------------------------------------------------------------------------


def _flatten_ops():
  good_td = REG.flatten([Junk(((Leaf(),), None))])[1]
  return {
      "flatten": REG.flatten,
      "flatten_with_path": REG.flatten_with_path,
      "flatten_up_to": good_td.flatten_up_to,
  }


@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
def test_flatten_function_that_raises(op):
  """The user's exception propagates unchanged."""
  fn = _flatten_ops()[op]
  with pytest.raises(Boom, match="from the flatten function"):
    fn([Junk(Boom)])
  # A shared node whose flatten raises at its first occurrence.
  j = Junk(Boom)
  with pytest.raises(Boom):
    fn([j, j] if op != "flatten_up_to" else [j])


JUNK_RESULTS = {
    "list instead of tuple": ([Leaf()], None),
    "3-tuple": ((Leaf(),), None, "extra"),
    "1-tuple": ((Leaf(),),),
    "not a tuple": 42,
    "None": None,
    "non-iterable children": (42, None),
    "None children": (None, None),
}


@isolated
@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
@pytest.mark.parametrize("junk", sorted(JUNK_RESULTS))
def test_flatten_function_returns_junk(op, junk):
  """A malformed (children, aux) result: ValueError."""
  result = JUNK_RESULTS[junk]
  if junk == "list instead of tuple":
    result = list(result)
  fn = _flatten_ops()[op]
  with pytest.raises(ValueError):
    fn([Junk(result)])


@isolated
@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
def test_flatten_children_iterator_raises_mid_way(op):
  """Children whose iterator raises after two items: that error."""
  fn = _flatten_ops()[op]
  with pytest.raises(Boom, match="mid-way"):
    fn([Junk(lambda: (RaisingIterator(op == "flatten_with_path"), None))])


@isolated
def test_flatten_with_keys_returns_non_pairs():
  """to_iterable_with_keys yielding non-(key, child) items: ValueError."""
  with pytest.raises(ValueError):
    REG.flatten_with_path(Junk(((Leaf(),), None)))
  with pytest.raises(ValueError):
    REG.flatten_with_path(Junk((((1, 2, 3),), None)))


@isolated
def test_from_iterable_that_raises():
  """unflatten and from_iterable_tree propagate from_iterable's error."""
  reg = pt.PyTreeRegistry()

  class Fragile:
    pass

  def unflatten(aux, children):
    raise Boom("from_iterable")

  reg.register_node(
      Fragile,
      lambda f: ((Leaf(),), None),
      unflatten,
      preserve_relative_identities=True,
  )
  f = Fragile()
  leaves, td = reg.flatten([f, f, Fragile()])
  for _ in range(3):  # No state is left behind by a failed call.
    with pytest.raises(Boom):
      td.unflatten(leaves)
    with pytest.raises(Boom):
      td.from_iterable_tree([[Leaf()], None, [Leaf()]])
  # walk does not call from_iterable.
  assert td.walk(lambda c, d: c, lambda x: x, leaves) is not None


# ---------------------------------------------------------------------------
# Aux data that misbehaves.
# ---------------------------------------------------------------------------


class BadEq:
  """Aux data whose __eq__ raises (and which is therefore unhashable)."""

  __hash__ = None

  def __eq__(self, other):
    raise Boom("__eq__")


@isolated
def test_aux_eq_raises():
  """Comparing treedefs turns the aux's __eq__ error into stock's ValueError,
  chained to the original; hash works."""

  def assert_raises_from_boom(compare):
    with pytest.raises(ValueError, match="checking equality of metadata") as e:
      compare()
    assert isinstance(e.value.__cause__, Boom)

  td1 = REG.flatten(AuxNode(Leaf(), aux=BadEq()))[1]
  td2 = REG.flatten(AuxNode(Leaf(), aux=BadEq()))[1]
  assert_raises_from_boom(lambda: td1 == td2)
  assert_raises_from_boom(lambda: td1 != td2)
  assert hash(td1) == hash(td2)
  # With sharing too.
  n = AuxNode(Leaf(), aux=BadEq())
  td3 = REG.flatten([n, n])[1]
  td4 = REG.flatten([AuxNode(Leaf(), aux=BadEq())] * 2)[1]
  assert_raises_from_boom(lambda: td3 == td4)
  assert hash(td3) == hash(td4)


@isolated
def test_unhashable_aux():
  """hash(treedef) works with unhashable aux data and agrees with ==."""
  n = AuxNode(Leaf(), aux=["unhashable", {"x": 1}])
  td1 = REG.flatten([n, n])[1]
  td2 = REG.flatten([n, n])[1]
  assert td1 == td2 and hash(td1) == hash(td2)
  assert {td1: 1}[td2] == 1
  td3 = REG.flatten([AuxNode(Leaf(), aux=["other"])] * 2)[1]
  assert td3 != td1


@isolated
def test_unpicklable_aux():
  """pickle.dumps of a treedef with unpicklable aux raises cleanly."""
  td = REG.flatten([AuxNode(Leaf(), aux=threading.Lock())] * 2)[1]
  with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
    pickle.dumps(td)
  # A picklable one still works afterwards.
  td = shared_treedef()
  assert pickle.loads(pickle.dumps(td)) == td


# ---------------------------------------------------------------------------
# Malformed pickled states.
# ---------------------------------------------------------------------------

L = (0, 0, None, None, 1, 1)  # A leaf entry.


def node_entry(arity, num_leaves=0, num_nodes=1, aux=None):
  return (6, arity, aux, AuxNode, num_leaves, num_nodes)


def ref_entry(distance, cls=AuxNode, kind=6):
  return (kind, 0, None, cls, 0, 1, distance)


MALFORMED_STATES = {
    "not a tuple": lambda: [REG, [L]],
    "1-tuple": lambda: (REG,),
    "3-tuple": lambda: (REG, [L], None),
    "no registry": lambda: (None, [L]),
    "registry is a string": lambda: ("REG", [L]),
    "nodes not iterable": lambda: (REG, 5),
    "no nodes": lambda: (REG, []),
    "two roots": lambda: (REG, [L, L]),
    "entry not a tuple": lambda: (REG, [list(L)]),
    "entry of 5": lambda: (REG, [L[:5]]),
    "entry of 8": lambda: (REG, [L + (0, 0)]),
    "kind -1": lambda: (REG, [(-1,) + L[1:]]),
    "kind 8": lambda: (REG, [(8,) + L[1:]]),
    "kind str": lambda: (REG, [("0",) + L[1:]]),
    "kind huge": lambda: (REG, [(2**70,) + L[1:]]),
    "arity str": lambda: (REG, [L, (2, "1", None, None, 1, 2)]),
    "negative arity": lambda: (REG, [L, (2, -1, None, None, 1, 2)]),
    "arity too big": lambda: (REG, [L, (2, 2, None, None, 1, 2)]),
    "leaf with a child": lambda: (REG, [L, (0, 1, None, None, 1, 2)]),
    "None with a child": lambda: (REG, [L, (1, 1, None, None, 1, 2)]),
    "dict keys not a list": lambda: (REG, [L, (5, 1, "a", None, 1, 2)]),
    "dict keys short": lambda: (REG, [L, L, (5, 2, ["a"], None, 2, 3)]),
    "namedtuple without type": lambda: (REG, [L, (3, 1, None, None, 1, 2)]),
    "custom type unknown": lambda: (REG, [L, (6, 1, None, Leaf, 1, 2)]),
    "custom type not a type": lambda: (REG, [L, (6, 1, None, "AuxNode", 1, 2)]),
    "custom kind for a dataclass": lambda: (
        REG,
        [L, (6, 1, (0,), DNode, 1, 2)],
    ),
    "dataclass kind for a custom": lambda: (
        REG,
        [L, (7, 1, (), AuxNode, 1, 2)],
    ),
    "dataclass wrong arity": lambda: (REG, [L, (7, 1, (0,), DNode, 1, 2)]),
    "dataclass meta not a tuple": lambda: (
        REG,
        [L, L, (7, 2, [0], DNode, 2, 3)],
    ),
    "dataclass meta too long": lambda: (
        REG,
        [L, L, (7, 2, (0, 1), DNode, 2, 3)],
    ),
    "reference to a leaf": lambda: (
        REG,
        [L, ref_entry(1), (2, 2, None, None, 1, 3)],
    ),
    "reference to a reference": lambda: (
        REG,
        [
            L,
            node_entry(1),
            ref_entry(1),
            ref_entry(1),
            (2, 3, None, None, 1, 5),
        ],
    ),
    "reference to another opted-in type": lambda: (
        REG,
        [L, (6, 1, None, PNode, 1, 2), ref_entry(1), (2, 2, None, None, 1, 4)],
    ),
    "reference to a non-opted-in type": lambda: (
        REG,
        [
            L,
            (6, 1, None, Box, 1, 2),
            ref_entry(1, Box),
            (2, 2, None, None, 1, 4),
        ],
    ),
    "reference of kind tuple": lambda: (
        REG,
        [
            L,
            (2, 1, None, None, 1, 2),
            (2, 0, None, None, 0, 1, 1),
            (2, 2, None, None, 1, 4),
        ],
    ),
    "reference of kind leaf": lambda: (
        REG,
        [L, (0, 0, None, None, 1, 1, 1), (2, 2, None, None, 2, 3)],
    ),
    "reference with a child": lambda: (
        REG,
        [
            L,
            node_entry(1),
            L,
            (6, 1, None, AuxNode, 1, 2, 2),
            (2, 2, None, None, 2, 5),
        ],
    ),
    "negative distance": lambda: (
        REG,
        [L, node_entry(1), ref_entry(-1), (2, 2, None, None, 1, 4)],
    ),
    "distance huge": lambda: (REG, [ref_entry(2**70)]),
    "distance str": lambda: (REG, [ref_entry("1")]),
    "distance float": lambda: (REG, [ref_entry(1.5)]),
    "distance None": lambda: (REG, [ref_entry(None)]),
    "kind float": lambda: (REG, [(0.0,) + L[1:]]),
    "reference of kind dict": lambda: (
        REG,
        [
            L,
            (5, 1, ["k"], None, 1, 2),
            (5, 0, [], None, 0, 1, 1),
            (2, 2, None, None, 1, 4),
        ],
    ),
    "reference of kind dict with a child": lambda: (
        REG,
        [L, (5, 1, ["k"], None, 1, 2, -1)],
    ),
    "dataclass reference to a custom": lambda: (
        REG,
        [L, node_entry(1), ref_entry(1, DNode, 7), (2, 2, None, None, 1, 4)],
    ),
}


@isolated
@pytest.mark.parametrize("name", sorted(MALFORMED_STATES))
def test_malformed_pickled_state(name):
  """__setstate__ of a malformed state: a clean error; self stays unusable."""
  td = pt.PyTreeDef.__new__(pt.PyTreeDef)
  # Whatever is wrong, the error docs/semantics.md promises.
  with pytest.raises(ValueError, match="^Malformed pickled PyTreeDef: "):
    td.__setstate__(MALFORMED_STATES[name]())
  # The failed object is uninitialized: methods refuse it (TypeError).
  with pytest.raises(TypeError):
    repr(td)
  with pytest.raises(TypeError):
    td.unflatten([])


def exercise(td):
  """Runs every operation on a treedef; each may raise, none may crash."""
  outcomes = []

  def attempt(fn, *args):
    try:
      outcomes.append(fn(*args))
    except SystemError:
      raise
    except (
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        IndexError,
        pickle.PicklingError,
    ):
      outcomes.append(None)

  attempt(repr, td)
  attempt(hash, td)
  attempt(lambda: td == td)
  attempt(lambda: td.num_leaves + td.num_nodes)
  attempt(lambda: [(c.node_data(), repr(c)) for c in td.children()])
  attempt(td.node_data)
  attempt(
      lambda: pt.PyTreeDef.from_node_data_and_children(
          REG, td.node_data(), td.children()
      )
      == td
  )
  attempt(lambda: td.unflatten([Leaf()] * td.num_leaves))
  attempt(lambda: td.flatten_up_to(td.unflatten([Leaf()] * td.num_leaves)))
  attempt(
      lambda: td.walk(
          lambda c, d: (c, d), lambda x: x, [Leaf()] * td.num_leaves
      )
  )
  attempt(lambda: td.compose(REG.flatten((1, 2))[1]))
  attempt(lambda: REG.flatten((1,))[1].compose(td))
  attempt(lambda: pickle.loads(pickle.dumps(td)) == td)
  attempt(lambda: td.serialize_using_proto())
  assert len(outcomes) == N_OPERATIONS
  return outcomes


N_OPERATIONS = 14


def _mutations(state):
  """Every single-field change of every entry, and a few reshufflings."""
  registry, entries = state
  values = [
      -1,
      0,
      1,
      2,
      3,
      7,
      2**40,
      None,
      "x",
      (),
      ["a"],
      AuxNode,
      DNode,
      PNode,
      Box,
      Leaf,
  ]
  for i, entry in enumerate(entries):
    for field in range(len(entry) + 1):
      for value in values:
        new = list(entry) + ([] if field < len(entry) else [None])
        new[field] = value
        yield f"entry {i} field {field} = {value!r}", (
            registry,
            entries[:i] + [tuple(new)] + entries[i + 1 :],
        )
    yield f"drop {i}", (registry, entries[:i] + entries[i + 1 :])
    yield f"duplicate {i}", (registry, entries[: i + 1] + entries[i:])
    if i + 1 < len(entries):
      swapped = list(entries)
      swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
      yield f"swap {i}", (registry, swapped)


@isolated
def test_mutated_pickled_states_never_crash():
  """Each one-field mutation of a real shared state: clean error or a usable
  treedef (every operation on it raises cleanly or works)."""
  state = shared_treedef().__getstate__()
  rejected = accepted = 0
  for name, mutated in _mutations(state):
    progress(f"{name}: {mutated[1]!r}")
    td = pt.PyTreeDef.__new__(pt.PyTreeDef)
    try:
      td.__setstate__(mutated)
    except CLEAN:
      rejected += 1
      continue
    except SystemError as e:
      raise AssertionError(f"{name}: SystemError {e}") from e
    accepted += 1
    try:
      exercise(td)
    except SystemError as e:
      raise AssertionError(f"{name}: SystemError {e}") from e
  assert rejected > 100 and accepted > 0


ENTRY_DATA = [None, (), (0,), (3,), ["k"], ["a", "b"], "aux", 0]
ENTRY_TYPES = [None, AuxNode, DNode, PNode, Box, Leaf, tuple, 1]


@st.composite
def random_entries(draw):
  """A random traversal: entries of 6 or 7 items from small value sets."""
  entries = []
  for _ in range(draw(st.integers(1, 7))):
    entry = (
        draw(st.integers(0, 7)),
        draw(st.integers(-1, 3)),
        draw(st.sampled_from(ENTRY_DATA)),
        draw(st.sampled_from(ENTRY_TYPES)),
        0,
        0,
    )
    if draw(st.booleans()):
      entry += (draw(st.integers(-1, 8)),)
    entries.append(entry)
  return entries


@isolated
@SETTINGS
@given(random_entries())
def test_random_pickled_states_never_crash(entries):
  """Random traversals: rejected cleanly, or a usable treedef."""
  progress(repr(entries))
  td = pt.PyTreeDef.__new__(pt.PyTreeDef)
  try:
    td.__setstate__((REG, entries))
  except CLEAN as e:
    assert str(e)  # A message says what is wrong.
    return
  assert len(exercise(td)) == N_OPERATIONS


NODE_DATA = [
    None,
    (tuple, None),
    (list, None),
    (dict, ["a"]),
    (dict, []),
    (type(None), None),
    (AuxNode, "aux"),
    (PNode, None),
    (DNode, (1,)),
    (DNode, ()),
    (Box, None),
]


@isolated
@SETTINGS
@given(st.data())
def test_random_from_node_data_and_children_never_crash(data):
  """Treedefs assembled from random node data (shared references among
  them) and earlier results: rejected cleanly, or usable."""
  built = [REG.flatten(Leaf())[1], REG.flatten(AuxNode(Leaf()))[1]]
  for _ in range(data.draw(st.integers(1, 6))):
    node_data = data.draw(
        st.one_of(
            st.sampled_from(NODE_DATA),
            st.tuples(
                st.sampled_from([AuxNode, DNode, PNode, Box, tuple]),
                st.integers(-1, 6).map(pt.SharedReference),
            ),
        )
    )
    children = data.draw(st.lists(st.sampled_from(built), max_size=3))
    progress(f"{node_data!r} {children!r}")
    try:
      td = pt.PyTreeDef.from_node_data_and_children(REG, node_data, children)
    except CLEAN as e:
      assert str(e)
      continue
    assert len(exercise(td)) == N_OPERATIONS
    built.append(td)


@isolated
def test_pickled_external_reference_is_usable_but_not_unflattenable():
  """A lone reference (a pickled child) unpickles; unflatten says why not."""
  td = pt.PyTreeDef.__new__(pt.PyTreeDef)
  td.__setstate__((REG, [ref_entry(5)]))
  assert td.num_leaves == 0
  assert repr(td) == "PyTreeDef(#^5#)"
  assert td.node_data() == (AuxNode, pt.SharedReference(5))
  with pytest.raises(ValueError):
    td.unflatten([])


# ---------------------------------------------------------------------------
# Protocol buffers.
# ---------------------------------------------------------------------------

# Not parsable as a PyTreeDefProto (truncated, bad wire types, unknown node
# types, out-of-range string ids, a dict key that is not UTF-8).
JUNK_PROTOS = [
    b"\n\x02\x10\x01\n\t\x08\x01\x10\x05\x1a\x03\n\x01\x00\x12\x02\xff\xfe",
    b"\x00",
    b"\xff",
    b"\xff\xff\xff\xff",
    b"\x0a",
    b"\x0a\x05",
    b"\x0a\x02\x10\x09",
    b"\x0a\x02\x08\x01\x10\x04",
    b"\x0b",
    b"\x0a\x80\x80\x80\x80\x10",
    b"\x0a\x07\x08\x01\x10\x05\x1a\x01\x05",
]

# Parsable protos that do not describe one tree (no node, two roots, a dict
# with fewer keys than children, a node with missing children).  Stock raises
# RuntimeError for these (and crashes on the third): docs/semantics.md lists
# the ValueError as a deliberate difference.
MALFORMED_TREE_PROTOS = [
    b"",
    b"\x12\x01a",
    b"\x0a\x02\x10\x01\x0a\x02\x10\x01",
    b"\x0a\x06\x08\x01\x10\x05\x1a\x00",
    b"\x0a\x04\x08\x02\x10\x04",
]


@isolated
@pytest.mark.parametrize("data", JUNK_PROTOS)
def test_deserialize_junk_bytes(data):
  """Bytes that are not a treedef proto: ValueError."""
  with pytest.raises(ValueError):
    pt.PyTreeDef.deserialize_using_proto(REG, data)


@isolated
@pytest.mark.parametrize("data", MALFORMED_TREE_PROTOS)
def test_deserialize_malformed_tree_proto(data):
  """A parsable proto that is not one tree: a clean error, no crash."""
  with pytest.raises(ValueError):
    pt.PyTreeDef.deserialize_using_proto(REG, data)
  # A real one still works.
  td = REG.flatten([{"a": None}, (1,)])[1]
  assert (
      pt.PyTreeDef.deserialize_using_proto(REG, td.serialize_using_proto())
      == td
  )


@isolated
@SETTINGS
@given(st.binary(max_size=40))
def test_deserialize_random_bytes(data):
  """Random bytes: a treedef that round-trips, or a clean error."""
  try:
    td = pt.PyTreeDef.deserialize_using_proto(REG, data)
  except ValueError:
    return
  exercise(td)
  again = pt.PyTreeDef.deserialize_using_proto(REG, td.serialize_using_proto())
  assert again == td


def test_internal_error_is_a_system_error_of_its_own():
  """A broken invariant of the module reaches Python as pt.InternalError, a
  SystemError: no handler of bad input catches it by mistake."""
  assert issubclass(pt.InternalError, SystemError)
  assert not issubclass(pt.InternalError, (RuntimeError, ValueError, TypeError))
  assert pt.InternalError.__module__ == "jaxlib_patch.pytree"
  assert pt.InternalError.__name__ == "InternalError"


# Bad input whose error stock (and this module, before it had InternalError)
# raised as the RuntimeError that also told a broken invariant ("PyTreeDef
# traversal did not yield a singleton." was both).
INPUT_ERRORS_THAT_READ_AS_INTERNAL = {
    "proto without nodes": lambda: pt.PyTreeDef.deserialize_using_proto(
        REG, b""
    ),
    "proto with two roots": lambda: pt.PyTreeDef.deserialize_using_proto(
        REG, b"\x0a\x02\x10\x01\x0a\x02\x10\x01"
    ),
    "node data of an unregistered type": lambda: (
        pt.PyTreeDef.from_node_data_and_children(REG, (Leaf, None), [])
    ),
    "dict node data with too few keys": lambda: (
        pt.PyTreeDef.from_node_data_and_children(
            REG, (dict, ["a"]), [REG.flatten(1)[1], REG.flatten(2)[1]]
        )
    ),
}


@isolated
@pytest.mark.parametrize("name", sorted(INPUT_ERRORS_THAT_READ_AS_INTERNAL))
def test_input_errors_are_not_internal_errors(name):
  """Input that no treedef can be made of: ValueError, whose message is not
  that of the invariant unflatten checks."""
  with pytest.raises(ValueError) as error:
    INPUT_ERRORS_THAT_READ_AS_INTERNAL[name]()
  assert "singleton" not in str(error.value)
  assert "internal error" not in str(error.value)


@isolated
def test_serialize_opted_in_node_rejected():
  """serialize_using_proto rejects custom nodes, opted-in ones included."""
  with pytest.raises(ValueError):
    shared_treedef().serialize_using_proto()


# ---------------------------------------------------------------------------
# from_node_data_and_children and external references.
# ---------------------------------------------------------------------------


@isolated
@pytest.mark.parametrize("node_type", [Box, tuple, list, dict, type(None)])
def test_shared_reference_for_non_opted_in_type(node_type):
  """SharedReference node data for a type without the flag: ValueError."""
  with pytest.raises(ValueError):
    pt.PyTreeDef.from_node_data_and_children(
        REG, (node_type, pt.SharedReference(1)), []
    )


@isolated
@pytest.mark.parametrize("node_type", [AuxNode, DNode, PNode])
@pytest.mark.parametrize("distance", [0, -1, -(2**40)])
def test_shared_reference_with_a_bad_distance(node_type, distance):
  """SharedReference(d) with d <= 0 is not a reference: ValueError."""
  leaf = REG.flatten(Leaf())[1]
  for children in ([], [leaf]):
    progress(
        f"from_node_data_and_children(REG, ({node_type.__name__}, "
        f"SharedReference({distance})), {children!r})"
    )
    with pytest.raises(ValueError):
      td = pt.PyTreeDef.from_node_data_and_children(
          REG, (node_type, pt.SharedReference(distance)), children
      )
      exercise(td)  # Not reached if the module rejects it as it should.


@isolated
def test_shared_reference_must_land_on_its_type():
  """A rebuilt reference aimed at a leaf, another type, or with children."""
  leaf = REG.flatten(Leaf())[1]
  ref = pt.PyTreeDef.from_node_data_and_children(
      REG, (AuxNode, pt.SharedReference(1)), []
  )
  # Aimed at a leaf.
  with pytest.raises(ValueError):
    pt.treedef_tuple(REG, [leaf, ref])
  with pytest.raises(ValueError):
    pt.PyTreeDef.from_node_data_and_children(REG, (list, None), [leaf, ref])
  # Aimed at a node of another opted-in type.
  other = REG.flatten(PNode("o", [Leaf()]))[1]
  with pytest.raises(ValueError):
    pt.treedef_tuple(REG, [other, ref])
  # Aimed at an AuxNode: fine.
  node = REG.flatten(AuxNode(Leaf()))[1]
  good = pt.treedef_tuple(REG, [node, ref])
  out = good.unflatten([Leaf()])
  assert out[0] is out[1]
  # A reference with children.
  with pytest.raises(ValueError):
    pt.PyTreeDef.from_node_data_and_children(
        REG, (AuxNode, pt.SharedReference(1)), [leaf]
    )


@isolated
@pytest.mark.parametrize("child", [1, None, "td", (1,)])
def test_children_must_be_treedefs(child):
  """A child that is not a PyTreeDef: TypeError.

  docs/semantics.md lists this as a deliberate difference from stock (which
  raises ``RuntimeError: std::bad_cast``).
  """
  leaf = REG.flatten(Leaf())[1]
  with pytest.raises(TypeError):
    pt.treedef_tuple(REG, [leaf, child])
  with pytest.raises(TypeError):
    pt.PyTreeDef.from_node_data_and_children(REG, (tuple, None), [leaf, child])


@isolated
def test_external_reference_operations():
  """A child that refers outside itself cannot be unflattened alone."""
  td = shared_treedef()
  # [n, {'k': n}, DNode(d), d]: children 1 and 3 refer to earlier siblings.
  children = td.children()
  external = [c for c in children if c.num_leaves == 0 and "#^" in repr(c)]
  assert len(external) == 2
  for child in external:
    with pytest.raises(ValueError):
      child.unflatten([])
    with pytest.raises(ValueError):
      child.walk(lambda c, d: c, lambda x: x, [])
    with pytest.raises(ValueError):
      # An iterable tree: a node is an iterable of its children.
      child.from_iterable_tree([0] if child.node_data()[0] is dict else 0)
    with pytest.raises(ValueError):
      child.compose(REG.flatten(1)[1])
    with pytest.raises(ValueError):
      REG.flatten((1,))[1].compose(child)
  with pytest.raises(ValueError):
    children[1].flatten_up_to({"k": AuxNode(Leaf(), PNode("o", [Leaf()]))})
  # Rebuilt whole, they work again.
  assert pt.treedef_tuple(REG, children) != td  # Its root is a tuple.
  rebuilt = pt.PyTreeDef.from_node_data_and_children(
      REG, td.node_data(), children
  )
  assert rebuilt == td
  out = rebuilt.unflatten([Leaf() for _ in range(rebuilt.num_leaves)])
  assert out[0] is out[1]["k"] and out[2].a is out[3]


# ---------------------------------------------------------------------------
# Depth.
# ---------------------------------------------------------------------------


@isolated
@pytest.mark.parametrize("kind", ["list", "opted-in", "dict"])
def test_very_deep_tree_raises_recursion_error(kind):
  """100,000 levels: RecursionError, even with a huge recursion limit."""
  tree = Leaf()
  for _ in range(100_000):
    if kind == "list":
      tree = [tree]
    elif kind == "dict":
      tree = {"a": tree}
    else:
      tree = AuxNode(tree)
  old = sys.getrecursionlimit()
  try:
    sys.setrecursionlimit(10**6)
    with pytest.raises(RecursionError):
      REG.flatten(tree)
    with pytest.raises(RecursionError):
      REG.flatten_with_path(tree)
    with pytest.raises(RecursionError):
      REG.flatten(tree, lambda x: False)
  finally:
    sys.setrecursionlimit(old)
  assert sys.getrecursionlimit() == old
  # Still works after.
  assert REG.flatten([[1]])[0] == [1]


@isolated
def test_cycle_of_plain_containers_raises_recursion_error():
  """A list that contains itself: RecursionError (no opted-in node)."""
  cyc = [1]
  cyc.append(cyc)
  with pytest.raises(RecursionError):
    REG.flatten(cyc)
  cyc.clear()
