"""Instructions per call of the plain-tree grid, stock jaxlib against ours.

Usage::

    python bench/count_instructions.py [--match REGEX] [--ops OP,...]
        [--leaves N] [--json out.json]

Timings on a loaded machine swing by several times between neighbouring
cells; instruction counts do not. This runs the workloads of
`bench_pytree.py --grid` (the same trees, registries and operations) under
valgrind's callgrind, in one process per run, and reports for each cell the
instructions one call executes in stock's module and in ours, and their
ratio; then the grid's targets as `bench_pytree.py` states them (every plain
cell at most 1.0x, geometric mean at most 0.6x, the opted-in model without
sharing at most 1.0x) for the cells counted.

Method: collection is off except inside libc's `qsort_r`, whose comparator is
a ctypes callback that makes the calls; callgrind dumps its counters as each
`qsort_r` returns. Per cell and library: one warm-up call, a run of no calls
(the callback's own cost), then `N` calls; the per-call count is the
difference over `N`. `N` is chosen so that each run covers about `--leaves`
leaves (at least 3 calls). The module measured as ours is whatever
`import jaxlib_patch.pytree` finds: point PYTHONPATH at another build (the
wheel's, say) to count that one.
"""

import argparse
import ctypes
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--match",
      default="",
      help="only workloads whose label matches this regular expression",
  )
  parser.add_argument(
      "--ops",
      default="flatten,unflatten,flatten_up_to,hash_eq",
      help="comma-separated operations (default: all four)",
  )
  parser.add_argument(
      "--leaves",
      type=int,
      default=20_000,
      help="leaves each measured run covers (default 20,000)",
  )
  parser.add_argument("--json", metavar="PATH", help="also write JSON")
  parser.add_argument("--child", metavar="PLAN", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


# --------------------------------------------------------------------------
# The child: runs under callgrind and makes the calls.


def run_inside_qsort(fn, calls):
  """Calls `fn` `calls` times from inside libc's qsort_r (where callgrind
  collects)."""
  libc = ctypes.CDLL(None)
  compare_type = ctypes.CFUNCTYPE(
      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p
  )

  def compare(_a, _b):
    for _ in range(calls):
      fn()
    return 0

  callback = compare_type(compare)
  items = (ctypes.c_int * 2)(1, 2)
  libc.qsort(items, 2, ctypes.sizeof(ctypes.c_int), callback)


def child(plan_path):
  sys.path.insert(0, HERE)
  import bench_pytree

  with open(plan_path) as f:
    plan = json.load(f)
  wanted = {workload for workload, _, _, _ in plan}
  grid = bench_pytree.make_grid()
  cells = bench_pytree.grid_cells({w: grid[w] for w in wanted if w in grid})
  for workload, op, library, calls in plan:
    fn = cells[workload, op, library]
    run_inside_qsort(fn, 1)
    run_inside_qsort(fn, 0)
    run_inside_qsort(fn, calls)


# --------------------------------------------------------------------------
# The parent: plans the runs, starts callgrind, reads the dumps.


def plan_cells(args):
  sys.path.insert(0, HERE)
  import bench_pytree

  pattern = re.compile(args.match)
  grid = bench_pytree.make_grid()
  cells = bench_pytree.grid_cells(
      {w: tree for w, tree in grid.items() if pattern.search(w)}
  )
  ops = args.ops.split(",")
  plan = []
  for workload, op, library in cells:
    if op not in ops or not pattern.search(workload):
      continue
    leaves = len(cells[workload, "flatten", "stock"]()[0])
    plan.append((workload, op, library, max(3, args.leaves // max(1, leaves))))
  return plan


def dump_totals(directory):
  """The `totals:` of each callgrind dump, in the order they were written."""

  def number(path):
    suffix = path.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else math.inf

  totals = []
  for path in sorted(glob.glob(os.path.join(directory, "out*")), key=number):
    if number(path) == math.inf:
      continue  # The final dump, at exit.
    with open(path) as f:
      for line in f:
        if line.startswith("totals:"):
          totals.append(int(line.split()[1]))
          break
      else:
        totals.append(0)
  return totals


def count(plan):
  """Instructions per call of each planned cell."""
  with tempfile.TemporaryDirectory() as directory:
    plan_path = os.path.join(directory, "plan.json")
    with open(plan_path, "w") as f:
      json.dump(plan, f)
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={directory}/out",
            "--collect-atstart=no",
            "--toggle-collect=qsort_r",
            "--dump-after=qsort_r",
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            plan_path,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    totals = dump_totals(directory)
  # The last three dumps per cell are ours (imports may sort before).
  ours = totals[len(totals) - 3 * len(plan) :]
  per_call = {}
  for i, (workload, op, library, calls) in enumerate(plan):
    _warm_up, empty, measured = ours[3 * i : 3 * i + 3]
    per_call[workload, op, library] = (measured - empty) / calls
  return per_call


def report(per_call):
  rows, plain, opted = [], [], []
  for (workload, op, library), value in per_call.items():
    if library == "stock":
      continue
    stock = per_call[workload, op, "stock"]
    ratio = value / stock
    (opted if library == "opt-in" else plain).append(ratio)
    rows.append((workload, op, library, stock, value, ratio))
  lines = [
      "| workload | op | stock instructions | ours | ours/stock |",
      "|---|---|---|---|---|",
  ]
  for workload, op, library, stock, value, ratio in rows:
    label = workload + (" (opted in)" if library == "opt-in" else "")
    lines.append(
        f"| {label} | {op} | {stock:,.0f} | {value:,.0f} | {ratio:.2f}x |"
    )
  over = [
      r
      for r in rows
      if r[5] > 1.0 and not (r[2] == "opt-in" and r[1] == "hash_eq")
  ]
  summary = []
  if plain:
    geomean = math.exp(sum(map(math.log, plain)) / len(plain))
    summary.append(
        f"plain cells: {len(plain)}, worst {max(plain):.2f}x, geometric mean "
        f"{geomean:.2f}x (target <= 0.60x: "
        f"{'met' if geomean <= 0.6 else 'NOT met'})"
    )
  if opted:
    summary.append(
        f"opted-in without sharing: worst {max(opted):.2f}x (target <= 1.00x)"
    )
  summary.append(f"{len(over)} cells over 1.00x")
  for workload, op, library, _, _, ratio in over:
    summary.append(f"OVER  {workload} {op} {library}/stock = {ratio:.2f}x")
  return "\n".join(lines), summary, rows


def main(argv=None):
  args = parse_args(argv)
  if args.child:
    child(args.child)
    return 0
  plan = plan_cells(args)
  if not plan:
    print("no workload matches", file=sys.stderr)
    return 2
  per_call = count(plan)
  table, summary, rows = report(per_call)
  import jaxlib_patch.pytree

  print(f"# ours: {jaxlib_patch.pytree.__file__}")
  print(table)
  print()
  print("\n".join(summary))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
          {
              "module": jaxlib_patch.pytree.__file__,
              "cells": [
                  dict(
                      zip(
                          (
                              "workload",
                              "op",
                              "library",
                              "stock",
                              "ours",
                              "ratio",
                          ),
                          row,
                      )
                  )
                  for row in rows
              ],
              "summary": summary,
          },
          f,
          indent=2,
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
