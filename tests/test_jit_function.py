"""The front door of jax.jit (`make_jit_function`), with stand-in dispatches
(jit_stand_ins.py): the general path.

The main dispatch gets the DispatchArgs (one flatten of the dynamic
arguments), then the static positional arguments, then the static keyword
arguments. Which calls the leaf dispatch takes instead is in
test_jit_leaf_dispatch.py.
"""

from __future__ import annotations

import gc
import inspect
import sys
import weakref

import pytest

from jaxlib_patch import pytree as pt
from harness import by_address, clear_as_the_collector_does, isolated
from jit_stand_ins import REG, Recorder, make, target
from nodes import PNode


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


def test_a_call_without_keywords_gets_its_own_kwargs_dict():
  jitted, dispatch = make()
  node = PNode("n", [1])
  jitted(node, 2)
  jitted(node, 2)
  first, second = (call[0][0] for call in dispatch.calls)
  assert first.treedef == REG.flatten(((node, 2), {}))[1]
  assert first.kwargs == {} and type(first.kwargs) is dict
  assert first.kwargs is first.kwargs  # Made once, at the first read.
  first.kwargs["written"] = 1
  assert second.kwargs == {} and first.kwargs == {"written": 1}
  jitted(node, 2)
  assert dispatch.calls[-1][0][0].kwargs == {}
  assert pt.jit.DispatchArgs([1], first.treedef).kwargs == {}


def test_dispatch_args_attributes_by_any_name():
  jitted, dispatch = make()
  jitted(PNode("n", [1]), a=2)
  dispatch_args = dispatch.calls[-1][0][0]
  # A name built at run time is not the interned one: the generic lookup.
  for name in ("leaves", "".join(["lea", "ves"])):
    assert getattr(dispatch_args, name) == [1, 2]
  assert getattr(dispatch_args, "".join(["tree", "def"])) is (
      dispatch_args.treedef
  )
  assert dispatch_args.kwargs == {"a": 2}
  with pytest.raises(AttributeError, match="nothing"):
    dispatch_args.nothing
  with pytest.raises(AttributeError):
    dispatch_args.leaves = []
  clear_as_the_collector_does(dispatch_args)
  for name in ("leaves", "treedef", "args"):
    with pytest.raises(AttributeError):
      getattr(dispatch_args, name)


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
    assert "garbage collector cleared it" in str(result)
  for args in [(1.5,), (PNode("n", [1]),)]:
    with pytest.raises(ValueError, match="garbage collector cleared it"):
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
