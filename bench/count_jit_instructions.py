"""Instructions per cached `jax.jit` call, stock jax against the patched wheels.

Usage::

    python bench/count_jit_instructions.py [--stock-python PY]
        [--patched-python PY] [--calls N] [--cases A,B] [--json out.json]
        [--by-function N] [--nothing-opted-in]

Cases (CASES), each calling a function that returns the tree with 1 added
to every leaf: first as bench_jit.py names them, hoisted (``f(x)`` on one
``float32[8]``, `f` made once), inline (``jax.jit(g)(x)`` on the same
array, a new ``jax.jit`` object at every call) and dict (``f(d)`` on a dict
of 100 ``float32[8]``); then one per kind of call of
tests/jax/jit_call_kinds.py (numpy and Python scalars, bfloat16, complex,
typed and raw keys, None, keyword and static arguments, containers, a
sharded array, ...), each on a jitted function of its own.

Every child opts the cases' Layer class in (the opted-in model's case
needs it), so that the cases run in a process with an opt-in, where a call
on a custom node takes the front door's general path; with
``--nothing-opted-in`` no class is opted in and that case is left out: the
process of a program that has the custom wheels and opts nothing in, where
every call with at most one dynamic keyword takes stock's dispatch as it is.

With ``--by-function N`` it counts each side once (heap state 0) and prints,
per case, the N functions whose instructions per call differ most between
the two sides: where a case's difference lies.

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

import children
from count_instructions import (
    callgrind_totals,
    dump_costs_by_function,
    dump_totals_and_allocator,
    measure_runs,
    median_over_heap_states,
    pad_heap,
    per_call_counts,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Each case's label in the table, in the order counted. The first three are
# the cases counted since the front door; the others are the kinds of call
# of tests/jax/jit_call_kinds.py.
CASES = {
    "hoisted": "hoisted `f(x)`, one `float32[8]`",
    "inline": "inline `jax.jit(f)(x)`",
    "dict": "dict of 100 arrays",
    "two arrays": "`f(x, y)`, two arrays",
    "numpy array": "a numpy `float32[8]`",
    "numpy scalar": "a numpy `float32` scalar",
    "python float": "a Python float",
    "python int": "a Python int",
    "python bool": "a Python bool",
    "array and scalars": "an array, a float and an int",
    "bfloat16": "a `bfloat16[8]`",
    "complex64": "a `complex64[8]`",
    "typed key": "a typed key, `jax.random.key(0)`",
    "typed key and array": "a typed key and an array",
    "raw key": "a raw key, `jax.random.PRNGKey(0)`",
    "raw key and array": "a raw key and an array",
    "typed key in a dict": "a typed key in a dict",
    "None": "`f(None)`",
    "array and None": "`f(x, None)`",
    "keyword": "`f(a=x)`, a keyword argument",
    "array and keyword": "`f(x, b=y)`",
    "static argnum": "`f(x, 3)`, `static_argnums=1`",
    "static argname": "`f(x, n=3)`, `static_argnames='n'`",
    "list": "a list of two arrays",
    "tuple": "a tuple of two arrays",
    "namedtuple": "a namedtuple of two arrays",
    "dataclass": "a dataclass of two arrays",
    "partial": "a `tree_util.Partial` and an array",
    "sharded": "an array sharded over 2 devices",
    "weak-typed": "a weak-typed `float32` scalar",
    "no arguments": "`f()`",
    "opted-in model": "a model of one opted-in layer in two places",
}
# The case that needs a class opted in; without --nothing-opted-in every
# child opts Layer in (node_classes), so that every case is counted in a
# process with an opt-in, where calls on custom nodes take the general path.
OPTED_IN_CASE = "opted-in model"


def node_classes(opt_in):
  """The cases' classes of nodes: Layer (opted in on the custom wheels if
  `opt_in`, a plain dataclass node on stock), the dataclass Pair and the
  namedtuple Point."""
  import collections
  import dataclasses
  import inspect

  import jax

  register = jax.tree_util.register_dataclass
  opt_in = opt_in and (
      "preserve_relative_identities" in inspect.signature(register).parameters
  )

  @dataclasses.dataclass
  class Layer:
    w: jax.Array

  Layer = (register(preserve_relative_identities=True) if opt_in else register)(
      Layer
  )

  @register
  @dataclasses.dataclass
  class Pair:
    a: object
    b: object

  return Layer, Pair, collections.namedtuple("Point", ["x", "y"])


def calls_of_cases(opt_in):
  """Each case's call, each on a jitted function of its own (stock's global
  cache is keyed on the function), after one call that compiled it; Layer
  opted in if `opt_in` (node_classes)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  def add_one(tree):
    return jax.tree.map(lambda leaf: leaf + 1, tree)

  def new_add_one():
    return lambda *args, **kwargs: add_one((args, kwargs))

  Layer, Pair, Point = node_classes(opt_in)
  x = jnp.asarray(np.arange(8, dtype=np.float32))
  y = x * 2
  d = {f"a{i:03d}": x + i for i in range(100)}
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
  sharded = jax.device_put(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  )
  layer = Layer(w=x)
  hoisted = jax.jit(add_one)
  jit = lambda: jax.jit(new_add_one())
  uniform = lambda k: jax.random.uniform(k)
  uniform_plus = lambda k, a: a + jax.random.uniform(k)
  static_argnum = jax.jit(lambda a, n: a * n, static_argnums=1)
  static_argname = jax.jit(lambda a, n: a * n, static_argnames="n")
  partial = jax.tree_util.Partial(lambda s, a: s * a, y)
  calls_of = {
      "hoisted": lambda: hoisted(x),
      "inline": lambda: jax.jit(add_one)(x),
      "dict": lambda: hoisted(d),
      "numpy array": (jit(), (np.arange(8, dtype=np.float32),)),
      "two arrays": (jit(), (x, y)),
      "numpy scalar": (jit(), (np.float32(2.0),)),
      "python float": (jit(), (2.0,)),
      "python int": (jit(), (2,)),
      "python bool": (jax.jit(lambda b: jnp.logical_not(b)), (True,)),
      "array and scalars": (jit(), (x, 2.0, 3)),
      "bfloat16": (jit(), (x.astype(jnp.bfloat16),)),
      "complex64": (jit(), (x.astype(jnp.complex64),)),
      # Each a new function: (lambda: ...)() is one per case.
      "typed key": (jax.jit(lambda k: uniform(k)), (jax.random.key(0),)),
      "typed key and array": (
          jax.jit(lambda k, a: uniform_plus(k, a)),
          (jax.random.key(0), x),
      ),
      "raw key": (jax.jit(lambda k: uniform(k)), (jax.random.PRNGKey(0),)),
      "raw key and array": (
          jax.jit(lambda k, a: uniform_plus(k, a)),
          (jax.random.PRNGKey(0), x),
      ),
      "typed key in a dict": (
          jax.jit(lambda d: jax.random.uniform(d["k"])),
          ({"k": jax.random.key(0)},),
      ),
      "None": (jit(), (None,)),
      "array and None": (jit(), (x, None)),
      "list": (jit(), ([x, y],)),
      "tuple": (jit(), ((x, y),)),
      "namedtuple": (jit(), (Point(x, y),)),
      "dataclass": (jit(), (Pair(x, y),)),
      "partial": (jax.jit(lambda p, a: p(a)), (partial, x)),
      "sharded": (jit(), (sharded,)),
      "weak-typed": (jit(), (jax.jit(lambda: 1.5)(),)),
      "no arguments": (jax.jit(lambda: jnp.arange(3.0)), ()),
      "opted-in model": (jit(), (Pair(layer, layer),)),
  }
  keyword, array_and_keyword = jit(), jit()
  calls_of["keyword"] = lambda: keyword(a=x)
  calls_of["array and keyword"] = lambda: array_and_keyword(x, b=y)
  calls_of["static argnum"] = lambda: static_argnum(x, 3)
  calls_of["static argname"] = lambda: static_argname(x, n=3)
  for case, call in calls_of.items():
    if isinstance(call, tuple):
      # Bound now: a default argument, not the loop's variable.
      calls_of[case] = lambda f=call[0], args=call[1]: f(*args)
  for call in calls_of.values():
    jax.block_until_ready(call())
  return calls_of


def child_main(calls, heap_state, cases, opt_in):
  import gc

  heap_padding = pad_heap(heap_state)  # Kept to the end.

  import jax

  calls_of = calls_of_cases(opt_in)
  gc.disable()
  for case in cases:
    measure_runs(calls_of[case], calls)
    jax.block_until_ready(calls_of[case]())


def run_child(python, calls, heap_state, cases, opt_in, read):
  """What `read` finds in the callgrind dumps of a child under `python`
  that counts `cases`, with Layer opted in if `opt_in`."""
  return callgrind_totals(
      children.child_command(
          python,
          __file__,
          *("--child", calls, "--child-heap-state", heap_state),
          *("--cases", ",".join(cases)),
          *(() if opt_in else ("--nothing-opted-in",)),
      ),
      read=read,
      cwd="/",
      env=dict(
          os.environ,
          JAX_PLATFORMS="cpu",
          OPENBLAS_NUM_THREADS="1",
          PYTHONHASHSEED="0",
          # The sharded case's two devices, on both sides and for every case.
          XLA_FLAGS="--xla_force_host_platform_device_count=2",
      ),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
  )


def count(python, calls, heap_state, cases, opt_in):
  """Instructions per call of each of `cases` under `python`: keyed (case,
  "whole") for the whole call and (case, "code") for the call less glibc's
  and CPython's allocators (count_instructions.ALLOCATOR_FUNCTIONS)."""
  totals, allocator = run_child(
      python, calls, heap_state, cases, opt_in, dump_totals_and_allocator
  )
  whole = per_call_counts(totals, [calls] * len(cases))
  code = per_call_counts(
      [total - spent for total, spent in zip(totals, allocator)],
      [calls] * len(cases),
  )
  counts = {}
  for case, whole_count, code_count in zip(cases, whole, code):
    counts[case, "whole"] = whole_count
    counts[case, "code"] = code_count
  return counts


def median_count(python, calls, heap_states, cases, opt_in):
  """Each case's median instructions per call over `heap_states` children."""
  return median_over_heap_states(
      lambda heap_state: count(python, calls, heap_state, cases, opt_in),
      heap_states,
  )


def by_function(python, calls, cases, opt_in):
  """Per case, the instructions per call of each function under `python`
  (heap state 0), keyed (the file of its code, the function's name)."""
  dumps = run_child(python, calls, 0, cases, opt_in, dump_costs_by_function)
  per_case = {}
  for i, case in enumerate(cases):
    empty, measured = dumps[3 * i + 1], dumps[3 * i + 2]
    per_case[case] = {
        where: (measured.get(where, 0) - empty.get(where, 0)) / calls
        for where in set(measured) | set(empty)
    }
  return per_case


def print_by_function(stock_python, patched_python, calls, cases, top, opt_in):
  """The `top` functions whose instructions per call differ most between
  the sides, per case."""
  stock = by_function(stock_python, calls, cases, opt_in)
  patched = by_function(patched_python, calls, cases, opt_in)
  for case in cases:
    functions = set(stock[case]) | set(patched[case])
    delta = {
        where: patched[case].get(where, 0) - stock[case].get(where, 0)
        for where in functions
    }
    print(
        f"\n{CASES[case]}: stock {sum(stock[case].values()):,.0f}, "
        f"patched {sum(patched[case].values()):,.0f} instructions per call"
    )
    print("| file | function | stock | patched | patched - stock |")
    print("|---|---|---|---|---|")
    for where in sorted(delta, key=lambda w: -abs(delta[w]))[:top]:
      print(
          f"| {where[0]} | `{where[1]}` | {stock[case].get(where, 0):,.0f} | "
          f"{patched[case].get(where, 0):,.0f} | {delta[where]:+,.0f} |"
      )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  children.add_interpreter_arguments(parser)
  parser.add_argument("--calls", type=int, default=2000)
  parser.add_argument(
      "--heap-states",
      type=int,
      default=1,
      help="children per side, each from another heap layout (median)",
  )
  parser.add_argument(
      "--cases",
      default=",".join(CASES),
      help="comma-separated cases to count (default: all): " + ", ".join(CASES),
  )
  parser.add_argument("--json")
  parser.add_argument(
      "--nothing-opted-in",
      action="store_true",
      help="count in processes where no class is opted in (Layer registered "
      "plainly; the opted-in model's case is left out): a program that "
      "has the custom wheels and opts nothing in",
  )
  parser.add_argument(
      "--by-function",
      type=int,
      metavar="N",
      help="print, per case, the N functions that differ most between the "
      "sides (one child per side, heap state 0)",
  )
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  parser.add_argument(
      "--child-heap-state", type=int, default=0, help=argparse.SUPPRESS
  )
  args = parser.parse_args()
  cases = args.cases.split(",")
  unknown = set(cases) - set(CASES)
  if unknown:
    parser.error(f"no such case: {', '.join(sorted(unknown))}")
  if args.child is not None:
    child_main(
        args.child, args.child_heap_state, cases, not args.nothing_opted_in
    )
    return
  opt_in = not args.nothing_opted_in
  if not opt_in:
    cases = [case for case in cases if case != OPTED_IN_CASE]
  if args.by_function:
    print_by_function(
        args.stock_python,
        args.patched_python,
        args.calls,
        cases,
        args.by_function,
        opt_in,
    )
    return
  stock = median_count(
      args.stock_python, args.calls, args.heap_states, cases, opt_in
  )
  patched = median_count(
      args.patched_python, args.calls, args.heap_states, cases, opt_in
  )
  print(
      "| case | stock instructions per call | patched | patched/stock | "
      "less the allocators: stock | patched | patched/stock |"
  )
  print("|---|---|---|---|---|---|---|")
  report = {}
  for case in cases:
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
        f"| {CASES[case]} | {stock[case, 'whole']:,.0f} | "
        f"{patched[case, 'whole']:,.0f} | {ratio:.3f}x "
        f"({'met' if ratio <= 1.0 else 'NOT met'}: <= 1.0x) | "
        f"{stock[case, 'code']:,.0f} | {patched[case, 'code']:,.0f} | "
        f"{code_ratio:.4f}x |"
    )
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
