"""bench_jit.py's child: measures one interpreter's jax.jit on the cells of
jit_cases.py and prints its result (children.print_result) for the parent.

It checks that the interpreter's jax is the side it was started as, that
(v)'s output keeps its shared layer on the patched side only, that every
timed call hit the cache; it reports the HLO parameters and the trace,
compile and first-call times of the model cases, where the time of (i)
goes, and the per-call times of every cell's batches.
"""

import gc
import inspect
import random
import re
import statistics
import sys
import time
import timeit

from children import print_result
from jit_cases import (
    FUNCTIONS,
    KINDS,
    NUM_LAYERS,
    array_maker,
    make_cells,
    make_eqx_cells,
    make_nnx_cells,
    make_trees,
    update,
)


def is_patched(expected):
  """Whether this interpreter's jax has the opt-in; exits unless that is
  the `expected` side ("stock" or "patched")."""
  import jax

  register = jax.tree_util.register_pytree_node
  patched = (
      "preserve_relative_identities" in inspect.signature(register).parameters
  )
  if patched != (expected == "patched"):
    raise SystemExit(
        f"{sys.executable}: jax {jax.__version__} at {jax.__file__} is "
        f"{'patched' if patched else 'stock'}, expected {expected}"
    )
  return patched


def versions():
  """The versions of what the child measures, and the backend it runs on."""
  import importlib.metadata

  import jax
  import numpy as np

  return {
      "python": sys.version.split()[0],
      "jax": jax.__version__,
      # The distributions' versions tell the custom wheels (+relid) apart.
      "jax_distribution": importlib.metadata.version("jax"),
      "jaxlib_distribution": importlib.metadata.version("jaxlib"),
      "numpy": np.__version__,
      "backend": jax.default_backend(),
  }


def sharing_checks(cells, shared_layer, patched):
  """Sharing in the outputs of (v), none in (iv); exits if (v)'s sharing is
  not the side's."""
  import numpy as np

  out_v = cells["v/tree"][0]()
  out_iv = cells["iv/tree"][0]()
  checks = {
      "v out shares layers": out_v.layers[0] is out_v.layers[NUM_LAYERS - 1],
      "iv out shares layers": out_iv.layers[0] is out_iv.layers[1],
      "v out value ok": bool(
          np.allclose(out_v.layers[5].w, shared_layer.w + 1)
      ),
  }
  if patched and not checks["v out shares layers"]:
    raise SystemExit("patched jax.jit did not keep the shared layer shared")
  if not patched and checks["v out shares layers"]:
    raise SystemExit("stock jax.jit kept sharing?")
  return checks


def hlo_params(text):
  """The number of parameters of a lowered module's main function."""
  for line in text.splitlines():
    if "func.func public @main(" in line:
      return len(re.findall(r"%arg\d+:", line))
  return None


def compile_stats(trees, compile_reps):
  """Per model cell, the HLO parameters and the median trace+lower,
  compile and first-call times of fresh jax.jit objects."""
  import jax

  stats = {}
  for case in ("iv", "v"):
    for kind in KINDS:
      lower_s, compile_s, first_s = [], [], []
      nparams = None
      for rep in range(compile_reps + 1):  # rep 0: not kept
        f = jax.jit(lambda t, _g=FUNCTIONS[kind]: _g(t))  # fresh: no cache
        t0 = time.perf_counter()
        lowered = f.lower(trees[case])
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        compile_s.append(t2 - t1)
        nparams = hlo_params(lowered.as_text())
        g = jax.jit(lambda t, _g=FUNCTIONS[kind]: _g(t))
        t0 = time.perf_counter()
        jax.block_until_ready(g(trees[case]))
        if rep:
          first_s.append(time.perf_counter() - t0)
        else:
          lower_s.clear()
          compile_s.clear()
      stats[f"{case}/{kind}"] = {
          "hlo_params": nparams,
          "lower_ms": 1e3 * statistics.median(lower_s),
          "compile_ms": 1e3 * statistics.median(compile_s),
          "first_call_ms": 1e3 * statistics.median(first_s),
      }
  return stats


def breakdown(jitted, trees, patched, rounds):
  """Where the time of (i) goes: the min of timeit repeats, ns per call."""
  import jax

  f_i, x_i = jitted["i/tree"], trees["i"]
  parts = {"f(x)": lambda: f_i(x_i)}
  if patched:
    from jax._src import jit_front_door
    from jax._src import tree_util as src_tree_util

    # As the front door flattens a call and hands it to the stock dispatch.
    flat = src_tree_util.identity_tracing_registry.flatten
    DA = jit_front_door.DispatchArgs
    leaves_i, td_i = flat(((x_i,), {}))
    parts.update(
        {
            "flatten((args, kwargs))": lambda: flat(((x_i,), {})),
            "DispatchArgs(...)": lambda: DA(leaves_i, td_i, (x_i,), {}),
        }
    )
  parts["jax.jit(f)"] = lambda: jax.jit(update)
  n_bd = 2000 if rounds < 10 else 20000
  return {
      k: 1e9 * min(timeit.repeat(fn, number=n_bd, repeat=5)) / n_bd
      for k, fn in parts.items()
  }


def time_cells(cells, extras, rounds, seed):
  """{name: [µs per call of each kept batch]}: every round runs one batch
  of each common cell in a seeded random order, then of each extra cell;
  round 0 is a warm-up. The garbage collector is off but between rounds."""
  import jax

  all_cells = {**cells, **extras}
  for call, sync, _ in all_cells.values():  # warm up: trace, compile
    for _ in range(3):
      jax.block_until_ready(sync(call()))

  common = sorted(cells)
  extra = sorted(extras)
  order_rng = random.Random(seed)
  extra_rng = random.Random(seed + 1)
  times = {name: [] for name in all_cells}
  gc.collect()
  gc.disable()
  try:
    for rnd in range(rounds + 1):  # round 0 is a warm-up, not kept
      order = common[:]
      order_rng.shuffle(order)
      order2 = extra[:]
      extra_rng.shuffle(order2)
      for name in order + order2:
        call, sync, n = all_cells[name]
        t0 = time.perf_counter()
        for _ in range(n):
          out = call()
        sync(out).block_until_ready()
        dt = (time.perf_counter() - t0) / n
        if rnd:
          times[name].append(dt * 1e6)
      gc.enable()
      gc.collect()
      gc.disable()
  finally:
    gc.enable()
  return times


def child_main(args):
  """Measures this interpreter's side (`args.child`) and prints the result."""
  import jax

  if args.platforms:
    jax.config.update("jax_platforms", args.platforms)
  patched = is_patched(args.child)
  arr = array_maker()
  trees, shared_layer = make_trees(patched, arr)
  cells, jitted = make_cells(trees)
  info = versions()
  checks = sharing_checks(cells, shared_layer, patched)
  extras = {}
  if patched:
    extras.update(make_nnx_cells(arr, checks, info))
    extras.update(make_eqx_cells(arr, checks, info))
  compile_ = compile_stats(trees, args.compile_reps)
  breakdown_ns = breakdown(jitted, trees, patched, args.rounds)
  times = time_cells(cells, extras, args.rounds, args.seed)
  # every timed call was a cache hit: one entry per jitted function
  checks["one cache entry per jit"] = all(
      f._cache_size() == 1 for f in jitted.values()
  )
  print_result(
      {
          "variant": args.child,
          "info": info,
          "checks": checks,
          "times_us": times,
          "compile": compile_,
          "breakdown_ns": breakdown_ns,
      }
  )
