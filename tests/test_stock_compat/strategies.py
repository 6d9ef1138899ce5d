"""Fixtures-as-data and hypothesis strategies of the differential tests.

It holds everything that must be importable by name so that pickle can find
it:

* the custom pytree node classes (plain Python classes, dataclasses and
  namedtuples) and the Python functions that flatten / unflatten them;
* one set of registries per module under test (``stock`` = the reference
  ``jaxlib._jax.pytree``, ``ours`` = the candidate ``jaxlib_patch.pytree``),
  each registry named ``<side>_<flavour>`` and stored as a module attribute so
  that ``PyTreeRegistry.__reduce__`` can pickle it by reference.

Every custom class is registered with *the same Python functions* in a stock
registry and in a candidate registry, so one tree object can be handed to both
modules and the results compared.

The functions called back by the pytree modules append to ``CALLS`` so the
tests can also compare *how* each module calls back into Python (which
callbacks, on which objects, in which order).

Candidate selection: by default the candidate is ``jaxlib_patch.pytree``.
Set the environment variable ``PYTREE_CANDIDATE=stock`` to compare the stock
module with itself instead; this is only meant for developing / debugging the
test-suite while the candidate is not built yet.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import numpy as np
from hypothesis import strategies as st

from jaxlib._jax import pytree as stock

if os.environ.get("PYTREE_CANDIDATE", "") == "stock":
  ours = stock
else:
  from jaxlib_patch import pytree as ours  # noqa: E402


# ---------------------------------------------------------------------------
# Call log shared by all callbacks.
# ---------------------------------------------------------------------------

CALLS: list = []


def log_call(*entry):
  """Records one callback invocation; entries only hold ids and plain values."""
  CALLS.append(entry)


# ---------------------------------------------------------------------------
# Leaves.
# ---------------------------------------------------------------------------


class Opaque:
  """An arbitrary leaf object; compared by identity in the tests."""

  def __init__(self, tag):
    self.tag = tag

  def __repr__(self):
    return f"Opaque({self.tag!r})"


class TupleSub(tuple):
  """A tuple subclass that no registry knows: always a leaf."""


class SentinelLeaf:
  """Fresh sentinel leaves handed to unflatten/walk; compared by identity.

  Labelled by the test that makes it (``SentinelLeaf(99)``, or a drawn
  number), so that a failing example names its leaves; nodes.Leaf numbers
  itself.
  """

  def __init__(self, i):
    self.i = i

  def __repr__(self):
    return f"SentinelLeaf({self.i})"


# ---------------------------------------------------------------------------
# Custom node types: alike in form to tests/nodes.py's, but their own, since
# each call back is logged for the comparison with stock.
# ---------------------------------------------------------------------------


class KeyedNode:
  """Custom node registered WITH ``to_iterable_with_keys``.

  ``children`` is stored exactly as received from ``from_iterable`` so the
  tests see which container type each module passes back.
  """

  def __init__(self, children, meta):
    self.children = children
    self.meta = meta

  def __repr__(self):
    return f"KeyedNode({self.children!r}, {self.meta!r})"


def keyed_flatten(node):
  log_call("keyed_flatten", id(node))
  return tuple(node.children), node.meta


def keyed_flatten_with_keys(node):
  log_call("keyed_flatten_with_keys", id(node))
  return [(f"c{i}", c) for i, c in enumerate(node.children)], node.meta


def keyed_unflatten(meta, children):
  log_call("keyed_unflatten", type(children).__name__)
  return KeyedNode(children, meta)


class PlainNode:
  """Custom node registered WITHOUT ``to_iterable_with_keys``.

  Its ``to_iterable`` returns a *list* of children.
  """

  def __init__(self, children, meta):
    self.children = children
    self.meta = meta

  def __repr__(self):
    return f"PlainNode({self.children!r}, {self.meta!r})"


def plain_flatten(node):
  log_call("plain_flatten", id(node))
  return list(node.children), node.meta


def plain_unflatten(meta, children):
  log_call("plain_unflatten", type(children).__name__)
  return PlainNode(children, meta)


@dataclasses.dataclass(eq=False)
class DataNode:
  """Registered with register_dataclass_node(data=['x', 'y'], meta=['tag'])."""

  x: object
  y: object
  tag: object

  def __post_init__(self):
    log_call("DataNode.__init__")


@dataclasses.dataclass(eq=False)
class DataOnly:
  """Registered with register_dataclass_node(data=['a'], meta=[])."""

  a: object


@dataclasses.dataclass(eq=False)
class MetaOnly:
  """Registered with register_dataclass_node(data=[], meta=['m', 'n'])."""

  m: object
  n: object


Pair = collections.namedtuple("Pair", ["first", "second"])
Single = collections.namedtuple("Single", ["only"])
Empty = collections.namedtuple("Empty", [])


class RaisingIterable:
  """An iterable whose iteration fails after yielding ``n`` items."""

  def __init__(self, n):
    self.n = n

  def __iter__(self):
    for i in range(self.n):
      yield SentinelLeaf(100 + i)
    raise KeyError("iteration failed")

  def __repr__(self):
    return f"RaisingIterable({self.n})"


class Junk:
  """Custom node whose flatten functions return whatever the test asks for.

  ``flat`` / ``keyed`` are *recipes* (see ``junk_result``): the callbacks
  turn them into the value to return (or an exception to raise) on every
  call, so that both modules see equivalent but fresh values (e.g. new
  generators).
  """

  def __init__(self, flat, keyed):
    self.flat = flat
    self.keyed = keyed

  def __repr__(self):
    return f"Junk({self.flat!r}, {self.keyed!r})"


class JunkNoKeys(Junk):
  """Like Junk but registered without to_iterable_with_keys."""


def junk_result(recipe):
  """Builds the value a Junk callback returns, or raises, from a recipe."""
  kind, payload = recipe
  if kind == "raise":
    raise RuntimeError(f"to_iterable failed: {payload}")
  if kind == "value":
    return payload
  if kind == "gen":  # (generator over payload children, aux)
    children, aux = payload
    return (c for c in children), aux
  if kind == "raising_iter":
    n, aux = payload
    return RaisingIterable(n), aux
  raise AssertionError(recipe)


def junk_flatten(node):
  log_call("junk_flatten", id(node))
  return junk_result(node.flat)


def junk_flatten_with_keys(node):
  log_call("junk_flatten_with_keys", id(node))
  return junk_result(node.keyed)


def junk_unflatten(aux, children):
  log_call("junk_unflatten", type(children).__name__)
  if aux == "fail-unflatten":
    raise LookupError("from_iterable failed")
  if aux == "return-none":
    return None
  return ("rebuilt", aux, tuple(children))


def tuple_flatten(t):
  log_call("tuple_flatten", id(t))
  return t, None


def tuple_unflatten(aux, children):
  log_call("tuple_unflatten", type(children).__name__)
  return tuple(children)


class RegA:
  """Plain classes used as registration targets (test_registrations and the
  hand-written registration cases)."""

  def __init__(self, p=1, q=2):
    self.p, self.q = p, q


class RegB(RegA):
  pass


def rega_flatten(x):
  log_call("rega_flatten", id(x))
  return (x.p, x.q), "rega"


def rega_flatten_keys(x):
  log_call("rega_flatten_keys", id(x))
  return [("p", x.p), ("q", x.q)], "rega"


def rega_unflatten(aux, children):
  log_call("rega_unflatten", aux, type(children).__name__)
  return RegA(*children)


# ---------------------------------------------------------------------------
# Registries.
# ---------------------------------------------------------------------------

# flavour name -> (constructor kwargs, register custom types?, tuple custom?)
FLAVOURS = {
    "full": ({}, True, False),
    "no_none": ({"enable_none": False}, True, False),
    "no_tuple": ({"enable_tuple": False}, True, False),
    "no_namedtuple": ({"enable_namedtuple": False}, True, False),
    "no_list": ({"enable_list": False}, True, False),
    "no_dict": ({"enable_dict": False}, True, False),
    "tuple_custom": ({"enable_tuple": False}, True, True),
    "bare": ({}, False, False),
}
# "default" (the module's default_registry(), never mutated) is also a
# flavour; it is deliberately left without __name__ so that pickling trees
# built with it exercises the error path of PyTreeRegistry.__reduce__.
ALL_FLAVOURS = sorted(FLAVOURS) + ["default"]

CUSTOM_TYPES = (
    KeyedNode,
    PlainNode,
    DataNode,
    DataOnly,
    MetaOnly,
    Junk,
    JunkNoKeys,
)


def register_custom_types(reg):
  """Registers every custom class in ``reg`` (same functions for all)."""
  reg.register_node(
      KeyedNode, keyed_flatten, keyed_unflatten, keyed_flatten_with_keys
  )
  reg.register_node(PlainNode, plain_flatten, plain_unflatten)
  reg.register_dataclass_node(DataNode, ["x", "y"], ["tag"])
  reg.register_dataclass_node(DataOnly, ["a"], [])
  reg.register_dataclass_node(MetaOnly, [], ["m", "n"])
  reg.register_node(Junk, junk_flatten, junk_unflatten, junk_flatten_with_keys)
  reg.register_node(JunkNoKeys, junk_flatten, junk_unflatten)


class Side:
  """One module under test together with its registries, by flavour."""

  def __init__(self, name, mod):
    self.name = name
    self.mod = mod
    self.regs = {}
    for flavour, (kwargs, custom, tuple_custom) in FLAVOURS.items():
      reg = mod.PyTreeRegistry(**kwargs)
      if tuple_custom:
        reg.register_node(tuple, tuple_flatten, tuple_unflatten)
      if custom:
        register_custom_types(reg)
      attr = f"{name}_{flavour}"
      reg.__module__ = __name__
      reg.__name__ = attr
      globals()[attr] = reg
      self.regs[flavour] = reg
    self.regs["default"] = mod.default_registry()

  def __repr__(self):
    return f"Side({self.name})"


STOCK = Side("stock", stock)
OURS = Side("ours", ours)
SIDES = (STOCK, OURS)

# id(registry) -> flavour name: lets results mentioning registries be compared.
REGISTRY_NAMES = {}
for _side in SIDES:
  for _flavour, _reg in _side.regs.items():
    REGISTRY_NAMES[id(_reg)] = _flavour


# ---------------------------------------------------------------------------
# Hypothesis strategies.
# ---------------------------------------------------------------------------

flavours = st.sampled_from(ALL_FLAVOURS)

small_ints = st.integers(-3, 3)

# Auxiliary data for custom nodes (shows up in repr via str(), compared with
# == by treedef equality).  Includes unhashable lists and NaN on purpose.
aux_data = st.one_of(
    st.none(),
    small_ints,
    st.text(alphabet="ab'\"", max_size=3),
    st.tuples(small_ints, st.text(alphabet="xy", max_size=2)),
    st.lists(small_ints, max_size=2),
    st.sampled_from([0.5, float("nan"), -0.0]),
)


def _arrays():
  return st.one_of(
      st.integers(0, 4).map(np.arange),
      st.integers(0, 3).map(lambda n: np.ones((n, 2), dtype=np.float32)),
      st.just(np.float64(2.5)),
  )


leaves = st.one_of(
    st.none(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.booleans(),
    st.integers(0, 20).map(Opaque),
    _arrays(),
    st.lists(small_ints, max_size=2).map(TupleSub),
)

str_keys = st.text(alphabet="abcxyz", max_size=3)
int_keys = st.integers(-5, 5)


def _containers(children, mixed_keys):
  """Node strategies whose children are drawn from ``children``."""
  options = [
      st.lists(children, max_size=4).map(tuple),
      st.lists(children, max_size=4),
      st.dictionaries(str_keys, children, max_size=4),
      st.dictionaries(int_keys, children, max_size=3),
      st.builds(Pair, children, children),
      st.builds(Single, children),
      st.just(Empty()),
      st.builds(KeyedNode, st.lists(children, max_size=3).map(tuple), aux_data),
      st.builds(PlainNode, st.lists(children, max_size=3), aux_data),
      st.builds(DataNode, children, children, aux_data),
      st.builds(DataOnly, children),
      st.builds(MetaOnly, aux_data, aux_data),
  ]
  if mixed_keys:
    options.append(
        st.dictionaries(st.one_of(int_keys, str_keys), children, max_size=3)
    )
  return st.one_of(*options)


def trees(max_leaves=12, mixed_keys=False):
  """Nested pytrees of every supported node kind (module independent)."""
  return st.recursive(
      leaves, lambda ch: _containers(ch, mixed_keys), max_leaves=max_leaves
  )


def builtin_trees(max_leaves=12, int_keys_too=True):
  """Trees made only of None/tuple/list/dict: what proto serialization supports."""

  def extend(children):
    opts = [
        st.lists(children, max_size=4).map(tuple),
        st.lists(children, max_size=4),
        st.dictionaries(str_keys, children, max_size=4),
    ]
    if int_keys_too:
      opts.append(st.dictionaries(int_keys, children, max_size=2))
    return st.one_of(*opts)

  base = st.one_of(st.none(), st.integers(-3, 3), st.integers(0, 5).map(Opaque))
  return st.recursive(base, extend, max_leaves=max_leaves)


# Recipes for Junk callbacks (see junk_result).
_junk_aux = st.sampled_from(["aux", "fail-unflatten", "return-none", None])
_good_children = st.lists(st.integers(0, 5).map(SentinelLeaf), max_size=3)

junk_flat_recipes = st.one_of(
    st.just(("raise", "flat")),
    st.sampled_from([5, None, "ab", (1,), (1, 2, 3), [(), None]]).map(
        lambda v: ("value", v)
    ),
    st.tuples(_good_children.map(tuple), _junk_aux).map(lambda v: ("value", v)),
    st.tuples(_good_children, _junk_aux).map(lambda v: ("value", v)),
    st.tuples(st.just(7), _junk_aux).map(lambda v: ("value", v)),
    st.tuples(st.just("xy"), _junk_aux).map(lambda v: ("value", v)),
    st.tuples(st.just({"k": 1, "j": 2}), _junk_aux).map(lambda v: ("value", v)),
    st.tuples(_good_children, _junk_aux).map(lambda v: ("gen", v)),
    st.tuples(st.integers(0, 2), _junk_aux).map(lambda v: ("raising_iter", v)),
)

_key_objs = st.sampled_from(["k", 0, ("t", 1), None])
_good_pairs = st.lists(
    st.tuples(_key_objs, st.integers(0, 5).map(SentinelLeaf)), max_size=3
)

junk_keyed_recipes = st.one_of(
    st.just(("raise", "keyed")),
    st.sampled_from(
        [5, None, (1,), ([1, 2], None), ([(1, 2, 3)], None), (7, None)]
    ).map(lambda v: ("value", v)),
    st.tuples(_good_pairs, _junk_aux).map(lambda v: ("value", v)),
    st.tuples(_good_pairs.map(tuple), _junk_aux).map(lambda v: ("value", v)),
    st.tuples(st.integers(0, 2), _junk_aux).map(lambda v: ("raising_iter", v)),
)

junk_nodes = st.one_of(
    st.builds(Junk, junk_flat_recipes, junk_keyed_recipes),
    st.builds(JunkNoKeys, junk_flat_recipes, st.just(("raise", "unused"))),
)
