#!/usr/bin/env python3
"""A seeded random fuzzer for `jaxlib_patch.pytree`.

It drives fresh registries and the treedefs they make through random
sequences of operations (register_node / register_dataclass_node with and
without `preserve_relative_identities`, flatten, flatten_with_path,
flatten_up_to, unflatten, walk, from_iterable_tree, children, node_data,
from_node_data_and_children, compose, treedef_tuple, ==, hash, repr, pickle,
the protocol-buffer format, flatten_one_level, all_leaves ...) on random
DAG-shaped trees, with adversarial user code: flatten functions that raise,
return junk or non-iterables, return iterators that fail mid-way, mutate the
object being flattened or the containers being walked, or re-enter the module
(flatten, unflatten, register, pickle ...) from inside; unflatten functions
that return cached singletons, their own children or leaves; aux data and dict
keys whose `__eq__`, `__hash__`, `__lt__`, `__repr__` or `__reduce__` raise;
`__del__` methods and weakref callbacks that run all of the above while
objects die inside the module's loops, and `gc.collect()` from inside
callbacks.

Every operation must end in a result or a Python exception of an allowed type:
ValueError, TypeError, RecursionError, KeyError, or `Boom`, the exception the
fuzzer's own callbacks raise. Anything else is a *finding*: the module's
InternalError or another SystemError, any other exception type (a
RuntimeError among them), a broken invariant on an operation during which
no callback misbehaved (round trips, hash/== consistency, the children
partition, pickling), a hang, or a crash (the worker process dies of a
signal). Crashes are caught by running the campaign in worker processes,
which the driver restarts after the program that crashed.

One *execution* is one classified call into the module (a top-level
operation, or one made by a callback from inside another operation). A
*program* is one fresh registry with its own types, trees and treedefs and a
few dozen operations on them; program `i` of seed `s` is reproducible on its
own:

  python fuzz/pytree_fuzz.py --executions 1000000 --seed 1 --jobs 2
  python fuzz/pytree_fuzz.py --seconds 60 --seed 7
  python fuzz/pytree_fuzz.py --seed 1 --program 1234 --verbose   # replay one

The generators that found F1-F3 of docs/hardening.md (all fixed) stay in
the campaign; `--skip-known` turns off these three (a dict key whose __hash__
fails, mutation of the key lists that __getstate__/walk hand out or
__setstate__ takes, namedtuple look-alikes whose `_fields` do not match), to
look past them.
"""

import argparse
import faulthandler
import os
import sys

# The fuzzer's modules live beside this script, which `python -P` does not
# put on the path; the module under test comes from the path, or from the
# checkout when it is not installed.
FUZZ_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FUZZ_DIR)
try:
  from jaxlib_patch import pytree as pt
except ImportError:
  sys.path.insert(1, os.path.dirname(FUZZ_DIR))
  from jaxlib_patch import pytree as pt

from pytree_fuzzer.runner import run_in_process, worker_main
from pytree_fuzzer.supervisor import Supervisor


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--executions", type=int, default=None)
  parser.add_argument("--seconds", type=float, default=None)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--jobs",
      type=int,
      default=1,
      help="worker processes (programs are interleaved)",
  )
  parser.add_argument(
      "--start", type=int, default=0, help="index of the first program"
  )
  parser.add_argument(
      "--programs",
      type=int,
      default=None,
      help="run this many programs (a deterministic budget)",
  )
  parser.add_argument(
      "--program",
      type=int,
      default=None,
      help="replay one program in this process",
  )
  parser.add_argument("--verbose", action="store_true")
  parser.add_argument(
      "--skip-known",
      action="store_true",
      help="leave out the generators that reached findings "
      "F1-F3 of docs/hardening.md",
  )
  parser.add_argument("--hang-seconds", type=float, default=60.0)
  parser.add_argument("--json", default=None, help="write a JSON report")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument("--end", type=int, default=None, help=argparse.SUPPRESS)
  parser.add_argument("--expect-module", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)

  if args.worker:
    worker_main(args)
    return 0
  if args.program is not None:
    faulthandler.enable()
    runner = run_in_process(
        args.seed,
        programs=1,
        start=args.program,
        verbose=args.verbose,
        skip_known=args.skip_known,
    )
    for record in runner.findings:
      print(record["traceback"])
    print(
        f"program {args.program}: {runner.executions} executions, "
        f"outcomes {dict(runner.outcomes)}, "
        f"{len(runner.findings)} findings"
    )
    return 1 if runner.findings else 0
  if args.executions is None and args.seconds is None and args.programs is None:
    args.executions = 100_000
  print(f"jaxlib_patch.pytree from {pt.__file__}", flush=True)
  return Supervisor(args, os.path.abspath(__file__)).run()


if __name__ == "__main__":
  sys.exit(main())
