"""The oracle of the public-surface test: a result with the opt-in against
the same program's on twins not opted in, or on stock JAX.

The reference is read in stock's layout, one value per place (what
`reference` returns, and what the stock child prints as JSON); the result
with the opt-in is read the same way, and each part is compared as its kind
says (`surface_programs.Part`).
"""

import numpy as np

import surface_nodes as nodes
import surface_programs as programs

RTOL, ATOL = 1e-4, 1e-5


def reference(result):
  """The result as plain data, per part: its kind and its places' values."""
  return [
      {"kind": p.kind, "places": [nodes.as_plain(x) for x in _leaves(p)]}
      for p in programs.parts(result)
  ]


def _leaves(part):
  if part.kind == "unique":
    return part.value
  return nodes.places(part.value)


def _group_keys(tree, is_leaf=None):
  return [group for _, group, _ in nodes.places_with_groups(tree, is_leaf)]


def _expected(part, ref_places):
  """What `part`'s places must hold, from the reference's places."""
  if part.kind == "same":
    return ref_places
  if part.kind == "summed":
    keys = _group_keys(part.inputs[0])
    if part.depth == 2:
      keys = [(a, b) for a in keys for b in keys]
    _same_count(keys, ref_places, "places of the derivative")
    totals = {}
    for key, value in zip(keys, ref_places):
      totals[key] = totals.get(key, 0) + np.asarray(value, np.float64)
    return [totals[key] for key in keys]
  keys = list(zip(*(_group_keys(t, part.is_leaf) for t in part.inputs)))
  _same_count(keys, ref_places, "places of the inputs")
  if part.kind == "first":
    firsts = {}
    return [ref_places[firsts.setdefault(key, i)] for i, key in enumerate(keys)]
  if part.kind == "unique":
    seen = set()
    kept = []
    for key, value in zip(keys, ref_places):
      if key not in seen:
        seen.add(key)
        kept.append(value)
    return kept
  raise ValueError(part.kind)


def _same_count(keys, ref_places, what):
  if len(keys) != len(ref_places):
    raise AssertionError(
        f"{len(ref_places)} reference places for {len(keys)} {what}"
    )


def check(result, ref):
  """Raises AssertionError where `result` (with the opt-in) differs from
  `ref` (`reference` of the same program on the twins, or stock's)."""
  ours = programs.parts(result)
  if len(ours) != len(ref):
    raise AssertionError(f"{len(ours)} parts, reference has {len(ref)}")
  for n, (part, theirs) in enumerate(zip(ours, ref)):
    if part.kind != theirs["kind"]:
      raise AssertionError(f"part {n}: {part.kind} vs {theirs['kind']}")
    mine = [nodes.as_plain(x) for x in _leaves(part)]
    expected = _expected(part, theirs["places"])
    if len(mine) != len(expected):
      raise AssertionError(
          f"part {n} ({part.kind}): {len(mine)} places, expected "
          f"{len(expected)}:\n  ours:     {mine}\n  expected: {expected}"
      )
    for i, (x, y) in enumerate(zip(mine, expected)):
      if not _equal(x, y):
        raise AssertionError(
            f"part {n} ({part.kind}) place {i}: {x!r} != expected {y!r}\n"
            f"  ours:     {mine}\n  expected: {expected}"
        )
    if part.kind == "summed" and part.depth == 1:
      _check_tied(part, n)


def _check_tied(part, n):
  """A derivative with respect to a tied node is one object (one gradient
  for one variable), as `grad` returns it."""
  keys = _group_keys(part.inputs[0])
  leaves = nodes.places(part.value)
  first = {}
  for i, (key, leaf) in enumerate(zip(keys, leaves)):
    j = first.setdefault(key, i)
    if leaves[j] is not leaf:
      raise AssertionError(
          f"part {n} (summed): the derivative at places {j} and {i}, which "
          "are one node in the input, is two objects"
      )


def _equal(x, y):
  if isinstance(x, (str, dict)) or isinstance(y, (str, dict)):
    return x == y
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return x.shape == y.shape and np.allclose(x, y, rtol=RTOL, atol=ATOL)


def _labels(tree):
  """The places of `tree` (stock's order): their paths, and a label per
  place that two places share when they hold one leaf of one node object."""
  groups = {}
  found = nodes.places_with_groups(tree)
  paths = [path for _, _, path in found]
  return paths, [groups.setdefault(group, len(groups)) for _, group, _ in found]


def check_ties(result, args, told, as_given):
  """Raises AssertionError where a `same` part of `result` has the places
  of `args` (or of one argument) and holds two objects where that input
  held one, unless the call told of a split (`told`, its warnings). With
  `as_given` (an API that takes no user function) a part is that input
  only where it holds the input's values."""
  if told:
    return
  inputs = [args, *args]
  for n, part in enumerate(programs.parts(result)):
    if part.kind != "same":
      continue
    paths, got = _labels(part.value)
    for given in inputs:
      given_paths, expected = _labels(given)
      if given_paths != paths or (
          as_given and not _same_values(part.value, given)
      ):
        continue
      first = {}
      for i, label in enumerate(expected):
        j = first.setdefault(label, i)
        if got[i] != got[j]:
          raise AssertionError(
              f"part {n}: places {paths[j]} and {paths[i]} are one object in "
              "the input and two in the result, and the call said nothing"
          )
      break


def _same_values(a, b):
  return all(
      _equal(nodes.as_plain(x), nodes.as_plain(y))
      for x, y in zip(nodes.places(a), nodes.places(b))
  )
