"""Stand-ins for the stock C++ dispatches of jax.jit's front door
(`make_jit_function`): Python objects that record what they are called with,
for test_jit_function.py and test_jit_leaf_dispatch.py."""

from jaxlib_patch import pytree as pt
from nodes import register_all

REG = register_all(pt.PyTreeRegistry(), opt_in=True)
# Pickled by reference, as jax's registries are: so is a jitted function
# made with it (its state names its registry).
REG.__module__ = __name__
REG.__name__ = "REG"


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


def new_recorder(*layout):
  """A make_dispatch that pickles (by reference)."""
  return Recorder()


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
