"""The module tests' node classes and their registration, in one place.

Module level, so that pickle finds them by name (``nodes.KNode``):

* ``Leaf``: a leaf object compared by identity;
* three classes that ``register_all`` opts in to
  ``preserve_relative_identities``: ``KNode`` (custom, with
  ``to_iterable_with_keys``), ``PNode`` (custom, without keys) and ``DNode``
  (a dataclass registered with ``register_dataclass_node``);
* ``Box``, a custom class registered without the flag: plain tree semantics;
* ``NT``, a namedtuple.

A test file that needs a class of other behaviour (flatten functions that
raise or hand over the GIL, node data that is exactly a given object)
defines it under a name of its own and says why.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools

from jaxlib_patch import pytree as pt


class Leaf:
  """A leaf object compared by identity."""

  _ids = itertools.count()

  def __init__(self):
    self.i = next(Leaf._ids)

  def __repr__(self):
    return f"Leaf({self.i})"


class KNode:
  """Opted-in custom node registered WITH ``to_iterable_with_keys``."""

  def __init__(self, tag, children):
    self.tag = tag
    self.children = list(children)

  def __repr__(self):
    return f"KNode({self.tag!r}, {self.children!r})"


def knode_flatten(node):
  return tuple(node.children), (node.tag, len(node.children))


def knode_flatten_with_keys(node):
  pairs = tuple(
      (pt.GetAttrKey(f"c{i}"), c) for i, c in enumerate(node.children)
  )
  return pairs, (node.tag, len(node.children))


def knode_unflatten(aux, children):
  return KNode(aux[0], children)


class PNode:
  """Opted-in custom node registered WITHOUT ``to_iterable_with_keys``."""

  def __init__(self, tag, children):
    self.tag = tag
    self.children = tuple(children)

  def __repr__(self):
    return f"PNode({self.tag!r}, {self.children!r})"


def pnode_flatten(node):
  return node.children, node.tag


def pnode_unflatten(tag, children):
  return PNode(tag, children)


@dataclasses.dataclass(eq=False)
class DNode:
  """Opted-in dataclass node: data fields ``a``, ``b``; meta field ``m``."""

  a: object
  b: object
  m: int


class Box:
  """Custom node registered WITHOUT the flag: plain tree semantics."""

  def __init__(self, children):
    self.children = list(children)

  def __repr__(self):
    return f"Box({self.children!r})"


def box_flatten(box):
  return tuple(box.children), None


def box_unflatten(_, children):
  return Box(children)


NT = collections.namedtuple("NT", ["x", "y"])

OPTED = (KNode, PNode, DNode)


def register_all(registry, opt_in):
  """Registers the custom classes; the flag only where the module has it
  (stock's registries do not)."""
  flag = {"preserve_relative_identities": True} if opt_in else {}
  registry.register_node(
      KNode, knode_flatten, knode_unflatten, knode_flatten_with_keys, **flag
  )
  registry.register_node(PNode, pnode_flatten, pnode_unflatten, **flag)
  registry.register_dataclass_node(DNode, ["a", "b"], ["m"], **flag)
  registry.register_node(Box, box_flatten, box_unflatten)
  return registry
