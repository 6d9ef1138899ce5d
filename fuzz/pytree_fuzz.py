#!/usr/bin/env python3
"""A seeded random fuzzer for `jaxlib_patch.pytree`.

It drives fresh registries and the treedefs they make through random
sequences of operations (register_node / register_dataclass_node with and
without `preserve_relative_identities`, flatten, flatten_with_path,
flatten_up_to, unflatten, walk, from_iterable_tree, children, node_data,
from_node_data_and_children, compose, treedef_tuple, ==, hash, repr, pickle,
the protocol-buffer format, flatten_one_level, all_leaves ...) on random
DAG-shaped trees, with adversarial user code: flatten functions that raise,
return junk or non-iterables, return iterators that fail mid-way, mutate the
object being flattened or the containers being walked, or re-enter the module
(flatten, unflatten, register, pickle ...) from inside; unflatten functions
that return cached singletons, their own children or leaves; aux data and dict
keys whose `__eq__`, `__hash__`, `__lt__`, `__repr__` or `__reduce__` raise;
`__del__` methods and weakref callbacks that run all of the above while
objects die inside the module's loops, and `gc.collect()` from inside
callbacks.

Every operation must end in a result or a Python exception of an allowed type:
ValueError, TypeError, RecursionError, KeyError, or `Boom`, the exception the
fuzzer's own callbacks raise. Anything else is a *finding*: the module's
InternalError or another SystemError, any other exception type (a
RuntimeError among them), a broken invariant on an operation during which
no callback misbehaved (round trips, hash/== consistency, the children
partition, pickling), a hang, or a crash (the worker process dies of a
signal). Crashes are caught by running the campaign in worker processes,
which the driver restarts after the program that crashed.

One *execution* is one classified call into the module (a top-level
operation, or one made by a callback from inside another operation). A
*program* is one fresh registry with its own types, trees and treedefs and a
few dozen operations on them; program `i` of seed `s` is reproducible on its
own:

  python fuzz/pytree_fuzz.py --executions 1000000 --seed 1 --jobs 2
  python fuzz/pytree_fuzz.py --seconds 60 --seed 7
  python fuzz/pytree_fuzz.py --seed 1 --program 1234 --verbose   # replay one

The generators that found F1-F3 of docs/hardening.md (all fixed) stay in
the campaign; `--skip-known` turns off these three (a dict key whose __hash__
fails, mutation of the key lists that __getstate__/walk hand out or
__setstate__ takes, namedtuple look-alikes whose `_fields` do not match), to
look past them.
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import json
import os
import pickle
import random
import select
import subprocess
import sys
import time
import traceback
import types
import warnings
import weakref

try:
  from jaxlib_patch import pytree as pt
except ImportError:  # Run from the checkout without an install.
  sys.path.insert(
      0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  from jaxlib_patch import pytree as pt

# ---------------------------------------------------------------------------
# Outcomes.
# ---------------------------------------------------------------------------


class Boom(Exception):
  """The exception that misbehaving callbacks raise."""


class OracleFailure(AssertionError):
  """An invariant that must hold when no callback misbehaved was broken."""


# What an execution may raise: the module's complaints about its input, and
# what the callbacks raise. Everything else is a finding: the module's
# InternalError (a SystemError, as is a misuse of the C API) is a bug
# whatever the input, and a RuntimeError is an error the module failed to
# classify.
ALLOWED = (ValueError, TypeError, RecursionError, KeyError, Boom)

# A namespace module for the classes and registries the programs create, so
# that pickle finds them by name.
NS_NAME = "_pytree_fuzz_ns"
NS = types.ModuleType(NS_NAME)
sys.modules[NS_NAME] = NS
# Pickling a treedef pickles its registry by name, as jax names its own.
pt.default_registry().__module__ = NS_NAME
pt.default_registry().__name__ = "DEFAULT"
NS.DEFAULT = pt.default_registry()


def _export(obj, name=None):
  name = name or obj.__name__
  obj.__module__ = NS_NAME
  obj.__qualname__ = name
  setattr(NS, name, obj)
  return obj


# ---------------------------------------------------------------------------
# Chaos: whether a callback misbehaves this time.
# ---------------------------------------------------------------------------

_rng = random.Random(0)
_rate = 0.0  # Probability that a callback misbehaves.
_fired = 0  # How many times callbacks misbehaved (oracles read it).
_depth = 0  # Re-entrancy depth of operations.
_prog = None  # The program running now.
_skip_known = False
MAX_DEPTH = 2


def chaos():
  """True when the calling callback should misbehave now."""
  global _fired
  if _rate and _rng.random() < _rate:
    _fired += 1
    return True
  return False


class Leaf:
  """A plain leaf object."""

  __slots__ = ("v", "__weakref__")

  def __init__(self, v=0):
    self.v = v

  def __repr__(self):
    return f"Leaf({self.v})"

  def __reduce__(self):
    return (Leaf, (self.v,))


class Aux:
  """Honest aux data: equality and hash by value."""

  __slots__ = ("v",)

  def __init__(self, v):
    self.v = v

  def __eq__(self, other):
    return type(other) is Aux and other.v == self.v

  def __hash__(self):
    return hash(self.v)

  def __repr__(self):
    return f"Aux({self.v!r})"

  def __reduce__(self):
    return (Aux, (self.v,))


class TrickyAux:
  """Aux data whose __eq__, __hash__, __repr__, __reduce__ raise under chaos."""

  __slots__ = ("v",)

  def __init__(self, v):
    self.v = v

  def __eq__(self, other):
    if chaos():
      return misbehave_in_dunder(other)
    return type(other) is TrickyAux and other.v == self.v

  def __hash__(self):
    if chaos():
      raise Boom("aux __hash__")
    return hash(self.v)

  def __repr__(self):
    if chaos():
      raise Boom("aux __repr__")
    return f"TrickyAux({self.v!r})"

  def __reduce__(self):
    if chaos():
      raise Boom("aux __reduce__")
    return (TrickyAux, (self.v,))


def misbehave_in_dunder(other):
  k = _rng.randrange(4)
  if k == 0:
    raise Boom("__eq__")
  if k == 1:
    return NotImplemented
  if k == 2:
    return _rng.choice([1, "yes", None, [], 0.0])  # A non-bool truth value.
  nested_op()
  return False


class Key:
  """A dict key whose __lt__, __eq__ and __hash__ misbehave under chaos.

  `__hash__` raising is what reaches finding F1 (flatten_up_to reads dict
  values with PyDict_GetItem, which swallows the error); `--skip-known` keeps
  its hash honest.
  """

  __slots__ = ("k",)

  def __init__(self, k):
    self.k = k

  def __lt__(self, other):
    if chaos():
      r = _rng.randrange(3)
      if r == 0:
        raise Boom("key __lt__")
      if r == 1:
        mutate_pools()
      else:
        return NotImplemented
    return type(other) is Key and self.k < other.k

  def __eq__(self, other):
    if chaos():
      r = _rng.randrange(3)
      if r == 0:
        raise Boom("key __eq__")
      mutate_pools()
    return type(other) is Key and other.k == self.k

  def __hash__(self):
    if not _skip_known and chaos():
      raise Boom("key __hash__")
    return hash(self.k)

  def __repr__(self):
    return f"Key({self.k})"

  def __reduce__(self):
    return (Key, (self.k,))


NT2 = collections.namedtuple("NT2", "a b")
NT1 = collections.namedtuple("NT1", "x")


class FakeNT(tuple):
  """A tuple subclass with `_fields`: a namedtuple to the module."""

  _fields = ("p", "q")


class ShortNT(tuple):
  """A 'namedtuple' whose `_fields` has fewer names than it has items."""

  _fields = ("only",)


class LongNT(tuple):
  """A 'namedtuple' whose `_fields` has more names than it has items."""

  _fields = ("a", "b", "c")


class IntFieldNT(tuple):
  """A 'namedtuple' with a field name that is not a str."""

  _fields = ("a", 1)


for _c in (
    Leaf,
    Aux,
    TrickyAux,
    Key,
    NT2,
    NT1,
    FakeNT,
    ShortNT,
    LongNT,
    IntFieldNT,
):
  _export(_c)


class Dying:
  """A leaf whose `__del__` misbehaves: it runs while the module drops it."""

  __slots__ = ("v", "__weakref__")

  def __init__(self, v=0):
    self.v = v

  def __del__(self):
    if _prog is not None and chaos():
      try:
        in_callback_mischief(None)
      except BaseException:  # noqa: BLE001 -- __del__ cannot raise.
        pass


_export(Dying)


def weakref_callback(_):
  if _prog is not None and chaos():
    try:
      in_callback_mischief(None)
    except BaseException:  # noqa: BLE001 -- Python ignores it anyway.
      pass


_WEAKREFS = []  # Weak references with callbacks; cleared per program.


def watch(obj):
  """Runs mischief (under chaos) when `obj` dies."""
  try:
    _WEAKREFS.append(weakref.ref(obj, weakref_callback))
  except TypeError:
    pass
  return obj


# ---------------------------------------------------------------------------
# Misbehaviour that any callback can show.
# ---------------------------------------------------------------------------


def mutate_pools():
  """Mutates a container that may be being walked right now."""
  prog = _prog
  if prog is None:
    return
  r = _rng.randrange(6)
  if r <= 2 and prog.lists:
    lst = _rng.choice(prog.lists)
    k = _rng.randrange(4)
    if k == 0:
      lst.clear()
    elif k == 1:
      lst.append(prog.gen_tree(1))
    elif k == 2 and lst:
      lst.pop(_rng.randrange(len(lst)))
    else:
      lst[:] = [Leaf(i) for i in range(_rng.randrange(4))]
  elif r == 3 and prog.dicts:
    d = _rng.choice(prog.dicts)
    if d and _rng.random() < 0.5:
      d.pop(next(iter(d)), None)
    else:
      d[f"x{_rng.randrange(5)}"] = prog.gen_tree(1)
  elif r == 4 and prog.nodes:
    node = _rng.choice(prog.nodes)
    if isinstance(node, CustomBase):
      node.kids = tuple(prog.gen_tree(1) for _ in range(_rng.randrange(3)))
    else:
      for name in _data_fields_of(node):
        setattr(node, name, prog.gen_tree(1))
        break
  elif prog.objects:
    # Drop a tree: objects may die (and run __del__/weakref callbacks).
    prog.objects.pop(_rng.randrange(len(prog.objects)))


def _data_fields_of(obj):
  spec = getattr(type(obj), "_spec", None)
  return spec.data_fields if spec is not None else ()


def in_callback_mischief(obj):
  """Side effects from inside a callback; may raise."""
  r = _rng.randrange(10)
  if r == 0:
    raise Boom("callback")
  if r <= 2:
    mutate_pools()
  elif r <= 5:
    nested_op()
  elif r == 6:
    gc.collect(0) if _rng.random() < 0.9 else gc.collect()
  elif r == 7:
    if _prog is not None:
      _prog.register_random_type(inside=True)
  elif r == 8 and isinstance(obj, CustomBase):
    # Make the object contain itself (a cycle), or replace its children.
    obj.kids = (obj,) if _rng.random() < 0.5 else (Leaf(), obj)
  elif r == 8 and isinstance(obj, DataBase):
    for name in _data_fields_of(obj):
      setattr(obj, name, obj)
      break
  else:
    if _prog is not None and _prog.objects:
      _prog.objects.clear()
      gc.collect(0)


def nested_op():
  """Runs a random operation from inside a callback (re-entrancy)."""
  prog = _prog
  if prog is None or _depth >= MAX_DEPTH:
    return
  name, op = prog.pick_op(nested=True)
  prog.execute(name, op)
  if _rng.random() < 0.2:
    raise Boom("after nested op")


def failing_iter(items):
  """Yields some of `items`, then raises."""
  n = _rng.randrange(len(items) + 1) if items else 0
  for i, item in enumerate(items):
    if i == n:
      break
    yield item
  raise Boom("iterator mid-way")


# ---------------------------------------------------------------------------
# Types registered by programs.
# ---------------------------------------------------------------------------


class CustomBase:
  """Base of the custom node classes: children in `kids`, aux in `aux`."""

  def __repr__(self):
    return f"{type(self).__name__}@{id(self) & 0xffff:x}"


class DataBase:
  """Base of the dataclass-node classes: fields set from keywords."""

  def __init__(self, **kwargs):
    if _rate and chaos():
      if _rng.random() < 0.5:
        raise Boom("dataclass __init__")
      in_callback_mischief(None)
    for k, v in kwargs.items():
      setattr(self, k, v)

  def __repr__(self):
    return f"{type(self).__name__}@{id(self) & 0xffff:x}"


KEY_MAKERS = (
    lambda i: pt.GetAttrKey(f"f{i}"),
    lambda i: pt.DictKey(i),
    pt.SequenceKey,
    pt.FlattenedIndexKey,
)


class TypeSpec:
  __slots__ = (
      "cls",
      "kind",
      "flag",
      "data_fields",
      "meta_fields",
      "singleton",
      "registered",
      "name",
      "register",
  )


def junk_flatten_result(obj, with_keys):
  kids = getattr(obj, "kids", ())
  aux = getattr(obj, "aux", None)
  r = _rng.randrange(9)
  if r == 0:
    raise Boom("to_iterable")
  if r == 1:
    return _rng.choice([42, None, "ab", [kids, aux], (kids,), (kids, aux, 1)])
  if r == 2:
    return (5, aux)  # Children not iterable.
  if r == 3:
    items = (
        [(pt.FlattenedIndexKey(i), c) for i, c in enumerate(kids)]
        if with_keys
        else list(kids)
    )
    return (failing_iter(items), aux)
  if r == 4 and with_keys:
    return (list(kids), aux)  # Not (key, child) pairs.
  if r == 5:
    # Mutate the object being flattened, then answer from the new state.
    in_callback_mischief(obj)
    kids = getattr(obj, "kids", ())
  elif r == 6:
    in_callback_mischief(obj)
  elif r == 7:
    # Children that are the object itself, or fresh objects each call.
    kids = (
        (obj,)
        if _rng.random() < 0.3
        else tuple(watch(Dying(i)) for i in range(len(kids)))
    )
  else:
    nested_op()
  if with_keys:
    return (
        tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(kids)),
        aux,
    )
  return (kids, aux)


def make_custom_type(prog, name, flag, with_keys):
  cls = _export(type(name, (CustomBase,), {}), name)
  spec = TypeSpec()
  spec.cls, spec.kind, spec.flag, spec.name = cls, "custom", flag, name
  spec.singleton = None
  spec.registered = False

  def to_iterable(obj):
    if _rate and chaos():
      return junk_flatten_result(obj, False)
    return (obj.kids, obj.aux)

  def to_iterable_with_keys(obj):
    if _rate and chaos():
      return junk_flatten_result(obj, True)
    return (
        tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(obj.kids)),
        obj.aux,
    )

  def from_iterable(aux, children):
    if _rate and chaos():
      r = _rng.randrange(7)
      if r == 0:
        raise Boom("from_iterable")
      if r == 1:
        # A cached singleton: one object for every node.
        if spec.singleton is None:
          spec.singleton = cls()
          spec.singleton.kids, spec.singleton.aux = tuple(children), aux
        return spec.singleton
      if r == 2:
        return children
      if r == 3:
        return Leaf(-1)
      if r == 4:
        in_callback_mischief(None)
      elif r == 5:
        new = watch(cls())
        new.kids, new.aux = (new,), aux  # A node that contains itself.
        return new
      else:
        nested_op()
    new = cls()
    new.kids = tuple(children)
    new.aux = aux
    if _rng.random() < 0.05:
      watch(new)
    return new

  spec.register = lambda reg: reg.register_node(
      cls,
      to_iterable,
      from_iterable,
      to_iterable_with_keys if with_keys else None,
      preserve_relative_identities=flag,
  )
  return spec


def make_dataclass_type(prog, name, flag):
  data = tuple(f"d{i}" for i in range(_rng.randrange(3)))
  meta = tuple(f"m{i}" for i in range(_rng.randrange(2)))
  attrs = {}
  if _rng.random() < 0.3 and data:
    # A data field that is a property, misbehaving under chaos.
    field = data[-1]
    store = "_" + field

    def getter(self):
      if _rate and chaos():
        if _rng.random() < 0.5:
          raise Boom("property")
        in_callback_mischief(self)
      return getattr(self, store)

    def setter(self, value):
      setattr(self, store, value)

    attrs[field] = property(getter, setter)
  cls = _export(type(name, (DataBase,), attrs), name)
  spec = TypeSpec()
  spec.cls, spec.kind, spec.flag, spec.name = cls, "dataclass", flag, name
  spec.data_fields, spec.meta_fields = data, meta
  cls._spec = spec
  spec.singleton = None
  spec.registered = False
  spec.register = lambda reg: reg.register_dataclass_node(
      cls, list(data), list(meta), preserve_relative_identities=flag
  )
  return spec


# ---------------------------------------------------------------------------
# Programs.
# ---------------------------------------------------------------------------

_serial = 0


class Program:
  """One registry with its types, trees and treedefs."""

  def __init__(self, runner, index, rng):
    global _serial
    _serial += 1
    self.runner = runner
    self.index = index
    self.rng = rng
    self.serial = _serial
    self.names = []
    flags = [rng.random() < 0.95 for _ in range(5)]
    self.reg = pt.PyTreeRegistry(*flags)
    self.reg_name = f"R{self.serial}"
    self.reg.__module__ = NS_NAME
    self.reg.__name__ = self.reg_name
    setattr(NS, self.reg_name, self.reg)
    self.names.append(self.reg_name)
    self.specs = []  # Registered type specs.
    self.objects = []  # Trees.
    self.lists = []  # Lists inside trees (mutation targets).
    self.dicts = []  # Dicts inside trees.
    self.nodes = []  # Custom/dataclass instances (sharing, mutation).
    self.treedefs = []  # (treedef, leaves or None)
    self.type_count = 0
    for _ in range(rng.randrange(1, 5)):
      self.register_random_type()

  def close(self):
    for name in self.names:
      try:
        delattr(NS, name)
      except AttributeError:
        pass

  # --- Types.

  def register_random_type(self, inside=False):
    rng = _rng
    self.type_count += 1
    name = f"T{self.serial}_{self.type_count}"
    flag = rng.random() < 0.7
    if rng.random() < 0.65:
      spec = make_custom_type(self, name, flag, rng.random() < 0.6)
    else:
      spec = make_dataclass_type(self, name, flag)
    self.names.append(name)
    spec.register(self.reg)
    spec.registered = True
    self.specs.append(spec)
    if inside and rng.random() < 0.2:
      spec.register(self.reg)  # A duplicate: ValueError, from a callback.
    return spec

  # --- Trees.

  def gen_leaf(self):
    r = _rng.randrange(12)
    if r < 4:
      return Leaf(_rng.randrange(100))
    if r < 6:
      return _rng.randrange(-3, 100)
    if r == 6:
      return "s"
    if r == 7:
      return 1.5
    if r == 8:
      return watch(Dying(r)) if _rng.random() < 0.5 else Dying(r)
    if r == 9 and self.objects:
      return _rng.choice(self.objects)  # A tree reused whole.
    return Leaf(-r)

  def gen_aux(self):
    r = _rng.randrange(8)
    if r < 3:
      return None
    if r == 3:
      return _rng.randrange(3)
    if r == 4:
      return (
          "meta",
          _rng.randrange(3),
          "\ud800" if _rng.random() < 0.1 else "",
      )
    if r == 5:
      return Aux(_rng.randrange(3))
    return TrickyAux(_rng.randrange(3))

  def gen_key(self, kind):
    if kind == 0:
      return f"k{_rng.randrange(6)}"
    if kind == 1:
      return _rng.randrange(6)
    if kind == 2:
      return Key(_rng.randrange(6))
    return _rng.choice(
        [
            f"k{_rng.randrange(3)}",
            _rng.randrange(3),
            float("nan"),
            None,
            (1, 2),  # Mixed: no total order.
            "\ud800",
            "k\udfff",
        ]
    )  # Lone surrogates.

  def gen_node(self, spec, depth):
    if spec.kind == "custom":
      obj = spec.cls()
      obj.kids = tuple(
          self.gen_tree(depth - 1) for _ in range(_rng.randrange(4))
      )
      obj.aux = self.gen_aux()
    else:
      obj = spec.cls.__new__(spec.cls)
      for f in spec.data_fields:
        setattr(obj, f, self.gen_tree(depth - 1))
      for f in spec.meta_fields:
        setattr(obj, f, self.gen_aux())
      if _rng.random() < 0.02 and spec.data_fields:
        # A missing field: AttributeError from getattr, as a callback error.
        obj.__dict__.pop(spec.data_fields[0], None)
        obj.__dict__.pop("_" + spec.data_fields[0], None)
    if _rng.random() < 0.1:
      watch(obj)
    self.nodes.append(obj)
    if _rng.random() < 0.03:
      # A cycle through this node.
      if spec.kind == "custom":
        obj.kids = obj.kids + ([obj],)
      elif spec.data_fields:
        setattr(obj, spec.data_fields[0], {"c": obj})
    return obj

  def gen_tree(self, depth=3):
    rng = _rng
    r = rng.randrange(20)
    if depth <= 0 or r < 5:
      return self.gen_leaf()
    if r < 9 and self.specs:
      if self.nodes and rng.random() < 0.35:
        return rng.choice(self.nodes)  # Sharing: a node met before.
      return self.gen_node(rng.choice(self.specs), depth)
    n = rng.randrange(4)
    if r < 11:
      lst = [self.gen_tree(depth - 1) for _ in range(n)]
      self.lists.append(lst)
      if rng.random() < 0.02:
        lst.append(lst)  # A cycle of plain containers.
      return lst
    if r < 13:
      return tuple(self.gen_tree(depth - 1) for _ in range(n))
    if r < 15:
      kind = rng.choice((0, 0, 0, 1, 2, 3))
      d = {self.gen_key(kind): self.gen_tree(depth - 1) for _ in range(n)}
      self.dicts.append(d)
      return d
    if r == 15:
      return NT2(self.gen_tree(depth - 1), self.gen_tree(depth - 1))
    if r == 16:
      if rng.random() < 0.7:
        return NT1(self.gen_tree(depth - 1))
      if _skip_known or rng.random() < 0.8:
        return FakeNT((self.gen_tree(depth - 1), 1))
      # `_fields` that do not match the items (finding F3).
      return rng.choice((ShortNT, LongNT, IntFieldNT))(
          (self.gen_tree(depth - 1), 2)
      )
    if r == 17:
      return None
    if r == 18 and self.nodes:
      # The same node several times in one container.
      node = rng.choice(self.nodes)
      return [node, self.gen_tree(depth - 1), node]
    return [self.gen_tree(depth - 1) for _ in range(n)]

  def some_tree(self):
    if self.objects and _rng.random() < 0.6:
      return _rng.choice(self.objects)
    tree = self.gen_tree(_rng.randrange(1, 5))
    self.objects.append(tree)
    if len(self.objects) > 12:
      self.objects.pop(0)
    return tree

  def some_treedef(self):
    if self.treedefs and _rng.random() < 0.7:
      return _rng.choice(self.treedefs)
    try:
      tree = self.some_tree()
      leaves, td = self.reg.flatten(tree)
    except ALLOWED:
      leaves, td = [1], self.reg.flatten(1)[1]
    return self.keep(td, leaves)

  def keep(self, td, leaves):
    entry = (td, leaves)
    self.treedefs.append(entry)
    if len(self.treedefs) > 12:
      self.treedefs.pop(0)
    return entry

  def predicate(self, with_path):
    r = _rng.randrange(6)
    if r == 0:
      return None
    if r <= 2:
      leafy = tuple({_rng.choice(self.specs).cls} if self.specs else ())
      leafy += (Leaf,)
      if with_path:
        return lambda path, x: isinstance(x, leafy)
      return lambda x: isinstance(x, leafy)

    def bad(*args):
      x = args[-1]
      if chaos():
        k = _rng.randrange(4)
        if k == 0:
          raise Boom("is_leaf")
        if k == 1:
          return _rng.choice([1, "yes", [], 0])  # Not a bool.
        in_callback_mischief(x)
      return x is None

    return bad

  def leaves_for(self, td, leaves):
    """Leaves to unflatten with: usually the right number."""
    n = td.num_leaves
    if leaves is None or len(leaves) != n:
      leaves = [Leaf(i) for i in range(n)]
    r = _rng.randrange(12)
    if r < 5:
      return list(leaves)
    if r == 5:
      return tuple(leaves)
    if r == 6:
      return iter(list(leaves))
    if r == 7:
      return leaves[:-1] if n else [1]
    if r == 8:
      return list(leaves) + [Leaf()]
    if r == 9:
      return failing_iter(list(leaves))
    if r == 10:
      return [self.gen_tree(1) for _ in range(n)]  # Leaves that are trees.
    return (x for x in leaves)

  # --- Operations.

  def pick_op(self, nested=False):
    if nested:
      return _rng.choice(NESTED_OPS)
    return _rng.choices(OPS, cum_weights=CUM_WEIGHTS_ALL, k=1)[0]

  def execute(self, name, op):
    """Runs one operation and classifies its outcome."""
    global _depth
    runner = self.runner
    runner.executions += 1
    if _depth:
      runner.nested += 1
    _depth += 1
    try:
      op(self)
      outcome = "ok"
    except OracleFailure as e:
      outcome = "FINDING:wrong"
      runner.finding(self, name, "wrong", e)
    except ALLOWED as e:
      outcome = type(e).__name__
    except AttributeError as e:
      # Only from a dataclass field the fuzzer deleted, or a property.
      outcome = "AttributeError"
      if "has no attribute 'd" not in str(e) and "'_d" not in str(e):
        outcome = "FINDING:" + type(e).__name__
        runner.finding(self, name, type(e).__name__, e)
    except BaseException as e:  # noqa: BLE001 -- every other type is a finding.
      if isinstance(e, KeyboardInterrupt):
        raise
      outcome = "FINDING:" + type(e).__name__
      runner.finding(self, name, type(e).__name__, e)
    finally:
      _depth -= 1
    runner.count(name, outcome)
    if runner.verbose:
      print(f"  {'  ' * _depth}{name}: {outcome}", flush=True)


def oracle(cond, message):
  if not cond:
    raise OracleFailure(message)


# Each operation may raise; oracle checks run only when no callback
# misbehaved during the operation (`_fired` unchanged).


def op_flatten(prog):
  f0 = _fired
  tree = prog.some_tree()
  pred = prog.predicate(False)
  leaves, td = prog.reg.flatten(tree, pred)
  oracle(len(leaves) == td.num_leaves, "len(leaves) != num_leaves")
  prog.keep(td, leaves)
  if _fired != f0 or _rng.random() < 0.5:
    return
  # Round trip: unflatten, then flatten again gives the same treedef, and the
  # very same leaves.
  # (Every value is computed before `_fired` is read: a comparison can run
  # misbehaving user code too.)
  out = td.unflatten(leaves)
  leaves2, td2 = prog.reg.flatten(out, pred)
  same = td2 == td
  up = td.flatten_up_to(out) if pred is None else leaves
  if _fired != f0:
    return
  oracle(same, f"re-flatten of unflatten differs: {td!r} vs {td2!r}")
  oracle(hash(td2) == hash(td), "equal treedefs hash differently")
  oracle(
      len(leaves2) == len(leaves)
      and all(a is b for a, b in zip(leaves, leaves2)),
      "re-flatten gives other leaves",
  )
  oracle(
      len(up) == len(leaves) and all(a is b for a, b in zip(up, leaves)),
      "flatten_up_to(unflatten(td, L)) != L",
  )


def op_flatten_with_path(prog):
  f0 = _fired
  tree = prog.some_tree()
  pred = prog.predicate(True)
  pairs, td = prog.reg.flatten_with_path(tree, pred)
  oracle(len(pairs) == td.num_leaves, "len(pairs) != num_leaves")
  if _rng.random() < 0.2:
    # The keys: repr, str, hash, ==, pickle.
    for path, _ in pairs[:4]:
      repr(path)
      [str(k) for k in path]
      hash(path)
      back = pickle.loads(pickle.dumps(path))
      text = repr(path)
      oracle(
          back == path or _fired != f0 or "nan" in text,
          f"a key path does not survive pickling: {text} became {back!r}",
      )
  if _fired != f0 or pred is not None:
    return
  leaves, td2 = prog.reg.flatten(tree)
  same = td2 == td
  if _fired != f0:
    return
  oracle(same, "flatten_with_path and flatten disagree on the treedef")
  oracle(
      all(a is b for (_, a), b in zip(pairs, leaves)),
      "flatten_with_path and flatten disagree on the leaves",
  )


def op_flatten_up_to(prog):
  td, leaves = prog.some_treedef()
  r = _rng.randrange(3)
  if r == 0:
    tree = prog.some_tree()
  else:
    tree = td.unflatten(
        prog.leaves_for(td, leaves)
        if r == 2
        else [Leaf(i) for i in range(td.num_leaves)]
    )
  td.flatten_up_to(tree)


def op_unflatten(prog):
  f0 = _fired
  td, leaves = prog.some_treedef()
  args = prog.leaves_for(td, leaves)
  out = td.unflatten(args)
  if _fired == f0 and _rng.random() < 0.3:
    td2 = prog.reg.flatten(out)[1]
    same = td2 == td
    if (
        _fired == f0
        and isinstance(args, list)
        and all(type(x) in (Leaf, int, str, float) for x in args)
    ):
      oracle(
          same,
          f"flatten(unflatten(td, L)) has another treedef: {td!r} "
          f"became {td2!r}",
      )


def op_walk(prog):
  f0 = _fired
  td, leaves = prog.some_treedef()
  calls = [0]

  def f_node(children, data):
    calls[0] += 1
    if chaos():
      in_callback_mischief(None)
      if _rng.random() < 0.3:
        return calls  # The same object for every node.
    return ("N", children, data)

  def f_leaf(x):
    if chaos():
      in_callback_mischief(x)
    return x

  out = td.walk(
      f_node,
      f_leaf if _rng.random() < 0.95 else None,
      prog.leaves_for(td, leaves),
  )
  del out
  if _fired == f0:
    state = td.__getstate__()[1]
    expected = sum(1 for e in state if e[0] != 0 and len(e) == 6)
    oracle(
        calls[0] == expected,
        f"walk called f_node {calls[0]} times, expected {expected}",
    )


def op_from_iterable_tree(prog):
  td, leaves = prog.some_treedef()
  n = td.num_leaves
  # An iterable tree: nested lists in the treedef's shape.
  tree = td.walk(
      lambda ch, _: list(ch), lambda x: x, [Leaf(i) for i in range(n)]
  )
  if _rng.random() < 0.3:
    tree = prog.gen_tree(2)  # Junk.
  elif _rng.random() < 0.2 and isinstance(tree, list):
    tree.append(1)
  td.from_iterable_tree(tree)


def op_children(prog):
  f0 = _fired
  td, _ = prog.some_treedef()
  children = td.children()
  data = td.node_data()
  if data is None:
    oracle(children == [], "a leaf with children")
    return
  oracle(
      sum(c.num_leaves for c in children) == td.num_leaves,
      "children do not partition the leaves",
  )
  if len(td.__getstate__()[1][-1]) == 6:  # Not a reference.
    oracle(
        sum(c.num_nodes for c in children) + 1 == td.num_nodes,
        "children do not partition the nodes",
    )
  rebuilt = pt.PyTreeDef.from_node_data_and_children(prog.reg, data, children)
  eq = rebuilt == td
  if _fired == f0:
    oracle(eq, "from_node_data_and_children(node_data(), children()) != td")
    oracle(hash(rebuilt) == hash(td), "rebuilt treedef hashes differently")
  for c in children:
    repr(c)
    c.node_data()


def op_from_node_data_and_children(prog):
  td, _ = prog.some_treedef()
  children = td.children()
  data = td.node_data()
  r = _rng.randrange(8)
  if r == 0 and children:
    children = children[::-1]
  elif r == 1 and children:
    children = children[1:]
  elif r == 2:
    children = children + [prog.some_treedef()[0]]
  elif r == 3 and prog.specs:
    data = (
        _rng.choice(prog.specs).cls,
        pt.SharedReference(_rng.randrange(1, 6)),
    )
  elif r == 4 and data is not None:
    data = (
        data[0],
        _rng.choice([None, (), ["k0"], 7, TrickyAux(1), pt.SharedReference(1)]),
    )
  elif r == 5:
    data = (
        _rng.choice([list, tuple, dict, NT2, type(None), int, Leaf]),
        _rng.choice([None, ["k0", "k1"], ("k0",), 3]),
    )
  elif r == 6:
    children = [c for c in children for _ in range(2)]
  if _rng.random() < 0.1:
    children = failing_iter(list(children))
  pt.PyTreeDef.from_node_data_and_children(prog.reg, data, children)


def op_compose(prog):
  f0 = _fired
  outer, _ = prog.some_treedef()
  inner, _ = prog.some_treedef()
  if _rng.random() < 0.3:
    outer = _rng.choice(outer.children() or [outer])
  composed = outer.compose(inner)
  oracle(
      composed.num_leaves == outer.num_leaves * inner.num_leaves,
      "compose: num_leaves is not the product",
  )
  if _fired == f0 and _rng.random() < 0.3:
    n = composed.num_leaves
    composed.unflatten([Leaf(i) for i in range(n)])


def op_treedef_tuple(prog):
  tds = [prog.some_treedef()[0] for _ in range(_rng.randrange(4))]
  if _rng.random() < 0.3:
    tds = [c for td in tds for c in (td.children() or [td])]
  if _rng.random() < 0.05:
    tds.append(pt.default_registry().flatten([1])[1])  # Another registry.
  td = pt.treedef_tuple(prog.reg, tds)
  oracle(
      td.num_leaves == sum(t.num_leaves for t in tds),
      "treedef_tuple: num_leaves is not the sum",
  )


def op_eq_hash(prog):
  f0 = _fired
  a, _ = prog.some_treedef()
  b, _ = prog.some_treedef()
  if _rng.random() < 0.2:
    b = pickle.loads(pickle.dumps(a))
  eq = a == b
  ne = a != b
  ha, hb = hash(a), hash(b)
  eq_ba = b == a
  eq_aa = a == a
  if _fired == f0:
    oracle(eq != ne, "== and != agree")
    oracle(not eq or ha == hb, "equal treedefs with different hashes")
    oracle(eq_ba == eq, f"== is not symmetric: {a!r} == {b!r} is {eq}")
    oracle(eq_aa, "a treedef is not equal to itself")


def op_repr(prog):
  td, _ = prog.some_treedef()
  text = repr(td)
  oracle(text.startswith("PyTreeDef("), "repr")
  str(td)


def op_pickle(prog):
  f0 = _fired
  td, _ = prog.some_treedef()
  data = pickle.dumps(td, protocol=_rng.choice([2, 4, 5]))
  back = pickle.loads(data)
  eq = back == td
  texts = (repr(td), repr(back))
  if _fired == f0 and "nan" not in texts[0]:  # nan != a new nan.
    oracle(eq, f"pickle round trip changed {texts[0]} into {texts[1]}")
    oracle(hash(back) == hash(td), "pickle round trip changed the hash")
    oracle(texts[0] == texts[1], "pickle changed the repr")


def mutate_state(state):
  reg, nodes = state
  nodes = list(nodes)
  r = _rng.randrange(10)
  if not nodes:
    return (reg, nodes)
  i = _rng.randrange(len(nodes))
  entry = list(nodes[i]) if isinstance(nodes[i], tuple) else [0, 0, 0, 0, 0, 0]
  entry += [0] * (6 - len(entry))
  if r == 0:
    entry[0] = _rng.randrange(-1, 9)
  elif r == 1:
    entry[1] = _rng.randrange(-2, 4)
  elif r == 2:
    entry[2] = _rng.choice([None, ["k0"], [], (), 3, NT2, Leaf()])
  elif r == 3:
    entry[3] = _rng.choice(
        [None, int, Leaf, NT2] + [s.cls for s in _prog.specs]
    )
  elif r == 4:
    entry[4:6] = [_rng.randrange(-1, 5), _rng.randrange(-1, 5)]
  elif r == 5:
    if len(entry) == 7:
      entry[6] = _rng.randrange(-2, len(nodes) + 3)
    else:
      entry.append(_rng.randrange(-1, len(nodes) + 2))
  elif r == 6:
    del nodes[i]
    return (reg, nodes)
  elif r == 7:
    nodes.insert(i, nodes[_rng.randrange(len(nodes))])
    return (reg, nodes)
  elif r == 8:
    return (_rng.choice([reg, pt.default_registry(), None, 1]), nodes)
  else:
    entry = entry[: _rng.randrange(len(entry) + 1)]
  nodes[i] = tuple(entry)
  return (reg, nodes)


def op_setstate(prog):
  f0 = _fired
  td, _ = prog.some_treedef()
  state = td.__getstate__()
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  new.__setstate__(state)
  same = new == td
  if _fired == f0:
    oracle(same, "__setstate__(__getstate__()) != td")


def op_setstate_mutated(prog):
  td, _ = prog.some_treedef()
  state = td.__getstate__()
  for _ in range(_rng.randrange(1, 3)):
    state = mutate_state(state)
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  new.__setstate__(state)
  # Whatever was accepted must be usable.
  exercise_treedef(prog, new)


def op_mutate_getstate_in_place(prog):
  """Mutates lists that the module handed out or was handed (finding F2):
  those in __getstate__()'s result, the node data that walk passes to
  f_node, or those in a state after __setstate__ took it.

  On a fresh treedef, kept by no pool: if the module shares such a list, the
  mutation changes the treedef itself, and must not spill into the other
  operations' results.
  """
  td = prog.reg.flatten(prog.gen_tree(3))[1]
  r = _rng.randrange(3)
  if r == 0:
    lists = [entry[2] for entry in td.__getstate__()[1]]
  elif r == 1:
    lists = []
    td.walk(
        lambda c, d: lists.append(d),
        lambda x: x,
        [Leaf(i) for i in range(td.num_leaves)],
    )
  else:
    registry, entries = td.__getstate__()
    entries = [tuple(e) for e in entries]
    new = pt.PyTreeDef.__new__(pt.PyTreeDef)
    new.__setstate__((registry, entries))
    lists = [e[2] for e in entries]
    td = new
  for data in lists:
    if isinstance(data, list):
      r = _rng.randrange(3)
      if r == 0:
        data.clear()
      elif r == 1:
        data.append("extra")
      else:
        data[:] = [Key(1)] * len(data)
  exercise_treedef(prog, td)


def exercise_treedef(prog, td):
  n = td.num_leaves
  ops = (
      lambda: repr(td),
      lambda: hash(td),
      lambda: td == td,
      lambda: td.unflatten([Leaf(i) for i in range(n)]),
      lambda: td.children(),
      lambda: td.node_data(),
      lambda: pickle.loads(pickle.dumps(td)),
      lambda: td.flatten_up_to(prog.some_tree()),
      lambda: td.compose(prog.reg.flatten(1)[1]),
      lambda: td.walk(lambda c, d: c, None, range(n)),
  )
  _rng.choice(ops)()


def op_proto(prog):
  f0 = _fired
  td, _ = prog.some_treedef()
  if _rng.random() < 0.5:
    td = prog.reg.flatten(prog.gen_plain(3))[1]
  data = td.serialize_using_proto()
  back = pt.PyTreeDef.deserialize_using_proto(prog.reg, data)
  same = back == td
  if _fired == f0:
    oracle(same, "proto round trip")


def op_deserialize_proto(prog):
  td = prog.reg.flatten(prog.gen_plain(3))[1]
  data = bytearray(td.serialize_using_proto())
  for _ in range(_rng.randrange(1, 4)):
    r = _rng.randrange(4)
    if r == 0 and data:
      data[_rng.randrange(len(data))] = _rng.randrange(256)
    elif r == 1 and data:
      del data[_rng.randrange(len(data)) :]
    elif r == 2:
      data.insert(_rng.randrange(len(data) + 1), _rng.randrange(256))
    else:
      data += bytes(_rng.randrange(256) for _ in range(3))
  back = pt.PyTreeDef.deserialize_using_proto(prog.reg, bytes(data))
  exercise_treedef(prog, back)


def op_one_level(prog):
  tree = prog.some_tree()
  if _rng.random() < 0.5:
    prog.reg.flatten_one_level(tree)
  else:
    prog.reg.flatten_one_level_with_keys(tree)
  pt.all_leaves(prog.reg, [tree, 1, prog.some_tree()])
  prog.reg.is_node(type(tree))


def op_register(prog):
  r = _rng.randrange(10)
  if r < 6:
    prog.register_random_type()
  elif r < 8 and prog.specs:
    _rng.choice(prog.specs).register(prog.reg)  # Duplicate: ValueError.
  elif r == 8:
    cls = _export(type(f"B{prog.serial}_{_rng.randrange(10**9)}", (), {}))
    prog.names.append(cls.__name__)
    prog.reg.register_node(
        cls,
        lambda x: ((), None),
        lambda a, c: cls(),
        preserve_relative_identities=_rng.choice(
            [1, "yes", None, 0.0, True, False]
        ),
    )
  else:
    cls = _export(type(f"B{prog.serial}_{_rng.randrange(10**9)}", (), {}))
    prog.names.append(cls.__name__)
    prog.reg.register_dataclass_node(
        cls,
        _rng.choice([["a"], "ab", [1], []]),
        _rng.choice([[], ["m"]]),
        preserve_relative_identities=_rng.choice([True, False, 1]),
    )


def op_gc(prog):
  if _rng.random() < 0.5 and prog.objects:
    prog.objects.pop(_rng.randrange(len(prog.objects)))
  if _rng.random() < 0.3:
    prog.treedefs.clear()
  gc.collect(0)


def op_uninitialized(prog):
  """Methods of a treedef made by __new__ and never set up: TypeError."""
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  method = _rng.choice(
      [
          "__repr__",
          "__hash__",
          "children",
          "node_data",
          "__getstate__",
          "serialize_using_proto",
      ]
  )
  getattr(new, method)()


def op_share_check(prog):
  """flatten_up_to on a tree whose sharing differs from the treedef's."""
  if not prog.specs:
    return
  spec = _rng.choice([s for s in prog.specs] or prog.specs)
  a = prog.gen_node(spec, 1)
  b = prog.gen_node(spec, 1)
  box = next((t for t in (list, tuple) if prog.reg.is_node(t)), None)
  if box is None:
    return
  shared = box([a, a] if _rng.random() < 0.5 else [a, b])
  other = box([a, b] if shared[1] is a else [a, a])
  f0 = _fired
  leaves, td = prog.reg.flatten(shared)
  if _fired != f0:
    return
  try:
    td.flatten_up_to(other)
    mismatched = False
  except ValueError:
    mismatched = True
  if _fired == f0 and spec.flag:
    oracle(
        mismatched,
        f"flatten_up_to accepted a tree with other sharing: "
        f"{td!r} from {shared!r}, given {other!r}",
    )


def gen_plain(self, depth):
  r = _rng.randrange(6)
  if depth <= 0 or r < 2:
    return _rng.choice([1, None, Leaf()])
  n = _rng.randrange(3)
  if r == 2:
    return [gen_plain(self, depth - 1) for _ in range(n)]
  if r == 3:
    return tuple(gen_plain(self, depth - 1) for _ in range(n))
  if r == 4:
    return {f"k{i}": gen_plain(self, depth - 1) for i in range(n)}
  return None


Program.gen_plain = gen_plain

OP_TABLE = [
    ("flatten", op_flatten, 14),
    ("flatten_with_path", op_flatten_with_path, 7),
    ("flatten_up_to", op_flatten_up_to, 7),
    ("unflatten", op_unflatten, 10),
    ("walk", op_walk, 4),
    ("from_iterable_tree", op_from_iterable_tree, 3),
    ("children", op_children, 5),
    ("from_node_data_and_children", op_from_node_data_and_children, 5),
    ("compose", op_compose, 3),
    ("treedef_tuple", op_treedef_tuple, 3),
    ("eq_hash", op_eq_hash, 6),
    ("repr", op_repr, 4),
    ("pickle", op_pickle, 4),
    ("setstate", op_setstate, 2),
    ("setstate_mutated", op_setstate_mutated, 3),
    ("mutate_getstate", op_mutate_getstate_in_place, 1),
    ("proto", op_proto, 2),
    ("deserialize_proto", op_deserialize_proto, 2),
    ("one_level", op_one_level, 3),
    ("register", op_register, 3),
    ("gc", op_gc, 1),
    ("uninitialized", op_uninitialized, 1),
    ("share_check", op_share_check, 3),
]
NESTED_NAMES = {
    "flatten",
    "flatten_with_path",
    "flatten_up_to",
    "unflatten",
    "repr",
    "eq_hash",
    "pickle",
    "register",
    "children",
    "walk",
}
OPS = []
CUM_WEIGHTS_ALL = []
NESTED_OPS = []


def _build_tables(skip_known):
  OPS.clear()
  CUM_WEIGHTS_ALL.clear()
  NESTED_OPS.clear()
  total = 0
  for name, fn, weight in OP_TABLE:
    if skip_known and name == "mutate_getstate":
      continue
    OPS.append((name, fn))
    total += weight
    CUM_WEIGHTS_ALL.append(total)
    if name in NESTED_NAMES:
      NESTED_OPS.append((name, fn))


_build_tables(False)

# ---------------------------------------------------------------------------
# Running programs.
# ---------------------------------------------------------------------------

CHAOS_RATES = (0.0, 0.0, 0.01, 0.05, 0.2, 0.5)


class Runner:
  """Runs programs in this process and counts outcomes."""

  def __init__(self, seed, verbose=False, max_findings=50, on_finding=None):
    self.seed = seed
    self.verbose = verbose
    self.executions = 0
    self.programs = 0
    self.outcomes = collections.Counter()
    self.by_op = collections.Counter()
    self.findings = []
    self.max_findings = max_findings
    self.on_finding = on_finding
    self.warnings = collections.Counter()
    self.nested = 0  # Executions from inside callbacks.

  def count(self, name, outcome):
    self.outcomes[outcome] += 1
    self.by_op[name] += 1

  def finding(self, prog, op_name, kind, exc):
    record = {
        "seed": self.seed,
        "program": prog.index,
        "op": op_name,
        "kind": kind,
        "exception": f"{type(exc).__name__}: {exc}"[:500],
        "traceback": "".join(traceback.format_exception(exc))[-3000:],
    }
    if len(self.findings) < self.max_findings:
      self.findings.append(record)
    if self.on_finding:
      self.on_finding(record)

  def run_program(self, index):
    """Runs program `index` of this seed: reproducible on its own."""
    global _rng, _rate, _prog, _fired
    rng = random.Random(self.seed * 1_000_003 + index)
    _rng = rng
    _rate = 0.0  # No misbehaviour while the program's types are made.
    _WEAKREFS.clear()
    prog = Program(self, index, rng)
    _prog = prog
    _rate = rng.choice(CHAOS_RATES)
    n_ops = rng.randrange(10, 60)
    if self.verbose:
      print(f"program {index}: chaos rate {_rate}, {n_ops} ops", flush=True)
    try:
      for _ in range(n_ops):
        name, op = prog.pick_op()
        prog.execute(name, op)
    finally:
      _rate = 0.0
      _prog = None
      prog.close()
      _WEAKREFS.clear()
      del prog
      # The collector runs only when a program asks (automatic collection
      # is off): so that __del__ methods and weakref callbacks run at the
      # same points when a program is replayed alone. Here it frees the
      # program's cycles, with no program running.
      gc.collect()
    self.programs += 1


def _install_warning_counter(runner):
  def showwarning(message, category, filename, lineno, file=None, line=None):
    runner.warnings[f"{category.__name__}: {str(message)[:120]}"] += 1

  warnings.showwarning = showwarning
  warnings.simplefilter("always")


def run_in_process(
    seed,
    executions=None,
    seconds=None,
    start=0,
    stride=1,
    verbose=False,
    skip_known=False,
    report=None,
    on_finding=None,
    programs=None,
    end=None,
):
  """Runs programs start, start+stride, ... until a budget is spent.

  `report(runner, index)` is called before each program.
  """
  global _skip_known
  _skip_known = skip_known
  _build_tables(skip_known)
  runner = Runner(seed, verbose, on_finding=on_finding)
  _install_warning_counter(runner)
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
  gc.collect()
  gc.disable()  # See Runner.run_program.
  deadline = None if seconds is None else time.monotonic() + seconds
  index = start
  while True:
    if executions is not None and runner.executions >= executions:
      break
    if deadline is not None and time.monotonic() >= deadline:
      break
    if programs is not None and runner.programs >= programs:
      break
    if end is not None and index >= end:
      break
    if report:
      report(runner, index)
    runner.run_program(index)
    index += stride
  runner.next_program = index
  gc.enable()
  return runner


# --- Worker processes, restarted after a crash.


def worker_main(args):
  faulthandler.enable(all_threads=False)
  if args.expect_module and os.path.realpath(pt.__file__) != args.expect_module:
    raise SystemExit(
        f"worker imported {pt.__file__}, expected " f"{args.expect_module}"
    )
  out = sys.stdout

  def report(runner, index):
    # A checkpoint before every program: a crash loses only its program.
    counts = {
        "e": runner.executions,
        "p": runner.programs,
        "o": runner.outcomes,
        "w": runner.warnings,
        "b": runner.by_op,
        "n": runner.nested,
        "f": _fired,
    }
    out.write("C " + json.dumps(counts) + "\n")
    out.write(f"P {index} {runner.executions}\n")
    out.flush()

  def on_finding(record):
    out.write("F " + json.dumps(record) + "\n")
    out.flush()

  runner = run_in_process(
      args.seed,
      executions=args.executions,
      seconds=args.seconds,
      start=args.start,
      stride=args.stride,
      skip_known=args.skip_known,
      report=report,
      on_finding=on_finding,
      end=args.end,
  )
  counts = {
      "e": runner.executions,
      "p": runner.programs,
      "o": runner.outcomes,
      "w": runner.warnings,
      "b": runner.by_op,
      "n": runner.nested,
      "f": _fired,
      "next": runner.next_program,
  }
  out.write("D " + json.dumps(counts) + "\n")
  out.flush()


class Worker:
  """A worker subprocess and what it has reported."""

  def __init__(self, driver, slot, start):
    self.driver = driver
    self.slot = slot
    self.start = start
    self.spawn()

  def spawn(self):
    d = self.driver
    remaining_e = None
    if d.args.executions is not None:
      remaining_e = max(
          1, (d.args.executions - d.executions_done) // d.args.jobs + 1
      )
    remaining_s = None
    if d.deadline is not None:
      remaining_s = max(0.0, d.deadline - time.monotonic())
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--seed",
        str(d.args.seed),
        "--start",
        str(self.start),
        "--stride",
        str(d.args.jobs),
        "--expect-module",
        os.path.realpath(pt.__file__),
    ]
    if d.args.programs is not None:
      cmd += ["--end", str(d.args.start + d.args.programs)]
    if remaining_e is not None:
      cmd += ["--executions", str(remaining_e)]
    if remaining_s is not None:
      cmd += ["--seconds", f"{remaining_s:.3f}"]
    if d.args.skip_known:
      cmd.append("--skip-known")
    self.stderr_path = os.path.join(d.tmpdir, f"worker{self.slot}.err")
    self.stderr = open(self.stderr_path, "wb")
    self.proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=self.stderr, env=os.environ.copy()
    )
    self.buffer = b""
    self.current = None  # Program index being run.
    self.base = None  # Counts at the last checkpoint of this process.
    self.last_counts = None
    self.exec_at_current = 0
    self.last_seen = time.monotonic()
    self.done = False
    self.hung = False

  def feed(self, data):
    self.buffer += data
    *lines, self.buffer = self.buffer.split(b"\n")
    for line in lines:
      self.handle(line.decode("utf-8", "replace"))

  def handle(self, line):
    self.last_seen = time.monotonic()
    tag, _, rest = line.partition(" ")
    if tag == "P":
      index, execs = rest.split()
      self.current = int(index)
      self.exec_at_current = int(execs)
    elif tag == "C":
      self.last_counts = json.loads(rest)
    elif tag == "F":
      self.driver.add_finding(json.loads(rest))
    elif tag == "D":
      self.last_counts = json.loads(rest)
      self.done = True


def crash_site(err):
  """Where a worker crashed: the sanitizer's first frame in the module and
  the fuzzer's operation, from the worker's stderr."""
  import re

  parts = []
  m = re.search(r"(ERROR: AddressSanitizer: [\w-]+|runtime error: [^\n]*)", err)
  if m:
    parts.append(m.group(1)[:80])
    frame = re.search(
        r"#\d+ 0x[0-9a-f]+ in (jaxlib_patch::[^\n]*?) "
        r"(\S*jaxlib_patch/\S+)",
        err,
    )
    if frame:
      parts.append(f"{frame.group(1)[:60]} {frame.group(2).split('/')[-1]}")
  ops = re.findall(r"line \d+ in (op_\w+)", err)
  if ops:
    parts.append(ops[0])
  elif "Fatal Python error" not in err and not parts:
    parts.append("no stack")
  return " | ".join(parts) or "unknown"


class Driver:

  def __init__(self, args):
    self.args = args
    self.deadline = (
        None if args.seconds is None else time.monotonic() + args.seconds
    )
    self.executions_done = 0
    self.programs_done = 0
    self.outcomes = collections.Counter()
    self.warnings = collections.Counter()
    self.by_op = collections.Counter()
    self.nested = 0
    self.misbehaved = 0
    self.findings = []
    self.finding_keys = collections.Counter()
    self.crashes = []
    import tempfile

    self.tmpdir = tempfile.mkdtemp(prefix="pytree_fuzz_")

  def add_finding(self, record):
    key = (record["kind"], record["op"], record["exception"][:80])
    self.finding_keys[key] += 1
    if self.finding_keys[key] <= 3:
      self.findings.append(record)
      print(
          f"FINDING ({record['kind']}) seed {record['seed']} program "
          f"{record['program']} op {record['op']}: {record['exception']}",
          flush=True,
      )

  def absorb(self, worker):
    counts = worker.last_counts
    if counts:
      self.executions_done += counts["e"]
      self.programs_done += counts["p"]
      self.outcomes.update(counts["o"])
      self.warnings.update(counts["w"])
      self.by_op.update(counts["b"])
      self.nested += counts["n"]
      self.misbehaved += counts["f"]
    worker.last_counts = None

  def run(self):
    start_time = time.monotonic()
    live = [Worker(self, k, self.args.start + k) for k in range(self.args.jobs)]
    last_print = time.monotonic()
    while live:
      fds = {w.proc.stdout.fileno(): w for w in live}
      ready, _, _ = select.select(list(fds), [], [], 1.0)
      for fd in ready:
        w = fds[fd]
        data = os.read(fd, 1 << 16)
        if data:
          w.feed(data)
          continue
        # End of output: the worker exited.
        rc = w.proc.wait()
        w.stderr.close()
        with open(w.stderr_path, "rb") as f:
          err = f.read().decode("utf-8", "replace")
        if w.done and rc == 0:
          self.absorb(w)
          live.remove(w)
          continue
        sanitizer = "runtime error:" in err or "Sanitizer" in err
        if (
            rc > 0
            and "Fatal Python error" not in err
            and not sanitizer
            and not w.hung
        ):
          # The fuzzer itself failed (not the module): stop.
          sys.stderr.write(err)
          raise SystemExit(f"a worker failed (exit status {rc})")
        # A crash or a hang: record it, count the programs completed before
        # it (the last checkpoint), and restart after the program.
        crash = {
            "seed": self.args.seed,
            "program": w.current,
            "returncode": "hang" if w.hung else rc,
            "site": crash_site(err),
            "stderr": err[-20000:],
        }
        self.crashes.append(crash)
        what = "HANG" if w.hung else "CRASH"
        print(
            f"{what} seed {self.args.seed} program {w.current} (rc {rc}); "
            f"replay: python {sys.argv[0]} --seed {self.args.seed} "
            f"--program {w.current} --verbose",
            flush=True,
        )
        self.absorb(w)
        if w.current is None:
          live.remove(w)
          continue
        w.start = w.current + self.args.jobs
        if (
            self.deadline is not None and time.monotonic() >= self.deadline
        ) or (
            self.args.executions is not None
            and self.executions_done >= self.args.executions
        ):
          live.remove(w)
          continue
        w.spawn()
      for w in live:
        idle = time.monotonic() - w.last_seen
        if not w.hung and idle > self.args.hang_seconds:
          w.hung = True
          w.proc.kill()
      if time.monotonic() - last_print > 10:
        last_print = time.monotonic()
        done = self.executions_done + sum(w.exec_at_current for w in live)
        print(
            f"  ... ~{done} executions, "
            f"{time.monotonic() - start_time:.0f} s",
            flush=True,
        )
    self.elapsed = time.monotonic() - start_time
    import shutil

    shutil.rmtree(self.tmpdir, ignore_errors=True)  # Kept in crash records.
    return self.report()

  def report(self):
    n_findings = sum(self.finding_keys.values())
    summary = {
        "seed": self.args.seed,
        "jobs": self.args.jobs,
        "executions": self.executions_done,
        "programs": self.programs_done,
        "nested_executions": self.nested,
        "callback_misbehaviours": self.misbehaved,
        "seconds": round(self.elapsed, 1),
        "exec_per_s": round(self.executions_done / max(self.elapsed, 1e-9)),
        "outcomes": dict(self.outcomes.most_common()),
        "executions_by_operation": dict(self.by_op.most_common()),
        "findings": n_findings,
        "distinct_findings": [
            {"kind": k[0], "op": k[1], "exception": k[2], "count": c}
            for k, c in self.finding_keys.most_common()
        ],
        "crashes": len(self.crashes),
        "crash_programs": [c["program"] for c in self.crashes],
        "crash_sites": dict(
            collections.Counter(c["site"] for c in self.crashes).most_common()
        ),
        "warnings": dict(self.warnings.most_common(10)),
        "skip_known": self.args.skip_known,
        "module": os.path.realpath(pt.__file__),
        "python": sys.version.split()[0],
    }
    print_summary(summary)
    if self.args.json:
      with open(self.args.json, "w") as f:
        json.dump(
            {
                "summary": summary,
                "findings": self.findings,
                "crashes": self.crashes,
            },
            f,
            indent=1,
        )
    return 1 if (n_findings or self.crashes) else 0


def print_summary(s):
  print(
      f"executions: {s['executions']}  programs: {s['programs']}  "
      f"time: {s['seconds']} s  exec/s: {s['exec_per_s']}  "
      f"seed: {s['seed']}  jobs: {s.get('jobs', 1)}"
  )
  print(
      f"executions from inside callbacks: {s['nested_executions']}  "
      f"callback misbehaviours: {s['callback_misbehaviours']}"
  )
  print("outcomes: " + ", ".join(f"{k}={v}" for k, v in s["outcomes"].items()))
  print(f"findings: {s['findings']}  crashes: {s['crashes']}")
  for f in s["distinct_findings"]:
    print(f"  {f['count']}x {f['kind']} in {f['op']}: {f['exception']}")
  if s["crashes"]:
    print(f"  crashed programs: {s['crash_programs'][:20]}")
    for site, count in s["crash_sites"].items():
      print(f"  {count}x crashed at {site}")
  if s["warnings"]:
    print(
        "warnings: " + "; ".join(f"{v}x {k}" for k, v in s["warnings"].items())
    )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--executions", type=int, default=None)
  parser.add_argument("--seconds", type=float, default=None)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--jobs",
      type=int,
      default=1,
      help="worker processes (programs are interleaved)",
  )
  parser.add_argument(
      "--start", type=int, default=0, help="index of the first program"
  )
  parser.add_argument(
      "--programs",
      type=int,
      default=None,
      help="run this many programs (a deterministic budget)",
  )
  parser.add_argument(
      "--program",
      type=int,
      default=None,
      help="replay one program in this process",
  )
  parser.add_argument("--verbose", action="store_true")
  parser.add_argument(
      "--skip-known",
      action="store_true",
      help="leave out the generators that reached findings "
      "F1-F3 of docs/hardening.md",
  )
  parser.add_argument("--hang-seconds", type=float, default=60.0)
  parser.add_argument("--json", default=None, help="write a JSON report")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument("--end", type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--expect-module", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args.worker:
    worker_main(args)
    return 0
  if args.program is not None:
    faulthandler.enable()
    runner = run_in_process(
        args.seed,
        programs=1,
        start=args.program,
        verbose=args.verbose,
        skip_known=args.skip_known,
    )
    for record in runner.findings:
      print(record["traceback"])
    print(
        f"program {args.program}: {runner.executions} executions, "
        f"outcomes {dict(runner.outcomes)}, "
        f"{len(runner.findings)} findings"
    )
    return 1 if runner.findings else 0
  if args.executions is None and args.seconds is None and args.programs is None:
    args.executions = 100_000
  print(f"jaxlib_patch.pytree from {pt.__file__}", flush=True)
  return Driver(args).run()


if __name__ == "__main__":
  sys.exit(main())
