"""Twin registries: one table of registrations, two layouts.

``PyTreeRegistry.twin(keeps_relative_identities=...)`` makes a registry that
reads and writes the very same registrations and opt-ins as the registry it
was made from, and differs only in whether its flattens keep relative
identities. JAX flattens its own trees with one of each pair and the user's
with the other, so a type registered on either (JAX registers some types on
one registry object directly) must flatten the same way in both, now and
after any later registration.
"""

import dataclasses
import gc
import pickle
import weakref

import pytest
from hypothesis import given, settings

import nodes
from sharing_model import dags
from harness import isolated
from jaxlib_patch import pytree as pt


def twins():
  keeping = pt.PyTreeRegistry()
  return keeping, keeping.twin(keeps_relative_identities=False)


class Fresh:
  """A class that no registry of this file knows until a test registers it."""

  def __init__(self, *children):
    self.children = list(children)


def fresh_flatten(node):
  return node.children, None


def fresh_unflatten(_, children):
  return Fresh(*children)


def test_a_twin_lays_out_as_it_says_and_keeps_the_enabled_builtins():
  keeping = pt.PyTreeRegistry(enable_none=False)
  stock_layout = keeping.twin(keeps_relative_identities=False)
  assert keeping.keeps_relative_identities
  assert not stock_layout.keeps_relative_identities
  assert stock_layout.flatten([None, (1,)])[0] == [None, 1]
  again = stock_layout.twin(keeps_relative_identities=True)
  assert again.keeps_relative_identities
  assert again.flatten([None, (1,)])[0] == [None, 1]


@pytest.mark.parametrize("register_on", ["origin", "twin", "twin of twin"])
def test_a_registration_on_any_twin_reaches_every_other(register_on):
  keeping, stock_layout = twins()
  grandchild = stock_layout.twin(keeps_relative_identities=True)
  registries = {
      "origin": keeping,
      "twin": stock_layout,
      "twin of twin": grandchild,
  }

  class Node(Fresh):
    pass

  @dataclasses.dataclass
  class Data:
    a: object

  target = registries[register_on]
  target.register_node(
      Node, fresh_flatten, fresh_unflatten, preserve_relative_identities=True
  )
  target.register_dataclass_node(Data, ["a"], [])
  node = Node(1, 2)
  data = Data(3)
  for registry in registries.values():
    assert registry.is_node(Node) and registry.is_node(Data)
    assert registry.has_relative_identities(Node)
    assert not registry.has_relative_identities(Data)
  for registry in (keeping, grandchild):
    leaves, treedef = registry.flatten([node, node, data])
    assert leaves == [1, 2, 3]
    assert treedef.has_shared_nodes
  leaves, treedef = stock_layout.flatten([node, node, data])
  assert leaves == [1, 2, 1, 2, 3]
  assert not treedef.has_shared_nodes


@pytest.mark.parametrize("opt_in_on", [0, 1])
def test_an_opt_in_on_either_twin_reaches_both_before_and_after_registration(
    opt_in_on,
):
  pair = twins()

  class Base:
    pass

  class Before(Base, Fresh):
    pass

  class After(Base, Fresh):
    pass

  pair[1 - opt_in_on].register_node(Before, fresh_flatten, fresh_unflatten)
  pair[opt_in_on].preserve_relative_identities(Base)
  pair[1 - opt_in_on].register_node(After, fresh_flatten, fresh_unflatten)
  for registry in pair:
    assert registry.has_relative_identities(Before)
    assert registry.has_relative_identities(After)
  keeping, _ = pair
  before, after = Before(1), After(2)
  assert keeping.flatten([before, before, after, after])[0] == [1, 2]


def test_registering_a_type_on_both_twins_is_a_duplicate():
  keeping, stock_layout = twins()
  keeping.register_node(Fresh, fresh_flatten, fresh_unflatten)
  with pytest.raises(ValueError, match="Duplicate custom PyTreeDef type"):
    stock_layout.register_node(Fresh, fresh_flatten, fresh_unflatten)


@pytest.mark.parametrize("flag", [1, 0, None, "yes", 1.0])
def test_the_layout_flag_is_a_bool(flag):
  keeping, _ = twins()
  with pytest.raises(
      TypeError, match="keeps_relative_identities must be a bool"
  ):
    keeping.twin(keeps_relative_identities=flag)


def test_the_layout_flag_is_keyword_only_and_required():
  keeping, _ = twins()
  with pytest.raises(TypeError):
    keeping.twin(False)
  with pytest.raises(TypeError):
    keeping.twin()


# Registered on the stock-layout twin only: its origin must see every type.
ORIGIN = pt.PyTreeRegistry()
STOCK_LAYOUT_TWIN = nodes.register_all(
    ORIGIN.twin(keeps_relative_identities=False), True
)
UNTWINNED_STOCK_LAYOUT = nodes.register_all(
    pt.PyTreeRegistry(keeps_relative_identities=False), True
)
UNTWINNED_KEEPING = nodes.register_all(pt.PyTreeRegistry(), True)


@settings(max_examples=150, deadline=None)
@given(dags())
def test_twins_flatten_as_registries_registered_apart(tree):
  """Each twin flattens exactly as a registry of its layout given the same
  registrations itself: the shared table changes nothing but who sees it."""
  for twin, alone in (
      (ORIGIN, UNTWINNED_KEEPING),
      (STOCK_LAYOUT_TWIN, UNTWINNED_STOCK_LAYOUT),
  ):
    leaves, treedef = twin.flatten(tree)
    alone_leaves, alone_treedef = alone.flatten(tree)
    assert leaves == alone_leaves
    assert repr(treedef) == repr(alone_treedef)
    assert treedef == alone_treedef and hash(treedef) == hash(alone_treedef)
    rebuilt = treedef.unflatten(leaves)
    assert twin.flatten(rebuilt)[1] == treedef
  keeping = ORIGIN.flatten(tree)[1]
  stock_layout = STOCK_LAYOUT_TWIN.flatten(tree)[1]
  assert keeping.unshared() == stock_layout


@settings(max_examples=150, deadline=None)
@given(dags())
def test_in_layout_of_names_the_twin_whose_flatten_matches_the_treedef(tree):
  """A registry asked for the layout of a treedef answers itself, or its
  family's origin where that keeps relative identities and the treedef was
  made by a registry that keeps them (or shares nodes): asked by the
  stock-layout twin (JAX's own code), a tree flattened with the answer
  comes out in the treedef's layout."""
  keeping = ORIGIN.flatten(tree)[1]
  stock_layout = STOCK_LAYOUT_TWIN.flatten(tree)[1]
  for treedef in (keeping, stock_layout):
    for registry in (ORIGIN, STOCK_LAYOUT_TWIN):
      chosen = registry.in_layout_of(treedef)
      kept = treedef.keeps_relative_identities or treedef.has_shared_nodes
      assert chosen is (ORIGIN if kept else registry)
    assert STOCK_LAYOUT_TWIN.in_layout_of(treedef).flatten(tree)[1] == treedef
  # A registry whose family's origin lays trees out as stock has no twin
  # that keeps them to answer with: it answers itself.
  stock_origin = pt.PyTreeRegistry(keeps_relative_identities=False)
  twin = stock_origin.twin(keeps_relative_identities=True)
  for registry in (stock_origin, twin):
    assert registry.in_layout_of(keeping) is (
        twin if registry is twin else stock_origin
    )


def test_in_layout_of_takes_a_treedef_only():
  with pytest.raises(TypeError):
    ORIGIN.in_layout_of(None)
  with pytest.raises(TypeError):
    ORIGIN.in_layout_of(pt.PyTreeRegistry())


def test_a_twin_keeps_its_origin_and_both_are_collected():
  gc.collect()

  def build():
    origin = pt.PyTreeRegistry()
    twin = origin.twin(keeps_relative_identities=False)

    class Cyclic(Fresh):
      pass

    # Registered functions that reach the twin: a cycle through the origin's
    # table, which the collector sees only through the twin's origin.
    twin.register_node(
        Cyclic,
        lambda node, twin=twin: (node.children, None),
        fresh_unflatten,
    )
    # Registries take no weak references; an attribute's object lives as
    # long as its registry.
    origin.marker, twin.marker = Fresh(), Fresh()
    return (
        weakref.ref(origin.marker),
        weakref.ref(twin.marker),
        weakref.ref(Cyclic),
        twin,
    )

  origin_ref, twin_ref, type_ref, twin = build()
  gc.collect()
  assert origin_ref() is not None  # The twin holds its origin.
  del twin
  gc.collect()
  assert origin_ref() is None and twin_ref() is None and type_ref() is None


@isolated
def test_a_twin_named_for_pickling_pickles_treedefs_by_reference():
  import sys
  import types

  module = types.ModuleType("twin_registry_home")
  sys.modules["twin_registry_home"] = module
  registry = nodes.register_all(pt.PyTreeRegistry(), True)
  module.stock_layout = registry.twin(keeps_relative_identities=False)
  module.stock_layout.__module__ = "twin_registry_home"
  module.stock_layout.__name__ = "stock_layout"
  p = nodes.PNode("p", [1])
  _, treedef = module.stock_layout.flatten([p, p])
  restored = pickle.loads(pickle.dumps(treedef))
  assert restored == treedef
  assert not restored.has_shared_nodes


@pytest.mark.parametrize("built_on", [0, 1])
def test_an_opt_in_names_the_classes_built_at_two_places_before_it(built_on):
  # Built at two places of one tree through either twin: named, once, by
  # the call that opts it in. Built once per tree, flattened only, never
  # seen, or already opted in: not named.
  pair = twins()

  class Base:
    pass

  class Twice(Base, Fresh):
    pass

  class OncePerTree(Base, Fresh):
    pass

  class OnlyFlattened(Base, Fresh):
    pass

  class Unseen(Base, Fresh):
    pass

  class AlreadyIn(Base, Fresh):
    pass

  @dataclasses.dataclass
  class TwiceDataclass(Base):
    x: int

  for cls in (Twice, OncePerTree, OnlyFlattened, Unseen):
    pair[0].register_node(cls, fresh_flatten, fresh_unflatten)
  pair[0].register_node(
      AlreadyIn,
      fresh_flatten,
      fresh_unflatten,
      preserve_relative_identities=True,
  )
  pair[0].register_dataclass_node(TwiceDataclass, ["x"], [])
  registry = pair[built_on]
  for tree in (
      [Twice(1), Twice(2)],
      [AlreadyIn(3), AlreadyIn(4)],
      (TwiceDataclass(5), [TwiceDataclass(6)]),
      OncePerTree(7),
      OncePerTree(8),
  ):
    leaves, treedef = registry.flatten(tree)
    treedef.unflatten(leaves)
  registry.flatten([OnlyFlattened(9), OnlyFlattened(10)])
  named = pair[1 - built_on].preserve_relative_identities(Base)
  assert sorted(named, key=lambda t: t.__name__) == [Twice, TwiceDataclass]
  assert pair[0].preserve_relative_identities(Base) == []  # Already in.


@pytest.mark.parametrize("registered", ["before the opt-in", "after it"])
def test_the_first_tie_of_a_class_opted_in_by_a_base_is_reported_once(
    registered,
):
  # Reported: an object met at two places by a flatten that keeps
  # identities, of a class whose opt-in came from a base class; to the
  # observer of the registry that flattened, with the tree and the base, once
  # per base for the family. Not reported: a class with its own flag, or
  # named itself (before or after its base), one place, or the stock-layout
  # twin.
  keeping, stock_layout = twins()

  class Base:
    pass

  class ByBase(Base, Fresh):
    pass

  class OwnFlag(Base, Fresh):
    pass

  class NamedAfter(Base, Fresh):
    pass

  class NamedBefore(Base, Fresh):
    pass

  class OtherBase:
    pass

  class ByOtherBase(OtherBase, Fresh):
    pass

  keeping.register_node(ByOtherBase, fresh_flatten, fresh_unflatten)
  keeping.preserve_relative_identities(OtherBase)
  keeping.register_node(
      OwnFlag, fresh_flatten, fresh_unflatten, preserve_relative_identities=True
  )
  keeping.register_node(NamedBefore, fresh_flatten, fresh_unflatten)
  keeping.preserve_relative_identities(NamedBefore)
  if registered == "after it":
    keeping.preserve_relative_identities(Base)
  for cls in (ByBase, NamedAfter):
    keeping.register_node(cls, fresh_flatten, fresh_unflatten)
  if registered == "before the opt-in":
    keeping.preserve_relative_identities(Base)
  keeping.preserve_relative_identities(NamedAfter)

  reports = []
  for registry in (keeping, stock_layout):
    # Returns None: takes the object (only False declines).
    registry.inherited_tie_observer = lambda *report: reports.append(report)
  for cls in (OwnFlag, NamedAfter, NamedBefore):
    node = cls(1)
    assert keeping.flatten([node, node])[1].has_shared_nodes
  keeping.flatten([ByBase(2), ByBase(3)])
  tied = ByBase(4)
  stock_layout.flatten((tied, tied))
  assert reports == []

  tree = {"a": tied, "b": [tied]}
  assert keeping.flatten(tree)[1].has_shared_nodes
  assert reports == [(tree, tied, Base)]
  keeping.flatten([tied, tied])
  grandchild = stock_layout.twin(keeps_relative_identities=True)
  grandchild.inherited_tie_observer = keeping.inherited_tie_observer
  grandchild.flatten([tied, tied])
  assert len(reports) == 1
  other = ByOtherBase(5)
  grandchild.flatten([other, other, tied])
  assert reports[1:] == [([other, other, tied], other, OtherBase)]
  keeping.flatten([other, other])
  assert len(reports) == 2


def test_a_declined_tie_passes_the_base_on_to_another_class():
  # An observer that returns False declines the object: its class is not
  # handed over again, and the base's next tie, of another class, is.
  keeping, _ = twins()

  class Base:
    pass

  class Aliased(Base, Fresh):
    pass

  class Tied(Base, Fresh):
    pass

  for cls in (Aliased, Tied):
    keeping.register_node(cls, fresh_flatten, fresh_unflatten)
  keeping.preserve_relative_identities(Base)
  handed = []

  def observe(tree, node, base):
    handed.append(type(node))
    return type(node) is Tied

  keeping.inherited_tie_observer = observe
  aliased, tied = Aliased(1), Tied(2)
  for tree in (
      [aliased, aliased],
      [aliased, aliased],
      [aliased, aliased, tied, tied],
      [tied, tied],
  ):
    keeping.flatten(tree)
  assert handed == [Aliased, Tied]


def test_an_inherited_tie_waits_for_an_observer_and_its_error_is_raised():
  # Unobserved, a tie is not used up; an observer's exception (a warning
  # made an error) is the flatten's, and the tie counts as told.
  keeping, _ = twins()

  class Base:
    pass

  class ByBase(Base, Fresh):
    pass

  keeping.register_node(ByBase, fresh_flatten, fresh_unflatten)
  keeping.preserve_relative_identities(Base)
  tied = ByBase(1)
  keeping.flatten([tied, tied])

  def refuse(tree, node, base):
    raise UserWarning(f"{type(node).__name__} tied through {base.__name__}")

  keeping.inherited_tie_observer = refuse
  with pytest.raises(UserWarning, match="ByBase tied through Base"):
    keeping.flatten([tied, tied])
  leaves, treedef = keeping.flatten([tied, tied])
  assert leaves == [1] and treedef.has_shared_nodes
