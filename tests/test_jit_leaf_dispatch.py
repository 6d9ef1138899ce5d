"""Which calls of jax.jit's front door (`make_jit_function`) go to the leaf
dispatch, with stand-in dispatches (jit_stand_ins.py): as they are, the calls
whose dynamic arguments are plain trees (leaves under None, builtin
containers and dataclasses not opted in) with at most one keyword argument;
every other call to the main dispatch, as one DispatchArgs.
"""

from __future__ import annotations

import collections
import dataclasses
import gc

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from jaxlib_patch import pytree as pt
from jit_stand_ins import REG, Recorder, make, target
from nodes import Box, DNode, PNode, pnode_flatten, pnode_unflatten, register_all


@dataclasses.dataclass
class PlainPair:
  """A dataclass node registered without the flag: a plain node."""

  a: object
  b: object


REG.register_dataclass_node(PlainPair, ["a", "b"], [])


def test_calls_on_plain_trees_take_the_leaf_dispatch_as_they_are():
  leaf = Recorder("leaf result")
  built = []

  def make_dispatch(static_argnums, static_argnames):
    # The front door's layout: the DispatchArgs at 0, then a call's static
    # positional arguments, the static keyword ones by name.
    assert static_argnums == (1, 2) and static_argnames == ("mode",)
    built.append(Recorder())
    return built[-1]

  jitted = pt.jit.make_jit_function(
      target, make_dispatch, REG, [1, -1], ["mode"], leaf
  )
  static_node = PNode("n", [2])
  # Static arguments may be anything, nodes included.
  assert jitted(1, static_node, mode=static_node) == "leaf result"
  assert leaf.calls[-1] == ((1, static_node), {"mode": static_node})
  # Leaves under None, builtin containers and plain dataclasses, and one
  # dynamic keyword argument: nothing that could be shared.
  plain = [
      ((1.5, "s", [3], static_node), {}),
      ((1,), {"b": 2}),
      ((None, "s", "t"), {}),
      ((None,), {}),  # Static: -1 is position 0 here.
      (({"k": (1, None)}, "s"), {"b": PlainPair([1], None)}),
  ]
  for args, kwargs in plain:
    assert jitted(*args, **kwargs) == "leaf result"
    assert leaf.calls[-1] == (args, kwargs)
  # A custom node anywhere, an opted-in dataclass, two dynamic keyword
  # arguments, or more objects than the walk looks at.
  general = [
      ((PNode("n", [1]), "s"), {}),
      (([1, (None, PNode("n", [1]))], "s"), {}),
      ((PlainPair(1, Box([2])), "s"), {}),
      ((DNode(1, 2, "m"), "s"), {}),
      ((1,), {"n": 2, "b": 3}),
      (([0] * 40, "s"), {}),
  ]
  for args, kwargs in general:
    assert jitted(*args, **kwargs) == "result"
    (dispatch_args, *_), _ = built[0].calls[-1]
    assert (dispatch_args.args, dispatch_args.kwargs) == (args, kwargs)
  assert len(built) == 1 and len(built[0].calls) == len(general)
  assert len(leaf.calls) == 1 + len(plain)
  assert jitted._cache_size() == 1 + len(plain) + len(general)
  jitted._clear_cache()
  assert jitted._cache_size() == 0 and leaf.calls == []


def test_while_nothing_is_opted_in_calls_take_the_leaf_dispatch_as_they_are():
  registry = register_all(pt.PyTreeRegistry(), opt_in=False)
  assert not registry.has_opt_ins
  leaf, main = Recorder("leaf result"), Recorder()
  jitted = pt.jit.make_jit_function(
      target, lambda *_: main, registry, [], [], leaf
  )
  calls = [
      ((PNode("n", [1]),), {}),  # A custom node: its flatten is not run.
      ((DNode(1, 2, "m"), 3), {"b": Box([4])}),
      ((list(range(100)),), {}),  # Past the walk's budget.
  ]
  for args, kwargs in calls:
    assert jitted(*args, **kwargs) == "leaf result"
  assert leaf.calls == calls and main.calls == []
  # Two dynamic keywords: the two dispatches would order their leaves apart.
  assert jitted(1, b=2, mode=3) == "result" and len(main.calls) == 1

  # An opt-in made through a twin is the whole family's: from then on a
  # custom node takes the general path, and a plain tree the walk.
  class Flagged(PNode):
    pass

  twin = registry.twin(keeps_relative_identities=False)
  twin.register_node(
      Flagged, pnode_flatten, pnode_unflatten, preserve_relative_identities=True
  )
  assert registry.has_opt_ins and twin.has_opt_ins
  assert jitted(PNode("n", [1])) == "result" and len(main.calls) == 2
  assert jitted([1, (2, None)]) == "leaf result" and len(leaf.calls) == 4


def test_a_failing_field_read_sends_the_call_down_the_general_path():
  # The walk never raises: the general path's flatten meets the error.
  class Failing:

    @property
    def a(self):
      raise RuntimeError("no field")

  registry = register_all(pt.PyTreeRegistry(), opt_in=True)
  registry.register_dataclass_node(Failing, ["a"], [])
  leaf, main = Recorder("leaf result"), Recorder()
  jitted = pt.jit.make_jit_function(
      target, lambda *_: main, registry, [], [], leaf
  )
  with pytest.raises(RuntimeError, match="no field"):
    jitted(Failing())
  assert leaf.calls == [] and main.calls == []


def test_a_type_registered_after_calls_on_it_is_a_node_from_then_on():
  # The front door remembers the last leaf type it saw; a registration in
  # between must not let an object of that type pass as a leaf.
  class Late:

    def __init__(self, x):
      self.x = x

  registry = register_all(pt.PyTreeRegistry(), opt_in=True)
  leaf = Recorder("leaf result")
  main = Recorder()
  jitted = pt.jit.make_jit_function(
      target, lambda *_: main, registry, [], [], leaf
  )
  assert jitted(Late(1), Late(2)) == "leaf result"
  assert jitted(Late(3)) == "leaf result"  # Remembered as a leaf type.
  registry.register_node(
      Late,
      lambda late: ((late.x,), None),
      lambda _, children: Late(*children),
      preserve_relative_identities=True,
  )
  shared = Late(4)
  assert jitted(shared, shared) == "result"
  (dispatch_args,), _ = main.calls[-1]
  assert dispatch_args.leaves == [4]  # One node, shared: flattened by us.
  assert dispatch_args.treedef.has_shared_nodes
  assert len(leaf.calls) == 2


def test_a_namedtuple_registered_after_calls_on_it_is_a_custom_node():
  # The front door remembers namedtuple types to skip their attribute
  # lookup; a registration in between must not let one pass as plain.
  Pair = collections.namedtuple("Pair", "a b")
  registry = register_all(pt.PyTreeRegistry(), opt_in=True)
  leaf, main = Recorder("leaf result"), Recorder()
  jitted = pt.jit.make_jit_function(
      target, lambda *_: main, registry, [], [], leaf
  )
  for _ in range(2):
    assert jitted(Pair(1, [2])) == "leaf result"
  # The collector sees the remembered types: the jitted function holds them.
  assert Pair in gc.get_referents(jitted)
  registry.register_node(
      Pair,
      lambda pair: ((pair.a, pair.b), None),
      lambda _, children: Pair(*children),
      preserve_relative_identities=True,
  )
  shared = Pair(3, 4)
  assert jitted([shared, shared]) == "result"
  (dispatch_args,), _ = main.calls[-1]
  assert dispatch_args.leaves == [3, 4]
  assert dispatch_args.treedef.has_shared_nodes
  assert len(leaf.calls) == 2


def test_without_a_leaf_dispatch_leaves_take_the_main_one():
  jitted, dispatch = make()
  jitted(1)
  (dispatch_args, *statics), _ = dispatch.calls[-1]
  assert type(
      dispatch_args
  ) is pt.jit.DispatchArgs and dispatch_args.leaves == [1]


def test_the_main_dispatch_is_built_only_when_needed():
  built = []
  leaf = Recorder()
  jitted = pt.jit.make_jit_function(
      target, lambda *_: built.append(1) or Recorder(), REG, [], [], leaf
  )
  for _ in range(3):
    jitted(1, 2.0)
  assert jitted._cache_size() == 3 and built == []


class Late:
  """A class that a generated run may register as a node between calls."""

  def __init__(self, x):
    self.x = x


class LateToo(Late):
  pass


# Arguments of calls: leaves of several types (so that the remembered leaf
# type changes), nodes of the registry, and objects of the classes that a run
# registers part way.
ARGUMENTS = st.sampled_from(
    [
        1,
        2.5,
        "s",
        None,
        (),
        [3],
        {"k": (3, None)},
        {"k": PNode("n", [4])},
        PlainPair(1, [2]),
        [0] * 31,  # 32 objects: the walk's budget by itself.
        PNode("n", [4]),
        Late(5),
        LateToo(6),
    ]
)


class OptedInBase:
  """A class no node derives from: opting it in opts nothing else in."""


CALLS = st.lists(
    st.one_of(
        st.tuples(
            st.just("call"),
            st.lists(ARGUMENTS, max_size=3),
            st.dictionaries(st.sampled_from(["b", "mode"]), ARGUMENTS),
        ),
        st.tuples(st.just("register"), st.sampled_from([Late, LateToo])),
        st.tuples(st.just("opt in"), st.sampled_from([DNode, OptedInBase])),
    ),
    max_size=12,
)


def plain_objects(registry, x):
  """How many objects `x` holds if the walk lets the leaf dispatch take it
  (leaves, None, tuples, lists, dicts and dataclasses not opted in, of such),
  else None."""
  if x is None or not registry.is_node(type(x)):
    return 1
  if registry.has_relative_identities(type(x)):
    return None
  children = {
      tuple: lambda: x,
      list: lambda: x,
      dict: lambda: x.values(),
      PlainPair: lambda: (x.a, x.b),
      DNode: lambda: (x.a, x.b),
  }.get(type(x))
  if children is None:
    return None
  counts = [plain_objects(registry, child) for child in children()]
  return None if None in counts else 1 + sum(counts)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(CALLS, st.sampled_from([(), (1,), (-1,)]), st.booleans(), st.booleans())
def test_generated_calls_take_the_leaf_dispatch_exactly_when_plain(
    calls, static_argnums, leaf_is_a_function, opt_in
):
  # Which dispatch a call takes must follow the registry at the time of the
  # call, whatever the front door remembers of earlier calls (the leaf type,
  # the treedef) and whether the leaf dispatch is one it jumps to directly
  # (a function, with a vectorcall) or one it calls through CPython (an
  # object whose class defines __call__). While nothing is opted in, every
  # call with at most one dynamic keyword is the leaf dispatch's, whatever
  # its nodes and size; from the first opt-in, only plain trees are.
  registry = register_all(pt.PyTreeRegistry(), opt_in=opt_in)
  registry.register_dataclass_node(PlainPair, ["a", "b"], [])
  has_opt_ins = opt_in
  leaf_calls, main = [], Recorder()

  def leaf_function(*args, **kwargs):
    leaf_calls.append((args, kwargs))
    return "leaf result"

  leaf_recorder = Recorder("leaf result")
  leaf_recorder.calls = leaf_calls
  leaf = leaf_function if leaf_is_a_function else leaf_recorder
  jitted = pt.jit.make_jit_function(
      target, lambda *_: main, registry, list(static_argnums), ["mode"], leaf
  )
  registered = set()
  for step in calls:
    if step[0] == "register":
      if step[1] not in registered:
        registry.register_node(
            step[1],
            lambda late: ((late.x,), None),
            lambda _, children: Late(*children),
        )
        registered.add(step[1])
      continue
    if step[0] == "opt in":
      registry.preserve_relative_identities(step[1])
      has_opt_ins = True
      continue
    assert registry.has_opt_ins == has_opt_ins
    _, args, kwargs = step
    note(f"call with {args!r}, {kwargs!r}")
    nargs = len(args)
    static = {i if i >= 0 else i + nargs for i in static_argnums}
    dynamic = [a for i, a in enumerate(args) if i not in static]
    counts = [plain_objects(registry, a) for a in dynamic]
    if "b" in kwargs:
      counts.append(plain_objects(registry, kwargs["b"]))
    expect_leaf = not has_opt_ins or (None not in counts and sum(counts) <= 32)
    leaf_before, main_before = len(leaf_calls), len(main.calls)
    result = jitted(*args, **kwargs)
    if expect_leaf:
      assert result == "leaf result"
      assert leaf_calls[leaf_before:] == [(tuple(args), kwargs)]
      assert len(main.calls) == main_before
    else:
      assert result == "result"
      assert len(leaf_calls) == leaf_before
      assert len(main.calls) == main_before + 1
      (dispatch_args, *_), _ = main.calls[-1]
      assert dispatch_args.args == tuple(args)
      assert dispatch_args.kwargs == kwargs
