"""Benchmark `jax.jit` dispatch (cache hit) on the custom wheels against stock jax.

Usage::

    python bench/bench_jit.py [--quick] [--json out.json]
        [--stock-python PY] [--patched-python PY] [--runs N] [--rounds N]
        [--platforms cpu]

The patched jax (0.10.2+relid) and stock jax 0.10.2 cannot be imported in one
process, so this script is a parent that runs itself as child processes: one
under the stock interpreter and one under the interpreter of a virtual
environment with the custom wheels. Both children run the same code with the
same repeat schedule; the parent alternates them (stock, patched, patched,
stock, ...) ``--runs`` times each and reports medians and ratios.

Cases (each with a function that returns an updated tree, "tree", and one
that returns a scalar, "scalar"):

(i)   one small array;
inline ``jax.jit(f)(x)`` on that array: a new ``jax.jit`` object at every call
      (the usual style in library code), which must hit the C++ cache that
      the first one filled (stock's global cache);
(ii)  a dict of 100 small arrays;
(iii) a model: a ``Model`` custom node holding a list of 100 distinct ``Layer``
      custom nodes, 3 small array leaves each; no class opted in;
(iv)  the same with the layer class (``LayerR``) registered with
      ``preserve_relative_identities=True`` (in the stock child: without the
      flag, which stock does not have), nothing shared;
(v)   ``Model([layer] * 100)``: 100 references to one opted-in layer. The
      stock child gets the same object and expands it (300 leaves, 100 copies
      out); the patched child flattens it to 3 leaves.

The patched child also times, on the equivalent shared model:

- ``nnx.jit`` (Flax NNX): 100 references to one ``nnx.Module`` with 3
  ``nnx.Param``;
- an equinox "share-through" wrapper around ``eqx.filter_jit``: the leaves are
  de-duplicated by ``id()`` before the call, re-shared (same tracer at every
  position) inside, and the outputs de-duplicated and re-shared after;
- plain ``eqx.filter_jit`` on the shared equinox model (no de-duplication),
  for information.

Method: every cell (case x function) makes a fixed number of calls per batch
(the same in both children); the time of a batch ends with blocking on one
output leaf. For ``--rounds`` rounds the common cells run one batch each in an
order shuffled by a seeded RNG (the same sequence in both children), then the
patched-only cells. The garbage collector is off while timing. A cell's time
is the median per-call time over all its batches of all runs of its
interpreter. A ratio is the median, over the run pairs (run k of stock and run
k of patched, adjacent in time), of patched median / stock median of the pair,
so that load that drifts between runs affects both sides alike; the range of
the per-pair ratios is shown too.

It also reports, for the model cases, the number of parameters of the lowered
HLO module (``jit(f).lower(model).as_text()``) and the time to trace+lower,
to compile, and of a first call of a fresh ``jax.jit``.

The children run on CPU (``--platforms cpu``); ``--platforms ''`` leaves the
platform to jax, as build/check_device.py does to time the cases on a GPU.

The cases are jit_cases.py's, the child's measurements jit_child.py's; this
file is the parent, which runs the children (children.py) and reports.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import children
import result_tables
from jit_cases import BATCH_CALLS, COMMON_CASES, EXTRA_CASES, KINDS
from machine import cpu_model


def run_children(args):
  """{side: [each child's result]} of `args.runs` runs a side, alternating,
  and the seconds they took."""
  print(f"stock:   {args.stock_python}\npatched: {args.patched_python}")
  print(f"{args.runs} runs each, {args.rounds} rounds per run, alternating")
  runs = {"stock": [], "patched": []}
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  if args.platforms:
    env["JAX_PLATFORMS"] = args.platforms
  t_start = time.time()
  for k, side in children.alternating(args.runs):
    python = children.interpreter(args, side)
    command = children.child_command(
        python,
        __file__,
        *("--child", side, "--rounds", args.rounds, "--seed", args.seed),
        *("--platforms", args.platforms, "--compile-reps", args.compile_reps),
        python_flags=("-E", "-s"),
    )
    t0 = time.perf_counter()
    runs[side].append(
        children.run_json_child(command, f"child {side} ({python})", env=env)
    )
    print(
        f"  run {k + 1}: {side:7s} {time.perf_counter() - t0:5.1f} s",
        flush=True,
    )
  return runs, time.time() - t_start


def med(xs):
  return statistics.median(xs) if xs else float("nan")


def dispatch_results(runs):
  """Per cell, the median times and the ratios over the run pairs."""

  def pooled(variant, name):
    return med([t for r in runs[variant] for t in r["times_us"].get(name, [])])

  def per_run(variant, name):
    return [med(r["times_us"].get(name, [])) for r in runs[variant]]

  res = {}
  for case in COMMON_CASES:
    for kind in KINDS:
      name = f"{case}/{kind}"
      s, p = pooled("stock", name), pooled("patched", name)
      pr = [
          b / a
          for a, b in zip(per_run("stock", name), per_run("patched", name))
      ]
      ratio = med(pr)
      res[name] = {
          "stock_us": s,
          "patched_us": p,
          "ratio": ratio,
          "pooled_ratio": p / s,
          "run_ratios": pr,
      }
  for case in EXTRA_CASES:
    for kind in KINDS:
      name = f"{case}/{kind}"
      p = pooled("patched", name)
      v = res[f"v/{kind}"]["patched_us"]
      res[name] = {"patched_us": p, "vs_patched_v": p / v}
  return res


def check_targets(res):
  """Each target, met or not, printed and returned."""
  targets = []

  def target(desc, value, ok, shown):
    targets.append({"target": desc, "value": value, "met": bool(ok)})
    print(f"{'PASS' if ok else 'FAIL'}  {desc}: {shown}")

  print("\nTargets:")
  for kind in KINDS:
    for case in ("i", "ii", "iii", "iv"):
      r = res[f"{case}/{kind}"]["ratio"]
      target(f"({case}) {kind} <= 1.05x stock", r, r <= 1.05, f"{r:.2f}x")
    r = res[f"inline/{kind}"]["ratio"]
    target(f"inline {kind} <= 1.10x stock", r, r <= 1.10, f"{r:.2f}x")
    r = res[f"v/{kind}"]["ratio"]
    target(f"(v) {kind} <= 0.5x stock (expanded)", r, r <= 0.5, f"{r:.2f}x")
    for case, what in (("nnx", "nnx.jit"), ("eqx_share", "eqx share-through")):
      f = res[f"{case}/{kind}"]["vs_patched_v"]
      if f != f:
        target(
            f"(v) {kind} >= 10x faster than {what}", None, False, "not measured"
        )
      else:
        target(f"(v) {kind} >= 10x faster than {what}", f, f >= 10, f"{f:.1f}x")
  return targets


def compile_results(runs):
  """The HLO parameters and compile times (medians over runs)."""
  comp = {}
  for variant in ("stock", "patched"):
    for case in ("iv", "v"):
      for kind in KINDS:
        name = f"{case}/{kind}"
        st = [r["compile"][name] for r in runs[variant]]
        c = {
            key: med([x[key] for x in st])
            for key in ("lower_ms", "compile_ms", "first_call_ms")
        }
        c["hlo_params"] = st[0]["hlo_params"]
        comp[f"{variant}:{name}"] = c
  return comp


def print_checks(runs):
  print("\nChecks:")
  for variant in ("stock", "patched"):
    r = runs[variant][0]
    print(
        f"  {variant}: " + ", ".join(f"{k}={v}" for k, v in r["checks"].items())
    )
    print(
        f"  {variant}: " + ", ".join(f"{k}={v}" for k, v in r["info"].items())
    )


def breakdown_results(runs):
  """Where the time of (i) tree goes: each part's min over runs, printed."""
  print("\nWhere the time of (i) tree goes (ns per call, min over runs):")
  bd = {}
  for variant in ("stock", "patched"):
    for key in runs[variant][0]["breakdown_ns"]:
      v = min(r["breakdown_ns"][key] for r in runs[variant])
      bd[f"{variant}: {key}"] = v
      print(f"  {variant:7s} {key:28s} {v:7.0f}")
  return bd


def parent_main(args):
  runs, elapsed = run_children(args)
  res = dispatch_results(runs)
  table = result_tables.jit_dispatch_table(res)
  print()
  print(table)
  print(
      "\nµs: median per call over all batches of all runs. patched/stock: "
      "median over the run pairs (stock run k, patched run k, adjacent in "
      "time) of the ratio of their medians. Rows marked '(v)': their time / "
      "patched jax.jit's time on (v) (higher = jax.jit faster)."
  )
  targets = check_targets(res)
  print("\nTrace+compile (median over runs; fresh jax.jit each):")
  comp = compile_results(runs)
  ctable = result_tables.jit_compile_table(comp)
  print(ctable)
  print_checks(runs)
  bd = breakdown_results(runs)
  met = sum(t["met"] for t in targets)
  print(f"\n{met} of {len(targets)} targets met; {elapsed:.0f} s")

  if args.json:
    with open(args.json, "w") as fh:
      json.dump(
          {
              "date": datetime.date.today().isoformat(),
              "machine": {
                  "nproc": os.cpu_count(),
                  "platform": platform.platform(),
                  "cpu": cpu_model(),
              },
              # The interpreters by their versions (in "info"), not paths.
              "runs": args.runs,
              "rounds": args.rounds,
              "batch_calls": BATCH_CALLS,
              "elapsed_s": elapsed,
              "results": res,
              "breakdown_ns": bd,
              "compile": comp,
              "targets": targets,
              "markdown_table": table.split("\n"),
              "markdown_compile_table": ctable.split("\n"),
              "info": {v: runs[v][0]["info"] for v in runs},
              "checks": {v: runs[v][0]["checks"] for v in runs},
              "raw_times_us": {
                  v: [r["times_us"] for r in runs[v]] for v in runs
              },
          },
          fh,
          indent=1,
      )
  return 0 if met == len(targets) or not args.strict else 1


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument(
      "--quick",
      action="store_true",
      help="a few-second smoke run (1 run each, 3 rounds)",
  )
  ap.add_argument("--json", help="write the results to this file")
  children.add_interpreter_arguments(ap)
  ap.add_argument(
      "--runs",
      type=int,
      default=6,
      help="child runs per interpreter, alternating (default 6)",
  )
  ap.add_argument(
      "--rounds", type=int, default=80, help="rounds per child run (default 80)"
  )
  ap.add_argument("--compile-reps", type=int, default=3)
  ap.add_argument("--seed", type=int, default=12345)
  ap.add_argument(
      "--platforms",
      default="cpu",
      help="jax_platforms of the children (default %(default)s; '' leaves "
      "jax's own choice, e.g. the GPU; build/check_device.py runs the patched "
      "child that way)",
  )
  ap.add_argument(
      "--strict", action="store_true", help="exit 1 if a target is missed"
  )
  ap.add_argument("--child", choices=children.SIDES, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    from jit_child import child_main

    return child_main(args)
  if args.quick:
    args.runs, args.rounds, args.compile_reps = 1, 3, 1
  return parent_main(args)


if __name__ == "__main__":
  sys.exit(main())
