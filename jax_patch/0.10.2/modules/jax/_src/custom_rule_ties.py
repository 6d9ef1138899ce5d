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
"""Ties through custom rules: what custom_jvp and custom_vjp do where their
arguments hold one opted-in object at several places.

The function itself sees its arguments as given; the rules get a copy per
place, as stock gives them, so that a rule written per position computes
stock's values. What the call returns keeps the ties the function returned,
and a fwd rule that fails on the copies, after using a structure traced
on the tied arguments, with the error of a structure that does not fit
(a ValueError or TypeError) runs again on the ties
(``TiedArguments.run_fwd_on_ties``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import contextlib
import threading
from typing import Any

from jax._src import linear_util as lu
from jax._src import tie_policy
from jax._src import traceback_util
from jax._src import tree_util
from jax._src.ad_util import SymbolicZero
from jax._src.tree_util import PyTreeDef, tree_flatten, tree_unflatten

# Its frames run the user's rules, as custom_derivatives' do: filtered out of
# the tracebacks users see.
traceback_util.register_exclusion(__file__)


@lu.transformation2
def leaves_as_given(
    f: Callable, in_tree: PyTreeDef, given_tree: PyTreeDef, *args_flat
):
  return f(*one_value_per_node(given_tree, in_tree, args_flat))


def one_value_per_node(
    treedef: PyTreeDef, places: PyTreeDef, values: Sequence[Any]
) -> list[Any]:
  """One value per leaf of ``treedef`` from ``values``, one per leaf of
  ``places`` (its layout with a copy per place), where the places of a
  shared node hold one value (traced apart, each place is a tracer of it):
  any of them stands for the node."""
  leaves, _ = tree_util.leaves_where_places_agree(
      treedef, places, values, lambda *_: True
  )
  return leaves


class ResultSharing:
  """Where a custom function's arguments share, the sharing of what it
  returned (or its rule returned as its primal result): one object at
  several places of the result is one value at each, so the call's result
  keeps it one object."""

  def __init__(self):
    self.output_given: PyTreeDef | None = None

  def note_result(self, result: Any) -> None:
    output_given = tree_util.default_registry.flatten(result)[1]
    if output_given.has_shared_nodes:
      self.output_given = output_given

  def result(self, out_tree: PyTreeDef, out_flat: Sequence[Any]) -> Any:
    """The call's result, tied as it was returned: one place of a node
    stands for the others (its other places' cotangents are zero, and rules
    are linear in them; its tangents are one, a value's)."""
    return tree_unflatten(
        self.output_given,
        one_value_per_node(self.output_given, out_tree, out_flat),
    )


class TiedArguments(ResultSharing):
  """The arguments of one custom_vjp call that share a node, and whether its
  rules compute with the tie.

  The rules get a copy per place, as stock gives them, so that a rule written
  per position computes stock's values. A fwd rule that raises on the copies
  the error of a tied structure that does not fit them has met the tie some
  other way:
  through a function traced on the caller's arguments before the call (a closure conversion, as in Equinox's
  checkpointed while_loop), which takes the shared node as one input. It
  runs again on the arguments as given, as the custom function itself does,
  and from then on this call's rules compute with the ties, as ``jax.vjp``
  does: the residuals keep their sharing, and a node that is one object has
  one cotangent, the sum over its places (places holding the very same
  object count once), in what the bwd rule is given (fwd's result) and in
  what it returns. So do the rules of every custom_vjp called while such
  rules run; its primitive takes and returns a shared node's leaves once
  (``primitive_shares``), so that its result keeps the sharing too.
  """

  _rules_running = threading.local()

  def __init__(
      self, given: PyTreeDef, copies: PyTreeDef, primitive_shares: bool
  ):
    super().__init__()
    self.given = given
    self.copies = copies  # A copy per place, stock's layout.
    self.primitive_shares = primitive_shares
    self.rules_see_ties = primitive_shares

  @classmethod
  def inside_tied_rule(cls) -> bool:
    return getattr(cls._rules_running, "depth", 0) > 0

  @contextlib.contextmanager
  def rules_running(self) -> Iterator[None]:
    running = type(self)._rules_running
    running.depth = getattr(running, "depth", 0) + 1
    try:
      yield
    finally:
      running.depth -= 1

  def as_given(self, args_flat: Sequence[Any]) -> Any:
    return tree_unflatten(
        self.given, one_value_per_node(self.given, self.copies, args_flat)
    )

  def run_fwd_on_ties(
      self, f: Callable, args_flat: Sequence[Any], on_copies: Exception
  ) -> Any:
    """Runs a fwd rule that raised ``on_copies`` after using a structure
    traced on the caller's tied arguments (it unflattened or compared a
    treedef that shares, which the module counts) again on the arguments as
    given; from then on this call's rules compute with the ties. Only a
    ValueError or TypeError, what a structure that does not fit raises (a
    leaf count, an arity, a treedef comparison), is taken for the tie's:
    any other error is the rule's own, raised as it is by the caller with
    the rule run once."""
    try:
      with self.rules_running():
        pair_out = f(*self.as_given(args_flat))
    except Exception:
      raise on_copies from None
    self.rules_see_ties = True
    return pair_out

  def flatten_fwd_output(
      self, primals_out: Any, res: Any
  ) -> tuple[list[Any], PyTreeDef, list[Any], PyTreeDef]:
    flatten = tree_util.default_registry.flatten
    if self.primitive_shares:
      primals_flat, out_tree = flatten(primals_out)
    else:
      primals_flat, out_tree = tree_flatten(primals_out)
      self.note_result(primals_out)
    return (primals_flat, out_tree, *flatten(res))

  def output_cotangents(
      self, out_tree: PyTreeDef, cts_out: Sequence[Any]
  ) -> Any:
    if self.output_given is None:
      return tree_unflatten(out_tree, cts_out)
    sums = tree_util.sum_over_places(
        self.output_given, out_tree, cts_out, add_cotangents()
    )
    return tree_unflatten(self.output_given, sums)

  def input_cotangents(
      self, cts: Sequence[Any], keypaths: Sequence[Any], zero: object
  ) -> tuple[list[Any], list[Any]]:
    """The cotangents of the primitive's inputs, from ``cts`` and
    ``keypaths``, one per place of the arguments."""
    sums = tree_util.sum_over_places(
        self.given, self.copies, cts, add_cotangents(zero)
    )
    leaf_of_place = self.given.expansion_indices(self.copies)
    if self.primitive_shares:
      first_path: dict[int, Any] = {}
      for leaf, path in zip(leaf_of_place, keypaths):
        first_path.setdefault(leaf, path)
      return sums, [first_path[leaf] for leaf in range(len(sums))]
    read: set[int] = set()
    by_place = []
    for leaf in leaf_of_place:
      by_place.append(zero if leaf in read else sums[leaf])
      read.add(leaf)
    return by_place, list(keypaths)


def add_cotangents(zero: object = None) -> Callable[[Any, Any], Any]:
  def add(x, y):
    if x is zero or type(x) is SymbolicZero:
      return y
    return x if y is zero or type(y) is SymbolicZero else x + y

  return add


@lu.transformation2
def noting_result(f: Callable, sharing: ResultSharing, *args):
  result = f(*args)
  sharing.note_result(result)
  return result


@lu.transformation2
def noting_copies(
    f: Callable,
    rule: str,
    given_tree: PyTreeDef,
    in_tree: PyTreeDef,
    positions: Sequence[int],
    *args,
):
  try:
    return f(*args)
  except Exception as error:
    tie_policy.note_rule_given_copies(
        error, rule, given_tree, in_tree, positions
    )
    raise
