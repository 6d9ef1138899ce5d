"""jax.jit in a program that has the custom wheels and opts nothing in:
printed as JSON, per kind of call, whether each call (made three times, the
later ones from the C++ cache) returned what the function returns unjitted,
and the jitted function's cache size; before and after the program's first
opt-in, with whether a registry had any.

nothing_opted_in_test.py runs this script in a child process of its own, so
that no opt-in of the test process (or of another test) is in force.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import tree_util

CALLS = 3


class Scaled:
  """A custom node registered plainly: its children reach jit only through
  its flatten function."""

  def __init__(self, scale, value):
    self.scale = scale
    self.value = value


jax.tree_util.register_pytree_node(
    Scaled,
    lambda s: ((s.value,), s.scale),
    lambda scale, children: Scaled(scale, *children),
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Pair:
  a: object
  b: object


def total(*args, **kwargs):
  """The sum of every leaf, a custom node's scaled."""
  flat = jax.tree.leaves(
      (args, kwargs), is_leaf=lambda node: isinstance(node, Scaled)
  )
  return sum(
      (leaf.scale * leaf.value if isinstance(leaf, Scaled) else leaf).sum()
      for leaf in flat
  )


def kinds():
  """(name, args, kwargs) of each kind of call."""
  x = jnp.arange(4.0)
  return [
      ("Partial", (jax.tree_util.Partial(jnp.multiply, 2.0), x), {}),
      ("custom node", (Scaled(3.0, x),), {}),
      ("custom node as a keyword", (x,), {"b": Scaled(2.0, x)}),
      ("two keywords", (), {"b": Scaled(2.0, x), "c": x}),
      ("dataclass of custom nodes", (Pair(Scaled(2.0, x), [x, None]),), {}),
      ("100 arrays and a custom node", ([x] * 100, Scaled(5.0, x)), {}),
  ]


def call_kinds():
  """Per kind: whether each call matched the unjitted value; cache size."""
  report = {}
  for name, args, kwargs in kinds():

    def function(*args, **kwargs):
      if args and isinstance(args[0], jax.tree_util.Partial):
        return args[0](args[1]).sum()
      return total(*args, **kwargs)

    expected = np.asarray(function(*args, **kwargs))
    jitted = jax.jit(function)
    matched = [
        bool(np.allclose(jitted(*args, **kwargs), expected))
        for _ in range(CALLS)
    ]
    report[name] = {"matched": matched, "cache_size": jitted._cache_size()}
  return report


before = {
    "has_opt_ins": tree_util.identity_tracing_registry.has_opt_ins,
    "kinds": call_kinds(),
}


@jax.tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass(eq=False)
class Layer:
  w: jax.Array


after = {
    "has_opt_ins": tree_util.identity_tracing_registry.has_opt_ins,
    "kinds": call_kinds(),
}
print(json.dumps({"before": before, "after": after}))
