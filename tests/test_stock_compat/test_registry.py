"""Registries, all_leaves, is_node and the key classes: the same outcomes
as stock."""

import pickle

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from test_stock_compat import strategies as S
from test_stock_compat.strategies import (
    DataNode,
    Empty,
    Opaque,
    Pair,
    RegA,
    RegB,
    SIDES,
    Single,
    TupleSub,
    rega_flatten,
    rega_flatten_keys,
    rega_unflatten,
)
from test_stock_compat.describe import KEY_CLASSES, canon, describe_exc, safe
from test_stock_compat.compare import PROPERTY, both

CANDIDATE_TYPES = [
    int,
    float,
    str,
    bytes,
    bool,
    type(None),
    tuple,
    list,
    dict,
    Pair,
    Single,
    Empty,
    *S.CUSTOM_TYPES,
    TupleSub,
    Opaque,
    np.ndarray,
    object,
    type,
]


@PROPERTY
@given(
    objs=st.lists(st.one_of(S.leaves, S.trees(max_leaves=3)), max_size=5),
    flavour=S.flavours,
    kind=st.sampled_from(["list", "tuple", "gen"]),
)
def test_all_leaves_and_is_node(objs, flavour, kind):
  """all_leaves(registry, iterable) and registry.is_node(type) agree with
  stock for every registry flavour."""

  def all_leaves(side):
    it = {"list": list, "tuple": tuple, "gen": lambda o: (x for x in o)}[kind](
        objs
    )
    return side.mod.all_leaves(side.regs[flavour], it)

  both("all_leaves", all_leaves)
  both(
      "is_node",
      lambda side: [
          side.regs[flavour].is_node(t)
          for t in CANDIDATE_TYPES + [type(o) for o in objs]
      ],
  )


key_args = st.one_of(
    st.integers(-(2**65), 2**65),
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.tuples(st.integers(0, 2), st.text(max_size=1)),
    st.lists(st.integers(0, 2), max_size=2),
    st.booleans(),
    st.floats(allow_nan=False),
)


@PROPERTY
@given(
    cls=st.sampled_from(KEY_CLASSES),
    arg=key_args,
    other_cls=st.sampled_from(KEY_CLASSES),
    other_arg=key_args,
    use_kw=st.booleans(),
)
def test_keys(cls, arg, other_cls, other_arg, use_kw):
  """Key classes: construction (positional and keyword, incl. bad argument
  types), repr, str, attribute, __match_args__, hash value, ==/!= with
  keys of the same/other class and with non-keys, __getstate__, pickling,
  and structural pattern matching."""
  field = {
      "SequenceKey": "idx",
      "DictKey": "key",
      "GetAttrKey": "name",
      "FlattenedIndexKey": "key",
  }

  def make(side, c, a, kw=False):
    ctor = getattr(side.mod, c)
    return ctor(**{field[c]: a}) if kw else ctor(a)

  def int_only(c, a):  # item 8 of the deliberate differences
    return c in ("SequenceKey", "FlattenedIndexKey") and type(a) is str

  s, o = both(
      "construct",
      lambda side: make(side, cls, arg, use_kw),
      place="test_keys/construct" if int_only(cls, arg) else None,
  )
  so, oo = both(
      "construct other",
      lambda side: make(side, other_cls, other_arg),
      place=(
          "test_keys/construct other"
          if int_only(other_cls, other_arg)
          else None
      ),
  )
  if not (s.ok and o.ok):
    return

  def k(side):
    return make(side, cls, arg, use_kw)

  both("repr/str", lambda side: (repr(k(side)), str(k(side))))
  both("attribute", lambda side: getattr(k(side), field[cls]))
  both("__match_args__", lambda side: type(k(side)).__match_args__)
  both("hash", lambda side: hash(k(side)))
  both("== same args", lambda side: (k(side) == k(side), k(side) != k(side)))
  if so.ok and oo.ok:
    both(
        "== other key",
        lambda side: (
            k(side) == make(side, other_cls, other_arg),
            k(side) != make(side, other_cls, other_arg),
        ),
    )
  both(
      "== non-key",
      lambda side: (k(side) == arg, k(side) == None, k(side) != arg),  # noqa
  )
  both("__getstate__", lambda side: k(side).__getstate__())

  def pickled(side):
    loaded = pickle.loads(pickle.dumps(k(side)))
    return loaded, loaded == k(side), type(loaded) is type(k(side))

  both("pickle", pickled)

  def match(side):
    key = k(side)
    m = side.mod
    match key:
      case m.SequenceKey(i):
        return ("seq", i)
      case m.DictKey(i):
        return ("dict", i)
      case m.GetAttrKey(i):
        return ("attr", i)
      case m.FlattenedIndexKey(i):
        return ("flat", i)
    return "no match"

  both("match", match)
  if type(safe(lambda: hash(s.value))) is int:
    for side in SIDES:
      a, b = k(side), k(side)
      if a == b:
        assert hash(a) == hash(b)


REGISTRATION_TARGETS = [
    RegA,
    RegB,
    tuple,
    list,
    dict,
    type(None),
    int,
    Pair,
    DataNode,
]
registration_ops = st.tuples(
    st.sampled_from(["node", "node_keys", "dataclass"]),
    st.sampled_from(range(len(REGISTRATION_TARGETS))),
    st.sampled_from([["p"], ["p", "q"], [], ["x"], ["first"]]),
    st.sampled_from([[], ["q"], ["second"], ["p"]]),
)


@PROPERTY
@given(
    ops=st.lists(registration_ops, min_size=1, max_size=4),
    flags=st.fixed_dictionaries(
        {},
        optional={
            f: st.booleans()
            for f in [
                "enable_none",
                "enable_tuple",
                "enable_namedtuple",
                "enable_list",
                "enable_dict",
            ]
        },
    ),
)
def test_registrations(ops, flags):
  """Sequences of register_node / register_dataclass_node calls on fresh
  registries (duplicates, builtin types, overlapping fields) give the same
  results/errors, and the registries then behave the same on sample trees
  (flatten, flatten_with_path, unflatten, is_node)."""
  samples = [
      RegA(1, (2, 3)),
      RegB([4], None),
      (RegA(), [1]),
      {"k": RegB()},
      Pair(RegA(5, 6), 7),
      DataNode(1, 2, "t"),
      None,
  ]

  def build(side):
    reg = side.mod.PyTreeRegistry(**flags)
    outcomes = []
    for kind, target_index, data_fields, meta_fields in ops:
      target = REGISTRATION_TARGETS[target_index]
      try:
        if kind == "node":
          res = reg.register_node(target, rega_flatten, rega_unflatten)
        elif kind == "node_keys":
          res = reg.register_node(
              target, rega_flatten, rega_unflatten, rega_flatten_keys
          )
        else:
          res = reg.register_dataclass_node(target, data_fields, meta_fields)
        outcomes.append(("ok", canon(res)))
      except Exception as ex:  # noqa: BLE001
        outcomes.append(describe_exc(ex))
    return reg, outcomes

  both("registrations", lambda side: build(side)[1])
  for sample in samples:
    s, _ = both("flatten", lambda side: build(side)[0].flatten(sample))
    both(
        "flatten_with_path",
        lambda side: build(side)[0].flatten_with_path(sample),
    )
    if s.ok:

      def unflatten(side):
        leaves, treedef = build(side)[0].flatten(sample)
        return treedef.unflatten(leaves)

      both("unflatten", unflatten)
  both(
      "is_node",
      lambda side: [build(side)[0].is_node(t) for t in REGISTRATION_TARGETS],
  )
