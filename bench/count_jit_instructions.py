"""Instructions per cached `jax.jit` call, stock jax against the patched wheels.

Usage::

    python bench/count_jit_instructions.py [--stock-python PY]
        [--patched-python PY] [--calls N] [--json out.json]

Cases, as bench_jit.py names them, each calling a function that returns the
tree with 1 added to every leaf: hoisted (``f(x)`` on one ``float32[8]``, `f`
made once), inline (``jax.jit(g)(x)`` on the same array, a new ``jax.jit``
object at every call) and dict (``f(d)`` on a dict of 100 ``float32[8]``).

Method (count_instructions.py's): each side runs in its own process under
valgrind's callgrind, collecting only inside the harness's own trigger
function, whose callback makes the calls; per case one warm-up call, a run of no calls and
a run of ``--calls`` calls; the per-call count is the difference of the last
two over ``--calls``. The garbage collector is off, BLAS runs one thread and
the hash seed is fixed, so that the counts repeat.

A count still depends on where earlier allocations left the heap: glibc's
free lists and the pointer-keyed maps of jaxlib cost a little more or less
from one layout to the next, by about 200 instructions a cached call, on
either side. With ``--heap-states N`` each side runs N times, the k-th child
first allocating and keeping k thousand small objects, and each case
reports the median over those runs. Each case is also reported less the
instructions spent in glibc's malloc family and CPython's object allocator
(count_instructions.ALLOCATOR_FUNCTIONS): what is left is the code the
call runs, and that part repeats to within a few instructions from one heap
layout to the next.
"""

import argparse
import json
import os
import pathlib
import subprocess

import interpreters
from count_instructions import (
    callgrind_totals,
    dump_totals_and_allocator,
    measure_runs,
    median_over_heap_states,
    pad_heap,
    per_call_counts,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = ("hoisted", "inline", "dict")


def child_main(calls, heap_state):
  import gc

  heap_padding = pad_heap(heap_state)  # Kept to the end.

  import jax
  import jax.numpy as jnp
  import numpy as np

  def add_one(tree):
    return jax.tree.map(lambda leaf: leaf + 1, tree)

  x = jnp.asarray(np.arange(8, dtype=np.float32))
  d = {f"a{i:03d}": x + i for i in range(100)}
  hoisted = jax.jit(add_one)
  calls_of = {
      "hoisted": lambda: hoisted(x),
      "inline": lambda: jax.jit(add_one)(x),
      "dict": lambda: hoisted(d),
  }
  for call in calls_of.values():
    jax.block_until_ready(call())
  gc.disable()
  for case in CASES:
    measure_runs(calls_of[case], calls)
    jax.block_until_ready(calls_of[case]())


def count(python, calls, heap_state):
  """Instructions per call of each case under `python`: keyed (case,
  "whole") for the whole call and (case, "code") for the call less glibc's
  and CPython's allocators (count_instructions.ALLOCATOR_FUNCTIONS)."""
  totals, allocator = callgrind_totals(
      [
          python,
          os.path.abspath(__file__),
          "--child",
          str(calls),
          "--child-heap-state",
          str(heap_state),
      ],
      read=dump_totals_and_allocator,
      cwd="/",
      env=dict(
          os.environ,
          JAX_PLATFORMS="cpu",
          OPENBLAS_NUM_THREADS="1",
          PYTHONHASHSEED="0",
      ),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )
  whole = per_call_counts(totals, [calls] * len(CASES))
  code = per_call_counts(
      [total - spent for total, spent in zip(totals, allocator)],
      [calls] * len(CASES),
  )
  counts = {}
  for case, whole_count, code_count in zip(CASES, whole, code):
    counts[case, "whole"] = whole_count
    counts[case, "code"] = code_count
  return counts


def median_count(python, calls, heap_states):
  """Each case's median instructions per call over `heap_states` children."""
  return median_over_heap_states(
      lambda heap_state: count(python, calls, heap_state), heap_states
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  interpreters.add_arguments(parser)
  parser.add_argument("--calls", type=int, default=2000)
  parser.add_argument(
      "--heap-states",
      type=int,
      default=1,
      help="children per side, each from another heap layout (median)",
  )
  parser.add_argument("--json")
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  parser.add_argument(
      "--child-heap-state", type=int, default=0, help=argparse.SUPPRESS
  )
  args = parser.parse_args()
  if args.child is not None:
    child_main(args.child, args.child_heap_state)
    return
  stock = median_count(args.stock_python, args.calls, args.heap_states)
  patched = median_count(args.patched_python, args.calls, args.heap_states)
  print(
      "| case | stock instructions per call | patched | patched/stock | "
      "less the allocators: stock | patched | patched/stock |"
  )
  print("|---|---|---|---|---|---|---|")
  report = {}
  for case in CASES:
    ratio = patched[case, "whole"] / stock[case, "whole"]
    code_ratio = patched[case, "code"] / stock[case, "code"]
    report[case] = {
        "stock": stock[case, "whole"],
        "patched": patched[case, "whole"],
        "ratio": ratio,
        "met": ratio <= 1.0,
        "stock_less_allocators": stock[case, "code"],
        "patched_less_allocators": patched[case, "code"],
        "ratio_less_allocators": code_ratio,
    }
    print(
        f"| {case} | {stock[case, 'whole']:,.0f} | "
        f"{patched[case, 'whole']:,.0f} | {ratio:.3f}x "
        f"({'met' if ratio <= 1.0 else 'NOT met'}: <= 1.0x) | "
        f"{stock[case, 'code']:,.0f} | {patched[case, 'code']:,.0f} | "
        f"{code_ratio:.4f}x |"
    )
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
