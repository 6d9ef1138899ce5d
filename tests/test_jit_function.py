"""The front door of jax.jit (`make_jit_function`), with stand-in dispatches.

The stock C++ dispatches are replaced by Python objects that record what they
are called with. The main one gets the DispatchArgs (one flatten of the
dynamic arguments), then the static positional arguments, then the static
keyword arguments; the leaf dispatch gets, as they are, the calls whose
dynamic arguments are plain trees (leaves under None, builtin containers and
dataclasses not opted in) with at most one keyword argument.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import inspect
import sys
import weakref

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from jaxlib_patch import pytree as pt
from harness import by_address, clear_as_the_collector_does, isolated
from nodes import Box, DNode, PNode, register_all

REG = register_all(pt.PyTreeRegistry(), opt_in=True)


def target(a, n=0, b=None, *, mode="add"):
  """The jitted function's docstring."""
  return a


class Recorder:

  def __init__(self, result="result"):
    self.calls = []
    self.result = result

  def __call__(self, *args, **kwargs):
    self.calls.append((args, kwargs))
    return self.result

  def _cache_size(self):
    return len(self.calls)

  def _clear_cache(self):
    self.calls.clear()


def make(static_argnums=(), static_argnames=(), fun=target, leaf=None):
  dispatch = Recorder()
  return (
      pt.jit.make_jit_function(
          fun,
          lambda *layout: dispatch,
          REG,
          list(static_argnums),
          list(static_argnames),
          leaf,
      ),
      dispatch,
  )


def test_dynamic_arguments_are_flattened_once():
  jitted, dispatch = make()
  node = PNode("n", [1])
  assert jitted(node, 2, b=node) == "result"
  (dispatch_args, *statics), static_kwargs = dispatch.calls[-1]
  assert type(dispatch_args) is pt.jit.DispatchArgs
  assert statics == [] and static_kwargs == {}
  assert dispatch_args.leaves == [1, 2]
  assert dispatch_args.treedef == REG.flatten(((node, 2), {"b": node}))[1]
  assert dispatch_args.args == (node, 2) and dispatch_args.kwargs == {"b": node}


@pytest.mark.parametrize("argnums", [(1,), (-2,), (1, -2)])
def test_static_positions(argnums):
  jitted, dispatch = make(static_argnums=argnums)
  node = PNode("n", [1])
  jitted(node, "static", node)
  (dispatch_args, *statics), _ = dispatch.calls[-1]
  assert statics == ["static"]
  assert dispatch_args.treedef == REG.flatten(((node, node), {}))[1]
  assert dispatch_args.args == (node, "static", node)


def test_a_negative_index_outside_the_arguments_selects_nothing():
  jitted, dispatch = make(static_argnums=(-3, 5))
  jitted(1, 2)
  (dispatch_args, *statics), _ = dispatch.calls[-1]
  assert statics == [] and dispatch_args.leaves == [1, 2]


def test_static_names_even_internal_looking_ones():
  jitted, dispatch = make(static_argnames=("mode", "dispatch_args"))
  jitted(1, mode="mul", b=2, dispatch_args=3)
  (dispatch_args, *statics), static_kwargs = dispatch.calls[-1]
  assert statics == [] and static_kwargs == {"mode": "mul", "dispatch_args": 3}
  assert dispatch_args.leaves == [1, 2]
  assert dispatch_args.kwargs == {"mode": "mul", "b": 2, "dispatch_args": 3}


def test_many_arguments():
  jitted, dispatch = make(static_argnums=tuple(range(0, 40, 2)))
  jitted(*range(40), **{f"k{i}": i for i in range(20)})
  (dispatch_args, *statics), _ = dispatch.calls[-1]
  assert statics == list(range(0, 40, 2))
  # Keyword arguments in sorted order, as dicts flatten.
  assert dispatch_args.leaves == list(range(1, 40, 2)) + [
      int(k[1:]) for k in sorted(f"k{i}" for i in range(20))
  ]


@pytest.mark.parametrize(
    "argnums, argnames",
    [
        ((), ()),
        ((1,), ()),
        ((-1,), ()),
        ((-2, 0), ()),
        ((-9, 7), ()),
        ((1,), ("n",)),
        ((), ("n", "mode")),
        ((0, -1, 2), ("b",)),
    ],
)
def test_split_static_args_splits_as_calls_do(argnums, argnames):
  # `lower` and `trace` split with split_static_args: the same dynamic and
  # static arguments, in the same order, as a call hands to the dispatch.
  jitted, dispatch = make(static_argnums=argnums, static_argnames=argnames)
  node = PNode("n", [1])
  for args, kwargs in [
      ((node, 2, node), {"mode": "mul", "n": 3}),
      ((node,), {"n": node, "b": 4}),
      ((), {}),
  ]:
    jitted(*args, **kwargs)
    (dispatch_args, *statics), static_kwargs = dispatch.calls[-1]
    dynamic_args, dynamic_kwargs, static_args, split_static_kwargs = (
        pt.jit.split_static_args(args, kwargs, list(argnums), list(argnames))
    )
    assert static_args == tuple(statics)
    # Tracing marks the positions that calls split off.
    flags = pt.jit.positional_statics(len(args), list(argnums))
    assert len(flags) == len(args) and all(type(f) is bool for f in flags)
    assert tuple(a for a, static in zip(args, flags) if static) == static_args
    assert list(split_static_kwargs.items()) == list(static_kwargs.items())
    assert (
        dispatch_args.treedef == REG.flatten((dynamic_args, dynamic_kwargs))[1]
    )


def test_split_static_args_bad_input():
  with pytest.raises(TypeError, match="must be str"):
    pt.jit.split_static_args((), {0: 1}, [], ["a"])
  with pytest.raises(TypeError):
    pt.jit.split_static_args([1], {}, [0], [])
  with pytest.raises(TypeError):
    pt.jit.split_static_args((1,), {}, ["0"], [])


def test_errors_propagate():
  def failing(*args, **kwargs):
    raise KeyError("from the dispatch")

  jitted = pt.jit.make_jit_function(target, lambda *_: failing, REG, [], [])
  with pytest.raises(KeyError, match="from the dispatch"):
    jitted(1)

  def no_dispatch(static_argnums, static_argnames):
    raise KeyError("while building the dispatch")

  jitted = pt.jit.make_jit_function(
      target, no_dispatch, REG, [], [], Recorder()
  )
  assert jitted(1) == "result"  # The leaf dispatch: nothing was built.
  with pytest.raises(KeyError, match="while building"):
    jitted(PNode("n", [1]))
  cycle = PNode("n", [None])
  cycle.children = (cycle,)
  jitted, _ = make()
  with pytest.raises(ValueError, match="PNode"):
    jitted(cycle)


def test_bad_construction():
  with pytest.raises(TypeError):
    pt.jit.make_jit_function(target, Recorder(), object(), [], [])
  with pytest.raises(TypeError):
    pt.jit.make_jit_function(target, Recorder(), REG, ["0"], [])
  with pytest.raises(TypeError):
    pt.jit.make_jit_function(target, Recorder(), REG, [], [0])
  with pytest.raises(TypeError):
    pt.jit.make_jit_function(target, Recorder(), REG, [], [], "not callable")
  with pytest.raises(TypeError):
    pt.jit.PjitFunction()
  with pytest.raises(TypeError):
    pt.jit.DispatchArgs()


def test_surface():
  jitted, _ = make()
  assert repr(jitted) == "<PjitFunction>"  # No __wrapped__ yet.
  jitted.__wrapped__ = target
  assert repr(jitted) == f"<PjitFunction of {target!r}>"
  assert inspect.signature(jitted) == inspect.signature(target)
  assert jitted.__getstate__()["fun"] is target
  assert jitted == jitted and jitted != make()[0]
  assert hash(jitted) == hash(jitted)

  class Owner:
    method = jitted

  owner = Owner()
  bound = owner.method
  assert bound.__self__ is owner and bound.__func__ is jitted
  assert Owner.method is jitted


def test_weak_references_and_cycles():
  jitted, dispatch = make()
  ref = weakref.ref(jitted)
  del jitted
  gc.collect()
  assert ref() is None

  class Model:

    def apply(self, x):
      return x

  model = Model()
  model.jitted, _ = make(fun=model.apply)
  model.jitted.__wrapped__ = model.apply
  model_ref = weakref.ref(model)
  del model
  gc.collect()
  assert model_ref() is None


@pytest.mark.parametrize("dying", ["leaf dispatch", "function", "dict"])
@isolated
def test_a_call_during_and_after_tp_clear_raises(dying):
  # tp_clear drops the object's references while the object lives on, and
  # code that a drop runs (here a weak reference's callback) may call it.
  # That call, and every later one, must raise: neither reach a half-dropped
  # dispatch nor jump to the leaf dispatch through the memoized leaf call.
  seen = []

  def call_it(_):
    jitted = by_address(address)
    for args in [(1.5,), (PNode("n", [1]),)]:
      try:
        seen.append(jitted(*args))
      except ValueError as e:
        seen.append(e)

  def held(*args):  # the function the weak reference watches
    return "leaf result"

  watch = weakref.ref(held, call_it)
  if dying == "leaf dispatch":  # a function: the memoized call jumps to it
    jitted, _ = make(leaf=held)
  elif dying == "function":
    jitted, _ = make(fun=held, leaf=lambda *args: "leaf result")
  else:
    jitted, _ = make(leaf=lambda *args: "leaf result")
    jitted.attribute = held
  del held
  assert jitted(2.5) == "leaf result"  # float memoized as a leaf type
  address = id(jitted)
  clear_as_the_collector_does(jitted)
  assert watch() is None and len(seen) == 2
  for result in seen:
    assert isinstance(result, ValueError), seen
    assert "cleared by the garbage collector" in str(result)
  for args in [(1.5,), (PNode("n", [1]),)]:
    with pytest.raises(ValueError, match="cleared by the garbage collector"):
      jitted(*args)


def test_no_reference_leaks():
  jitted, dispatch = make(static_argnums=(1,), static_argnames=("mode",))
  node = PNode("n", [1])
  static = object()
  jitted(node, static, node, mode="x")
  dispatch.calls.clear()
  before = (sys.getrefcount(node), sys.getrefcount(static))
  for _ in range(100):
    jitted(node, static, node, mode="x")
  dispatch.calls.clear()
  assert (sys.getrefcount(node), sys.getrefcount(static)) == before


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
CALLS = st.lists(
    st.one_of(
        st.tuples(
            st.just("call"),
            st.lists(ARGUMENTS, max_size=3),
            st.dictionaries(st.sampled_from(["b", "mode"]), ARGUMENTS),
        ),
        st.tuples(st.just("register"), st.sampled_from([Late, LateToo])),
    ),
    max_size=12,
)


def plain_objects(registry, x):
  """How many objects `x` holds if the leaf dispatch may take it (leaves,
  None, tuples and lists of such), else None."""
  if x is None or not registry.is_node(type(x)):
    return 1
  children = {
      tuple: lambda: x,
      list: lambda: x,
      dict: lambda: x.values(),
      PlainPair: lambda: (x.a, x.b),
  }.get(type(x))
  if children is None:
    return None
  counts = [plain_objects(registry, child) for child in children()]
  return None if None in counts else 1 + sum(counts)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(CALLS, st.sampled_from([(), (1,), (-1,)]), st.booleans())
def test_generated_calls_take_the_leaf_dispatch_exactly_when_plain(
    calls, static_argnums, leaf_is_a_function
):
  # Which dispatch a call takes must follow the registry at the time of the
  # call, whatever the front door remembers of earlier calls (the leaf type,
  # the treedef) and whether the leaf dispatch is one it jumps to directly
  # (a function, with a vectorcall) or one it calls through CPython (an
  # object whose class defines __call__).
  registry = register_all(pt.PyTreeRegistry(), opt_in=True)
  registry.register_dataclass_node(PlainPair, ["a", "b"], [])
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
    _, args, kwargs = step
    note(f"call with {args!r}, {kwargs!r}")
    nargs = len(args)
    static = {i if i >= 0 else i + nargs for i in static_argnums}
    dynamic = [a for i, a in enumerate(args) if i not in static]
    counts = [plain_objects(registry, a) for a in dynamic]
    if "b" in kwargs:
      counts.append(plain_objects(registry, kwargs["b"]))
    expect_leaf = None not in counts and sum(counts) <= 32
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
