"""Adapters of the public-surface test: jax.tree and jax.tree_util.

These keep relative identities by design: a tied node's leaves are listed
once, under the path of its first place, and a map over trees that all tie
a node maps it once. So their flat results are read as `unique` parts (the
reference's entries at places that are not later copies of a tied node) and
results that depend on a place's path as `first` parts; where the result's
values do not depend on it, it is read place by place.

Each function is tested under both of its names, `jax.tree.X` and
`jax.tree_util.tree_X`, which could differ.
"""

import functools

import jax
import jax.numpy as jnp

import surface_nodes as nodes
from surface_programs import ONE_SHOT, first, smooth, unique
from surface_programs import adapter as _adapter


def adapter(api, **kw):
  """The tree functions run no XLA computation of their own: every
  combination of pattern, mode and differentiation is a case."""
  return _adapter(api, cost="cheap", **kw)


def _both(short, long, **kw):
  """Registers one adapter under `jax.tree.<short>` and
  `jax.tree_util.<long>`; the adapter gets the function as `api`."""

  def register(call):
    for name, api in (
        (f"jax.tree.{short}", getattr(jax.tree, short)),
        (f"jax.tree_util.{long}", getattr(jax.tree_util, long)),
    ):
      adapter(name, **kw)(functools.partial(call, api=api))
    return call

  return register


def _second_tree(args, fn, fam):
  """A tree of `args[0]`'s shape sharing as `fn`'s mode says: as `args[0]`
  does (keep), nowhere (less), or one node everywhere (more)."""
  return fn.tree(args[0], g=lambda v: 2.0 * v)


def _path_code(path):
  """A number for a key path, so that values tell paths apart."""
  return sum(map(ord, jax.tree_util.keystr(path))) % 97 / 10.0


def _is_node(fam):
  return lambda x: isinstance(x, fam.node)


@_both("map", "tree_map")
def _map(args, fn, fam, api):
  return api(lambda x, y: smooth(x) * y, args[0], _second_tree(args, fn, fam))


@_both("map_with_path", "tree_map_with_path", diffs=ONE_SHOT)
def _map_with_path(args, fn, fam, api):
  other = _second_tree(args, fn, fam)
  out = api(lambda p, x, y: x + y + _path_code(p), args[0], other)
  return first(out, args[0], other)


@adapter("jax.tree.map[is_leaf]")
def _map_is_leaf(args, fn, fam):
  """`f` gets whole parameter nodes, and returns each as the mode says."""
  memo = {}
  shared = []

  def f(node):
    if fn.mode == "keep":
      return memo.setdefault(id(node), fam.node(smooth(node.value)))
    if fn.mode == "more" and shared:
      return shared[0]
    shared.append(fam.node(smooth(node.value)))
    return shared[-1]

  return jax.tree.map(f, args, is_leaf=_is_node(fam))


@adapter("jax.tree_util.tree_map_with_path[is_leaf]", diffs=ONE_SHOT)
def _map_with_path_is_leaf(args, fn, fam):
  """Parameter nodes are leaves, under boxes that a pattern may tie."""
  other = _second_tree(args, fn, fam)
  out = jax.tree_util.tree_map_with_path(
      lambda p, x, y: x.value + y.value + _path_code(p),
      args[0],
      other,
      is_leaf=_is_node(fam),
  )
  return first(out, args[0], other, is_leaf=_is_node(fam))


@adapter("jax.tree_util.tree_map_with_path[is_leaf_takes_path]", diffs=ONE_SHOT)
def _map_with_path_leaf_path(args, fn, fam):
  other = _second_tree(args, fn, fam)
  out = jax.tree_util.tree_map_with_path(
      lambda p, x, y: x + y + _path_code(p),
      args[0],
      other,
      is_leaf=lambda path, x: x is None,
      is_leaf_takes_path=True,
  )
  return first(out, args[0], other)


@_both("leaves", "tree_leaves", fns=False, diffs=ONE_SHOT)
def _leaves(args, fn, fam, api):
  return unique(api(args), args)


@adapter("jax.tree.leaves[is_leaf]", fns=False, diffs=ONE_SHOT)
def _leaves_is_leaf(args, fn, fam):
  found = jax.tree.leaves(args, is_leaf=_is_node(fam))
  return unique([n.value for n in found], args, is_leaf=_is_node(fam))


def _keystrs(pairs):
  return [jax.tree_util.keystr(p) for p, _ in pairs]


@_both("leaves_with_path", "tree_leaves_with_path", fns=False, diffs=ONE_SHOT)
def _leaves_with_path(args, fn, fam, api):
  pairs = api(args)
  return (unique(_keystrs(pairs), args), unique([x for _, x in pairs], args))


@_both("flatten", "tree_flatten", fns=False, diffs=ONE_SHOT)
def _flatten(args, fn, fam, api):
  leaves, treedef = api(args)
  return (
      unique(leaves, args),
      jax.tree.unflatten(treedef, [smooth(x) for x in leaves]),
  )


@_both("flatten_with_path", "tree_flatten_with_path", fns=False, diffs=ONE_SHOT)
def _flatten_with_path(args, fn, fam, api):
  pairs, treedef = api(args)
  return (
      unique(_keystrs(pairs), args),
      jax.tree.unflatten(treedef, [smooth(x) for _, x in pairs]),
  )


@_both("structure", "tree_structure", fns=False)
def _structure(args, fn, fam, api):
  treedef = api(args)
  return jax.tree.unflatten(treedef, [smooth(x) for x in jax.tree.leaves(args)])


@_both("unflatten", "tree_unflatten", fns=False)
def _unflatten(args, fn, fam, api):
  leaves, treedef = jax.tree.flatten(args)
  return api(treedef, [jnp.cos(x) for x in leaves])


def _as_list(x):
  return x if isinstance(x, list) else [x]


@_both("reduce", "tree_reduce", fns=False, diffs=ONE_SHOT)
def _reduce(args, fn, fam, api):
  return unique(api(lambda a, b: _as_list(a) + [b], args), args)


@_both(
    "reduce_associative", "tree_reduce_associative", fns=False, diffs=ONE_SHOT
)
def _reduce_associative(args, fn, fam, api):
  joined = api(lambda a, b: _as_list(a) + _as_list(b), args)
  return unique(joined, args)


@_both("all", "tree_all", fns=False, diffs=ONE_SHOT)
def _all(args, fn, fam, api):
  positive = jax.tree.map(lambda x: bool(jnp.all(x > -10.0)), args)
  return api(positive), api(jax.tree.map(lambda x: x is not None, args))


@_both("transpose", "tree_transpose")
def _transpose(args, fn, fam, api):
  outer = jax.tree.structure(args)
  inner = jax.tree.structure(fam.node((0.0, 0.0)))
  pairs = fn.tree(args, g=lambda x: fam.node((smooth(x), jnp.cos(x))))
  return api(outer, inner, pairs)


@_both("broadcast", "tree_broadcast")
def _broadcast(args, fn, fam, api):
  scale = jnp.float32(1.5)  # one object: a node the prefix reaches twice
  prefix = tuple(scale for _ in args)
  out = api(prefix, args)
  return out, jax.tree.map(lambda p, x: p * x, out, args)


@adapter("jax.tree_util.treedef_children", fns=False, diffs=ONE_SHOT)
def _treedef_children(args, fn, fam):
  children = jax.tree_util.treedef_children(jax.tree.structure(args))
  counted = sum(c.num_leaves for c in children)
  return (
      tuple(jax.tree_util.treedef_is_leaf(c) for c in children),
      unique([1.0] * counted, args),
  )


@adapter("jax.tree_util.treedef_tuple", fns=False)
def _treedef_tuple(args, fn, fam):
  joined = jax.tree_util.treedef_tuple([jax.tree.structure(a) for a in args])
  leaves = [x for a in args for x in jax.tree.leaves(a)]
  return jax.tree.unflatten(joined, leaves)


@adapter("jax.tree_util.all_leaves", fns=False, diffs=ONE_SHOT)
def _all_leaves(args, fn, fam):
  return (
      jax.tree_util.all_leaves(jax.tree.leaves(args)),
      jax.tree_util.all_leaves(args),
  )


@adapter("jax.tree_util.flatten_one_level", fns=False)
def _flatten_one_level(args, fn, fam):
  return tuple(jax.tree_util.flatten_one_level(args[0])[0])


@adapter("jax.tree_util.flatten_one_level_with_keys", fns=False)
def _flatten_one_level_with_keys(args, fn, fam):
  keyed, _ = jax.tree_util.flatten_one_level_with_keys(args[-1])
  return tuple(x for _, x in keyed)


@adapter("jax.tree_util.is_tree_node", fns=False, diffs=ONE_SHOT)
def _is_tree_node(args, fn, fam):
  return tuple(jax.tree_util.is_tree_node(x) for x in nodes.places(args))
