# Copyright 2026 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The public pytree functions, keeping relative identities.

``jax.tree`` and ``jax.tree_util`` are where users and libraries hand trees
to JAX and get them back, so their functions keep relative identities: a
node of a class registered with ``preserve_relative_identities=True`` that a
tree holds at several places is flattened once, and comes back as one new
object at all of them. JAX's own code flattens with ``jax._src.tree_util``,
in stock's layout (see the comment on its registries).

Mapping over several trees keeps a shared node one node wherever the trees'
values cannot tell its places apart; where they can, the places are mapped
apart, as stock maps them, and get objects of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import functools
from typing import Any

from jax._src import tie_policy
from jax._src import tree_util
from jax._src.lib import pytree

# `export`: the functions below are jax.tree_util's, and say so as its
# others do.
from jax._src.tree_util import (
    KeyPath,
    Leaf,
    PyTreeDef,
    SharedPrefixError,
    T,
    Unspecified,
    export,
    default_registry,
)


@export
def tree_flatten(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[Leaf], PyTreeDef]:
  """Alias of :func:`jax.tree.flatten`."""
  return default_registry.flatten(tree, is_leaf)


@export
def tree_leaves(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> list[Leaf]:
  """Alias of :func:`jax.tree.leaves`."""
  return default_registry.flatten(tree, is_leaf)[0]


@export
def tree_structure(
    tree: Any, is_leaf: None | Callable[[Any], bool] = None
) -> PyTreeDef:
  """Alias of :func:`jax.tree.structure`."""
  return default_registry.flatten(tree, is_leaf)[1]


def _is_leaf_with_path(is_leaf, is_leaf_takes_path: bool):
  if is_leaf is None or is_leaf_takes_path:
    return is_leaf
  return lambda _, x: is_leaf(x)


@export
def tree_flatten_with_path(
    tree: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> tuple[list[tuple[KeyPath, Any]], PyTreeDef]:
  """Alias of :func:`jax.tree.flatten_with_path`."""
  return default_registry.flatten_with_path(
      tree, _is_leaf_with_path(is_leaf, is_leaf_takes_path)
  )


@export
def tree_leaves_with_path(
    tree: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> list[tuple[KeyPath, Any]]:
  """Alias of :func:`jax.tree.leaves_with_path`."""
  return tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


@export
def tree_map(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
  """Alias of :func:`jax.tree.map`."""
  leaves, treedef = default_registry.flatten(tree, is_leaf)
  try:
    all_leaves = [leaves] + [treedef.flatten_up_to(r) for r in rest]
  except Exception:  # As stock's, which words every mismatch its own way.
    all_leaves = None
  if all_leaves is None:  # Not in the handler: its errors are its own.
    return _map_where_values_agree(
        f,
        tree,
        rest,
        lambda t: tree_structure(t, is_leaf),
        lambda: tree_util.tree_flatten(tree, is_leaf),
        lambda leaves: leaves,
        lambda: tree_util.tree_map(f, tree, *rest, is_leaf=is_leaf),
    )
  return treedef.unflatten(f(*xs) for xs in zip(*all_leaves))


@export
def tree_map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Callable[..., bool] | None = None,
    is_leaf_takes_path: bool = False,
) -> Any:
  """Alias of :func:`jax.tree.map_with_path`."""
  path_leaves, treedef = tree_flatten_with_path(
      tree, is_leaf, is_leaf_takes_path
  )
  try:
    all_leaves = [treedef.flatten_up_to(r) for r in rest]
  except Exception:  # As stock's, which words every mismatch its own way.
    all_leaves = None
  if all_leaves is None:  # Not in the handler: its errors are its own.
    return _map_where_values_agree(
        lambda path_leaf, *xs: f(*path_leaf, *xs),
        tree,
        rest,
        lambda t: tree_flatten_with_path(t, is_leaf, is_leaf_takes_path)[1],
        lambda: tree_util.tree_flatten_with_path(
            tree, is_leaf, is_leaf_takes_path
        ),
        lambda path_leaves: [leaf for _, leaf in path_leaves],
        lambda: tree_util.tree_map_with_path(
            f,
            tree,
            *rest,
            is_leaf=is_leaf,
            is_leaf_takes_path=is_leaf_takes_path,
        ),
    )
  return treedef.unflatten(
      f(path, leaf, *xs) for (path, leaf), *xs in zip(path_leaves, *all_leaves)
  )


def _map_where_values_agree(
    f, tree, rest, structure_of, stock_flatten, values_of, stock_map
):
  """A map over trees that do not share alike.

  The result is laid out as the first tree. A node that it shares stays one
  node in the result where every tree holds the very same objects at all of
  its places (the same node, or nodes whose leaves are the same objects:
  nothing in the inputs tells the places apart); elsewhere the places are
  mapped apart, as stock maps them, and get objects of their own. What the
  other trees share ties nothing; a tie of any tree whose places the values
  tell apart is reported.

  `structure_of(t)` flattens a tree as the map does, keeping identities;
  `stock_flatten()` flattens the first tree as stock does (`values_of` takes
  its leaves out of what it returns) and `stock_map()` is the whole map as
  stock does it, where the trees do not even match in stock's layout (its
  error is stock's).
  """
  first_leaves, stock_treedef = stock_flatten()
  try:
    rest_leaves = [stock_treedef.flatten_up_to(r) for r in rest]
  except Exception:
    return stock_map()
  classes: dict[tuple[int, ...], int] = {}
  leaf_classes = [
      classes.setdefault(tuple(map(id, xs)), len(classes))
      for xs in zip(values_of(first_leaves), *rest_leaves)
  ]
  # The result is laid out as the first tree, so it keeps that tree's ties
  # where the values agree, and no other: places the first tree holds as
  # two objects stay two, whatever another tree shares there (a scale held
  # once and applied to two layers makes no tie of them, which would sum
  # their gradients from then on).
  kept = None
  for i, t in enumerate((tree, *rest)):
    given = structure_of(t)
    if not given.has_shared_nodes or given.unshared() != stock_treedef:
      continue
    agreed = given.sharing_where_leaves_agree(leaf_classes)
    if i == 0:
      kept = agreed
    # A tie of any tree that the values split (a hand-built mask, a spec
    # that gives the places of a shared node two values) is the user's to
    # know of; one that only the first tree's layout leaves out is not.
    tie_policy.report_split_tie(
        "jax.tree.map",
        given,
        agreed,
        root="tree" if i == 0 else f"rest[{i - 1}]",
    )
  if kept is None or not kept.has_shared_nodes:
    # Mapped apart, as stock maps, by stock's layout made anew (unshared()):
    # a treedef that carries nothing of the tie the split above undid.
    return stock_treedef.unshared().unflatten(
        f(leaf, *xs) for leaf, *xs in zip(first_leaves, *rest_leaves)
    )
  # Each of the kept treedef's leaves is mapped once, at its first place.
  first_place: dict[int, int] = {}
  for place, leaf in enumerate(kept.expansion_indices(stock_treedef)):
    first_place.setdefault(leaf, place)
  places = [first_place[leaf] for leaf in range(kept.num_leaves)]
  return kept.unflatten(
      f(first_leaves[k], *(xs[k] for xs in rest_leaves)) for k in places
  )


@export
def tree_transpose(
    outer_treedef: PyTreeDef,
    inner_treedef: PyTreeDef | None,
    pytree_to_transpose: Any,
) -> Any:
  """Alias of :func:`jax.tree.transpose`."""
  if not (
      outer_treedef.has_shared_nodes
      or (inner_treedef is not None and inner_treedef.has_shared_nodes)
  ):
    return tree_util.tree_transpose(
        outer_treedef, inner_treedef, pytree_to_transpose
    )
  # A shared node of the outer or inner treedef has its leaves once, so the
  # tree is read place by place rather than as one run of leaves.
  try:
    inner_trees = outer_treedef.flatten_up_to(pytree_to_transpose)
  except ValueError:
    # A tree that shares otherwise than outer_treedef: as stock reads it,
    # place by place.
    return tree_util.tree_transpose(
        outer_treedef.unshared(),
        None if inner_treedef is None else inner_treedef.unshared(),
        pytree_to_transpose,
    )
  if inner_treedef is None:
    inner_treedef = tree_structure(inner_trees[0])
  columns = [inner_treedef.flatten_up_to(t) for t in inner_trees]
  return inner_treedef.unflatten(
      outer_treedef.unflatten(column) for column in zip(*columns)
  )


@export
def tree_reduce(
    function: Callable[[T, Any], T],
    tree: Any,
    initializer: T | Unspecified = Unspecified(),
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
  """Alias of :func:`jax.tree.reduce`."""
  leaves = tree_leaves(tree, is_leaf)
  if isinstance(initializer, Unspecified):
    return functools.reduce(function, leaves)
  return functools.reduce(function, leaves, initializer)


@export
def tree_reduce_associative(
    operation: Callable[[T, T], T],
    tree: Any,
    *,
    identity: T | Unspecified = Unspecified(),
    is_leaf: Callable[[Any], bool] | None = None,
) -> T:
  """Alias of :func:`jax.tree.reduce_associative`."""
  return tree_util._parallel_reduce(
      tree_leaves(tree, is_leaf), operation, identity
  )


@export
def tree_all(
    tree: Any, *, is_leaf: Callable[[Any], bool] | None = None
) -> bool:
  """Alias of :func:`jax.tree.all`."""
  return all(tree_leaves(tree, is_leaf))


@export
def tree_broadcast(
    prefix_tree: Any,
    full_tree: Any,
    is_leaf: Callable[[Any], bool] | None = None,
) -> Any:
  """Alias of :func:`jax.tree.broadcast`."""
  full_treedef = tree_structure(full_tree)
  if not full_treedef.has_shared_nodes:
    return tree_util.tree_broadcast(prefix_tree, full_tree, is_leaf)
  # Over the treedef, which has each shared node's leaves once: the prefix
  # must give such a node one value wherever it reaches it.
  prefix_leaves, prefix_treedef = tree_flatten(prefix_tree, is_leaf)
  try:
    leaves = full_treedef.broadcast_flattened_prefix(
        prefix_treedef, prefix_leaves
    )
  except SharedPrefixError as e:
    raise tree_util.shared_prefix_error(
        "broadcast_prefix prefix_tree", e, tree_util.PrefixPlaces.FULL_TREE
    ) from None
  except ValueError:
    # Worded as stock words it, found over the treedef (a walk of the
    # objects would meet a shared node once per path to it).
    errors = tree_util.prefix_errors(
        prefix_tree, full_tree, is_leaf, full_treedef=full_treedef
    )
    if errors:
      raise errors[0]("broadcast_prefix prefix_tree") from None
    return tree_util.tree_broadcast(prefix_tree, full_tree, is_leaf)
  return full_treedef.unflatten(leaves)


@export
def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
  """Makes a tuple treedef from an iterable of child treedefs.

  The public :func:`jax.tree_util.treedef_tuple`: the tuple treedef is of the
  registry that keeps relative identities, as :func:`jax.tree.structure`'s
  treedefs are.
  """
  return pytree.treedef_tuple(default_registry, list(treedefs))
