"""What copies and pickles of the front door's object (`make_jit_function`)
keep: as stock's PjitFunction, `PjitFunction()` makes an object with no
function, which `__setstate__` gives the state that `__getstate__` returns;
copy, deepcopy and pickle go through the two."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref

import pytest

from jaxlib_patch import pytree as pt
from jit_stand_ins import REG, Recorder, make, new_recorder, target
from nodes import PNode

STATE_KEYS = {
    "version",
    "fun",
    "make_dispatch",
    "registry",
    "static_argnums",
    "static_argnames",
    "leaf_dispatch",
}


class LeafRecorder(Recorder):
  """A leaf dispatch with stock's `_cache_miss`."""

  def _cache_miss(self, *args):
    return ("miss", args)

  def __getstate__(self):
    return {"function_name": "target"}  # As a stock dispatch's names it.


def test_an_object_without_a_state_says_so():
  empty = pt.jit.PjitFunction()
  assert repr(empty) == "<PjitFunction>"
  for touch in (
      lambda: empty(1.5),
      lambda: empty(PNode("n", [1])),
      empty.__getstate__,
      empty._cache_size,
      lambda: empty._cache_miss,
  ):
    with pytest.raises(ValueError, match="has no function"):
      touch()
  assert pt.jit.PjitFunction.__new__(pt.jit.PjitFunction, 1, k=2) is not None


@pytest.mark.parametrize("leaf", [None, LeafRecorder("leaf result")])
def test_the_state_rebuilds_the_function(leaf):
  jitted, dispatch = make(
      static_argnums=(1,), static_argnames=("mode",), leaf=leaf
  )
  state = jitted.__getstate__()
  # Stock's state names the function too, read from its dispatch's.
  if leaf is None:
    assert set(state) == STATE_KEYS
  else:
    assert set(state) == STATE_KEYS | {"function_name"}
    assert state["function_name"] == "target"
  assert state["fun"] is target and state["registry"] is REG
  assert state["static_argnums"] == [1] and state["static_argnames"] == ["mode"]
  assert state["leaf_dispatch"] is leaf
  fresh = pt.jit.PjitFunction()
  assert fresh.__setstate__(state) is None
  node = PNode("n", [1])
  assert fresh(node, "static", mode="m") == "result"
  (dispatch_args, static), kwargs = dispatch.calls[-1]
  assert dispatch_args.leaves == [1] and static == "static"
  assert kwargs == {"mode": "m"}
  assert fresh.__getstate__() == state


def test_cache_miss_is_the_leaf_dispatchs():
  leaf = LeafRecorder()
  jitted, _ = make(leaf=leaf)
  assert jitted._cache_miss(1) == ("miss", (1,))
  without_leaf, dispatch = make()
  dispatch._cache_miss = "the dispatch's"
  assert without_leaf._cache_miss == "the dispatch's"


def test_setstate_on_a_live_function_takes_the_new_one():
  jitted, first = make()
  node = PNode("n", [1])
  jitted(node)
  other, second = make(static_argnums=(0,))
  jitted.__setstate__(other.__getstate__())
  jitted("static", node)
  assert len(first.calls) == 1
  assert second.calls[-1][0][1] == "static"


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda state: "not a dict", TypeError),
        (lambda state: {}, KeyError),
        (lambda state: dict(state, version=2), ValueError),
        (lambda state: dict(state, version="1"), TypeError),
        (lambda state: dict(state, registry=object()), TypeError),
        (lambda state: dict(state, static_argnums=["0"]), TypeError),
        (lambda state: dict(state, static_argnames=[0]), TypeError),
    ]
    + [
        (
            lambda state, key=key: {k: v for k, v in state.items() if k != key},
            KeyError,
        )
        for key in sorted(STATE_KEYS)
    ],
)
def test_a_bad_state_is_refused_and_changes_nothing(change, error):
  jitted, dispatch = make()
  with pytest.raises(error):
    jitted.__setstate__(change(jitted.__getstate__()))
  assert jitted(PNode("n", [1])) == "result" and dispatch.calls


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copies_and_pickles_call_alike(how):
  jitted = pt.jit.make_jit_function(target, new_recorder, REG, [1], ["mode"])
  jitted.__wrapped__ = target
  made = {
      "copy": copy.copy,
      "deepcopy": copy.deepcopy,
      "pickle": lambda f: pickle.loads(pickle.dumps(f)),
  }[how](jitted)
  assert type(made) is pt.jit.PjitFunction and made is not jitted
  assert made(PNode("n", [1]), 2, mode="m") == "result"
  # As stock's copies: the instance __dict__ is not part of the state.
  assert repr(made) == "<PjitFunction>"
  assert made.__getstate__()["fun"] is target


def test_a_state_that_refers_to_its_function_is_collected():
  jitted = pt.jit.PjitFunction()
  jitted.__setstate__(make(fun=lambda: jitted)[0].__getstate__())
  ref = weakref.ref(jitted)
  del jitted
  gc.collect()
  assert ref() is None
