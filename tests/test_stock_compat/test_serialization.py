"""Pickling and the proto format: the same outcomes as stock."""

import pickle

from hypothesis import given
from hypothesis import strategies as st

from test_stock_compat import strategies as S
from test_stock_compat.compare import PROPERTY, both
from test_stock_compat.inputs import leaf_pool, treedef_of


def _state(side, flavour, tree):
  return treedef_of(side, flavour, tree).__getstate__()


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    protocol=st.sampled_from([2, pickle.HIGHEST_PROTOCOL]),
)
def test_pickle(tree, flavour, protocol):
  """__getstate__ content, pickle round trip (registries pickled by
  reference), equality of the loaded treedef with the original, unflatten
  with the loaded treedef, and __setstate__ of a fresh instance."""
  s, _ = both("__getstate__", lambda side: _state(side, flavour, tree))

  def roundtrip(side):
    treedef = treedef_of(side, flavour, tree)
    loaded = pickle.loads(pickle.dumps(treedef, protocol=protocol))
    return loaded, loaded == treedef, type(loaded) is type(treedef)

  r, _ = both("pickle round trip", roundtrip)
  if r.ok:
    pool = leaf_pool(r.value[0].num_leaves)
    both("loaded.unflatten", lambda side: roundtrip(side)[0].unflatten(pool))
  if s.ok:

    def setstate(side):
      fresh = side.mod.PyTreeDef.__new__(side.mod.PyTreeDef)
      fresh.__setstate__(_state(side, flavour, tree))
      return fresh, fresh == treedef_of(side, flavour, tree)

    both("__setstate__", setstate)


@PROPERTY
@given(
    tree=st.one_of(S.builtin_trees(), S.builtin_trees(), S.trees()),
    flavour=S.flavours,
    load_flavour=S.flavours,
)
def test_proto(tree, flavour, load_flavour):
  """serialize_using_proto gives byte-identical output (or the same error
  for custom nodes / non-string dict keys); deserialize_using_proto round
  trip (into any registry flavour) gives the same treedef."""
  s, _ = both(
      "serialize_using_proto",
      lambda side: treedef_of(side, flavour, tree).serialize_using_proto(),
  )
  if not s.ok:
    return
  proto = s.value

  def load(side):
    return side.mod.PyTreeDef.deserialize_using_proto(
        side.regs[load_flavour], proto
    )

  both("deserialize_using_proto", load)
  both(
      "deserialized == original",
      lambda side: load(side) == treedef_of(side, flavour, tree),
  )
  both(
      "deserialized.serialize_using_proto",
      lambda side: load(side).serialize_using_proto(),
  )
