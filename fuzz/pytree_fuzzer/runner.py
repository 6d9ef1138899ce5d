"""Runs programs in this process and counts their outcomes; in a worker
process of a campaign, reports them to the supervisor line by line.

A worker writes, before each program, `C <counts>` (a checkpoint of its
counts as JSON) and `P <program> <executions>`; `F <record>` for each
finding; `D <counts>` when its budget is spent.
"""

import collections
import faulthandler
import gc
import json
import os
import random
import sys
import time
import traceback
import warnings

from jaxlib_patch import pytree as pt

from pytree_fuzzer import chaos
from pytree_fuzzer.adversaries import WEAKREFS
from pytree_fuzzer.operations import build_tables
from pytree_fuzzer.program import Program

CHAOS_RATES = (0.0, 0.0, 0.01, 0.05, 0.2, 0.5)


class Runner:
  """Runs programs in this process and counts outcomes."""

  def __init__(self, seed, verbose=False, max_findings=50, on_finding=None):
    self.seed = seed
    self.verbose = verbose
    self.executions = 0
    self.programs = 0
    self.outcomes = collections.Counter()
    self.by_op = collections.Counter()
    self.findings = []
    self.max_findings = max_findings
    self.on_finding = on_finding
    self.warnings = collections.Counter()
    self.nested = 0  # Executions from inside callbacks.

  def count(self, name, outcome):
    self.outcomes[outcome] += 1
    self.by_op[name] += 1

  def finding(self, prog, op_name, kind, exc):
    record = {
        "seed": self.seed,
        "program": prog.index,
        "op": op_name,
        "kind": kind,
        "exception": f"{type(exc).__name__}: {exc}"[:500],
        "traceback": "".join(traceback.format_exception(exc))[-3000:],
    }
    if len(self.findings) < self.max_findings:
      self.findings.append(record)
    if self.on_finding:
      self.on_finding(record)

  def run_program(self, index):
    """Runs program `index` of this seed: reproducible on its own."""
    rng = random.Random(self.seed * 1_000_003 + index)
    chaos.rng = rng
    chaos.rate = 0.0  # No misbehaviour while the program's types are made.
    WEAKREFS.clear()
    prog = Program(self, index, rng)
    chaos.program = prog
    chaos.rate = rng.choice(CHAOS_RATES)
    n_ops = rng.randrange(10, 60)
    if self.verbose:
      print(
          f"program {index}: chaos rate {chaos.rate}, {n_ops} ops", flush=True
      )
    try:
      for _ in range(n_ops):
        name, op = prog.pick_op()
        prog.execute(name, op)
    finally:
      chaos.rate = 0.0
      chaos.program = None
      prog.close()
      WEAKREFS.clear()
      del prog
      # The collector runs only when a program asks (automatic collection
      # is off): so that __del__ methods and weakref callbacks run at the
      # same points when a program is replayed alone. Here it frees the
      # program's cycles, with no program running.
      gc.collect()
    self.programs += 1


def install_warning_counter(runner):
  def showwarning(message, category, filename, lineno, file=None, line=None):
    runner.warnings[f"{category.__name__}: {str(message)[:120]}"] += 1

  warnings.showwarning = showwarning
  warnings.simplefilter("always")


def run_in_process(
    seed,
    executions=None,
    seconds=None,
    start=0,
    stride=1,
    verbose=False,
    skip_known=False,
    report=None,
    on_finding=None,
    programs=None,
    end=None,
):
  """Runs programs start, start+stride, ... until a budget is spent.

  `report(runner, index)` is called before each program.
  """
  chaos.skip_known = skip_known
  build_tables(skip_known)
  runner = Runner(seed, verbose, on_finding=on_finding)
  install_warning_counter(runner)
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
  gc.collect()
  gc.disable()  # See Runner.run_program.
  deadline = None if seconds is None else time.monotonic() + seconds
  index = start
  while True:
    if executions is not None and runner.executions >= executions:
      break
    if deadline is not None and time.monotonic() >= deadline:
      break
    if programs is not None and runner.programs >= programs:
      break
    if end is not None and index >= end:
      break
    if report:
      report(runner, index)
    runner.run_program(index)
    index += stride
  gc.enable()
  return runner


def counts_of(runner):
  """What a worker reports of its runner's counts so far."""
  return {
      "e": runner.executions,
      "p": runner.programs,
      "o": runner.outcomes,
      "w": runner.warnings,
      "b": runner.by_op,
      "n": runner.nested,
      "f": chaos.fired,
  }


def worker_main(args):
  """Runs the programs of one worker of a campaign (restarted by the
  supervisor after a crash), reporting on stdout."""
  faulthandler.enable(all_threads=False)
  if args.expect_module and os.path.realpath(pt.__file__) != args.expect_module:
    raise SystemExit(
        f"worker imported {pt.__file__}, expected " f"{args.expect_module}"
    )
  out = sys.stdout

  def report(runner, index):
    # A checkpoint before every program: a crash loses only its program.
    out.write("C " + json.dumps(counts_of(runner)) + "\n")
    out.write(f"P {index} {runner.executions}\n")
    out.flush()

  def on_finding(record):
    out.write("F " + json.dumps(record) + "\n")
    out.flush()

  runner = run_in_process(
      args.seed,
      executions=args.executions,
      seconds=args.seconds,
      start=args.start,
      stride=args.stride,
      skip_known=args.skip_known,
      report=report,
      on_finding=on_finding,
      end=args.end,
  )
  out.write("D " + json.dumps(counts_of(runner)) + "\n")
  out.flush()
