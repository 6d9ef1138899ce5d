"""Malformed pickled states of treedefs give a clean exception or a usable
treedef, never a crash: hand-written ones, every one-field mutation of a
real shared state, and random ones; and random node data and children for
from_node_data_and_children.

Each test runs in a forked child process (``harness.isolated``), so that a
crash fails that one test with the signal's name.
"""

from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st

from bad_input_registry import (
    CLEAN,
    N_OPERATIONS,
    REG,
    SETTINGS,
    AuxNode,
    exercise,
    shared_treedef,
)
from harness import isolated, progress
from jaxlib_patch import pytree as pt
from nodes import Box, DNode, Leaf, PNode

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
