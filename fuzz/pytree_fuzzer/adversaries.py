"""The fuzzer's adversaries: leaves, aux data, dict keys and namedtuple
look-alikes that misbehave, the custom and dataclass node types programs
register (flatten and unflatten functions that raise, return junk, mutate
what is being walked or re-enter the module), and the mischief any callback
can do.

Every misbehaviour is drawn from `chaos.rng` when `chaos.now()` says so.
"""

import collections
import gc
import sys
import types
import weakref

from jaxlib_patch import pytree as pt

from pytree_fuzzer import chaos

# How deep operations run inside callbacks of other operations.
MAX_DEPTH = 2


class Boom(Exception):
  """The exception that misbehaving callbacks raise."""


# A namespace module for the classes and registries the programs create, so
# that pickle finds them by name.
NS_NAME = "_pytree_fuzz_ns"
NS = types.ModuleType(NS_NAME)
sys.modules[NS_NAME] = NS
# Pickling a treedef pickles its registry by name, as jax names its own.
pt.default_registry().__module__ = NS_NAME
pt.default_registry().__name__ = "DEFAULT"
NS.DEFAULT = pt.default_registry()


def export(obj, name=None):
  name = name or obj.__name__
  obj.__module__ = NS_NAME
  obj.__qualname__ = name
  setattr(NS, name, obj)
  return obj


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
    if chaos.now():
      return misbehave_in_dunder(other)
    return type(other) is TrickyAux and other.v == self.v

  def __hash__(self):
    if chaos.now():
      raise Boom("aux __hash__")
    return hash(self.v)

  def __repr__(self):
    if chaos.now():
      raise Boom("aux __repr__")
    return f"TrickyAux({self.v!r})"

  def __reduce__(self):
    if chaos.now():
      raise Boom("aux __reduce__")
    return (TrickyAux, (self.v,))


def misbehave_in_dunder(other):
  k = chaos.rng.randrange(4)
  if k == 0:
    raise Boom("__eq__")
  if k == 1:
    return NotImplemented
  if k == 2:
    return chaos.rng.choice(
        [1, "yes", None, [], 0.0]
    )  # A non-bool truth value.
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
    if chaos.now():
      r = chaos.rng.randrange(3)
      if r == 0:
        raise Boom("key __lt__")
      if r == 1:
        mutate_pools()
      else:
        return NotImplemented
    return type(other) is Key and self.k < other.k

  def __eq__(self, other):
    if chaos.now():
      r = chaos.rng.randrange(3)
      if r == 0:
        raise Boom("key __eq__")
      mutate_pools()
    return type(other) is Key and other.k == self.k

  def __hash__(self):
    if not chaos.skip_known and chaos.now():
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
  export(_c)


class Dying:
  """A leaf whose `__del__` misbehaves: it runs while the module drops it."""

  __slots__ = ("v", "__weakref__")

  def __init__(self, v=0):
    self.v = v

  def __del__(self):
    if chaos.program is not None and chaos.now():
      try:
        in_callback_mischief(None)
      except BaseException:  # noqa: BLE001 -- __del__ cannot raise.
        pass


export(Dying)


def weakref_callback(_):
  if chaos.program is not None and chaos.now():
    try:
      in_callback_mischief(None)
    except BaseException:  # noqa: BLE001 -- Python ignores it anyway.
      pass


WEAKREFS = []  # Weak references with callbacks; cleared per program.


def watch(obj):
  """Runs mischief (under chaos) when `obj` dies."""
  try:
    WEAKREFS.append(weakref.ref(obj, weakref_callback))
  except TypeError:
    pass
  return obj


# ---------------------------------------------------------------------------
# Misbehaviour that any callback can show.
# ---------------------------------------------------------------------------


def mutate_pools():
  """Mutates a container that may be being walked right now."""
  prog = chaos.program
  if prog is None:
    return
  r = chaos.rng.randrange(6)
  if r <= 2 and prog.lists:
    lst = chaos.rng.choice(prog.lists)
    k = chaos.rng.randrange(4)
    if k == 0:
      lst.clear()
    elif k == 1:
      lst.append(prog.gen_tree(1))
    elif k == 2 and lst:
      lst.pop(chaos.rng.randrange(len(lst)))
    else:
      lst[:] = [Leaf(i) for i in range(chaos.rng.randrange(4))]
  elif r == 3 and prog.dicts:
    d = chaos.rng.choice(prog.dicts)
    if d and chaos.rng.random() < 0.5:
      d.pop(next(iter(d)), None)
    else:
      d[f"x{chaos.rng.randrange(5)}"] = prog.gen_tree(1)
  elif r == 4 and prog.nodes:
    node = chaos.rng.choice(prog.nodes)
    if isinstance(node, CustomBase):
      node.kids = tuple(prog.gen_tree(1) for _ in range(chaos.rng.randrange(3)))
    else:
      for name in _data_fields_of(node):
        setattr(node, name, prog.gen_tree(1))
        break
  elif prog.objects:
    # Drop a tree: objects may die (and run __del__/weakref callbacks).
    prog.objects.pop(chaos.rng.randrange(len(prog.objects)))


def _data_fields_of(obj):
  spec = getattr(type(obj), "_spec", None)
  return spec.data_fields if spec is not None else ()


def in_callback_mischief(obj):
  """Side effects from inside a callback; may raise."""
  r = chaos.rng.randrange(10)
  if r == 0:
    raise Boom("callback")
  if r <= 2:
    mutate_pools()
  elif r <= 5:
    nested_op()
  elif r == 6:
    gc.collect(0) if chaos.rng.random() < 0.9 else gc.collect()
  elif r == 7:
    if chaos.program is not None:
      chaos.program.register_random_type(inside=True)
  elif r == 8 and isinstance(obj, CustomBase):
    # Make the object contain itself (a cycle), or replace its children.
    obj.kids = (obj,) if chaos.rng.random() < 0.5 else (Leaf(), obj)
  elif r == 8 and isinstance(obj, DataBase):
    for name in _data_fields_of(obj):
      setattr(obj, name, obj)
      break
  else:
    if chaos.program is not None and chaos.program.objects:
      chaos.program.objects.clear()
      gc.collect(0)


def nested_op():
  """Runs a random operation from inside a callback (re-entrancy)."""
  prog = chaos.program
  if prog is None or chaos.depth >= MAX_DEPTH:
    return
  name, op = prog.pick_op(nested=True)
  prog.execute(name, op)
  if chaos.rng.random() < 0.2:
    raise Boom("after nested op")


def failing_iter(items):
  """Yields some of `items`, then raises."""
  n = chaos.rng.randrange(len(items) + 1) if items else 0
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
    if chaos.rate and chaos.now():
      if chaos.rng.random() < 0.5:
        raise Boom("dataclass __init__")
      in_callback_mischief(None)
    for k, v in kwargs.items():
      setattr(self, k, v)

  def __repr__(self):
    return f"{type(self).__name__}@{id(self) & 0xffff:x}"


class TypeSpec:
  __slots__ = (
      "cls",
      "kind",
      "flag",
      "data_fields",
      "meta_fields",
      "singleton",
      "register",
  )


def junk_flatten_result(obj, with_keys):
  kids = getattr(obj, "kids", ())
  aux = getattr(obj, "aux", None)
  r = chaos.rng.randrange(9)
  if r == 0:
    raise Boom("to_iterable")
  if r == 1:
    return chaos.rng.choice(
        [42, None, "ab", [kids, aux], (kids,), (kids, aux, 1)]
    )
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
        if chaos.rng.random() < 0.3
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


def make_custom_type(name, flag, with_keys):
  cls = export(type(name, (CustomBase,), {}), name)
  spec = TypeSpec()
  spec.cls, spec.kind, spec.flag = cls, "custom", flag
  spec.singleton = None

  def to_iterable(obj):
    if chaos.rate and chaos.now():
      return junk_flatten_result(obj, False)
    return (obj.kids, obj.aux)

  def to_iterable_with_keys(obj):
    if chaos.rate and chaos.now():
      return junk_flatten_result(obj, True)
    return (
        tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(obj.kids)),
        obj.aux,
    )

  def from_iterable(aux, children):
    if chaos.rate and chaos.now():
      r = chaos.rng.randrange(7)
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
    if chaos.rng.random() < 0.05:
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


def make_dataclass_type(name, flag):
  data = tuple(f"d{i}" for i in range(chaos.rng.randrange(3)))
  meta = tuple(f"m{i}" for i in range(chaos.rng.randrange(2)))
  attrs = {}
  if chaos.rng.random() < 0.3 and data:
    # A data field that is a property, misbehaving under chaos.
    field = data[-1]
    store = "_" + field

    def getter(self):
      if chaos.rate and chaos.now():
        if chaos.rng.random() < 0.5:
          raise Boom("property")
        in_callback_mischief(self)
      return getattr(self, store)

    def setter(self, value):
      setattr(self, store, value)

    attrs[field] = property(getter, setter)
  cls = export(type(name, (DataBase,), attrs), name)
  spec = TypeSpec()
  spec.cls, spec.kind, spec.flag = cls, "dataclass", flag
  spec.data_fields, spec.meta_fields = data, meta
  cls._spec = spec
  spec.singleton = None
  spec.register = lambda reg: reg.register_dataclass_node(
      cls, list(data), list(meta), preserve_relative_identities=flag
  )
  return spec
