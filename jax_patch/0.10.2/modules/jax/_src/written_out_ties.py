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
# WITHOUT WARRANTIES OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Ties told where JAX writes a shared node out at each place.

Inside JAX trees are laid out as stock lays them out: a flatten with the
registries of `jax._src.tree_util` writes an opted-in object that sits at
several places out once per place. Such a treedef remembers which places
were one object; its `unflatten` builds an object per place, as stock does
(so that nothing JAX computes changes: it reads the sharing of some trees
it builds, such as cotangents), and hands each object built for a later
place, beside the one built for the first, to `observe_split`. No site
needs to be listed to tell the user where such copies reach them:

- a public function (one wrapped by `traceback_util.api_boundary`) whose
  result, returned to a caller outside JAX, holds both objects of a pair
  tells the caller (`tell_split_result`), naming the places in the result;
- a function of the user's that JAX traces on arguments that hold both
  objects of a pair (`unflatten_arguments`, the arguments of
  `api_util.flatten_fun`) is told as given copies;
- a public function that JAX itself called leaves its pairs to whoever
  takes its result: where that is JAX tracing a function of the user's
  (`jax.jit(f)` or `jax.vmap(f)` of a public `f`, a `custom_vjp`), the
  traced function's result holds them, and `tell_returned_pairs` tells
  the user, naming the public function that built them apart.

The places that hand out copies on purpose (custom derivative rules)
flatten with `tree_util.tree_flatten_as_copies`, which remembers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
import sys
from typing import Any
import weakref

from jax._src import config
from jax._src import tie_policy
from jax._src import traceback_util
from jax._src import tree_util
from jax._src import tree_identities


def _held(obj: Any) -> weakref.ref | int:
  """`obj` as the record of split pairs holds it: the record lives as long
  as the outermost public call, so it keeps no object alive (the tracers of
  an inner trace, under `jax.checking_leaks`, say). A weak reference where
  the object takes one; else its id, which names it while it lives (and a
  result that holds it keeps it alive)."""
  try:
    return weakref.ref(obj)
  except TypeError:
    return id(obj)


def _id_of(held: weakref.ref | int) -> int | None:
  """The id of the object `_held` held, None if it died."""
  if isinstance(held, int):
    return held
  obj = held()
  return None if obj is None else id(obj)


def observe_split(pairs: list[tuple[Any, Any]]) -> None:
  """The registries' `tie_split_observer`: keeps the pairs an unflatten
  built apart while some public function can still tell them, each with
  the innermost public function it was built in; anywhere else nobody
  could, and they are let go."""
  calls = traceback_util.public_calls
  if calls.functions:
    function = calls.functions[-1]
    calls.split_pairs.extend((_held(a), _held(b), function) for a, b in pairs)


def _places_of_pairs(
    tree: Any, pairs: list[tuple[Any, Any, Any]]
) -> list[tuple[int, type, tuple[Any, ...], tuple[Any, ...]]]:
  """(index in `pairs`, type, first place, other place) in `tree`, as key
  paths from its root, of each pair (as `observe_split` holds them) whose
  two objects are both in it."""
  ids = [(_id_of(first), _id_of(copy)) for first, copy, _ in pairs]
  watched = {i for pair in ids for i in pair if i is not None}
  found: dict[int, tuple[tuple[Any, ...], Any]] = {}
  # Each object's first place is all that is named: a walk that keeps
  # identities meets a shared node once (stock's layout, once per place).
  for path, leaf in tree_identities.tree_flatten_with_path(
      tree, is_leaf=lambda x: id(x) in watched
  )[0]:
    if id(leaf) in watched:
      found.setdefault(id(leaf), (path, leaf))
  places = []
  for index, (first, copy) in enumerate(ids):
    if first in found and copy in found:
      (first_path, node), (copy_path, _) = found[first], found[copy]
      places.append((index, type(node), first_path, copy_path))
  return places


# The boundaries whose function is JAX's own, by the name the user calls
# them: a jitted function's call and its stages.
_PUBLIC_NAMES = {
    ("jax._src.pjit", "_cpp_pjit"): "jax.jit",
    ("jax._src.pjit", "jit_trace"): "jax.jit(...).trace",
    ("jax._src.pjit", "jit_lower"): "jax.jit(...).lower",
    ("jax._src.pjit", "jit_eval_shape"): "jax.jit(...).eval_shape",
}


def _name(function: Any) -> str:
  """The public name of a boundary's function: `jax.grad` for the function
  that `jax.grad` returns (`grad.<locals>.grad_f`)."""
  module = getattr(function, "__module__", None) or ""
  name = getattr(function, "__qualname__", None) or repr(function)
  # A call of an object of a public class (custom_vjp) is named by it.
  name = name.split(".<locals>")[0].removesuffix(".__call__")
  if (module, name) in _PUBLIC_NAMES:
    return _PUBLIC_NAMES[module, name]
  if module.startswith("jax._src."):
    # jax's top level where it exports the name (the transformations,
    # custom_vjp), else the public module that does (jax.scipy...).
    public = "jax." + module.removeprefix("jax._src.")
    on_top = getattr(sys.modules.get("jax"), name, None) is not None
    exported = getattr(sys.modules.get(public), name, None) is not None
    module = public if exported and not on_top else "jax"
  return f"{module}.{name}" if module else name


def tell_split_result(function: Any, result: Any, since: int) -> None:
  """`traceback_util.api_boundary`'s check of a public function's result:
  where it holds both objects of a pair built apart during the call, and
  the caller is not JAX itself, the caller is told."""
  if config.split_ties.value == "allow" or tie_policy._boundary_called_by_jax():
    return  # JAX's own call: the pairs are the outer public function's.
  calls = traceback_util.public_calls
  pairs = calls.split_pairs[since:]
  del calls.split_pairs[since:]
  try:
    places = _places_of_pairs(result, pairs)
  except Exception:  # pylint: disable=broad-except
    # Not a tree (a cycle of the caller's own making, a node whose flatten
    # fails): the call succeeded, and its result is the caller's to use;
    # the places cannot be named.
    return
  _tell_result_places(places, lambda _: function)


def _tell_result_places(
    places: list[tuple[int, type, tuple[Any, ...], tuple[Any, ...]]],
    function_of: Callable[[int], Any],
) -> None:
  """Tells the places (`_places_of_pairs`') of a result that a public
  function, `function_of(index of the pair)`, built apart."""
  for index, node_type, first, place in places:
    tie_policy.tell_split_tie(
        _name(function_of(index)),
        node_type,
        f"result{tree_util.keystr(first)}",
        f"result{tree_util.keystr(place)}",
        given_as="the trees it computed them from",
        cause="It wrote the object out once per place, as stock JAX sees "
        "it, and computed each place apart.",
    )


def unflatten_arguments(
    treedef: tree_util.PyTreeDef, leaves: Any, with_kwargs: bool
) -> Any:
  """`treedef.unflatten(leaves)`: the arguments of a function of the user's
  that JAX traces, a tuple of positional ones, or with `with_kwargs` a
  pair of that tuple and a dict of keyword ones. If a node the caller
  passed as one object comes out as one object per place (the tracers of
  its places differ), the caller is told that the function gets copies."""
  calls = traceback_util.public_calls
  if not calls.functions:
    # Traced by no public function (a helper of JAX's own, such as
    # closure_convert, which tells its splits itself): nobody to name.
    return treedef.unflatten(leaves)
  since = len(calls.split_pairs)
  arguments = treedef.unflatten(leaves)
  if len(calls.split_pairs) == since:
    return arguments
  pairs = calls.split_pairs[since:]
  del calls.split_pairs[since:]
  if config.split_ties.value == "allow" or tie_policy._boundary_called_by_jax():
    # JAX's own call hands copies on purpose (odeint's to jax.vjp).
    return arguments

  def name(path: tuple[Any, ...]) -> str:
    if with_kwargs:
      root, path = ("args", "kwargs")[path[0].idx], path[1:]
    else:
      root = "args"
    return root + tree_util.keystr(path)

  for _, node_type, first, place in _places_of_pairs(arguments, pairs):
    tie_policy.tell_split_tie(
        _name(calls.functions[-1]),
        node_type,
        name(first),
        name(place),
        result_as="the arguments it traces your function on",
        cause="It wrote the object out once per place, as stock JAX sees "
        "it, with a tracer per place.",
    )
  return arguments


def tell_returned_pairs(result: Any) -> None:
  """Tells the user where `result`, what a function of the user's that JAX
  traces returned, holds both objects of a pair that a public function
  JAX itself called built apart (`jax.jit(f)` of a `custom_vjp` `f`, which
  returns one object at two places): that function left its pairs to
  whoever takes its result, and here the user does."""
  calls = traceback_util.public_calls
  if not calls.split_pairs or config.split_ties.value == "allow":
    return
  try:
    places = _places_of_pairs(result, calls.split_pairs)
  except Exception:  # pylint: disable=broad-except
    return  # Not a tree: the caller's own checks say so.
  _tell_result_places(places, lambda index: calls.split_pairs[index][2])
  told = {index for index, *_ in places}
  calls.split_pairs[:] = [
      pair for index, pair in enumerate(calls.split_pairs) if index not in told
  ]


traceback_util.split_results_hook = tell_split_result
for _registry in (
    tree_util.stock_layout_registry,
    tree_util.none_leaf_registry,
    tree_util.tracing_registry,
):
  _registry.tie_split_observer = observe_split
