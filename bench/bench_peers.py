"""Users' steps with Equinox and Flax NNX: the relative-identity opt-in against
each library's own ways to share on stock JAX.

Usage::

    python bench/bench_peers.py [--stock-python PY] [--patched-python PY]
        [--runs N] [--calls N] [--batches N] [--match REGEX] [--instructions]
        [--by-object] [--json out.json]

Patched and stock JAX cannot be imported in one process, so the parent runs
this script as children, alternately under the stock interpreter and under
the patched one (stock, patched, patched, stock, ...), ``--runs`` times each.

Models (all small, so that a step's time is mostly its per-call overhead):

- deep: one ``nnx.Linear(8, 8)`` object used as 100 layers (NNX only).
- lm: the tied transformer LM of tests/jax/equinox_tied_lm.py (Equinox only).
- pairs: 50 distinct elementwise affine layers (``tanh(weight * x + bias)``,
  ``float32[4]`` each) as encoders and the same 50 objects again as decoders
  in reverse order (tied weights), the output the sum of the 50
  ``decoder(encoder(x))``: 100 parameter arrays and 200 references on
  ``float32[8, 4]`` data; the dispatch-bound model, for both libraries.

Patterns. NNX, stock: ``split`` (``nnx.split`` once, then a ``jax.jit`` step
that takes ``(graphdef, state)``, ``nnx.merge``s inside and returns the new
state: Flax's functional pattern for speed) and ``nnx.jit`` (the step on the
module, updated in place). NNX, patched: ``jax.jit`` (plain ``jax.jit`` on
the module and optimizer, ``nnx.Pytree`` and ``nnx.Variable`` opted in,
returning them, as docs/guide.md shows), and the two stock patterns on the
patched wheels for information. Equinox: ``eqx.filter_jit`` on ``Shared``
(tied with ``eqx.nn.Shared``; stock, and on the patched wheels for
information) and on ``opt-in`` (the same object in both places, ``eqx.Module``
opted in; patched only).

Cells (cache-hit calls of an already compiled function, per call): the
training step (an ``optax.adamw`` update, the returned state fed to the next
call, as a training loop does) of each model, and the forward call of deep.
Within a child the cells take turns batch by batch, so that load drifts over
all of them alike.

A cell's time is the median per-call time over its batches; a ratio is the
median over the run pairs (run k of each side) of patched / stock. With
``--instructions`` each side runs once under valgrind's callgrind, and a
cell's figure is the instructions per call (count_instructions.py's method,
each call waited for, XLA's threads included), which load does not change;
``--by-object`` adds where each cell's instructions lie, by executable and
shared library (exclusive cost: the CPython interpreter running Python code,
jaxlib, libc, this module). The targets: an NNX step opted in at most 1.0x
the fastest stock pattern of the same run; an Equinox step opted in at most
0.8x ``eqx.nn.Shared``; the deep forward opted in at most 0.1x ``nnx.jit``.
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # The children run with -P.

# pylint: disable=wrong-import-position
import children  # noqa: E402
from peer_cells import equinox_cells, nnx_cells  # noqa: E402

# cell -> (patched pattern, the stock patterns it is held against, bound)
TARGETS = {
    "nnx deep step": ("jax.jit", ("split", "nnx.jit"), 1.0),
    "nnx pairs step": ("jax.jit", ("split", "nnx.jit"), 1.0),
    "nnx deep forward": ("jax.jit", ("nnx.jit",), 0.1),
    "eqx lm step": ("opt-in", ("Shared",), 0.8),
    "eqx pairs step": ("opt-in", ("Shared",), 0.8),
}


def time_cells(cells, calls, batches):
  """Median per-call seconds of each cell, the cells taking turns batch by
  batch."""
  import jax

  for call in cells.values():
    jax.block_until_ready(call())  # compile
  times = {name: [] for name in cells}
  for _ in range(batches):
    for name, call in cells.items():
      start = time.perf_counter()
      for _ in range(calls):
        out = call()
      jax.block_until_ready(out)
      times[name].append((time.perf_counter() - start) / calls)
  return {name: statistics.median(batch) for name, batch in times.items()}


def measure_cells(cells, calls):
  """count_instructions.py's runs of each cell in turn (under callgrind, the
  parent counts them), every call waited for, so that the step's work on
  XLA's threads is inside the run."""
  import gc

  import jax
  from count_instructions import measure_runs

  for call in cells.values():
    jax.block_until_ready(call())  # compile
  gc.disable()
  for call in cells.values():
    measure_runs(lambda call=call: jax.block_until_ready(call()), calls)


def child_main(args):
  cells = {
      (cell, pattern): call
      for (cell, pattern), call in {
          **nnx_cells(args.child),
          **equinox_cells(args.child),
      }.items()
      if re.search(args.match, cell)
  }
  if args.instructions:
    print(json.dumps(list(cells)), flush=True)
    measure_cells(cells, args.calls)
    return
  seconds = time_cells(cells, args.calls, args.batches)
  children.print_result(
      [[cell, pattern, value] for (cell, pattern), value in seconds.items()]
  )


def _child_argv(python, side, args):
  return children.child_command(
      python,
      __file__,
      *("--child", side, "--calls", args.calls, "--batches", args.batches),
      *("--match", args.match),
      *(["--instructions"] if args.instructions else []),
      python_flags=("-P",),
  )


def _run_child(python, side, args):
  result = {}
  for cell, pattern, value in children.run_json_child(
      _child_argv(python, side, args), f"{side} child ({python})", cwd="/"
  ):
    result.setdefault(cell, {})[pattern] = value
  return result


def _count_child(python, side, args):
  """Instructions per call of each cell: the child run under callgrind."""
  from count_instructions import (
      callgrind_totals,
      dump_costs_by_object,
      dump_totals,
      per_call_by_object,
      per_call_counts,
  )

  argv = _child_argv(python, side, args)
  with (
      tempfile.TemporaryDirectory() as cache,
      tempfile.TemporaryFile("w+") as names,
  ):
    # Compiling under callgrind takes about an hour a side: a first run
    # under valgrind's no-op tool (a few times native speed) fills a
    # persistent compilation cache that the counted run reads. It runs
    # under valgrind too because XLA's CPU topology fingerprint, part of
    # the cache key, differs there (valgrind's CPUID): entries compiled
    # natively are never hit.
    env = dict(
        os.environ,
        OPENBLAS_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    subprocess.run(
        ["valgrind", "--tool=none", *argv],
        check=True,
        cwd="/",
        env=env,
        capture_output=True,
    )
    totals, by_object = callgrind_totals(
        argv,
        read=lambda d: (
            dump_totals(d),
            dump_costs_by_object(d) if args.by_object else None,
        ),
        cwd="/",
        env=env,
        stdout=names,
        stderr=subprocess.DEVNULL,
    )
    names.seek(0)
    cells = json.loads(names.read().splitlines()[-1])
  result = {}
  per_call = per_call_counts(totals, [args.calls] * len(cells))
  for (cell, pattern), value in zip(cells, per_call):
    result.setdefault(cell, {})[pattern] = value
  if by_object:
    shares = per_call_by_object(by_object, [args.calls] * len(cells))
    result["by object"] = dict(zip(map(tuple, cells), shares))
  return result


def _print_by_object(runs):
  """Each cell's instructions per call by file, largest first, down to 1%."""
  by_object = {}
  print("\nwhere the instructions lie, per call (exclusive, by file)")
  for side, side_runs in runs.items():
    for (cell, pattern), shares in side_runs[0]["by object"].items():
      total = sum(shares.values())
      print(f"{side} {cell}, {pattern}: {total:,.0f}")
      for name, cost in sorted(shares.items(), key=lambda kv: -kv[1]):
        if cost >= 0.01 * total:
          print(f"  {cost:12,.0f}  {cost / total:6.1%}  {name}")
      by_object[f"{side} {cell}, {pattern}"] = shares
  return by_object


def _row(label, stock_runs, patched_runs, unit, bound=None):
  """One line of the report: medians (seconds, or instructions), the ratio
  over run pairs and, with a `bound`, the verdict."""
  ratios = [p / s for s, p in zip(stock_runs, patched_runs)]
  ratio = statistics.median(ratios)
  row = {
      f"stock_{unit}": statistics.median(stock_runs),
      f"patched_{unit}": statistics.median(patched_runs),
      "ratio": ratio,
      "ratios": ratios,
  }
  scale = 1e6 if unit == "s" else 1
  verdict = ""
  if bound is not None:
    row.update(target=bound, met=ratio <= bound)
    verdict = f"<= {bound}: {'met' if ratio <= bound else 'NOT met'}"
  print(
      f"{label:44} {row[f'stock_{unit}'] * scale:11,.1f} "
      f"{row[f'patched_{unit}'] * scale:13,.1f} "
      f"{ratio:7.3f} {min(ratios):6.3f}-{max(ratios):.3f}  {verdict}"
  )
  return row


def parent_main(args):
  # Instruction counts repeat: one run of each side.
  measure, unit, runs_wanted = (
      (_count_child, "instructions", 1)
      if args.instructions
      else (_run_child, "s", args.runs)
  )
  runs = {"stock": [], "patched": []}
  for k, side in children.alternating(runs_wanted):
    runs[side].append(measure(children.interpreter(args, side), side, args))
    print(f"  run {k + 1}: {side}", file=sys.stderr, flush=True)

  def per_run(side, cell, pattern):
    return [run[cell][pattern] for run in runs[side]]

  report = {}
  print(
      f"{'cell: patched pattern / stock pattern':44} "
      f"{'stock ' + ('us' if unit == 's' else unit):>11} "
      f"{'patched ' + ('us' if unit == 's' else unit):>13} "
      f"{'ratio':>7} {'range':>13}  target"
  )
  for cell, (opted_in, stock_patterns, bound) in TARGETS.items():
    if not re.search(args.match, cell):
      continue
    fastest_stock = [
        min(run[cell][pattern] for pattern in stock_patterns)
        for run in runs["stock"]
    ]
    against = " | ".join(stock_patterns)
    fastest = "fastest of " if len(stock_patterns) > 1 else ""
    report[cell] = _row(
        f"{cell}: {opted_in} / {fastest}{against}",
        fastest_stock,
        per_run("patched", cell, opted_in),
        unit,
        bound,
    )
    for pattern in stock_patterns:
      report[f"{cell}, {pattern} on both"] = _row(
          f"  {pattern} on both sides",
          per_run("stock", cell, pattern),
          per_run("patched", cell, pattern),
          unit,
      )
  if args.by_object:
    report["by object"] = _print_by_object(runs)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  children.add_interpreter_arguments(parser)
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--calls", type=int, default=20)
  parser.add_argument("--batches", type=int, default=10)
  parser.add_argument("--json")
  parser.add_argument(
      "--match", default="", help="only the cells whose name matches this"
  )
  parser.add_argument(
      "--instructions",
      action="store_true",
      help="count instructions per call under valgrind's callgrind instead "
      "of timing (--calls calls a cell, one run a side)",
  )
  parser.add_argument(
      "--by-object",
      action="store_true",
      help="with --instructions: also each cell's instructions by "
      "executable and shared library",
  )
  parser.add_argument("--child", choices=children.SIDES, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.by_object and not args.instructions:
    parser.error("--by-object needs --instructions")
  if args.child:
    child_main(args)
  else:
    parent_main(args)


if __name__ == "__main__":
  main()
