"""Stock parity of what the differential suite does not compare:
DeprecationWarnings for builtin iterables flattened as leaves, what
``gc.get_referents`` reports for registries and treedefs, and equality with
stock's own treedefs (jit's dispatch registry is a stock one).

Most tests run the same code on stock ``jaxlib._jax.pytree`` and on
``jaxlib_patch.pytree`` and compare.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import warnings

import pytest
from jaxlib._jax import pytree as stock

from jaxlib_patch import pytree as ours
from nodes import Box, box_flatten, box_unflatten

MODULES = {"stock": stock, "ours": ours}


def _generator():
  yield 1


# Each maker returns a fresh object (iterators are consumed).
ITERABLES = {
    "zip": lambda: zip([1], [2]),
    "generator": _generator,
    "map": lambda: map(abs, [1]),
    "filter": lambda: filter(None, [1]),
    "enumerate": lambda: enumerate([1]),
    "reversed": lambda: reversed((1,)),
    "list_iterator": lambda: iter([1]),
    "tuple_iterator": lambda: iter((1,)),
    "set_iterator": lambda: iter({1}),
    "dict_keyiterator": lambda: iter({1: 2}),
    "dict_valueiterator": lambda: iter({1: 2}.values()),
    "dict_itemiterator": lambda: iter({1: 2}.items()),
    "dict_values": lambda: {1: 2}.values(),
    # Not deprecated in stock: no warning either.
    "dict_keys": lambda: {1: 2}.keys(),
    "dict_items": lambda: {1: 2}.items(),
    "range": lambda: range(2),
    "range_iterator": lambda: iter(range(2)),
    "str_iterator": lambda: iter("ab"),
    "list_reverseiterator": lambda: reversed([1]),
    "set": lambda: {1},
    "frozenset": lambda: frozenset({1}),
    "str": lambda: "ab",
}


def _warnings_of(fn):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn()
  return [(w.category, str(w.message), w.filename) for w in caught]


def _both(make_call):
  """The warnings `make_call(module)()` gives on stock and on ours."""
  return {
      name: _warnings_of(make_call(module)) for name, module in MODULES.items()
  }


@pytest.mark.parametrize("name", sorted(ITERABLES))
@pytest.mark.parametrize("operation", ["flatten", "flatten_with_path"])
def test_iterable_leaf_warns_as_stock(name, operation):
  make = ITERABLES[name]
  result = _both(
      lambda m: lambda: getattr(m.PyTreeRegistry(), operation)(
          [make(), {"k": (make(),)}]
      )
  )
  assert result["ours"] == result["stock"]


def test_deprecated_iterables_do_warn():
  # The comparison above could pass with both silent: pin stock's message.
  ((category, message, filename),) = _warnings_of(
      lambda: ours.PyTreeRegistry().flatten(zip([], []))
  )
  assert category is DeprecationWarning
  assert message == (
      "Python iterable type 'zip' is treated as a leaf in PyTree. Use is_leaf "
      "to suppress this warning if you want this behavior. In a future "
      "version of JAX, this will become an error."
  )
  assert filename == __file__  # stacklevel 1: the caller of flatten


@pytest.mark.parametrize("claims", [True, False])
def test_no_warning_when_is_leaf_claims_the_iterable(claims):
  make = ITERABLES["generator"]
  result = _both(
      lambda m: lambda: m.PyTreeRegistry().flatten(
          [make()], lambda x: claims and not isinstance(x, list)
      )
  )
  assert result["ours"] == result["stock"]
  assert bool(result["ours"]) is not claims


@pytest.mark.parametrize(
    "operation",
    [
        "flatten_one_level",
        "all_leaves",
        "flatten_up_to",
        "unflatten",
        "walk",
        "from_iterable_tree",
    ],
)
def test_other_operations_do_not_warn(operation):
  def call(m):
    registry = m.PyTreeRegistry()
    treedef = registry.flatten([1])[1]
    calls = {
        "flatten_one_level": lambda: registry.flatten_one_level(zip()),
        "all_leaves": lambda: m.all_leaves(registry, [zip()]),
        "flatten_up_to": lambda: treedef.flatten_up_to([zip()]),
        "unflatten": lambda: treedef.unflatten([zip()]),
        "walk": lambda: treedef.walk(lambda *a: None, lambda x: x, [zip()]),
        "from_iterable_tree": lambda: treedef.from_iterable_tree([zip()]),
    }
    return calls[operation]

  result = _both(call)
  assert result["ours"] == result["stock"] == []


def test_warning_turned_error_propagates():
  for module in MODULES.values():
    with warnings.catch_warnings():
      warnings.simplefilter("error", DeprecationWarning)
      with pytest.raises(DeprecationWarning, match="'generator'"):
        module.PyTreeRegistry().flatten({"a": [_generator()]})


# --- gc.get_referents --------------------------------------------------------


Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Pair:
  a: int
  b: str


def _describe(referents, module):
  """Referents as comparable values: each module's own types by name."""
  out = []
  for r in referents:
    if r is module.PyTreeRegistry or r is module.PyTreeDef:
      out.append(("own type", r.__name__))
    elif isinstance(r, module.PyTreeRegistry):
      out.append(("registry", r.name))
    else:
      out.append(r)
  return out


def _registry(module):
  registry = module.PyTreeRegistry()
  registry.name = "r"
  registry.register_node(Box, box_flatten, box_unflatten)
  registry.register_dataclass_node(Pair, ["a"], ["b"])
  return registry


def _same_multiset(a, b):
  remaining = list(b)
  for item in a:
    for k, other in enumerate(remaining):
      if item is other or item == other:
        del remaining[k]
        break
    else:
      return False
  return not remaining


def test_treedef_referents_are_stocks():
  k1, k2 = "k1", "k" + str(2)  # k2 made at run time: not interned
  tree = [1, {k1: 2, k2: Point("a", "b")}, Box([3]), Pair(4, "m"), None]
  described = {}
  for name, module in MODULES.items():
    registry = _registry(module)
    treedef = registry.flatten(tree)[1]
    referents = gc.get_referents(treedef)
    described[name] = _describe(referents, module)
    # Each dict key itself, not a container the treedef keeps internally.
    assert any(r is k1 for r in referents) and any(r is k2 for r in referents)
    assert not any(isinstance(r, list) for r in referents)
  assert _same_multiset(described["ours"], described["stock"]), described


def test_registry_referents_hold_stocks():
  described = {}
  for name, module in MODULES.items():
    referents = gc.get_referents(_registry(module))
    described[name] = _describe(referents, module)
  for item in (
      ("own type", "PyTreeRegistry"),
      Box,
      box_flatten,
      box_unflatten,
      Pair,
  ):
    assert item in described["stock"] and item in described["ours"], item


def test_a_cycle_through_dict_keys_is_collected():
  import weakref

  class Key:

    def __lt__(self, other):
      return False

  key = Key()
  _, treedef = ours.PyTreeRegistry().flatten({key: 1})
  key.treedef = treedef  # key -> treedef -> key
  alive = weakref.ref(key)
  del key, treedef
  gc.collect()
  assert alive() is None


# --- Equality with stock treedefs -------------------------------------------


Opaque = type("Opaque", (), {})


def _registries():
  registries = {}
  for name, module in MODULES.items():
    registry = module.PyTreeRegistry()
    registry.register_node(Box, box_flatten, box_unflatten)
    registry.register_dataclass_node(Pair, ["a"], ["b"])
    registries[name] = registry
  return registries


def test_a_treedef_equals_stocks_for_the_same_tree():
  r = _registries()
  tree = [Box([1]), {"k": (2, None), "j": Point(3, 4)}, Pair(5, "m"), Opaque()]
  ours_td, stock_td = r["ours"].flatten(tree)[1], r["stock"].flatten(tree)[1]
  assert ours_td == stock_td
  assert not ours_td != stock_td


@pytest.mark.parametrize(
    "other",
    [
        [Box([1]), Pair(5, "other meta")],
        [Box([1]), Pair(5, "m"), 3],
        [Pair(5, "m"), Box([1])],
        [Box([1]), {"k": Pair(5, "m")}],
        [Box([(1, 2)]), Pair(5, "m")],
    ],
)
def test_a_treedef_differs_from_stocks_for_another_tree(other):
  r = _registries()
  ours_td = r["ours"].flatten([Box([1]), Pair(5, "m")])[1]
  stock_td = r["stock"].flatten(other)[1]
  assert not ours_td == stock_td
  assert ours_td != stock_td


def test_a_type_only_stock_knows_is_not_equal():
  r = _registries()
  r["stock"].register_node(Opaque, lambda o: ((), None), lambda *_: Opaque())
  stock_td = r["stock"].flatten([Opaque()])[1]
  ours_td = r["ours"].flatten([Opaque()])[1]  # a leaf here
  assert not ours_td == stock_td and ours_td != stock_td


def test_sharing_makes_a_treedef_differ_from_stocks():
  r = _registries()
  ours_shared = ours.PyTreeRegistry()
  ours_shared.register_node(
      Box, box_flatten, box_unflatten, preserve_relative_identities=True
  )
  b = Box([1])
  stock_td = r["stock"].flatten([b, b])[1]
  assert ours_shared.flatten([b, Box([2])])[1] == stock_td
  assert ours_shared.flatten([b, b])[1] != stock_td


def test_non_treedefs_compare_as_in_stock():
  r = _registries()
  for name in MODULES:
    treedef = r[name].flatten([1])[1]
    assert (treedef == 5, treedef != 5, treedef == "x") == (False,) * 3
