"""Bad protocol buffers, and treedefs built from node data and children
that refer outside themselves, give a clean exception, never a crash.

Each test runs in a forked child process (``harness.isolated``), so that a
crash fails that one test with the signal's name.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bad_input_registry import REG, SETTINGS, AuxNode, exercise, shared_treedef
from harness import isolated, progress
from jaxlib_patch import pytree as pt
from nodes import Box, DNode, Leaf, PNode

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
