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
platform to jax, as build/check_gpu.py does to time the cases on a GPU.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_model

NUM_LAYERS = 100
NUM_DICT = 100
KINDS = ("tree", "scalar")

# Calls per batch, per case: fixed, so that both children run the same schedule.
BATCH_CALLS = {
    "i": 200,
    "inline": 200,
    "ii": 40,
    "iii": 20,
    "iv": 20,
    "v": 20,
    "nnx": 4,
    "eqx_share": 8,
    "eqx_plain": 4,
}
COMMON_CASES = ("i", "inline", "ii", "iii", "iv", "v")
EXTRA_CASES = ("nnx", "eqx_share", "eqx_plain")
CASE_LABELS = {
    "i": "(i) one small array",
    "inline": "inline jax.jit(f)(x), one small array",
    "ii": "(ii) dict of 100 arrays",
    "iii": "(iii) 100 layers, no opt-in",
    "iv": "(iv) 100 layers, opted in, unshared",
    "v": "(v) 1 opted-in layer shared x100",
    "nnx": "(v) nnx.jit, 1 nnx layer shared x100",
    "eqx_share": "(v) eqx share-through, 1 layer shared x100",
    "eqx_plain": "(v) plain eqx.filter_jit, shared x100",
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ==========================================================================
# The child: measures one interpreter's jax.
# ==========================================================================


def child_main(args):
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import tree_util

  if args.platforms:
    jax.config.update("jax_platforms", args.platforms)
  register = tree_util.register_pytree_node
  import inspect

  patched = (
      "preserve_relative_identities" in inspect.signature(register).parameters
  )
  if patched != (args.child == "patched"):
    raise SystemExit(
        f"{sys.executable}: jax {jax.__version__} at {jax.__file__} is "
        f"{'patched' if patched else 'stock'}, expected {args.child}"
    )

  # ---- the trees -------------------------------------------------------

  class Layer:

    def __init__(self, w, b, scale):
      self.w, self.b, self.scale = w, b, scale

  class LayerR(Layer):
    """The class opted in to relative identities (in the patched jax)."""

  class Model:

    def __init__(self, layers):
      self.layers = layers

  for cls, flags in (
      (Layer, {}),
      (LayerR, {"preserve_relative_identities": True} if patched else {}),
  ):
    register(
        cls,
        lambda l: ((l.w, l.b, l.scale), None),
        (lambda c: lambda _, ch: c(*ch))(cls),
        **flags,
    )
  register(Model, lambda m: ((m.layers,), None), lambda _, ch: Model(ch[0]))

  rng = np.random.default_rng(0)

  def arr(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

  def new_layer(cls):
    return cls(arr(4, 4), arr(4), arr())

  shared_layer = new_layer(LayerR)
  trees = {
      "i": arr(8),
      "ii": {f"a{i:03d}": arr(8) for i in range(NUM_DICT)},
      "iii": Model([new_layer(Layer) for _ in range(NUM_LAYERS)]),
      "iv": Model([new_layer(LayerR) for _ in range(NUM_LAYERS)]),
      "v": Model([shared_layer] * NUM_LAYERS),
  }

  # ---- the functions (the same for every case and library) ---------------

  def update(t):
    """x + 1 on every distinct leaf object (memo by id, so a leaf that is
    the same tracer at several positions stays one output)."""
    memo = {}

    def one(x):
      y = memo.get(id(x))
      if y is None:
        y = memo[id(x)] = x + 1
      return y

    return jax.tree.map(one, t)

  def total(t):
    """Sum of the sums of the distinct leaf objects."""
    seen = {id(x): x for x in jax.tree.leaves(t)}
    return sum(jnp.sum(x) for x in seen.values())

  funs = {"tree": update, "scalar": total}

  def first_leaf(out):
    return jax.tree.leaves(out)[0]

  cells = {}  # name -> (call, sync, ncalls)
  jitted = {}
  for case in COMMON_CASES:
    for kind in KINDS:
      if case == "inline":
        cells[f"{case}/{kind}"] = (
            (lambda g=funs[kind], x=trees["i"]: jax.jit(g)(x)),
            first_leaf,
            BATCH_CALLS[case],
        )
        continue
      f = jax.jit(lambda t, _g=funs[kind]: _g(t))
      x = trees[case]
      jitted[f"{case}/{kind}"] = f
      cells[f"{case}/{kind}"] = (
          (lambda f=f, x=x: f(x)),
          first_leaf,
          BATCH_CALLS[case],
      )

  checks = {}
  info = {
      "python": sys.version.split()[0],
      "jax": jax.__version__,
      "jax_file": jax.__file__,
      "numpy": np.__version__,
      "backend": jax.default_backend(),
  }

  # sanity: sharing in the outputs of (v), none in (iv)
  out_v = cells["v/tree"][0]()
  out_iv = cells["iv/tree"][0]()
  checks["v out shares layers"] = (
      out_v.layers[0] is out_v.layers[NUM_LAYERS - 1]
  )
  checks["iv out shares layers"] = out_iv.layers[0] is out_iv.layers[1]
  checks["v out value ok"] = bool(
      np.allclose(out_v.layers[5].w, shared_layer.w + 1)
  )
  if patched and not checks["v out shares layers"]:
    raise SystemExit("patched jax.jit did not keep the shared layer shared")
  if not patched and checks["v out shares layers"]:
    raise SystemExit("stock jax.jit kept sharing?")

  extras = {}
  if patched:
    extras.update(make_nnx_cells(jax, jnp, arr, checks, info))
    extras.update(
        make_eqx_cells(jax, jnp, arr, update, total, first_leaf, checks, info)
    )

  # ---- HLO parameters and trace/compile time ------------------------------

  def hlo_params(text):
    for line in text.splitlines():
      if "func.func public @main(" in line:
        return len(re.findall(r"%arg\d+:", line))
    return None

  compile_stats = {}
  for case in ("iv", "v"):
    for kind in KINDS:
      lower_s, compile_s, first_s = [], [], []
      nparams = None
      for rep in range(args.compile_reps + 1):  # rep 0: not kept
        f = jax.jit(lambda t, _g=funs[kind]: _g(t))  # fresh: no cache
        t0 = time.perf_counter()
        lowered = f.lower(trees[case])
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        compile_s.append(t2 - t1)
        nparams = hlo_params(lowered.as_text())
        g = jax.jit(lambda t, _g=funs[kind]: _g(t))
        t0 = time.perf_counter()
        jax.block_until_ready(g(trees[case]))
        if rep:
          first_s.append(time.perf_counter() - t0)
        else:
          lower_s.clear()
          compile_s.clear()
      compile_stats[f"{case}/{kind}"] = {
          "hlo_params": nparams,
          "lower_ms": 1e3 * statistics.median(lower_s),
          "compile_ms": 1e3 * statistics.median(compile_s),
          "first_call_ms": 1e3 * statistics.median(first_s),
      }

  # ---- where the time of (i) goes (min of timeit repeats, ns per call) ----
  import timeit

  f_i, x_i = jitted["i/tree"], trees["i"]
  parts = {"f(x)": lambda: f_i(x_i)}
  if patched:
    from jax._src import tree_util as src_tree_util

    flat = src_tree_util.tracing_registry.flatten
    DA = src_tree_util.DispatchArgs
    leaves_i, td_i = flat(((x_i,), {}))
    parts.update(
        {
            "flatten((args, kwargs))": lambda: flat(((x_i,), {})),
            "DispatchArgs(...)": lambda: DA(leaves_i, td_i, (x_i,), {}),
        }
    )
  parts["jax.jit(f)"] = lambda: jax.jit(update)
  n_bd = 2000 if args.rounds < 10 else 20000
  breakdown = {
      k: 1e9 * min(timeit.repeat(fn, number=n_bd, repeat=5)) / n_bd
      for k, fn in parts.items()
  }

  # ---- timing ---------------------------------------------------------------

  all_cells = dict(cells)
  all_cells.update(extras)
  for call, sync, _ in all_cells.values():  # warm up: trace, compile
    for _ in range(3):
      jax.block_until_ready(sync(call()))

  common = sorted(cells)
  extra = sorted(extras)
  order_rng = random.Random(args.seed)
  extra_rng = random.Random(args.seed + 1)
  times = {name: [] for name in all_cells}
  gc.collect()
  gc.disable()
  try:
    for rnd in range(args.rounds + 1):  # round 0 is a warm-up, not kept
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

  # every timed call was a cache hit: one entry per jitted function
  checks["one cache entry per jit"] = all(
      f._cache_size() == 1 for f in jitted.values()
  )
  result = {
      "variant": args.child,
      "info": info,
      "checks": checks,
      "times_us": times,
      "compile": compile_stats,
      "breakdown_ns": breakdown,
  }
  with open(args.child_out, "w") as fh:
    json.dump(result, fh)


def make_nnx_cells(jax, jnp, arr, checks, info):
  try:
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import flax
    from flax import nnx
  except Exception as e:  # pragma: no cover
    info["flax"] = f"not available: {type(e).__name__}: {e}"
    return {}
  info["flax"] = flax.__version__

  class NLayer(nnx.Module):

    def __init__(self):
      self.w = nnx.Param(arr(4, 4))
      self.b = nnx.Param(arr(4))
      self.scale = nnx.Param(arr())

  class NModel(nnx.Module):

    def __init__(self, layer):
      self.layers = nnx.List([layer] * NUM_LAYERS)

  layer = NLayer()
  model = NModel(layer)

  @nnx.jit
  def nnx_update(m):
    # nnx style: update the (de-duplicated) state in place
    nnx.update(m, jax.tree.map(lambda x: x + 1, nnx.state(m)))

  @nnx.jit
  def nnx_total(m):
    return sum(jnp.sum(x) for x in jax.tree.leaves(nnx.state(m)))

  before = float(layer.scale[...])
  nnx_update(model)
  checks["nnx state has 3 leaves"] = len(jax.tree.leaves(nnx.state(model))) == 3
  checks["nnx keeps sharing"] = model.layers[0] is model.layers[NUM_LAYERS - 1]
  checks["nnx updated once"] = abs(float(layer.scale[...]) - before - 1) < 1e-5
  return {
      "nnx/tree": (
          lambda: nnx_update(model),
          lambda _: layer.w[...],
          BATCH_CALLS["nnx"],
      ),
      "nnx/scalar": (
          lambda: nnx_total(model),
          lambda out: out,
          BATCH_CALLS["nnx"],
      ),
  }


def make_eqx_cells(jax, jnp, arr, update, total, first_leaf, checks, info):
  try:
    import equinox as eqx
  except Exception as e:  # pragma: no cover
    info["equinox"] = f"not available: {type(e).__name__}: {e}"
    return {}
  info["equinox"] = eqx.__version__

  class ELayer(eqx.Module):
    w: jax.Array
    b: jax.Array
    scale: jax.Array

  class EModel(eqx.Module):
    layers: tuple

  layer = ELayer(arr(4, 4), arr(4), arr())
  model = EModel(tuple([layer] * NUM_LAYERS))
  share_update = share_through(update)
  share_total = share_through(total)
  plain_update = eqx.filter_jit(update)
  plain_total = eqx.filter_jit(total)

  out = share_update(model)
  checks["eqx share-through re-shares leaves"] = (
      out.layers[0].w is out.layers[NUM_LAYERS - 1].w
  )
  checks["eqx share-through value ok"] = bool(
      jnp.allclose(out.layers[3].w, layer.w + 1)
  )
  checks["eqx share-through traced 3 leaves"] = (
      share_update.last_num_unique == 3
  )
  return {
      "eqx_share/tree": (
          lambda: share_update(model),
          first_leaf,
          BATCH_CALLS["eqx_share"],
      ),
      "eqx_share/scalar": (
          lambda: share_total(model),
          lambda o: o,
          BATCH_CALLS["eqx_share"],
      ),
      "eqx_plain/tree": (
          lambda: plain_update(model),
          first_leaf,
          BATCH_CALLS["eqx_plain"],
      ),
      "eqx_plain/scalar": (
          lambda: plain_total(model),
          lambda o: o,
          BATCH_CALLS["eqx_plain"],
      ),
  }


def share_through(fn):
  """``eqx.filter_jit(fn)`` that passes each distinct leaf object once.

  Before the call, the leaves of the arguments are de-duplicated by ``id()``;
  the plan (treedef and, per position, the index of its distinct leaf) is a
  static argument, so it is part of the cache key. Inside, the tree is
  rebuilt with the same tracer at every position of one leaf. The outputs are
  de-duplicated the same way and rebuilt after the call, so an output leaf
  that was one tracer inside is one array outside.
  """
  import equinox as eqx
  import jax

  def split(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    distinct, index, where = [], [], {}
    for leaf in leaves:
      i = where.get(id(leaf))
      if i is None:
        i = where[id(leaf)] = len(distinct)
        distinct.append(leaf)
      index.append(i)
    return distinct, (treedef, tuple(index))

  def join(distinct, plan):
    treedef, index = plan
    return jax.tree_util.tree_unflatten(treedef, [distinct[i] for i in index])

  @eqx.filter_jit
  def inner(distinct, plan):
    wrapper.last_num_unique = len(distinct)
    return split(fn(join(distinct, plan)))  # the out plan is static output

  def wrapper(tree):
    distinct, plan = split(tree)
    out_distinct, out_plan = inner(distinct, plan)
    return join(out_distinct, out_plan)

  wrapper.last_num_unique = None
  return wrapper


# ==========================================================================
# The parent: runs the children, alternating, and reports.
# ==========================================================================


def default_patched_python():
  for cand in (
      os.path.join(REPO, ".venv-jax/bin/python"),
      os.path.join(REPO, ".venv/bin/python"),
      "/tmp/venvjax/bin/python",
  ):
    if os.path.exists(cand):
      return cand
  return None


def run_child(python, variant, args, tmpdir, k):
  out = os.path.join(tmpdir, f"{variant}{k}.json")
  cmd = [
      python,
      "-E",
      "-s",
      os.path.abspath(__file__),
      "--child",
      variant,
      "--child-out",
      out,
      "--rounds",
      str(args.rounds),
      "--seed",
      str(args.seed),
      "--platforms",
      args.platforms,
      "--compile-reps",
      str(args.compile_reps),
  ]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  if args.platforms:
    env["JAX_PLATFORMS"] = args.platforms
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if proc.returncode != 0:
    sys.stderr.write(proc.stdout + proc.stderr)
    raise SystemExit(f"child {variant} ({python}) failed: rc={proc.returncode}")
  with open(out) as fh:
    res = json.load(fh)
  print(
      f"  run {k + 1}: {variant:7s} {time.perf_counter() - t0:5.1f} s",
      flush=True,
  )
  return res


def med(xs):
  return statistics.median(xs) if xs else float("nan")


def fmt_us(x):
  return f"{x:.1f}" if x == x else "-"


def parent_main(args):
  stock_py = args.stock_python or sys.executable
  patched_py = args.patched_python or default_patched_python()
  if not patched_py:
    raise SystemExit("no --patched-python given and none found")
  print(f"stock:   {stock_py}\npatched: {patched_py}")
  print(f"{args.runs} runs each, {args.rounds} rounds per run, alternating")
  runs = {"stock": [], "patched": []}
  t_start = time.time()
  with tempfile.TemporaryDirectory() as tmpdir:
    for k in range(args.runs):
      order = ("stock", "patched") if k % 2 == 0 else ("patched", "stock")
      for variant in order:
        py = stock_py if variant == "stock" else patched_py
        runs[variant].append(run_child(py, variant, args, tmpdir, k))
  elapsed = time.time() - t_start

  def pooled(variant, name):
    return med([t for r in runs[variant] for t in r["times_us"].get(name, [])])

  def per_run(variant, name):
    return [med(r["times_us"].get(name, [])) for r in runs[variant]]

  rows = []
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
      rows.append(
          (
              CASE_LABELS[case],
              kind,
              fmt_us(s),
              fmt_us(p),
              f"{ratio:.2f}x",
              f"{min(pr):.2f}-{max(pr):.2f}x",
          )
      )
  for case in EXTRA_CASES:
    for kind in KINDS:
      name = f"{case}/{kind}"
      p = pooled("patched", name)
      v = res[f"v/{kind}"]["patched_us"]
      res[name] = {"patched_us": p, "vs_patched_v": p / v}
      rows.append(
          (
              CASE_LABELS[case],
              kind,
              "-",
              fmt_us(p),
              f"{p / v:.1f}x (v)" if p == p else "-",
              "",
          )
      )

  header = (
      "case",
      "fn",
      "stock µs",
      "patched µs",
      "patched/stock",
      "range over runs",
  )
  table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  table += ["| " + " | ".join(r) + " |" for r in rows]
  print()
  print("\n".join(table))
  print(
      "\nµs: median per call over all batches of all runs. patched/stock: "
      "median over the run pairs (stock run k, patched run k, adjacent in "
      "time) of the ratio of their medians. Rows marked '(v)': their time / "
      "patched jax.jit's time on (v) (higher = jax.jit faster)."
  )

  # ---- targets ----
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

  # ---- HLO params and compile times (medians over runs) ----
  print("\nTrace+compile (median over runs; fresh jax.jit each):")
  comp = {}
  chead = (
      "interpreter",
      "case",
      "fn",
      "HLO params",
      "trace+lower ms",
      "compile ms",
      "first call ms",
  )
  ctable = ["| " + " | ".join(chead) + " |", "|" + "---|" * len(chead)]
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
        label = {
            "iv": "(iv) 100 distinct layers",
            "v": "(v) 1 layer shared x100",
        }[case]
        ctable.append(
            f"| {variant} | {label} | {kind} | {c['hlo_params']} | "
            f"{c['lower_ms']:.1f} | {c['compile_ms']:.1f} | "
            f"{c['first_call_ms']:.1f} |"
        )
  print("\n".join(ctable))

  print("\nChecks:")
  for variant in ("stock", "patched"):
    r = runs[variant][0]
    print(
        f"  {variant}: " + ", ".join(f"{k}={v}" for k, v in r["checks"].items())
    )
    print(
        f"  {variant}: " + ", ".join(f"{k}={v}" for k, v in r["info"].items())
    )
  print("\nWhere the time of (i) tree goes (ns per call, min over runs):")
  bd = {}
  for variant in ("stock", "patched"):
    for key in runs[variant][0]["breakdown_ns"]:
      v = min(r["breakdown_ns"][key] for r in runs[variant])
      bd[f"{variant}: {key}"] = v
      print(f"  {variant:7s} {key:28s} {v:7.0f}")
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
              "argv": sys.argv,
              "stock_python": stock_py,
              "patched_python": patched_py,
              "runs": args.runs,
              "rounds": args.rounds,
              "batch_calls": BATCH_CALLS,
              "elapsed_s": elapsed,
              "results": res,
              "breakdown_ns": bd,
              "compile": comp,
              "targets": targets,
              "markdown_table": table,
              "markdown_compile_table": ctable,
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
  ap.add_argument(
      "--stock-python",
      help="interpreter with stock jax 0.10.2 " "(default: this one)",
  )
  ap.add_argument(
      "--patched-python",
      help="interpreter with the custom wheels "
      "(default: .venv-jax, .venv or /tmp/venvjax)",
  )
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
      "jax's own choice, e.g. the GPU; build/check_gpu.py runs the patched "
      "child that way)",
  )
  ap.add_argument(
      "--strict", action="store_true", help="exit 1 if a target is missed"
  )
  ap.add_argument(
      "--child", choices=("stock", "patched"), help=argparse.SUPPRESS
  )
  ap.add_argument("--child-out", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.child:
    return child_main(args)
  if args.quick:
    args.runs, args.rounds, args.compile_reps = 1, 3, 1
  return parent_main(args)


if __name__ == "__main__":
  sys.exit(main())
