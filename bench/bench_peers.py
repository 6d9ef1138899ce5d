"""Equinox and Flax NNX with the relative-identity opt-in against their own
ways to share on stock JAX.

Usage::

    python bench/bench_peers.py [--stock-python PY] [--patched-python PY]
        [--runs N] [--calls N] [--json out.json]

Patched and stock JAX cannot be imported in one process, so the parent runs
this script as children, alternately under the stock interpreter and under
the patched one (stock, patched, patched, stock, ...), ``--runs`` times each.

Cells (cache-hit calls of an already compiled function, per call):

- equinox step: one optax.adamw training step of the tied transformer LM of
  tests/jax/equinox_tied_lm.py. Patched: ``TiedLM`` (one ``eqx.nn.Embedding``
  object in two places, ``eqx.Module`` opted in) under ``eqx.filter_jit``.
  Stock: ``SharedLM`` (tied with ``eqx.nn.Shared``) under ``eqx.filter_jit``.
- nnx 100 layers: the forward call of an NNX model whose 100 layers are one
  ``nnx.Linear``. Patched: plain ``jax.jit`` (``nnx.Pytree`` and
  ``nnx.Variable`` opted in). Stock: ``nnx.jit`` (graph mode).

A cell's time is the median per-call time over its batches; a ratio is the
median over the run pairs (run k of each side) of patched / stock.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
NNX_LAYERS = 100


def _per_call_seconds(call, calls, batches):
  """Median over `batches` of the time of `calls` calls, per call."""
  import jax

  call()  # compile
  times = []
  for _ in range(batches):
    start = time.perf_counter()
    for _ in range(calls):
      out = call()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls)
  return statistics.median(times)


def _equinox_step(side):
  import equinox as eqx
  import jax

  if side == "patched":
    jax.tree_util.preserve_relative_identities(eqx.Module)
  sys.path.insert(0, str(ROOT / "tests" / "jax"))
  import equinox_tied_lm as lm

  model_class = lm.TiedLM if side == "patched" else lm.SharedLM
  model = model_class(jax.random.key(0))
  opt_state = lm.optimizer.init(eqx.filter(model, eqx.is_array))
  inputs, targets = lm.batch()
  step = eqx.filter_jit(lm.step)
  return lambda: step(model, opt_state, inputs, targets)


def _nnx_forward(side):
  import jax
  import jax.numpy as jnp
  from flax import nnx

  if side == "patched":
    jax.tree_util.preserve_relative_identities(nnx.Pytree)
    jax.tree_util.preserve_relative_identities(nnx.Variable)

  class Deep(nnx.Module):

    def __init__(self, rngs):
      layer = nnx.Linear(8, 8, rngs=rngs)
      for index in range(NNX_LAYERS):
        setattr(self, f"layer{index:03d}", layer)

    def __call__(self, x):
      for index in range(NNX_LAYERS):
        x = getattr(self, f"layer{index:03d}")(x)
      return x

  model = Deep(nnx.Rngs(0))
  x = jnp.ones((2, 8))
  forward = (jax.jit if side == "patched" else nnx.jit)(
      lambda model, x: model(x)
  )
  return lambda: forward(model, x)


def child_main(args):
  cells = {
      "equinox step": _equinox_step(args.child),
      "nnx 100 layers": _nnx_forward(args.child),
  }
  print(
      json.dumps(
          {
              name: _per_call_seconds(call, args.calls, args.batches)
              for name, call in cells.items()
          }
      )
  )


def _run_child(python, side, args):
  done = subprocess.run(
      [
          python,
          "-P",
          __file__,
          "--child",
          side,
          "--calls",
          str(args.calls),
          "--batches",
          str(args.batches),
      ],
      capture_output=True,
      text=True,
      cwd="/",
      check=True,
  )
  return json.loads(done.stdout.splitlines()[-1])


def parent_main(args):
  runs = {"stock": [], "patched": []}
  for k in range(args.runs):
    order = ("stock", "patched") if k % 2 == 0 else ("patched", "stock")
    for side in order:
      python = args.stock_python if side == "stock" else args.patched_python
      runs[side].append(_run_child(python, side, args))
  targets = {"equinox step": ("<=", 0.7), "nnx 100 layers": ("<=", 0.1)}
  report = {}
  print(
      f"{'cell':16} {'stock us':>9} {'patched us':>11} {'ratio':>7} "
      f"{'range':>13}  target"
  )
  for name, (_, bound) in targets.items():
    stock = statistics.median(run[name] for run in runs["stock"])
    patched = statistics.median(run[name] for run in runs["patched"])
    ratios = [p[name] / s[name] for s, p in zip(runs["stock"], runs["patched"])]
    ratio = statistics.median(ratios)
    met = "met" if ratio <= bound else "NOT met"
    print(
        f"{name:16} {stock * 1e6:9.1f} {patched * 1e6:11.1f} {ratio:7.3f} "
        f"{min(ratios):6.3f}-{max(ratios):.3f}  <= {bound}: {met}"
    )
    report[name] = {
        "stock_s": stock,
        "patched_s": patched,
        "ratio": ratio,
        "ratios": ratios,
        "target": bound,
        "met": ratio <= bound,
    }
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--stock-python",
      default=os.environ.get(
          "JAXLIB_PATCH_STOCK_PYTHON", str(ROOT / ".venv-test/bin/python")
      ),
  )
  parser.add_argument(
      "--patched-python", default=str(ROOT / ".venv-jax/bin/python")
  )
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--calls", type=int, default=50)
  parser.add_argument("--batches", type=int, default=20)
  parser.add_argument("--json")
  parser.add_argument(
      "--child", choices=("stock", "patched"), help=argparse.SUPPRESS
  )
  args = parser.parse_args()
  if args.child:
    child_main(args)
  else:
    parent_main(args)


if __name__ == "__main__":
  main()
