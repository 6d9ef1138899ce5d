"""Bad input gives a clear Python exception, never a crash.

Each test that could crash the interpreter (a segfault, an abort) runs in a
forked child process (``harness.isolated``), so that a crash fails that one
test with the signal's name instead of killing the whole test run.
"""

from __future__ import annotations

import pickle
import sys
import threading

import pytest

from bad_input_registry import REG, AuxNode, Junk, shared_treedef
from harness import isolated
from jaxlib_patch import pytree as pt
from nodes import Leaf


class Boom(Exception):
  """Raised by misbehaving user callbacks."""


class RaisingIterator:
  """Iterates over two children (or (key, child) pairs), then raises Boom."""

  def __init__(self, pairs=False):
    self.i = 0
    self.pairs = pairs

  def __iter__(self):
    return self

  def __next__(self):
    self.i += 1
    if self.i > 2:
      raise Boom("mid-way")
    return (pt.FlattenedIndexKey(self.i), Leaf()) if self.pairs else Leaf()


# ---------------------------------------------------------------------------
# Registration flag.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [1, 0, "yes", 1.0, [True]])
def test_flag_must_be_a_bool(flag):
  """preserve_relative_identities=<not a bool, not None> is a TypeError."""
  reg = pt.PyTreeRegistry()

  class T:
    pass

  with pytest.raises(
      TypeError,
      match=r"^preserve_relative_identities must be a bool, or None to "
      r"follow the class's bases, got ",
  ):
    reg.register_node(
        T,
        lambda t: ((), None),
        lambda _, c: T(),
        preserve_relative_identities=flag,
    )
  with pytest.raises(TypeError):
    reg.register_dataclass_node(T, [], [], preserve_relative_identities=flag)
  # Nothing was registered.
  assert reg.flatten(T())[1].num_leaves == 1
  # A bool is accepted; the flag is keyword-only.
  reg.register_node(
      T,
      lambda t: ((), None),
      lambda _, c: T(),
      preserve_relative_identities=False,
  )
  with pytest.raises(TypeError):
    pt.PyTreeRegistry().register_node(
        T, lambda t: ((), None), lambda _, c: T(), None, True
    )


@pytest.mark.parametrize("base_first", [False, True])
@pytest.mark.parametrize("dataclass", [False, True])
def test_an_explicit_false_keeps_a_subclass_out_of_its_bases_opt_in(
    dataclass, base_first
):
  """None (the default) follows the opt-in of a base class, given before or
  after the subclass is registered; False said in so many words keeps the
  subclass out of it, in both twins."""
  reg = pt.PyTreeRegistry()
  twin = reg.twin(keeps_relative_identities=False)

  class Base:
    pass

  subclasses = {flag: type(f"Sub{flag}", (Base,), {}) for flag in (None, False)}

  def register(cls, flag):
    if dataclass:
      reg.register_dataclass_node(
          cls, [], [], preserve_relative_identities=flag
      )
    else:
      reg.register_node(
          cls,
          lambda t: ((), None),
          lambda _, c, cls=cls: cls(),
          preserve_relative_identities=flag,
      )

  if base_first:
    reg.preserve_relative_identities(Base)
  for flag, cls in subclasses.items():
    register(cls, flag)
  if not base_first:
    reg.preserve_relative_identities(Base)
  for registry in (reg, twin):
    assert registry.has_relative_identities(subclasses[None])
    assert not registry.has_relative_identities(subclasses[False])
  following, declining = subclasses[None](), subclasses[False]()
  treedef = reg.flatten([following, following, declining, declining])[1]
  out = treedef.unflatten([])
  assert out[0] is out[1] and out[2] is not out[3]
  # Opting in the declining class itself still works.
  reg.preserve_relative_identities(subclasses[False])
  assert twin.has_relative_identities(subclasses[False])


@pytest.mark.parametrize("dataclass", [False, True])
def test_registering_again_with_the_flag_says_how_to_opt_in(dataclass):
  """The duplicate registration that opting in by registering again makes
  says what opts a registered class in; other duplicates are worded as
  stock's."""
  reg = pt.PyTreeRegistry()

  class T:
    pass

  def register(**flag):
    if dataclass:
      reg.register_dataclass_node(T, [], [], **flag)
    else:
      reg.register_node(T, lambda t: ((), None), lambda _, c: T(), **flag)

  register()
  kind = "dataclass " if dataclass else ""
  with pytest.raises(ValueError) as plain:
    register()
  assert str(plain.value) == (
      f"Duplicate custom {kind}PyTreeDef type registration for {T!r}."
  )
  with pytest.raises(ValueError) as opting_in:
    register(preserve_relative_identities=True)
  assert str(opting_in.value).startswith(str(plain.value))
  assert "call preserve_relative_identities(cls)" in str(opting_in.value)
  assert not reg.has_relative_identities(T)


# ---------------------------------------------------------------------------
# Leaf counts.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [-3, -1, 1, 5])
def test_wrong_leaf_count(delta):
  """unflatten and walk with too few/many leaves: ValueError."""
  td = shared_treedef()
  n = td.num_leaves + delta
  if n < 0:
    n = 0
  with pytest.raises(ValueError):
    td.unflatten([Leaf()] * n)
  with pytest.raises(ValueError):
    td.walk(lambda c, d: c, lambda x: x, [Leaf()] * n)
  with pytest.raises(TypeError):
    td.unflatten(42)


# ---------------------------------------------------------------------------
# Misbehaving flatten / unflatten functions.
# ---------------------------------------------------------------------------


def _flatten_ops():
  good_td = REG.flatten([Junk(((Leaf(),), None))])[1]
  return {
      "flatten": REG.flatten,
      "flatten_with_path": REG.flatten_with_path,
      "flatten_up_to": good_td.flatten_up_to,
  }


@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
def test_flatten_function_that_raises(op):
  """The user's exception propagates unchanged."""
  fn = _flatten_ops()[op]
  with pytest.raises(Boom, match="from the flatten function"):
    fn([Junk(Boom)])
  # A shared node whose flatten raises at its first occurrence.
  j = Junk(Boom)
  with pytest.raises(Boom):
    fn([j, j] if op != "flatten_up_to" else [j])


JUNK_RESULTS = {
    "list instead of tuple": ([Leaf()], None),
    "3-tuple": ((Leaf(),), None, "extra"),
    "1-tuple": ((Leaf(),),),
    "not a tuple": 42,
    "None": None,
    "non-iterable children": (42, None),
    "None children": (None, None),
}


@isolated
@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
@pytest.mark.parametrize("junk", sorted(JUNK_RESULTS))
def test_flatten_function_returns_junk(op, junk):
  """A malformed (children, aux) result: ValueError."""
  result = JUNK_RESULTS[junk]
  if junk == "list instead of tuple":
    result = list(result)
  fn = _flatten_ops()[op]
  with pytest.raises(ValueError):
    fn([Junk(result)])


@isolated
@pytest.mark.parametrize(
    "op", ["flatten", "flatten_with_path", "flatten_up_to"]
)
def test_flatten_children_iterator_raises_mid_way(op):
  """Children whose iterator raises after two items: that error."""
  fn = _flatten_ops()[op]
  with pytest.raises(Boom, match="mid-way"):
    fn([Junk(lambda: (RaisingIterator(op == "flatten_with_path"), None))])


@isolated
def test_flatten_with_keys_returns_non_pairs():
  """to_iterable_with_keys yielding non-(key, child) items: ValueError."""
  with pytest.raises(ValueError):
    REG.flatten_with_path(Junk(((Leaf(),), None)))
  with pytest.raises(ValueError):
    REG.flatten_with_path(Junk((((1, 2, 3),), None)))


@isolated
def test_from_iterable_that_raises():
  """unflatten and from_iterable_tree propagate from_iterable's error."""
  reg = pt.PyTreeRegistry()

  class Fragile:
    pass

  def unflatten(aux, children):
    raise Boom("from_iterable")

  reg.register_node(
      Fragile,
      lambda f: ((Leaf(),), None),
      unflatten,
      preserve_relative_identities=True,
  )
  f = Fragile()
  leaves, td = reg.flatten([f, f, Fragile()])
  for _ in range(3):  # No state is left behind by a failed call.
    with pytest.raises(Boom):
      td.unflatten(leaves)
    with pytest.raises(Boom):
      td.from_iterable_tree([[Leaf()], None, [Leaf()]])
  # walk does not call from_iterable.
  assert td.walk(lambda c, d: c, lambda x: x, leaves) is not None


# ---------------------------------------------------------------------------
# Aux data that misbehaves.
# ---------------------------------------------------------------------------


class BadEq:
  """Aux data whose __eq__ raises (and which is therefore unhashable)."""

  __hash__ = None

  def __eq__(self, other):
    raise Boom("__eq__")


@isolated
def test_aux_eq_raises():
  """Comparing treedefs turns the aux's __eq__ error into stock's ValueError,
  chained to the original; hash works."""

  def assert_raises_from_boom(compare):
    with pytest.raises(ValueError, match="checking equality of metadata") as e:
      compare()
    assert isinstance(e.value.__cause__, Boom)

  td1 = REG.flatten(AuxNode(Leaf(), aux=BadEq()))[1]
  td2 = REG.flatten(AuxNode(Leaf(), aux=BadEq()))[1]
  assert_raises_from_boom(lambda: td1 == td2)
  assert_raises_from_boom(lambda: td1 != td2)
  assert hash(td1) == hash(td2)
  # With sharing too.
  n = AuxNode(Leaf(), aux=BadEq())
  td3 = REG.flatten([n, n])[1]
  td4 = REG.flatten([AuxNode(Leaf(), aux=BadEq())] * 2)[1]
  assert_raises_from_boom(lambda: td3 == td4)
  assert hash(td3) == hash(td4)


@isolated
def test_unhashable_aux():
  """hash(treedef) works with unhashable aux data and agrees with ==."""
  n = AuxNode(Leaf(), aux=["unhashable", {"x": 1}])
  td1 = REG.flatten([n, n])[1]
  td2 = REG.flatten([n, n])[1]
  assert td1 == td2 and hash(td1) == hash(td2)
  assert {td1: 1}[td2] == 1
  td3 = REG.flatten([AuxNode(Leaf(), aux=["other"])] * 2)[1]
  assert td3 != td1


@isolated
def test_unpicklable_aux():
  """pickle.dumps of a treedef with unpicklable aux raises cleanly."""
  td = REG.flatten([AuxNode(Leaf(), aux=threading.Lock())] * 2)[1]
  with pytest.raises((TypeError, pickle.PicklingError, AttributeError)):
    pickle.dumps(td)
  # A picklable one still works afterwards.
  td = shared_treedef()
  assert pickle.loads(pickle.dumps(td)) == td


# ---------------------------------------------------------------------------
# Depth.
# ---------------------------------------------------------------------------


@isolated
@pytest.mark.parametrize("kind", ["list", "opted-in", "dict"])
def test_very_deep_tree_raises_recursion_error(kind):
  """100,000 levels: RecursionError, even with a huge recursion limit."""
  tree = Leaf()
  for _ in range(100_000):
    if kind == "list":
      tree = [tree]
    elif kind == "dict":
      tree = {"a": tree}
    else:
      tree = AuxNode(tree)
  old = sys.getrecursionlimit()
  try:
    sys.setrecursionlimit(10**6)
    with pytest.raises(RecursionError):
      REG.flatten(tree)
    with pytest.raises(RecursionError):
      REG.flatten_with_path(tree)
    with pytest.raises(RecursionError):
      REG.flatten(tree, lambda x: False)
  finally:
    sys.setrecursionlimit(old)
  assert sys.getrecursionlimit() == old
  # Still works after.
  assert REG.flatten([[1]])[0] == [1]


@isolated
def test_cycle_of_plain_containers_raises_recursion_error():
  """A list that contains itself: RecursionError (no opted-in node)."""
  cyc = [1]
  cyc.append(cyc)
  with pytest.raises(RecursionError):
    REG.flatten(cyc)
  cyc.clear()
