"""What the C++ tells about sharing: the treedef and registry queries.

``PyTreeDef.has_shared_nodes``, ``has_external_references``, ``is_reference``
and ``shared_references()``, and ``PyTreeRegistry.has_relative_identities``
/ ``preserve_relative_identities`` (docs/api.md, "Sharing queries").
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import threading

import pytest

from jaxlib_patch import pytree as pt
from nodes import Box, PNode, register_all


def register(registry, cls, **flag):
  registry.register_node(
      cls, lambda b: ((b.x,), None), lambda _, xs: cls(*xs), **flag
  )


@pytest.fixture
def registry():
  return register_all(pt.PyTreeRegistry(), opt_in=True)


# --- Treedef queries --------------------------------------------------------


def test_no_sharing_answers_no(registry):
  b = PNode("b", [1])
  _, treedef = registry.flatten([b, PNode("b", [2]), Box([3]), (4, None)])
  assert not treedef.has_shared_nodes
  assert not treedef.has_external_references
  assert not treedef.is_reference
  assert treedef.shared_references() == {}


def test_a_repeated_node_is_a_shared_node(registry):
  b = PNode("b", [1])
  _, treedef = registry.flatten([b, b])
  # Traversal: leaf 0, PNode 1, reference 2, list 3.
  assert treedef.has_shared_nodes
  assert not treedef.has_external_references
  assert not treedef.is_reference
  assert treedef.shared_references() == {2: 1}


def test_a_repeated_plain_node_is_not_shared(registry):
  p = Box([1])
  _, treedef = registry.flatten([p, p])
  assert not treedef.has_shared_nodes
  assert treedef.shared_references() == {}


def test_children_tell_references_and_their_targets(registry):
  b = PNode("b", [1])
  _, treedef = registry.flatten((b, [3, b], b))
  first, middle, last = treedef.children()
  assert not first.has_shared_nodes and not first.has_external_references
  assert not first.is_reference
  # Whole traversal: leaf, PNode 1, leaf, ref, list, ref, tuple. The middle
  # child [3, ref] starts at 2, so its reference (1) aims at its index -1.
  assert middle.has_external_references and not middle.has_shared_nodes
  assert not middle.is_reference
  assert middle.shared_references() == {1: -1}
  assert last.is_reference and last.has_external_references
  assert last.node_data() == (PNode, pt.SharedReference(4))
  assert last.shared_references() == {0: -4}
  assert treedef.shared_references() == {3: 1, 5: 1}


def test_shared_references_follow_each_target(registry):
  a, b = PNode("a", [1]), PNode("b", [2])
  outer = PNode("outer", [[a, b]])
  _, treedef = registry.flatten([outer, a, b, outer])
  refs = treedef.shared_references()
  assert len(refs) == 3
  traversal_types = []
  treedef.walk(
      lambda node_type, _: traversal_types.append(node_type),
      lambda leaf: leaf,
      range(treedef.num_leaves),
  )
  for reference, target in refs.items():
    assert 0 <= target < reference < treedef.num_nodes
  # Distinct targets: a, b and outer, each referenced once.
  assert len(set(refs.values())) == 3


def test_queries_survive_state_and_node_data_round_trips(registry):
  b = PNode("b", [1])
  _, treedef = registry.flatten({"x": b, "y": (b, PNode("b", [2]))})
  rebuilt = pt.PyTreeDef.from_node_data_and_children(
      registry, treedef.node_data(), treedef.children()
  )
  again = pt.PyTreeDef.__new__(pt.PyTreeDef)
  again.__setstate__(treedef.__getstate__())
  for other in (again, rebuilt):
    assert other.has_shared_nodes == treedef.has_shared_nodes
    assert other.shared_references() == treedef.shared_references()


def test_composed_copies_do_not_share_with_each_other(registry):
  b = PNode("b", [1])
  _, inner = registry.flatten([b, b])
  _, outer = registry.flatten((0, 0))
  composed = outer.compose(inner)
  assert composed.has_shared_nodes
  assert len(composed.shared_references()) == 2
  assert len(set(composed.shared_references().values())) == 2


# --- Registry query ---------------------------------------------------------


def test_preserves_relative_identities_follows_the_registration(registry):
  assert registry.has_relative_identities(PNode)
  assert not registry.has_relative_identities(Box)
  assert not registry.has_relative_identities(int)  # a leaf
  for builtin in (tuple, list, dict, type(None)):
    assert not registry.has_relative_identities(builtin)


def test_preserves_relative_identities_of_a_dataclass():
  @dataclasses.dataclass
  class Point:
    x: int

  r = pt.PyTreeRegistry()
  r.register_dataclass_node(Point, ["x"], [], preserve_relative_identities=True)
  assert r.has_relative_identities(Point)


@pytest.mark.parametrize("bad", [PNode("b", [1]), "PNode", None, 3])
def test_registry_queries_reject_a_non_class(registry, bad):
  with pytest.raises(TypeError, match="expects a class"):
    registry.has_relative_identities(bad)
  with pytest.raises(TypeError, match="expects a class"):
    registry.preserve_relative_identities(bad)


# --- Opting in already-registered classes and their subclasses --------------


class Base:

  def __init__(self, x):
    self.x = x


class Early(Base):
  pass


class Late(Base):
  pass


class Other:

  def __init__(self, x):
    self.x = x


def test_opt_in_reaches_registered_and_later_subclasses():
  r = pt.PyTreeRegistry()
  register(r, Early)
  register(r, Other)
  early = Early(1)
  _, before = r.flatten([early, early])
  assert not before.has_shared_nodes
  assert not r.has_relative_identities(Base)

  r.preserve_relative_identities(Base)  # Base itself is not registered
  assert r.has_relative_identities(Base)
  assert r.has_relative_identities(Early)
  assert r.has_relative_identities(Late)  # once registered
  assert not r.has_relative_identities(Other)
  assert not r.is_node(Base)  # the opt-in does not register anything

  leaves, after = r.flatten([early, early])
  assert after.has_shared_nodes and leaves == [1]
  register(r, Late)
  late = Late(2)
  assert r.flatten((late, late))[1].has_shared_nodes
  other = Other(3)
  assert not r.flatten((other, other))[1].has_shared_nodes


def test_treedefs_made_before_the_opt_in_stay_valid():
  r = pt.PyTreeRegistry()
  register(r, Early)
  early = Early(1)
  leaves, before = r.flatten([early, early])
  r.preserve_relative_identities(Base)
  first, second = before.unflatten(leaves)
  assert first is not second  # built as flattened: two nodes
  assert before == r.flatten([Early(1), Early(2)])[1]
  assert hash(before) == hash(r.flatten([Early(1), Early(2)])[1])
  restored = pt.PyTreeDef.__new__(pt.PyTreeDef)
  restored.__setstate__(before.__getstate__())
  assert restored == before and not restored.has_shared_nodes
  assert before != r.flatten([early, early])[1]


def test_opt_in_twice_and_through_a_subclass_is_harmless():
  r = pt.PyTreeRegistry()
  register(r, Early)
  r.preserve_relative_identities(Early)
  r.preserve_relative_identities(Base)
  r.preserve_relative_identities(Base)
  e = Early(1)
  assert r.flatten([e, e])[1].shared_references() == {2: 1}


def test_opt_in_is_per_registry():
  r1, r2 = pt.PyTreeRegistry(), pt.PyTreeRegistry()
  register(r1, Early)
  register(r2, Early)
  r1.preserve_relative_identities(Base)
  assert r1.has_relative_identities(Early)
  assert not r2.has_relative_identities(Early)


@pytest.mark.parametrize("builtin", [tuple, list, dict, type(None)])
def test_builtin_nodes_cannot_be_opted_in(builtin):
  r = pt.PyTreeRegistry()
  with pytest.raises(ValueError, match="builtin pytree node"):
    r.preserve_relative_identities(builtin)
  assert not r.has_relative_identities(builtin)


def test_opting_in_object_is_refused():
  # It would opt in every class registered from then on, irreversibly.
  r = pt.PyTreeRegistry()
  register(r, Other)
  with pytest.raises(ValueError, match="base class of the builtin pytree"):
    r.preserve_relative_identities(object)
  assert not r.has_relative_identities(Other)


def test_namedtuple_classes_cannot_be_opted_in():
  import collections

  Point = collections.namedtuple("Point", "x y")
  r = pt.PyTreeRegistry()
  with pytest.raises(ValueError, match="builtin pytree node"):
    r.preserve_relative_identities(Point)
  assert not r.has_relative_identities(Point)


def test_registry_keeps_opted_in_classes_alive_and_visible_to_gc():
  r = pt.PyTreeRegistry()

  class Temporary:
    pass

  before = sys.getrefcount(Temporary)
  r.preserve_relative_identities(Temporary)
  assert sys.getrefcount(Temporary) == before + 1
  assert Temporary in gc.get_referents(r)


def test_a_registry_cycle_through_an_opted_in_class_is_collected():
  import weakref

  class Holder:
    pass

  r = pt.PyTreeRegistry()
  r.preserve_relative_identities(Holder)
  Holder.registry = r  # registry -> Holder -> registry
  alive = weakref.ref(Holder)
  del Holder, r
  gc.collect()
  assert alive() is None


def test_concurrent_opt_in_and_registration_miss_no_subclass():
  # Each thread registers subclasses while the main thread opts the base in:
  # every subclass must end up opted in, whichever came first.
  r = pt.PyTreeRegistry()

  class Root:
    pass

  subclasses = [type(f"Sub{i}", (Root,), {}) for i in range(400)]
  start = threading.Barrier(3)

  def register_half(part):
    start.wait()
    for cls in part:
      r.register_node(cls, lambda o: ((), None), lambda _, __: None)

  threads = [
      threading.Thread(target=register_half, args=(subclasses[k::2],))
      for k in range(2)
  ]
  for t in threads:
    t.start()
  start.wait()
  r.preserve_relative_identities(Root)
  for t in threads:
    t.join()
  assert all(r.has_relative_identities(cls) for cls in subclasses)
  assert all(
      r.flatten([o, o])[1].has_shared_nodes
      for o in (cls() for cls in subclasses)
  )
