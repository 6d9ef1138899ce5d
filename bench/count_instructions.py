"""Instructions per call of bench_pytree.py's trees, stock jaxlib against ours.

Usage::

    python bench/count_instructions.py [--match REGEX] [--ops OP,...]
        [--leaves N] [--json out.json]
    python bench/count_instructions.py --compare gcc.json wheel.json

Timings on a loaded machine swing by several times between neighbouring
cells; instruction counts do not. This runs the workloads of
`bench_pytree.py --grid` and its four trees (a) to (d), ours and opted in
(the same trees, registries and operations), under valgrind's callgrind in
one process, and reports for each cell the instructions one call executes
in stock's module and in ours, and their ratio; then the grid's targets in
instructions (GRID_GEOMEAN_TARGET, GRID_CELL_TARGET: the plain cells'
geometric mean at most 0.40x of stock's, none over 0.90x; the opted-in model
without sharing at most 1.0x) for the cells counted.

Method: collection is off except inside the measured runs: a C function of
the harness's own (measured_run.c, compiled on first use with `$CC` or `cc`
against valgrind's headers) turns it on, calls a ctypes callback that makes
the calls, turns it off and has callgrind dump its counters. Per cell and
library: one warm-up call, a run of no calls (the callback's own cost), then
`N` calls; the per-call count is the difference over `N`. `N` is chosen so
that each run covers about `--leaves` nodes (at least one call). The garbage
collector is off, as in timeit. The module measured as ours is whatever
`import jaxlib_patch.pytree` finds: point PYTHONPATH at another build (the
wheel's, say) to count that one.

A count still depends on where earlier allocations left the heap (glibc's
free lists, the addresses that id-based hashes and dict probes see): a
small cell moves by a few percent from one layout to the next, on either
side, and two builds run in two processes see two layouts. With
``--heap-states N`` the child runs N times, the k-th first allocating and
keeping k thousand small objects (`pad_heap`), and each cell reports the
median over those runs, stock's and ours each.
"""

import argparse
import ctypes
import gc
import glob
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

from children import child_command

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
      help="nodes each measured run covers, in one call at least "
      "(default 20,000)",
  )
  parser.add_argument(
      "--heap-states",
      type=int,
      default=1,
      help="children, each from another heap layout; each cell reports "
      "the median (default 1)",
  )
  parser.add_argument("--json", metavar="PATH", help="also write JSON")
  parser.add_argument(
      "--compare",
      nargs=2,
      metavar=("BASE.json", "OTHER.json"),
      help="count nothing: compare two --json outputs, the wheel's build "
      "(OTHER) against the gcc build (BASE), cell by cell (target: within "
      "5%%)",
  )
  parser.add_argument("--child", metavar="PLAN", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


# --------------------------------------------------------------------------
# The child: runs under callgrind and makes the calls.


MEASURED_RUN = "jaxlib_patch_measured_run"


def measured_run_library():
  """The shared library of measured_run.c, compiled once per source text
  (the parent compiles it before valgrind starts the child)."""
  with open(os.path.join(HERE, "measured_run.c"), "rb") as f:
    source = f.read()
  digest = hashlib.sha256(source).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"measured_run-{digest}.so")
  if not os.path.exists(path):
    partial = f"{path}.{os.getpid()}"
    subprocess.run(
        [
            os.environ.get("CC", "cc"),
            "-O1",
            "-shared",
            "-fPIC",
            "-o",
            partial,
            os.path.join(HERE, "measured_run.c"),
        ],
        check=True,
    )
    os.replace(partial, path)
  return path


def run_measured(fn, calls):
  """Calls `fn` `calls` times in one measured run (where callgrind
  collects)."""
  measured_run = getattr(ctypes.CDLL(measured_run_library()), MEASURED_RUN)

  def run():
    for _ in range(calls):
      fn()

  measured_run(ctypes.CFUNCTYPE(None)(run))


def pad_heap(heap_state):
  """`heap_state` thousand small objects, for the caller to keep alive to
  the end: they move every later allocation (heap state 0: none)."""
  return [bytearray(64) for _ in range(1000 * heap_state)]


def median_over_heap_states(count_in_state, heap_states):
  """Each key's median over `count_in_state(k)` for k below `heap_states`
  (dicts of counts with the same keys, one per heap state)."""
  runs = [count_in_state(k) for k in range(heap_states)]
  return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def measure_runs(fn, calls):
  """The three runs of one cell that `per_call_counts` reads: a warm-up
  call, no calls (the callback's own cost), then `calls` calls."""
  run_measured(fn, 1)
  run_measured(fn, 0)
  run_measured(fn, calls)


def matching_cells(pattern):
  """(workload, op, library) -> callable for the workloads matching
  `pattern`: the grid's (stock, ours, and the opted-in model) and the four
  trees of bench_pytree.py (stock, ours, opt-in)."""
  sys.path.insert(0, HERE)
  import bench_pytree
  import pytree_grid

  grid = pytree_grid.make_grid()
  cells = pytree_grid.grid_cells(
      {w: tree for w, tree in grid.items() if pattern.search(w)}
  )
  libraries = bench_pytree.make_libraries()
  for case, tree in bench_pytree.make_cases().items():
    if not pattern.search(case):
      continue
    for library in ("stock", "ours", "opt-in"):
      for op, fn in libraries[library].calls(tree).items():
        cells[case, op, library] = fn
  return {key: fn for key, fn in cells.items() if pattern.search(key[0])}


def child(plan_path):
  with open(plan_path) as f:
    pattern, plan, heap_state = json.load(f)
  heap_padding = pad_heap(heap_state)  # Kept to the end.
  cells = matching_cells(re.compile(pattern))
  # As timeit does: a collection that falls into a run would walk every
  # tree of the grid, on whichever side reached the threshold.
  gc.collect()
  gc.disable()
  for workload, op, library, calls in plan:
    measure_runs(cells[workload, op, library], calls)
  del heap_padding


# --------------------------------------------------------------------------
# The parent: plans the runs, starts callgrind, reads the dumps.


def plan_cells(args):
  cells = matching_cells(re.compile(args.match))
  ops = args.ops.split(",")
  plan = []
  for workload, op, library in cells:
    if op not in ops:
      continue
    # Nodes, not leaves: a tree of 10,000 None has no leaf, and 10,000
    # nodes to walk.
    nodes = cells[workload, "flatten", "stock"]()[1].num_nodes
    plan.append((workload, op, library, max(1, args.leaves // nodes)))
  return plan


def dump_paths(directory):
  """The callgrind dumps of the measured runs, in the order they were
  written (not the final one, at exit)."""

  def number(path):
    suffix = path.rsplit(".", 1)[-1]
    return int(suffix) if suffix.isdigit() else math.inf

  paths = sorted(glob.glob(os.path.join(directory, "out*")), key=number)
  return [path for path in paths if number(path) != math.inf]


def dump_totals(directory):
  """The `totals:` of each callgrind dump, in the order they were written."""
  totals = []
  for path in dump_paths(directory):
    with open(path) as f:
      for line in f:
        if line.startswith("totals:"):
          totals.append(int(line.split()[1]))
          break
      else:
        totals.append(0)
  return totals


def dump_costs_by_function(directory):
  """Each dump's exclusive instructions by function, keyed by (the file its
  code lies in, by base name; the function's name), in the order written."""
  dumps = []
  for path in dump_paths(directory):
    # Callgrind's name compression: "(id) name" once, then "(id)"; objects
    # (ob=, cob=) and functions (fn=, cfn=) each have their own ids.
    names = {"ob": {}, "fn": {}}
    costs = {}
    current = ["?", "?"]
    skip_next = False  # the line after calls= is the call's inclusive cost
    with open(path) as f:
      for line in f:
        if skip_next:
          skip_next = False
        elif line.startswith(("ob=", "cob=", "fn=", "cfn=")):
          spec, _, rest = line.partition("=")
          kind = spec[-2:]
          key, _, name = rest.strip().partition(" ")
          if name:
            names[kind][key] = os.path.basename(name) if kind == "ob" else name
          if spec in ("ob", "fn"):
            current[spec == "fn"] = names[kind].get(key, key)
        elif line.startswith("calls="):
          skip_next = True
        elif line[:1].isdigit() or line[:1] in "+-*":
          fields = line.split()
          if len(fields) > 1:
            where = tuple(current)
            costs[where] = costs.get(where, 0) + int(fields[1])
    dumps.append(costs)
  return dumps


def dump_costs_by_object(directory):
  """Each dump's exclusive instructions by the file their code lies in (the
  executable or a shared library, by base name), in the order written."""
  dumps = []
  for costs in dump_costs_by_function(directory):
    by_object = {}
    for (name, _), cost in costs.items():
      by_object[name] = by_object.get(name, 0) + cost
    dumps.append(by_object)
  return dumps


# glibc's malloc family and CPython's object allocator, by function name
# (less callgrind's suffixes: ".isra.0", "'2"). What they cost a call follows
# the heap's layout (free lists, arenas) more than the code asking for
# memory: the same call moves by a few hundred instructions between two
# processes here, and the code outside these functions not at all.
ALLOCATOR_FUNCTIONS = re.compile(
    r"(malloc|free|cfree|calloc|realloc|_int_\w+|malloc_consolidate"
    r"|unlink_chunk|sysmalloc|tcache_\w+|alloc_perturb|free_perturb"
    r"|_?PyObject_(Malloc|Calloc|Realloc"
    r"|Free)|_?PyMem_(Raw)?(Malloc|Calloc|Realloc|Free))"
)


def is_allocator(function):
  """Whether callgrind's name `function` is one of ALLOCATOR_FUNCTIONS."""
  return (
      ALLOCATOR_FUNCTIONS.fullmatch(re.split(r"[.']", function)[0]) is not None
  )


def dump_totals_and_allocator(directory):
  """Each dump's total and the part of it in ALLOCATOR_FUNCTIONS, as two
  lists in the order written."""
  dumps = dump_costs_by_function(directory)
  totals = [sum(costs.values()) for costs in dumps]
  allocator = [
      sum(cost for (_, fn), cost in costs.items() if is_allocator(fn))
      for costs in dumps
  ]
  return totals, allocator


def callgrind_totals(argv, read=dump_totals, **run_options):
  """Runs the child `argv` under callgrind, collecting only inside the
  measured runs, which dump as each returns; what `read` finds in the
  dumps' folder (by default their totals, in order)."""
  measured_run_library()
  with tempfile.TemporaryDirectory() as directory:
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={directory}/out",
            "--collect-atstart=no",
            *argv,
        ],
        check=True,
        **run_options,
    )
    return read(directory)


def per_call_counts(totals, calls):
  """Each cell's instructions per call, from the dumps of a child that made
  `measure_runs`'s runs for one cell after another, `calls[i]` measured
  calls for cell i."""
  if len(totals) != 3 * len(calls):
    sys.exit(f"{len(totals)} callgrind dumps for {len(calls)} cells")
  per_call = [
      (totals[3 * i + 2] - totals[3 * i + 1]) / n for i, n in enumerate(calls)
  ]
  if min(per_call) <= 0:
    sys.exit(f"the callgrind dumps are not the cells' runs: {totals}")
  return per_call


def per_call_by_object(dumps, calls):
  """As `per_call_counts`, file by file: each cell's instructions per call
  by the file their code lies in, from `dump_costs_by_object`'s dumps."""
  if len(dumps) != 3 * len(calls):
    sys.exit(f"{len(dumps)} callgrind dumps for {len(calls)} cells")
  return [
      {
          name: (cost - dumps[3 * i + 1].get(name, 0)) / n
          for name, cost in dumps[3 * i + 2].items()
      }
      for i, n in enumerate(calls)
  ]


def count(pattern, plan, heap_state=0):
  """Instructions per call of each planned cell, counted in a child from
  heap state `heap_state` (pad_heap)."""
  with tempfile.TemporaryDirectory() as directory:
    plan_path = os.path.join(directory, "plan.json")
    with open(plan_path, "w") as f:
      json.dump([pattern, plan, heap_state], f)
    totals = callgrind_totals(
        child_command(sys.executable, __file__, "--child", plan_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
  per_call = per_call_counts(totals, [calls for *_, calls in plan])
  return {
      (workload, op, library): value
      for (workload, op, library, _), value in zip(plan, per_call)
  }


# The plain-tree grid's targets in instructions, as fractions of stock's: its
# plain cells' geometric mean, and the most any one of them may cost.
GRID_GEOMEAN_TARGET = 0.40
GRID_CELL_TARGET = 0.90


def report(per_call):
  rows, plain, opted = [], [], []
  for (workload, op, library), value in per_call.items():
    if library == "stock":
      continue
    stock = per_call[workload, op, "stock"]
    ratio = value / stock
    if not workload.startswith("("):  # The four trees have their own targets.
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
      if r[5] > 1.0
      and not r[0].startswith("(")
      and not (r[2] == "opt-in" and r[1] == "hash_eq")
  ]
  summary = []
  if plain:
    geomean = math.exp(sum(map(math.log, plain)) / len(plain))
    met = geomean <= GRID_GEOMEAN_TARGET and max(plain) <= GRID_CELL_TARGET
    summary.append(
        f"plain cells: {len(plain)}, worst {max(plain):.2f}x, geometric mean "
        f"{geomean:.2f}x (targets: geometric mean <= "
        f"{GRID_GEOMEAN_TARGET:.2f}x, no cell over {GRID_CELL_TARGET:.2f}x: "
        f"{'met' if met else 'NOT met'})"
    )
  if opted:
    summary.append(
        f"opted-in without sharing: worst {max(opted):.2f}x (target <= 1.00x)"
    )
  summary.append(f"{len(over)} cells over 1.00x")
  for workload, op, library, _, _, ratio in over:
    summary.append(f"OVER  {workload} {op} {library}/stock = {ratio:.2f}x")
  return "\n".join(lines), summary, rows


def compare(base_path, other_path, bound=1.05):
  """Our instructions per call in two builds, cell by cell: the lines of a
  table, and the summary against `bound`."""

  def ours(path):
    with open(path) as f:
      cells = json.load(f)["cells"]
    return {(c["workload"], c["op"], c["library"]): c["ours"] for c in cells}

  base, other = ours(base_path), ours(other_path)
  lines = [
      "| workload | op | base | other | other/base |",
      "|---|---|---|---|---|",
  ]
  ratios, over = [], []
  for key in [key for key in base if key in other]:
    workload, op, library = key
    ratio = other[key] / base[key]
    ratios.append(ratio)
    label = workload + (" (opted in)" if library == "opt-in" else "")
    lines.append(
        f"| {label} | {op} | {base[key]:,.0f} | {other[key]:,.0f} | "
        f"{ratio:.3f}x |"
    )
    if ratio > bound:
      over.append(f"OVER  {label} {op}: {ratio:.3f}x")
  geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
  summary = [
      f"cells in both: {len(ratios)}, worst {max(ratios):.3f}x, geometric "
      f"mean {geomean:.3f}x; {len(over)} over {bound:.2f}x (target, none "
      f"over: {'met' if not over else 'NOT met'})",
      *sorted(over),
  ]
  return lines, summary


def main(argv=None):
  args = parse_args(argv)
  if args.child:
    child(args.child)
    return 0
  if args.compare:
    lines, summary = compare(*args.compare)
    print("\n".join(lines + [""] + summary))
    return 0
  plan = plan_cells(args)
  if not plan:
    print("no workload matches", file=sys.stderr)
    return 2
  per_call = median_over_heap_states(
      lambda heap_state: count(args.match, plan, heap_state), args.heap_states
  )
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
              "heap_states": args.heap_states,
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
