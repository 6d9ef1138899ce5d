"""Benchmark `jaxlib_patch.pytree` against stock jaxlib's pytree and optree.

Usage::

    python bench/bench_pytree.py [--quick] [--json out.json] [--strict]

Times `flatten`, `unflatten` and `flatten_up_to` on four trees:

(a) a dict of 1,000 ints;
(b) a model of 100 distinct layers, each a custom node with 3 numpy leaves;
(c) the same model where all 100 layers are one shared layer object;
(d) a chain of 100 nested dicts.

and, with ``--grid``, the plain trees of the workload grid: flat lists,
tuples and dicts of ints, floats, one numpy array and ``None``, nested
namedtuples, custom nodes and a mixed model-like tree, each at 10 to 100,000
leaves, under ``flatten``, ``unflatten``, ``flatten_up_to`` and ``hash`` +
``==`` of the treedef (stock against ours), plus an opted-in model of 2,000
distinct two-field nodes (nothing shared). The grid's targets are judged
on instruction counts, by count_instructions.py (GRID_GEOMEAN_TARGET and
GRID_CELL_TARGET: a geometric mean of at most 0.40x stock, no cell above
0.90x); this timed grid gives the same ratios in seconds, which swing with
the machine's load.

Libraries, all measured in the same process:

- ``stock``:  ``jaxlib._jax.pytree`` (a fresh ``PyTreeRegistry``);
- ``ours``:   ``jaxlib_patch.pytree``, ``Layer`` registered without the flag;
- ``opt-in``: ``jaxlib_patch.pytree``, ``Layer`` registered with
  ``preserve_relative_identities=True`` (so in (c) the shared layer is
  flattened once, and the other 99 occurrences become references);
- ``optree``: ``optree`` with its own namespace (for information only).

Method: every (case, operation, library) cell is calibrated so that one batch
of calls takes about ``--batch-ms``; then, for ``--rounds`` rounds, every cell
runs one batch, in a fresh random order each round, so that machine drift hits
all libraries alike. The reported time is the median over rounds of the
per-call time of a batch. Batches run under ``timeit`` (garbage collector off).
"""

import argparse
import datetime
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
import timeit

import numpy as np
import optree
from jaxlib._jax import pytree as stock_pytree

import jaxlib_patch.pytree as our_pytree

import result_tables
from machine import cpu_model
from pytree_grid import OPS, grid_cells, grid_report, make_grid

OPTREE_NAMESPACE = "bench_pytree"
LIBRARIES = ("stock", "ours", "opt-in", "optree")
NUM_LAYERS = 100


# --------------------------------------------------------------------------
# The trees.


class Layer:
  """A model layer: three array leaves."""

  def __init__(self, w, b, scale):
    self.w = w
    self.b = b
    self.scale = scale


class Model:
  """A model: a list of layers (one child, a list node)."""

  def __init__(self, layers):
    self.layers = layers


def layer_to_iterable(layer):
  return (layer.w, layer.b, layer.scale), None


def layer_from_iterable(_aux, children):
  return Layer(*children)


def model_to_iterable(model):
  return (model.layers,), None


def model_from_iterable(_aux, children):
  return Model(children[0])


def new_layer():
  """A layer with small, distinct numpy arrays."""
  return Layer(np.zeros((16, 16)), np.zeros(16), np.ones(16))


def make_cases():
  """The benchmarked trees, keyed by case label, in table order."""
  shared = new_layer()
  chain = {"value": NUM_LAYERS - 1}
  for i in reversed(range(NUM_LAYERS - 1)):
    chain = {"value": i, "next": chain}
  return {
      "(a) dict of 1000 ints": {f"k{i:04d}": i for i in range(1000)},
      "(b) 100 distinct layers": Model(
          [new_layer() for _ in range(NUM_LAYERS)]
      ),
      "(c) 1 layer shared x100": Model([shared] * NUM_LAYERS),
      "(d) chain of 100 dicts": chain,
  }


# --------------------------------------------------------------------------
# The libraries, behind one small interface.


class JaxlibStyle:
  """A jaxlib-style `PyTreeRegistry` (stock or ours) with Layer and Model."""

  def __init__(self, module, **layer_flags):
    self.registry = module.PyTreeRegistry()
    self.registry.register_node(
        Layer, layer_to_iterable, layer_from_iterable, **layer_flags
    )
    self.registry.register_node(Model, model_to_iterable, model_from_iterable)

  def flatten(self, tree):
    return self.registry.flatten(tree)

  def calls(self, tree):
    """Zero-argument callables for each operation on `tree`."""
    leaves, treedef = self.flatten(tree)
    return {
        "flatten": functools.partial(self.registry.flatten, tree),
        "unflatten": functools.partial(treedef.unflatten, leaves),
        "flatten_up_to": functools.partial(treedef.flatten_up_to, tree),
    }


class OptreeStyle:
  """optree, with Layer and Model registered in a private namespace."""

  def __init__(self):
    for cls, to_it, from_it in (
        (Layer, layer_to_iterable, layer_from_iterable),
        (Model, model_to_iterable, model_from_iterable),
    ):
      optree.register_pytree_node(
          cls, to_it, from_it, namespace=OPTREE_NAMESPACE
      )

  def flatten(self, tree):
    return optree.tree_flatten(tree, namespace=OPTREE_NAMESPACE)

  def calls(self, tree):
    """Zero-argument callables for each operation on `tree`."""
    leaves, treespec = self.flatten(tree)
    return {
        "flatten": functools.partial(
            optree.tree_flatten, tree, namespace=OPTREE_NAMESPACE
        ),
        "unflatten": functools.partial(optree.tree_unflatten, treespec, leaves),
        "flatten_up_to": functools.partial(treespec.flatten_up_to, tree),
    }


def make_libraries():
  return {
      "stock": JaxlibStyle(stock_pytree),
      "ours": JaxlibStyle(our_pytree, preserve_relative_identities=False),
      "opt-in": JaxlibStyle(our_pytree, preserve_relative_identities=True),
      "optree": OptreeStyle(),
  }


# --------------------------------------------------------------------------
# Sanity checks: every library handles every tree as expected.


def expected_num_leaves(case, library):
  if case.startswith("(a)"):
    return 1000
  if case.startswith("(d)"):
    return NUM_LAYERS
  if case.startswith("(c)") and library == "opt-in":
    return 3
  return 3 * NUM_LAYERS


def check_library(case, name, library, tree):
  """Fails loudly if a library's results on `tree` are not as expected."""
  ops = library.calls(tree)
  leaves, _ = ops["flatten"]()
  assert len(leaves) == expected_num_leaves(case, name), (
      case,
      name,
      len(leaves),
  )
  rebuilt = ops["unflatten"]()
  assert library.flatten(rebuilt)[0] == leaves, (case, name)
  assert ops["flatten_up_to"]() == leaves, (case, name)
  if isinstance(rebuilt, Model):
    layers = rebuilt.layers
    shared = all(layer is layers[0] for layer in layers)
    assert shared == (name == "opt-in" and case.startswith("(c)")), (case, name)


def check_same_as_stock(tree, libraries):
  """Ours (without opt-in) and optree must do the same work as stock."""
  stock_leaves, stock_treedef = libraries["stock"].flatten(tree)
  our_leaves, our_treedef = libraries["ours"].flatten(tree)
  optree_leaves, _ = libraries["optree"].flatten(tree)
  for leaves in (our_leaves, optree_leaves):
    assert all(x is y for x, y in zip(leaves, stock_leaves, strict=True))
  assert repr(our_treedef) == repr(stock_treedef)


# --------------------------------------------------------------------------
# Timing.


def time_batch(fn, number):
  """Per-call seconds of `number` calls of `fn` (timeit: gc disabled)."""
  return timeit.Timer(fn).timeit(number) / number


def calibrate(fn, batch_s):
  """How many calls of `fn` make a batch of about `batch_s` seconds."""
  number = 1
  while True:
    per_call = time_batch(fn, number)
    if per_call * number >= batch_s / 10:
      return max(1, round(batch_s / per_call))
    number *= 10


def measure(cells, batch_s, rounds, seed=0):
  """Median per-call time of each cell, interleaving cells in every round.

  `cells` maps a key to a zero-argument callable; returns key -> list of
  per-call times (one per round).
  """
  numbers = {key: calibrate(fn, batch_s) for key, fn in cells.items()}
  samples = {key: [] for key in cells}
  order = list(cells)
  rng = random.Random(seed)
  for _ in range(rounds):
    rng.shuffle(order)
    for key in order:
      samples[key].append(time_batch(cells[key], numbers[key]))
  return samples, numbers


# --------------------------------------------------------------------------
# Targets and the report.


def targets(cases):
  """(case, op, library, max ratio to stock) for each checked target."""
  a, b, c, d = cases
  checked = [(case, op, "ours", 1.10) for case in (a, b, d) for op in OPS]
  checked += [(b, op, "opt-in", 1.25) for op in OPS]
  checked.append((c, "flatten", "opt-in", 0.20))
  return checked


def ratio(medians, case, op, library):
  return medians[case, op, library] / medians[case, op, "stock"]


def format_table(cases, medians):
  """A Markdown table: microseconds per call, and ratios to stock."""
  medians_us = {key: t * 1e6 for key, t in medians.items()}
  return result_tables.pytree_table(cases, OPS, LIBRARIES, medians_us)


def evaluate_targets(cases, medians):
  """One result dict per target, with PASS/FAIL."""
  results = []
  for case, op, library, limit in targets(cases):
    value = ratio(medians, case, op, library)
    results.append(
        {
            "case": case,
            "op": op,
            "library": library,
            "ratio": value,
            "limit": limit,
            "pass": value <= limit,
        }
    )
  return results


def format_targets(results):
  lines = []
  for r in results:
    verdict = "PASS" if r["pass"] else "FAIL"
    lines.append(
        f"{verdict}  {r['case']:<26} {r['op']:<14} "
        f"{r['library']}/stock = {r['ratio']:.2f}x (target <= {r['limit']:.2f}x)"
    )
  return "\n".join(lines)


def machine_info():
  import jaxlib

  return {
      "nproc": len(os.sched_getaffinity(0)),
      "cpu": cpu_model(),
      "python": platform.python_version(),
      "jaxlib": jaxlib.__version__,
      "optree": optree.__version__,
      "numpy": np.__version__,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"
      ),
  }


# --------------------------------------------------------------------------


def parse_args(argv):
  # Alike in form to count_instructions.py's and doc_tables.py's options,
  # not in what they are: each script declares its own.
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--quick",
      action="store_true",
      help="a few seconds (CI smoke test); numbers are rough",
  )
  parser.add_argument(
      "--json", metavar="PATH", help="also write results as JSON"
  )
  parser.add_argument(
      "--rounds", type=int, help="rounds (default 400, quick 15)"
  )
  parser.add_argument(
      "--batch-ms",
      type=float,
      help="milliseconds per batch (default 2, quick 0.5)",
  )
  parser.add_argument(
      "--grid",
      action="store_true",
      help="also time the plain-tree workload grid (stock against ours)",
  )
  parser.add_argument(
      "--strict",
      action="store_true",
      help="exit with status 1 if a target fails",
  )
  args = parser.parse_args(argv)
  if args.rounds is None:
    args.rounds = 15 if args.quick else 400
  if args.batch_ms is None:
    args.batch_ms = 0.5 if args.quick else 2.0
  return args


def main(argv=None):
  args = parse_args(argv)
  start = time.perf_counter()
  cases = make_cases()
  libraries = make_libraries()
  cells = {}
  for case, tree in cases.items():
    check_same_as_stock(tree, libraries)
    for name, library in libraries.items():
      check_library(case, name, library, tree)
      for op, fn in library.calls(tree).items():
        cells[case, op, name] = fn

  samples, numbers = measure(cells, args.batch_ms / 1e3, args.rounds)
  medians = {key: statistics.median(times) for key, times in samples.items()}
  results = evaluate_targets(list(cases), medians)
  elapsed = time.perf_counter() - start
  info = machine_info()

  print(
      f"# {info['cpu']}, {info['nproc']} CPUs, Python {info['python']}, "
      f"jaxlib {info['jaxlib']}, optree {info['optree']}, {info['date']}"
  )
  print(
      f"# {args.rounds} rounds, batches of ~{args.batch_ms} ms, "
      f"median per-call time; {elapsed:.0f} s"
  )
  print(format_table(cases, medians))
  print()
  print(format_targets(results))
  failed = sum(not r["pass"] for r in results)
  print(f"\n{len(results) - failed}/{len(results)} targets met")
  grid_medians = {}
  if args.grid:
    grid_samples, _ = measure(
        grid_cells(make_grid()), args.batch_ms / 1e3, max(5, args.rounds // 20)
    )
    grid_medians = {
        key: statistics.median(times) for key, times in grid_samples.items()
    }
    table, failures, summary, _ = grid_report(grid_medians)
    print("\n# plain-tree grid\n" + table + "\n")
    print("\n".join(failures + summary))
    failed += len(failures)

  if args.json:
    cell_rows = [
        {
            "case": case,
            "op": op,
            "library": lib,
            "median_us": medians[case, op, lib] * 1e6,
            "q1_us": np.percentile(samples[case, op, lib], 25) * 1e6,
            "q3_us": np.percentile(samples[case, op, lib], 75) * 1e6,
            "calls_per_batch": numbers[case, op, lib],
        }
        for case, op, lib in cells
    ]
    with open(args.json, "w") as f:
      json.dump(
          {
              "machine": info,
              "rounds": args.rounds,
              "batch_ms": args.batch_ms,
              "quick": args.quick,
              "seconds": elapsed,
              "cells": cell_rows,
              "targets": results,
              "grid_median_us": {
                  f"{w} | {op} | {lib}": t * 1e6
                  for (w, op, lib), t in grid_medians.items()
              },
          },
          f,
          indent=2,
      )
  return 1 if args.strict and failed else 0


if __name__ == "__main__":
  sys.exit(main())
