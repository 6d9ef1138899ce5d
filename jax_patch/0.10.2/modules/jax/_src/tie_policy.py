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
"""The tie policy: what decides whether a tie is kept, and what the user is
told where one is lost.

A node of a class opted in to relative identities that a tree holds at
several places (a *tie*) is kept one object by the flattens that keep
relative identities, and written out once per place by those that lay
trees out as stock does. Where JAX builds a tie apart (*splits* it), or
keeps one that a library's base class opted in, the functions below tell
the user, at the user's line, as `jax_split_ties` says; they are the one
place that decides *telling*.

Every switch that decides keeping or telling, with its parts and where each
lives (the project's tests read this list: each part must exist in its
file, and each piece of module-level or thread-local state that the series
or the C++ module adds must be named here, or be said to decide nothing):

The opt-in: which classes can be kept one object.
  - `CheckRegistrationFlag` in `jaxlib_patch/module.cc`: the class's flag.
  - `OptInRelativeIdentities` in `jaxlib_patch/registry.cc`: a base's.
  - `has_opt_ins_` in `jaxlib_patch/pytree.h`: nothing opted in yet, so
    nothing to keep (the jit front door's fast path).
  - `built_by_unflatten` in `jaxlib_patch/pytree.h`: objects of a class
    built apart before it was opted in, told at the opt-in.

The layout of a flatten: whether it keeps the ties it meets.
  - `twin` in `jax/_src/tree_util.py`: each registry with a twin that
    lays trees out as stock; a call site names the twin it flattens with.
  - `in_layout_of` in `jax/_src/tree_util.py`: results laid out as the
    arguments were (a function's results beside its arguments).
  - `IdentityScopes` in `jax/_src/api_util.py`: one identity scope per
    call or per argument (where two arguments may share).
  - `stock_layout_depth` in `jaxlib_patch/pytree.h`: a stock-layout
    section of this thread (custom rules, callbacks), where the identity
    registries lay trees out as stock.
  - `open_stock_layout_sections` in `jaxlib_patch/pytree.h`: the count
    that lets a flatten skip reading stock_layout_depth.
  - `Repeats` in `jaxlib_patch/flatten.cc`: a repeat referenced, written
    out and recorded (to tell a split), or written out.

The values rule: a result of several trees keeps what their values agree on.
  - `leaves_where_places_agree` in `jax/_src/tree_util.py`.

Custom rules: they get a copy per place, as on stock.
  - `tree_flatten_as_copies` in `jax/_src/tree_util.py`.
  - `_rules_running` in `jax/_src/custom_rule_ties.py`: rules running on
    the ties, after one failed on a structure traced on them.
  - `tied_treedefs_met` in `jaxlib_patch/pytree.h`: a rule's uses of
    such a structure, counted; a ValueError or TypeError after one reruns
    the rule on the ties, any other error is raised as on stock.

The user's setting: `jax_split_ties`, 'warn', 'raise' or 'allow'.
  - `split_ties` in `jax/_src/config.py`.

Whose tie it is, and at which line the user is told.
  - `_called_by_library` in `jax/_src/tie_policy.py`: a loop or branch
    that JAX or an installed package called splits its own aliasing.
  - `_one_place_in_two_slots` in `jax/_src/tie_policy.py`: one subtree
    held in two slots of a carry (an optimizer's memory).
  - `_in_a_librarys_record` in `jax/_src/tie_policy.py`: two fields of a
    library's namedtuple.
  - `held_twice` in `jax/_src/tree_util.py`: a tree held twice by the
    code that built the tuple, not tied by the user's model.
  - `_boundary_called_by_jax` in `jax/_src/tie_policy.py`: a public
    function that JAX called leaves its splits to its caller.
  - `_users_level` in `jax/_src/tie_policy.py`: the stack level of the
    user's line; Python's `warnings` then decides how often it is told.
  - `_bases_told` in `jax/_src/tie_policy.py`: a library base class's
    ties told once per base.
  - `tie_reported` in `jaxlib_patch/pytree.h`: the module's half of it: a
    base's first tie handed to `inherited_tie_observer` once.
  - `inherited_tie_declined` in `jaxlib_patch/pytree.h`: a class whose tie
    the observer declined (a library's aliasing) is not handed to it again.

Splits nobody listed: recorded where built apart, told where they surface.
  - `tie_split_observer` in `jax/_src/written_out_ties.py`: the pairs an
    unflatten built apart.
  - `_PublicCalls` in `jax/_src/traceback_util.py`: `public_calls`, the
    public functions this thread is in, and their pairs (weakly held).
  - `split_results_hook` in `jax/_src/traceback_util.py`: where a public
    function's result that holds a pair is told.
  - `inherited_tie_observer` in `jax/_src/tie_policy.py`: a tie that a
    library's base class opted in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import os
import sys
from typing import Any
import warnings

from jax._src import config
from jax._src import traceback_util
from jax._src import tree_identities
from jax._src import tree_util

# `export`: the functions below are jax.tree_util's, and say so as its
# others do.
from jax._src.tree_util import (
    KeyPath,
    PyTreeDef,
    SharedPrefixError,
    export,
    default_registry,
)


@export
class SplitTieWarning(UserWarning):
  """A node that was one object at several places of a tree the user handed
  over came back as several objects (``jax_split_ties='warn'``)."""


@export
class SplitTieError(ValueError):
  """The same, where ``jax_split_ties='raise'``."""


@export
class LateOptInWarning(UserWarning):
  """A class was opted in to relative identities (by
  :func:`~jax.tree_util.preserve_relative_identities`) after JAX had rebuilt
  trees that held its objects at several places: those trees keep an object
  per place, as stock JAX built them."""


def _public_name(cls: type) -> str:
  """The shortest name a package of its module exports `cls` under
  (`equinox.Module`, `flax.nnx.Pytree`), else its module's and its name."""
  parts = cls.__module__.split(".")
  for end in range(1, len(parts) + 1):
    module = ".".join(parts[:end])
    if getattr(sys.modules.get(module), cls.__qualname__, None) is cls:
      return f"{module}.{cls.__qualname__}"
  return f"{cls.__module__}.{cls.__qualname__}"


def tell_late_opt_in(cls: type, built_before: Sequence[type]) -> None:
  """Warns, at the user's line, that opting `cls` in comes after JAX rebuilt
  trees that held objects of `built_before` (classes it opts in) at several
  places: nothing can tell those copies from objects the user made apart."""
  names = ", ".join(sorted(t.__name__ for t in built_before))
  warnings.warn(
      f"preserve_relative_identities({_public_name(cls)}) comes after JAX "
      f"rebuilt trees that hold {names} at several places: a tree that came "
      "out of such a call (a transformation's result, jax.tree.map) has an "
      "object of its own at each place where the tree it was made from had "
      "one, as in stock JAX, and keeps them apart. Opt the class in before "
      "making or transforming its instances (a library's base class right "
      "after importing the library), or make such trees again after this "
      "call. warnings.filterwarnings('ignore', "
      "category=jax.tree_util.LateOptInWarning) silences it.",
      LateOptInWarning,
      stacklevel=_users_level(),
  )


@export
class TiedByOptInWarning(UserWarning):
  """An object of a class opted in through a library's base class (given to
  :func:`~jax.tree_util.preserve_relative_identities`, such as
  ``equinox.Module``) sat at several places of a tree and is kept one node,
  where stock JAX, and code written for it, gives each place a copy. Given
  once per such base class, for the first object met."""


_bases_told: set[type] = set()


def _defined_in_installed_package(cls: type) -> bool:
  return _is_installed(
      getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
  )


def _in_a_librarys_record(tree: Any, first: KeyPath, place: KeyPath) -> bool:
  """Whether the nearest node that holds both places is a namedtuple of an
  installed package: a library's record of its own state, which holds one
  object in two fields on purpose (optax.lbfgs's `grad` and `safe_grad`)."""
  common = 0
  while common < min(len(first), len(place)) and first[common] == place[common]:
    common += 1
  holder = tree
  try:
    for key in first[:common]:
      children, _ = tree_util.flatten_one_level_with_keys(holder)
      holder = next(child for k, child in children if k == key)
  except (ValueError, StopIteration):
    return False  # Not to be walked again as it was flattened: told.
  return (
      isinstance(holder, tuple)
      and hasattr(type(holder), "_fields")
      and _defined_in_installed_package(type(holder))
  )


def tell_tie_by_opt_in(tree: Any, node: Any, base: type) -> bool:
  """The identity registries' `inherited_tie_observer`: the module hands it
  the first object of a class opted in by `base` that a flatten met at two
  places of `tree`. Opting in the base class of an installed library changes
  code written for stock's copies (a layer held at two places that was meant
  to train as two), so the user is told, at their line, with the fix.
  False declines the object (one place in two slots, or two fields of a
  library's record: a library's aliasing), and the module hands over the
  base's next tie, of another class."""
  if base in _bases_told or not _defined_in_installed_package(base):
    # Told by another registry (each reports its first); or the user's own
    # base class, whose subclasses are the user's to have written for ties.
    return True
  paths = [
      path
      for path, leaf in tree_identities.tree_flatten_with_path(
          tree, is_leaf=lambda x: x is node
      )[0]
      if leaf is node
  ]
  if _one_place_in_two_slots(
      paths[0], paths[1], isinstance(tree, (tuple, list))
  ) or _in_a_librarys_record(tree, paths[0], paths[1]):
    return False
  _bases_told.add(base)
  first, second = (tree_util.keystr(path) or "the root" for path in paths[:2])
  message = (
      f"The {type(node).__name__} at {first} and {second} is one object, "
      "and is kept one node there: preserve_relative_identities("
      f"{_public_name(base)}) opted its class in. Stock JAX "
      "gives each place a copy of its own, which train apart; these places "
      "share one gradient and one update. If they are meant to be "
      "independent, give each place its own object (copy.copy) or untie the "
      "tree once with jax.tree_util.tree_unshare. If the tie is meant, "
      "nothing is wrong: this is said once, for the first such object of "
      "its base class; "
      "warnings.filterwarnings('ignore', "
      "category=jax.tree_util.TiedByOptInWarning) silences it."
  )
  warnings.warn(message, TiedByOptInWarning, stacklevel=_users_level())
  return True


def report_split_tie(
    operation: str,
    given: PyTreeDef,
    result: PyTreeDef,
    root: str = "tree",
    users_call_only: bool = False,
    cause: str | None = None,
    given_as: str = "what it was given",
    made_by_holding: Callable[[KeyPath, KeyPath], bool] | None = None,
) -> None:
  """Tells the user, as `jax_split_ties` says, where a node shared in
  `given` (a tree the user handed to `operation`) is two objects in
  `result`, the same tree: a tie the user made is dropped from there on.
  `cause` says why `operation` splits ties, where the usual causes (a tree
  built before the opt-in, a hand-built mask) are not why; `given_as` names
  `given` in the message.

  `made_by_holding(first, place)` traces the places of a tie to the code
  that made it (`tree_util.held_twice` on the tree `given` lays out): where
  both run through one container that does not keep identities, whoever
  holds that tree twice made the tie, not the user's model, and it is not
  told.

  With `users_call_only` (loops), nothing is said where `operation` was
  called by JAX itself or by an installed library: a solver's carry aliases
  one object in two slots (`p = r`) by design, and splits it.
  """
  if not given.has_shared_nodes or config.split_ties.value == "allow":
    return
  if users_call_only and _called_by_library():
    return
  try:
    differences = given.sharing_differences(result)
  except ValueError:
    return  # Not one tree: the caller reports that its own way.
  for path, node_type, first, kept_with in differences:
    # Every tie split there: each place where a node parts from the place it
    # was first met at. Not a place the result shares more at (no `first`),
    # nor one it still ties to an earlier place (`kept_with`): that place
    # parted with the first of its group, told there.
    if (
        first is None
        or kept_with is not None
        or _one_place_in_two_slots(first, path, _holds_slots(given))
        or made_by_holding is not None
        and made_by_holding(first, path)
    ):
      continue
    tell_split_tie(
        operation,
        node_type,
        f"{root}{tree_util.keystr(first)}",
        f"{root}{tree_util.keystr(path)}",
        given_as=given_as,
        cause=cause,
    )


def tell_split_tie(
    operation: str,
    node_type: type,
    first: str,
    place: str,
    given_as: str = "what it was given",
    cause: str | None = None,
    result_as: str = "its result",
) -> None:
  """Warns, or raises under ``jax_split_ties='raise'``, that the node of
  type `node_type` at `first` and `place` was one object in `given_as` and
  is two in `result_as`, at the user's line that led here.

  How often is Python's `warnings` to decide, as for any warning: by default
  once per line of the user's and message (a library's maps of one split,
  Equinox's filter_vmap maps the user's arguments thrice, are told once at
  the user's call), and as the filters say (`'error'` raises at every call,
  `'ignore'` hides it without keeping it from being told later)."""
  message = (
      f"{operation} split a tie: the {node_type.__name__} at {first} and "
      f"{place} is one object in {given_as}, and two objects in "
      f"{result_as}, which from here on are updated apart. "
      + (
          cause
          or "Usual causes: a tree built before the class was opted in to relative "
          "identities (an optimizer state, say), or a mask or label tree built "
          "by hand with a node per place that gives the places different "
          "values."
      )
      + " "
  )
  if config.split_ties.value == "raise":
    raise SplitTieError(
        message + "It is an error under jax_split_ties='raise'; "
        "jax.config.update('jax_split_ties', 'warn') makes it a warning, "
        "'allow' silences it."
    )
  message += (
      "jax.config.update('jax_split_ties', 'raise') makes this an "
      "error, 'allow' silences it."
  )
  warnings.warn(message, SplitTieWarning, stacklevel=_users_level())


def report_split_results(
    operation: str,
    given: PyTreeDef,
    result: PyTreeDef,
    root: str,
    cause: str,
    users_call_only: bool = False,
) -> None:
  """Tells the user where `result`, what the user's function returned,
  holds apart the places of a node that its arguments share: `given`, the
  tree of the tuple of them, returned as a whole, or of its one argument."""
  report_split_tie(
      operation,
      given,
      result,
      root=root,
      users_call_only=users_call_only,
      cause=cause,
  )
  children = given.children()
  if len(children) == 1:
    report_split_tie(
        operation,
        children[0],
        result,
        root=f"{root}[0]",
        users_call_only=users_call_only,
        cause=cause,
    )


def _one_place_in_two_slots(
    first: KeyPath, place: KeyPath, root_holds_slots: bool
) -> bool:
  """Whether key paths `first` and `place` are the same place in two slots:
  one subtree held in both (an optimizer's memory, a solver's p = r), which
  code aliases on purpose and updates apart; not a tie between two places of
  the user's model. A node that is a whole slot counts where a library
  fills the slots of a tuple or list (`root_holds_slots`) side by side
  (optax.lbfgs's two memories of one initial object); the user's own tuple
  of elements is the user's tie."""
  return (
      len(place) == len(first)
      and place[1:] == first[1:]
      and (len(place) >= 2 or (root_holds_slots and _called_by_package()))
  )


def _holds_slots(treedef: PyTreeDef) -> bool:
  """Whether ``treedef``'s root is a tuple or a list (a namedtuple
  included): slots that code fills side by side, not a class of the user's."""
  root_type, _ = treedef.node_data() or (None, None)
  return isinstance(root_type, type) and issubclass(root_type, (tuple, list))


def note_rule_given_copies(
    error: BaseException,
    rule: str,
    given: PyTreeDef,
    copies: PyTreeDef,
    positions: Sequence[int],
) -> None:
  """Notes on `error`, raised by `rule`, the first node that the caller
  passed as one object at several places of the arguments (`given`, which
  shares) and the rule got as a copy per place (`copies`, stock's layout,
  as custom rules get their arguments). A function traced on the caller's
  arguments before the rule ran takes one input for such a node, and fails
  on the copies; the error itself names neither. `positions` are the
  positional indices of `given`'s children among the call's arguments."""
  path, node_type, first, _ = given.sharing_difference(copies)

  def place(keys: tuple[Any, ...]) -> str:
    return f"args[{positions[keys[0].idx]}]{tree_util.keystr(keys[1:])}"

  error.add_note(
      f"The caller passed the {node_type.__name__} at {place(first)} and "
      f"{place(path)} as one object; {rule} got a copy of it at each place, "
      f"as stock JAX gives a custom rule its arguments. A function traced on "
      f"the caller's arguments before the rule ran (a closure conversion, "
      f"such as the body of an Equinox checkpointed while_loop) takes that "
      f"object as one input and fails on the copies. Giving the places "
      f"objects of their own computes what stock JAX computes."
  )


class SplitSpecError(SplitTieError, SharedPrefixError):
  """A spec that gives the places of a shared node two values: a prefix
  conflict that would split a tie, so that either ``except`` finds it."""


def refuse_split_prefix(error: SharedPrefixError) -> None:
  """Raises `error` (a spec that gives the places of a node shared among a
  call's arguments two values, worded in the user's terms) as a
  SplitSpecError, unless `jax_split_ties='allow'`: then the caller gives
  each place a copy of the node, as stock JAX sees it."""
  if config.split_ties.value == "allow":
    return
  refusal = SplitSpecError(
      f"{error.args[0]} Or jax.config.update('jax_split_ties', 'allow') "
      "gives each place a copy of the node, as stock JAX does, updated apart "
      "from then on."
  )
  refusal.paths, refusal.values = error.paths, error.values
  raise refusal from None


_JAX_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The modules of the operations that tell only the user's calls: loops and
# branches, closure_convert.
_USERS_CALL_ONLY = (
    os.path.join(_JAX_PACKAGE, "_src", "lax", "control_flow"),
    os.path.join(_JAX_PACKAGE, "_src", "custom_derivatives.py"),
)


# Frames that stand between a public API function and its caller.
_WRAPPERS = tuple(
    os.path.join(_JAX_PACKAGE, "_src", name)
    for name in ("traceback_util.py", "source_info_util.py", "api.py")
)


def _outer_frame(skipped: Callable[[str], bool]) -> tuple[Any, int]:
  """The innermost frame, from the caller of this function's caller
  outward, whose file `skipped` does not name (None if none), and its
  stacklevel for a warning issued from that caller's caller (1: there)."""
  frame, level = sys._getframe(2), 1
  while frame is not None and skipped(frame.f_code.co_filename):
    frame, level = frame.f_back, level + 1
  return frame, level


def _in_jax(filename: str) -> bool:
  return filename.startswith(_JAX_PACKAGE + os.sep)


def _is_installed(filename: str) -> bool:
  return (
      f"{os.sep}site-packages{os.sep}" in filename
      or f"{os.sep}dist-packages{os.sep}" in filename
  )


def _called_by_library() -> bool:
  """Whether the loop (or other operation of _USERS_CALL_ONLY) being traced
  was called by JAX's own code or by an installed package (site-packages,
  dist-packages), not by the user."""
  frame, _ = _outer_frame(
      lambda name: name.startswith((*_USERS_CALL_ONLY, __file__, *_WRAPPERS))
  )
  if frame is None:
    return True
  filename = frame.f_code.co_filename
  return _in_jax(filename) or _is_installed(filename)


def _boundary_called_by_jax() -> bool:
  """Whether the innermost public function this thread is in (the
  innermost `traceback_util.api_boundary` on the stack) was called by JAX's
  own code, which prepared its arguments and takes its result."""
  frame = sys._getframe(1)
  while frame is not None and not (
      frame.f_code is traceback_util.boundary_code
  ):
    frame = frame.f_back
  caller = None if frame is None else frame.f_back
  return caller is not None and _in_jax(caller.f_code.co_filename)


def _called_by_package() -> bool:
  """Whether the innermost frame outside the jax package (the code that
  called into JAX) is an installed package's, not the user's."""
  frame, _ = _outer_frame(_in_jax)
  return frame is not None and _is_installed(frame.f_code.co_filename)


def _users_level() -> int:
  """The stacklevel of the user's line that led to this call: the innermost
  frame outside the jax package and installed packages (a library's call
  into JAX is told at the user's line that made it), else outside jax."""
  frame, level = _outer_frame(lambda name: _in_jax(name) or _is_installed(name))
  if frame is None:
    _, level = _outer_frame(_in_jax)
  return level


for _registry in (
    default_registry,
    tree_util.identity_none_leaf_registry,
    tree_util.identity_tracing_registry,
):
  _registry.inherited_tie_observer = tell_tie_by_opt_in
