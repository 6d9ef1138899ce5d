"""bench_pytree.py's plain-tree grid (--grid): flat lists, tuples and dicts
of ints, floats, one numpy array and None, nested namedtuples, custom pairs
and a mixed model-like tree, at 10 to 100,000 leaves, stock against ours;
and an opted-in model of 2,000 distinct pairs, nothing shared. No tree of it
holds a node of an opted-in class but the last.
"""

import collections
import functools
import math

import numpy as np
from jaxlib._jax import pytree as stock_pytree

import jaxlib_patch.pytree as our_pytree

OPS = ("flatten", "unflatten", "flatten_up_to")

GRID_SIZES = (10, 100, 1_000, 10_000, 100_000)
GRID_OPS = OPS + ("hash_eq",)
GridNT = collections.namedtuple("GridNT", "a b c")


class Pair:
  """A custom node with two children."""

  def __init__(self, a, b):
    self.a = a
    self.b = b


def pair_to_iterable(pair):
  return (pair.a, pair.b), None


def pair_from_iterable(_aux, children):
  return Pair(*children)


def _namedtuples(depth):
  return 1.0 if depth == 0 else GridNT(*(_namedtuples(depth - 1),) * 3)


def _mixed(n):
  """A model-like tree of about n leaves: layers of arrays, floats, None."""
  layer = lambda i: {
      "w": np.zeros(4),
      "b": float(i),
      "scale": None,
      "extra": (i, np.ones(2)),
  }
  return {"layers": [layer(i) for i in range(max(1, n // 4))], "step": 0}


def make_grid():
  """Workload label -> plain tree (no node of an opted-in class)."""
  array = np.zeros(3)
  leaf_kinds = {
      "ints": lambda i: i,
      "floats": float,
      "array": lambda i: array,
      "None": lambda i: None,
  }
  grid = {}
  for size in GRID_SIZES:
    for kind, make in leaf_kinds.items():
      items = [make(i) for i in range(size)]
      grid[f"list of {size} {kind}"] = items
      grid[f"tuple of {size} {kind}"] = tuple(items)
      grid[f"dict of {size} {kind}"] = {
          f"k{i:06d}": x for i, x in enumerate(items)
      }
    grid[f"namedtuples, {3 ** round(math.log(size, 3))} leaves"] = _namedtuples(
        round(math.log(size, 3))
    )
    grid[f"{size // 2} custom pairs"] = [
        Pair(float(i), array) for i in range(size // 2)
    ]
    grid[f"mixed model, ~{size} leaves"] = _mixed(size)
  return grid


def grid_cells(grid):
  """(workload, op, library) -> callable, for stock and ours, plus the
  opted-in model without sharing (target 3)."""
  libraries = {}
  for name, module, flags in (
      ("stock", stock_pytree, {}),
      ("ours", our_pytree, {}),
      ("opt-in", our_pytree, {"preserve_relative_identities": True}),
  ):
    registry = module.PyTreeRegistry()
    registry.register_node(Pair, pair_to_iterable, pair_from_iterable, **flags)
    libraries[name] = registry
  cells = {}

  def add(workload, tree, names):
    for name in names:
      registry = libraries[name]
      leaves, treedef = registry.flatten(tree)
      twin = registry.flatten(tree)[1]
      cells[workload, "flatten", name] = functools.partial(
          registry.flatten, tree
      )
      cells[workload, "unflatten", name] = functools.partial(
          treedef.unflatten, leaves
      )
      cells[workload, "flatten_up_to", name] = functools.partial(
          treedef.flatten_up_to, tree
      )
      cells[workload, "hash_eq", name] = lambda t=treedef, u=twin: (
          hash(t),
          t == u,
      )

  for workload, tree in grid.items():
    stock_leaves, stock_treedef = libraries["stock"].flatten(tree)
    our_leaves, our_treedef = libraries["ours"].flatten(tree)
    assert repr(our_treedef) == repr(stock_treedef), workload
    assert all(x is y for x, y in zip(our_leaves, stock_leaves, strict=True))
    add(workload, tree, ("stock", "ours"))
  unshared_model = [Pair(np.zeros(2), float(i)) for i in range(2_000)]
  add(
      "opted-in model, 2000 pairs, no sharing",
      unshared_model,
      ("stock", "opt-in"),
  )
  return cells


def grid_report(medians):
  """The grid's table (ratios to stock per op) and its targets."""
  workloads = list(dict.fromkeys(w for w, _, _ in medians))
  lines = [
      "| workload | " + " | ".join(GRID_OPS) + " |",
      "|" + "---|" * (len(GRID_OPS) + 1),
  ]
  plain, opted, failures = [], [], []
  for workload in workloads:
    library = "opt-in" if (workload, "flatten", "opt-in") in medians else "ours"
    row = []
    for op in GRID_OPS:
      value = medians[workload, op, library] / medians[workload, op, "stock"]
      row.append(f"{value:.2f}x")
      (opted if library == "opt-in" else plain).append(value)
      if value > 1.0 and (library == "ours" or op != "hash_eq"):
        failures.append(
            f"FAIL  {workload} {op} {library}/stock = {value:.2f}x"
            " (target <= 1.00x)"
        )
    lines.append(f"| {workload} ({library}) | " + " | ".join(row) + " |")
  geomean = math.exp(sum(map(math.log, plain)) / len(plain))
  summary = [
      f"plain workloads: {len(plain)} cells, worst {max(plain):.2f}x, "
      f"geometric mean {geomean:.2f}x (target <= 0.60x: "
      f"{'met' if geomean <= 0.6 else 'NOT met'})",
      f"opted-in without sharing: worst {max(opted):.2f}x (target <= 1.00x)",
      f"{len(failures)} cells over 1.00x",
  ]
  return "\n".join(lines), failures, summary, geomean
