"""Transformations of a shared DAG: time against depth.

Usage::

    python bench/bench_shared_dag.py [--depths 10,100,...] [--repeats N]
        [--json out.json]

Runs under the interpreter of an environment with the custom wheels. The
tree is ``n = Param(x); for _ in range(d): n = Pair(n, n)``, both classes
opted in: ``d + 1`` unique nodes at ``2^d`` places. Stock JAX, which walks
every place, cannot run it past a depth of about 20, so there is no stock
column: what this measures is that each transformation's time grows with
the unique nodes (linearly in ``d``), never with the places. Each cell is
the best of ``--repeats`` calls of a new transformation (tracing, and for
jit compilation, included, as a training step's first call pays them),
garbage collector paused (``bench_limits.best_per_call``).
"""

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_limits import best_per_call  # noqa: E402
from machine import cpu_model  # noqa: E402
from result_tables import shared_dag_table  # noqa: E402


@jax.tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Param:
  value: jax.Array


@jax.tree_util.register_dataclass(preserve_relative_identities=True)
@dataclasses.dataclass
class Pair:
  left: object
  right: object


def shared_dag(depth):
  node = Param(jnp.ones((2,)))
  for _ in range(depth):
    node = Pair(node, node)
  return node


def total(tree):
  return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(tree))


def identity(tree):
  return tree


TRANSFORMATIONS = {
    # A new function each call, so that jit traces and compiles each time.
    "jit": lambda n: jax.jit(lambda t: t)(n),
    "grad": lambda n: jax.grad(total)(n),
    "value_and_grad, aux": lambda n: jax.value_and_grad(
        lambda t: (total(t), t), has_aux=True
    )(n),
    "vmap": lambda n: jax.vmap(identity)(n),
    "scan": lambda n: jax.lax.scan(
        lambda carry, _: (carry, None), n, None, length=2
    ),
    "checkpoint": lambda n: jax.checkpoint(identity)(n),
    "tree.map": lambda n: jax.tree.map(lambda x: x + 1, n),
    "device_put": jax.device_put,
}


def main():
  # The tree is d levels deep: pytree operations, as stock's, recurse once a
  # level, within Python's recursion limit.
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--depths", default="10,30,100,300,1000")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", type=pathlib.Path)
  args = parser.parse_args()
  depths = [int(d) for d in args.depths.split(",")]
  seconds = {name: [] for name in TRANSFORMATIONS}
  for depth in depths:
    tree = shared_dag(depth)
    for name, transform in TRANSFORMATIONS.items():
      seconds[name].append(
          best_per_call(
              lambda: jax.block_until_ready(transform(tree)),
              calls=1,
              rounds=args.repeats,
          )
      )
  print(shared_dag_table(depths, seconds))
  if args.json:
    args.json.write_text(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"
                ),
                "machine": cpu_model(),
                "python": platform.python_version(),
                "jax": jax.__version__,
                "depths": depths,
                "seconds": seconds,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
  main()
