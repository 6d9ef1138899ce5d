"""Node classes, tree walks and the oracle of the public-surface test.

Importable on stock JAX too (the stock sample runs the same programs in a
child process): there the opted-in classes are registered without the
opt-in, which stock does not know, and so behave as their plain twins.

Every walk here lays a tree out as stock JAX does, a shared node written out
at each of its places, by its own recursion over the few node types the
tests build, so that the oracle does not depend on the patch it checks.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

OPT_IN_KNOWN = hasattr(jax.tree_util, "preserve_relative_identities")


def _register_dataclass(cls, opt_in):
  if opt_in and OPT_IN_KNOWN:
    return jax.tree_util.register_dataclass(
        cls, preserve_relative_identities=True
    )
  return jax.tree_util.register_dataclass(cls)


def _register_box(cls, opt_in):
  def flatten_with_keys(box):
    keys = (jax.tree_util.SequenceKey(0), jax.tree_util.SequenceKey(1))
    return tuple(zip(keys, box.c)), None

  extra = {"preserve_relative_identities": True} if opt_in else {}
  if opt_in and not OPT_IN_KNOWN:
    extra = {}
  jax.tree_util.register_pytree_with_keys(
      cls, flatten_with_keys, lambda _, c: cls(*c), **extra
  )


class _Leafy:
  """One child, `value`; printed alike for a class and its twin so that
  text that shows a tree (`jax.debug.print`) compares between them."""

  def __repr__(self):
    return f"N({self.value!r})"


@dataclasses.dataclass(repr=False, eq=False)
class P(_Leafy):
  """A parameter node, opted in."""

  value: object


@dataclasses.dataclass(repr=False, eq=False)
class PlainP(_Leafy):
  """P's twin, registered without the opt-in."""

  value: object


class _Box:
  """Two children, keyed 0 and 1 (a model holding two parameters)."""

  def __init__(self, a, b):
    self.c = (a, b)

  def __repr__(self):
    return f"B{self.c!r}"


class Box(_Box):
  """Opted in."""


class PlainBox(_Box):
  """Box's twin, registered without the opt-in."""


_register_dataclass(P, opt_in=True)
_register_dataclass(PlainP, opt_in=False)
_register_box(Box, opt_in=True)
_register_box(PlainBox, opt_in=False)

Family = collections.namedtuple("Family", ["node", "box"])
OPTED = Family(P, Box)
PLAIN = Family(PlainP, PlainBox)
NODE_TYPES = (P, PlainP, _Box)
OPTED_TYPES = (P, Box)

Pair = collections.namedtuple("Pair", ["carry", "y"])


def _children(x):
  """The children of a node in stock's order, or None for a leaf."""
  if isinstance(x, (P, PlainP)):
    return [x.value]
  if isinstance(x, _Box):
    return list(x.c)
  if isinstance(x, dict):
    return [x[k] for k in sorted(x)]
  if isinstance(x, (tuple, list)):
    return list(x)
  return None


def _rebuilt(x, children):
  """A node of `x`'s type with new children."""
  if isinstance(x, (P, PlainP)):
    return type(x)(children[0])
  if isinstance(x, _Box):
    return type(x)(*children)
  if isinstance(x, dict):
    return dict(zip(sorted(x), children))
  if hasattr(type(x), "_fields"):
    return type(x)(*children)
  return type(x)(children)


def places(tree, is_leaf=None):
  """The leaves in stock's layout: one per place, None an empty node."""
  return [leaf for leaf, _, _ in places_with_groups(tree, is_leaf)]


def places_with_groups(tree, is_leaf=None):
  """`(leaf, group, path)` per place, stock's order. Two places are in one
  group when they are the same leaf of the same opted-in node object (the
  nearest such node above them), so one tied node's copies group together;
  `path` is the place's path of keys (positions, dict keys)."""
  out = []

  def walk(x, anchor, rel, path):
    if x is None or (is_leaf is not None and is_leaf(x)):
      if x is not None:
        out.append((x, (anchor, rel), path))
      return
    children = _children(x)
    if children is None:
      out.append((x, (anchor, rel), path))
      return
    if isinstance(x, OPTED_TYPES):
      anchor, rel = id(x), ()
    keys = sorted(x) if isinstance(x, dict) else range(len(children))
    for key, child in zip(keys, children):
      walk(child, anchor, rel + (key,), path + (key,))

  walk(tree, None, (), ())
  return out


def map_nodes(leaf_fn, tree, *rest, node_fn=None, keep_ties=True):
  """`tree` rebuilt with `leaf_fn` of the leaves at each place of `tree` and
  of the trees `rest` of its shape. With `keep_ties`, a place where every
  tree holds the same objects as at an earlier place gets the object built
  there (one object in gives one object out), else every place gets a new
  node; `node_fn(new)`, if given, may replace each rebuilt parameter node
  or box."""
  memo = {}

  def walk(xs):
    x = xs[0]
    if x is None:
      return None
    children = _children(x)
    if children is None:
      return leaf_fn(*xs)
    key = tuple(id(y) for y in xs)
    if keep_ties and key in memo:
      return memo[key][0]
    columns = zip(*(_children(y) for y in xs))
    new = _rebuilt(x, [walk(c) for c in columns])
    if node_fn is not None and isinstance(x, NODE_TYPES):
      new = node_fn(new)
    memo[key] = (new, xs)  # xs kept alive: no id is reused
    return new

  return walk((tree,) + rest)


def is_float_leaf(x):
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)


def loss(tree):
  """A scalar of every floating place, weighted by position so that places
  are told apart."""
  total = jnp.float32(0.0)
  for i, leaf in enumerate(places(tree)):
    if is_float_leaf(leaf) or isinstance(leaf, float):
      total = total + (1.0 + 0.25 * i) * jnp.sum(jnp.sin(leaf))
  return total


def as_plain(value):
  """A leaf as JSON-able data (also what the stock child prints)."""
  if isinstance(value, jax.ShapeDtypeStruct):
    return {"shape": list(value.shape), "dtype": str(value.dtype)}
  if isinstance(value, str):
    return value
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  arr = np.asarray(value)
  if arr.dtype == object:
    return repr(value)
  return arr.astype(np.float64).tolist() if arr.dtype.kind != "V" else []
