"""`nnx.jit` against plain `jax.jit` on the same Flax NNX module, with
`nnx.Pytree` and `nnx.Variable` opted in: the like-for-like comparison behind
docs/guide.md's figure for NNX.

Usage::

    python bench/bench_nnx_jit.py [--runs N] [--rounds N] [--calls N]
        [--json out.json]

Runs in one process, under the interpreter of an environment with the custom
wheels and flax. Cells (cache-hit calls of an already compiled function):

- shared x100, tree: 100 references to one ``nnx.Module`` with 3
  ``nnx.Param`` (bench_jit.py's (v) nnx model); the function adds 1 to every
  parameter (``nnx.update`` of the state), under ``nnx.jit`` in place, under
  ``jax.jit`` returning the module, which the next call gets;
- shared x100, scalar: the same module, the function the sum of its
  parameters;
- deep forward: one ``nnx.Linear(8, 8)`` used as 100 layers (bench_peers.py's
  deep model), the forward call on a ``float32[2, 8]`` batch.

Each round runs one batch of ``--calls`` calls of every cell, the two
functions of a cell back to back, in an order that alternates between
rounds. A function's time is the median per-call time over its batches; a
cell's ratio is ``nnx.jit`` over ``jax.jit`` of those medians, and the range
is that of the per-round ratios. ``--runs`` repeats the whole measurement in
the same process; the ratios the documents quote are the range over runs.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402

jax.tree_util.preserve_relative_identities(nnx.Pytree)
jax.tree_util.preserve_relative_identities(nnx.Variable)
# The models' ties are meant: acknowledged, as their user would.
warnings.filterwarnings("ignore", category=jax.tree_util.TiedByOptInWarning)

LAYERS = 100


class SmallLayer(nnx.Module):

  def __init__(self):
    self.w = nnx.Param(jnp.ones((4, 4)))
    self.b = nnx.Param(jnp.ones(4))
    self.scale = nnx.Param(jnp.ones(()))


class SharedModel(nnx.Module):

  def __init__(self, layer):
    self.layers = nnx.List([layer] * LAYERS)


class Deep(nnx.Module):

  def __init__(self, rngs):
    layer = nnx.Linear(8, 8, rngs=rngs)
    self.layers = nnx.List([layer] * LAYERS)

  def __call__(self, x):
    for layer in self.layers:
      x = jnp.tanh(layer(x))
    return x


def add_one(model):
  nnx.update(model, jax.tree.map(lambda x: x + 1, nnx.state(model)))
  return model


def total(model):
  return sum(jnp.sum(x) for x in jax.tree.leaves(nnx.state(model)))


def make_cells():
  """cell -> {"nnx.jit": call, "jax.jit": call}, each call returning what
  to block on."""
  shared = SharedModel(SmallLayer())
  loop = {"model": SharedModel(SmallLayer())}
  nnx_add_one, jax_add_one = nnx.jit(add_one), jax.jit(add_one)

  def jax_tree_call():
    loop["model"] = jax_add_one(loop["model"])
    return loop["model"].layers[0].scale[...]

  def nnx_tree_call():
    nnx_add_one(shared)
    return shared.layers[0].scale[...]

  deep, x = Deep(nnx.Rngs(0)), jnp.ones((2, 8))
  nnx_forward = nnx.jit(lambda model, x: model(x))
  jax_forward = jax.jit(lambda model, x: model(x))
  return {
      "shared x100, tree": {"nnx.jit": nnx_tree_call, "jax.jit": jax_tree_call},
      "shared x100, scalar": {
          "nnx.jit": lambda f=nnx.jit(total): f(shared),
          "jax.jit": lambda f=jax.jit(total): f(shared),
      },
      "deep forward": {
          "nnx.jit": lambda: nnx_forward(deep, x),
          "jax.jit": lambda: jax_forward(deep, x),
      },
  }


def check(cells):
  """Both functions of a cell agree, and jax.jit keeps the sharing."""
  out = cells["deep forward"]
  assert jnp.allclose(out["nnx.jit"](), out["jax.jit"]())
  scalar = cells["shared x100, scalar"]
  assert float(scalar["nnx.jit"]()) == float(scalar["jax.jit"]())
  model = SharedModel(SmallLayer())
  out = jax.jit(add_one)(model)
  assert out.layers[0] is out.layers[LAYERS - 1]


def time_batch(call, calls):
  start = time.perf_counter()
  for _ in range(calls):
    out = call()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls


def measure(cells, rounds, calls):
  for pair in cells.values():
    for call in pair.values():
      jax.block_until_ready(call())  # compile
  times = {(c, p): [] for c, pair in cells.items() for p in pair}
  for k in range(rounds):
    for cell, pair in cells.items():
      order = ("nnx.jit", "jax.jit") if k % 2 == 0 else ("jax.jit", "nnx.jit")
      for pattern in order:
        times[cell, pattern].append(time_batch(pair[pattern], calls))
  report = {}
  for cell in cells:
    nnx_times, jax_times = times[cell, "nnx.jit"], times[cell, "jax.jit"]
    per_round = [n / j for n, j in zip(nnx_times, jax_times)]
    report[cell] = {
        "nnx.jit_us": statistics.median(nnx_times) * 1e6,
        "jax.jit_us": statistics.median(jax_times) * 1e6,
        "ratio": statistics.median(nnx_times) / statistics.median(jax_times),
        "round_ratio_min": min(per_round),
        "round_ratio_max": max(per_round),
    }
  return report


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--calls", type=int, default=20)
  parser.add_argument("--json")
  args = parser.parse_args()
  import flax

  cells = make_cells()
  check(cells)
  started = time.perf_counter()
  runs = []
  for run in range(args.runs):
    report = measure(cells, args.rounds, args.calls)
    runs.append(report)
    print(f"run {run + 1}")
    print_report(report)
  if args.json:
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "load_average": os.getloadavg(),
        },
        "argv": sys.argv,
        "versions": {"jax": jax.__version__, "flax": flax.__version__},
        "rounds": args.rounds,
        "calls": args.calls,
        "elapsed_s": time.perf_counter() - started,
        "runs": runs,
    }
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


def print_report(report):
  print(
      f"{'cell':22} {'nnx.jit us':>11} {'jax.jit us':>11} {'ratio':>7}  range"
  )
  for cell, row in report.items():
    print(
        f"{cell:22} {row['nnx.jit_us']:11.1f} {row['jax.jit_us']:11.1f} "
        f"{row['ratio']:6.2f}x  {row['round_ratio_min']:.2f}-"
        f"{row['round_ratio_max']:.2f}x"
    )


if __name__ == "__main__":
  main()
