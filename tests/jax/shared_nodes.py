"""The opted-in node classes the JAX-level tests share.

Each is registered once, at import, with `preserve_relative_identities=True`,
each through a different registration function so that the tests of
tree_util_sharing_test.py cover them all.
"""

import dataclasses

from jax import tree_util


class Child:
  """Registered with register_pytree_node(..., preserve_relative_identities=True)."""

  def __init__(self, x):
    self.x = x


tree_util.register_pytree_node(
    Child,
    lambda c: ((c.x,), None),
    lambda _, xs: Child(*xs),
    preserve_relative_identities=True,
)


@tree_util.register_pytree_node_class(preserve_relative_identities=True)
class Parent:
  """Two children, typically one shared `Child` twice."""

  def __init__(self, left, right):
    self.left = left
    self.right = right

  def tree_flatten(self):
    return (self.left, self.right), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


@tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Param:
  """A parameter that a model ties by holding it in several places."""

  value: object
