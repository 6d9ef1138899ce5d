"""The custom wheels on a GPU: relative identities, buffers and timings.

    bash build/check_gpu.sh WHEELS [options]     # fresh venv, offline install
    python build/check_gpu.py --no-install [options]   # this interpreter

WHEELS is a folder with the custom jax and jaxlib wheels (jaxlib for the
venv's Python) and, for a GPU, the stock jax-cuda13-plugin and
jax-cuda13-pjrt wheels of the same version (or the CUDA 12 ones). A wheel
split into NAME.part-000, NAME.part-001, ... is put back together first
(under build/_work/check-gpu/wheels/). The wheels that fit the venv's Python
are installed with ``pip install --no-index --no-deps --force-reinstall``
into a fresh venv made with ``--system-site-packages`` (so that the NVIDIA
runtime wheels, numpy and the rest come from the machine's Python, while the
given wheels override any jax already there); then the checks run in that
venv. Extra wheels in WHEELS (equinox, optax and what they need, for the
timing) are installed the same way; one wheel per distribution.

Checks, each passed, failed or skipped:

- install: jax and jaxlib are the custom distributions, imported from where
  those distributions are, and with --expect-dist (the install step passes
  one per wheel) every given wheel is what is installed;
- device: jax's backend and devices are the expected platform (gpu, or what
  JAX_PLATFORMS names) and no jax module comes from outside the venv;
- jit, grad, vmap, scan: a Parent whose left and right are one opted-in
  Child keeps ``left is right`` inside the traced function and on the
  outputs, outputs are new objects, one leaf, one gradient (the sum over
  both uses);
- buffers: ``jax.device_put`` of 100 references to one opted-in Param over a
  large host array makes exactly one new device buffer;
- donation: a jitted call that donates a tree holding one Param twice
  deletes the input buffer and works;
- tied LM: one step of the Equinox model of tests/jax/equinox_tied_lm.py,
  tied by identity (``eqx.Module`` opted in), against the same model tied
  with ``eqx.nn.Shared``: same loss, one table gradient equal to Shared's,
  the tie kept through the step; both timed with bench/bench_peers.py's
  code, in this process (Shared first, before the opt-in, which cannot be
  undone); skipped, saying so, where Equinox or optax is missing;
- jit dispatch: bench/bench_jit.py's patched child on this platform, its
  sanity checks held; its cases timed.

The last line is ``check_gpu: N passed, M failed, K skipped (device: ...)``;
the exit status is 1 if a check failed. Timings are printed, and written with
the checks to --json, never checked.
"""

import argparse
import gc
import importlib.metadata
import inspect
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "_work" / "check-gpu"

# --lm presets, (vocabulary, width, sequence, batch); "tiny" is the size
# tests/jax/equinox_tied_lm.py defines, where dispatch dominates, "gpu" one
# where the device's work does.
LM_PRESETS = {"tiny": None, "gpu": (32768, 1024, 512, 16)}

PART_RE = re.compile(r"(?P<name>.+)\.part-(?P<index>\d+)")
WHEEL_RE = re.compile(
    r"(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl"
)


class CheckError(Exception):
  """The install step cannot go on; the message says why."""


# ==========================================================================
# The install step: wheels, venv, pip.
# ==========================================================================


def gather_wheels(source, dest):
  """The wheels of folder `source`, whole, in a fresh folder `dest`; returns
  their paths. NAME.part-000, NAME.part-001, ... are concatenated into NAME
  (numbered from 0 without a gap) and NAME must then read as a whole zip;
  a whole NAME beside its parts is used as it is."""
  if dest.resolve() == source.resolve():
    raise CheckError(f"{source} is the folder the wheels are gathered in")
  if dest.exists():
    shutil.rmtree(dest)
  dest.mkdir(parents=True)
  parts, whole = {}, []
  for path in sorted(source.iterdir()):
    match = PART_RE.fullmatch(path.name)
    if match:
      parts.setdefault(match["name"], []).append((int(match["index"]), path))
    elif path.name.endswith(".whl"):
      whole.append(path)
  wheels = []
  for path in whole:
    target = dest / path.name
    try:
      os.link(path, target)
    except OSError:  # another file system, or no hard links
      shutil.copy2(path, target)
    wheels.append(target)
  for name, pieces in sorted(parts.items()):
    if name in {path.name for path in whole}:
      print(f"  {name}: whole file found, its parts are not used")
      continue
    pieces.sort()
    numbers = [index for index, _ in pieces]
    if numbers != list(range(len(pieces))):
      raise CheckError(
          f"{name}: parts {numbers} in {source}, expected 0 to "
          f"{len(pieces) - 1} without a gap"
      )
    target = dest / name
    with open(target, "wb") as out:
      for _, path in pieces:
        with open(path, "rb") as piece:
          shutil.copyfileobj(piece, out, 1 << 22)
    if name.endswith(".whl"):
      try:
        with zipfile.ZipFile(target) as wheel:
          bad = wheel.testzip()
      except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
        bad = str(e)
      if bad:
        raise CheckError(f"{name}, from {len(pieces)} parts, is corrupt: {bad}")
      wheels.append(target)
    print(f"  {name}: put together from {len(pieces)} parts")
  return wheels


def wheel_tags(path):
  """(distribution name normalized, version, {"py-abi-platform", ...})."""
  match = WHEEL_RE.fullmatch(path.name)
  if not match:
    raise CheckError(f"{path.name} is not a wheel's file name")
  name = re.sub(r"[-_.]+", "_", match["name"]).lower()
  tags = {
      f"{python}-{abi}-{platform}"
      for python in match["python"].split(".")
      for abi in match["abi"].split(".")
      for platform in match["platform"].split(".")
  }
  return name, match["version"], tags


def select_wheels(wheels, supported):
  """The wheels whose tags an interpreter with tags `supported` installs: one
  per distribution, a custom (local-labelled) jax and jaxlib among them."""
  chosen = {}
  for path in wheels:
    name, version, tags = wheel_tags(path)
    if tags & set(supported):
      chosen.setdefault(name, []).append((version, path))
  twice = {name: found for name, found in chosen.items() if len(found) > 1}
  if twice:
    raise CheckError(
        "more than one wheel per distribution for this Python: "
        + "; ".join(
            f"{name}: " + ", ".join(path.name for _, path in found)
            for name, found in sorted(twice.items())
        )
    )
  for name in ("jax", "jaxlib"):
    if name not in chosen:
      raise CheckError(f"no {name} wheel for this Python among the wheels")
    version = chosen[name][0][0]
    if "+" not in version:
      raise CheckError(f"{name} {version}: not a custom build (no +label)")
  return {name: found[0] for name, found in sorted(chosen.items())}


TAGS_PROBE = """
import json
try:
  from packaging import tags
except ImportError:
  from pip._vendor.packaging import tags
print(json.dumps([str(tag) for tag in tags.sys_tags()]))
"""


def install(args):
  """Install the wheels into a fresh venv, run the checks there; the checks'
  exit status."""
  source = pathlib.Path(args.wheels).resolve()
  print(f"check_gpu: wheels from {source}")
  wheels = gather_wheels(source, WORK / "wheels")
  venv = pathlib.Path(args.venv).resolve()
  command = [args.python, "-m", "venv", "--clear"]
  if args.system_site_packages:
    command.append("--system-site-packages")
  subprocess.run(command + [str(venv)], check=True)
  python = str(venv / "bin" / "python")
  supported = json.loads(
      subprocess.run(
          [python, "-I", "-c", TAGS_PROBE],
          check=True,
          capture_output=True,
          text=True,
      ).stdout
  )
  chosen = select_wheels(wheels, supported)
  for _, path in chosen.values():
    print(f"  installing {path.name}")
  # --isolated: no pip configuration or PIP_* variable can bring in an index
  # or another wheel folder. --force-reinstall --no-deps: exactly these
  # wheels, in the venv, whatever the machine's Python already has.
  pip = [python, "-I", "-m", "pip", "--isolated", "--disable-pip-version-check"]
  links = ["--no-index", "--find-links", str(WORK / "wheels")]
  subprocess.run(
      pip
      + ["install", "--quiet", *links, "--no-deps", "--force-reinstall"]
      + [str(path) for _, path in chosen.values()],
      check=True,
  )
  command = [
      python,
      "-I",
      str(pathlib.Path(__file__).resolve()),
      "--no-install",
  ]
  for name, (version, _) in chosen.items():
    command += ["--expect-dist", f"{name}=={version}"]
  command += forwarded(args)
  return subprocess.run(command).returncode


def forwarded(args):
  """The options of the checks, for the run in the venv."""
  options = [
      "--calls",
      str(args.calls),
      "--batches",
      str(args.batches),
      "--jit-rounds",
      str(args.jit_rounds),
      "--big-mib",
      str(args.big_mib),
      "--platform",
      args.platform,
  ]
  for size in args.lm:
    options += ["--lm", size]
  if args.json:
    options += ["--json", str(pathlib.Path(args.json).resolve())]
  return options


# ==========================================================================
# The checks, in the current interpreter.
# ==========================================================================


class Skip(Exception):
  """The check cannot run here; the message says why."""


class Conditions:
  """The conditions of one check; `done` raises with every one that failed."""

  def __init__(self):
    self.failed = []

  def __call__(self, ok, what):
    if not ok:
      self.failed.append(what)

  def done(self, detail):
    if self.failed:
      raise AssertionError("; ".join(self.failed))
    return detail


class Child:

  def __init__(self, x):
    self.x = x


class Parent:

  def __init__(self, left, right):
    self.left = left
    self.right = right


class Param:
  """An opted-in wrapper of one array, as a model ties a weight with."""

  def __init__(self, value):
    self.value = value


def register_nodes(jax):
  """The demo's classes: Child opted in, Parent not (the sharing is the
  child's); and Param."""
  register = jax.tree_util.register_pytree_node
  register(
      Child,
      lambda c: ((c.x,), None),
      lambda _, xs: Child(*xs),
      preserve_relative_identities=True,
  )
  register(
      Parent, lambda p: ((p.left, p.right), None), lambda _, xs: Parent(*xs)
  )
  register(
      Param,
      lambda p: ((p.value,), None),
      lambda _, xs: Param(*xs),
      preserve_relative_identities=True,
  )


def check_install(expect):
  import jax
  import jaxlib
  from jax._src.lib import pytree

  c = Conditions()
  versions = {}
  for name, module in (("jax", jax), ("jaxlib", jaxlib)):
    version = versions[name] = importlib.metadata.version(name)
    c("+" in version, f"{name} {version} is not a custom build")
    base = version.split("+")[0]
    # The published version.py stays: a jax of another version that the
    # venv does not hide would show here.
    c(
        module.__version__ == base,
        f"{name}.__version__ is {module.__version__}, not {base}",
    )
    located = importlib.metadata.distribution(name).locate_file(
        f"{name}/__init__.py"
    )
    c(
        os.path.realpath(located) == os.path.realpath(module.__file__),
        f"{name} is imported from {module.__file__}, its distribution "
        f"{version} is at {located}",
    )
  c(
      versions["jax"] == versions["jaxlib"],
      f"jax {versions['jax']} beside jaxlib {versions['jaxlib']}",
  )
  c(
      pytree.__name__ == "jaxlib_patch.pytree",
      f"jax._src.lib.pytree is {pytree.__name__}",
  )
  c(
      "preserve_relative_identities"
      in inspect.signature(jax.tree_util.register_pytree_node).parameters,
      "register_pytree_node has no preserve_relative_identities",
  )
  for spec in expect:
    name, version = spec.split("==")
    try:
      found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found = "not installed"
    c(found == version, f"{name} is {found}, the wheel given is {version}")
  return c.done(
      f"jax {versions['jax']}, jaxlib {versions['jaxlib']} from "
      f"{os.path.dirname(os.path.dirname(jax.__file__))}"
      + (f"; {len(expect)} wheel(s) as given" if expect else "")
  )


def accelerator_dists():
  """The accelerator plugins' distributions, each the one that imports (the
  first on sys.path: the venv's before the machine's)."""
  found = {}
  for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
    if re.match(r"jax-(cuda|rocm)|libtpu", name):
      found.setdefault(name, f"{name} {dist.version}")
  return sorted(found.values())


def check_device(jax, platform, in_venv):
  import jax.numpy as jnp

  c = Conditions()
  devices = jax.devices()
  backend = jax.default_backend()
  c(backend == platform, f"jax's backend is {backend}, not {platform}")
  c(
      all(d.platform == platform for d in devices),
      f"devices {devices}, not {platform}",
  )
  x = jnp.arange(4.0) + 1
  c(x.devices() == {devices[0]}, f"a result lies on {x.devices()}")
  c(float(x.sum()) == 10.0, f"arange(4) + 1 sums to {float(x.sum())}")
  if in_venv:
    prefix = os.path.realpath(sys.prefix) + os.sep
    outside = sorted(
        f"{name} ({module.__file__})"
        for name, module in list(sys.modules.items())
        if re.fullmatch(
            r"jax|jaxlib|jaxlib_patch|jax_plugins|jax_(cuda|rocm)\d+_plugin",
            name.split(".")[0],
        )
        and getattr(module, "__file__", None)
        and not os.path.realpath(module.__file__).startswith(prefix)
    )
    c(not outside, f"modules from outside the venv: {outside[:5]}")
  plugins = accelerator_dists()
  return c.done(
      f"{len(devices)} x {devices[0].device_kind} ({backend}); "
      f"plugins: {', '.join(plugins) or 'none'}"
  )


def hlo_parameters(lowered):
  text = lowered.as_text()
  main = re.search(r"func\.func public @main\((.*?)\) ->", text)
  return len(re.findall(r"%arg\d+:", main[1])) if main else None


def check_jit(jax):
  import jax.numpy as jnp

  c = Conditions()
  child = Child(jnp.array(2.0))
  parent = Parent(child, child)
  inside = []

  @jax.jit
  def identity(p):
    inside.append(p.left is p.right)
    return p

  for call in ("first call", "cached call"):
    out = identity(parent)
    c(out.left is out.right, f"{call}: out.left is not out.right")
    c(
        out is not parent and out.left is not child,
        f"{call}: the output is the input object",
    )
  c(inside == [True], f"inside the trace, left is right: {inside}")
  c(
      out.left.x.devices() == {jax.devices()[0]},
      f"the output lies on {out.left.x.devices()}",
  )
  c(len(jax.tree.leaves(parent)) == 1, "the shared child is not one leaf")
  params = hlo_parameters(jax.jit(lambda p: p.left.x + p.right.x).lower(parent))
  c(params == 1, f"the lowered function has {params} parameters, not 1")
  return c.done("left is right inside and out; 1 leaf, 1 HLO parameter")


def check_grad(jax):
  import jax.numpy as jnp

  c = Conditions()
  child = Child(jnp.array(2.0))
  parent = Parent(child, child)
  for how in ("grad", "jit(grad)"):
    inside = []

    def product(p):
      inside.append(p.left is p.right)
      return p.left.x * p.right.x

    grad = jax.grad(product)
    grads = (grad if how == "grad" else jax.jit(grad))(parent)
    c(inside and all(inside), f"{how}: inside, left is right: {inside}")
    c(grads.left is grads.right, f"{how}: two gradient objects")
    c(grads.left is not child, f"{how}: the gradient is the input object")
    c(len(jax.tree.leaves(grads)) == 1, f"{how}: more than one gradient leaf")
    value = float(grads.left.x)
    c(value == 4.0, f"{how}: gradient {value}, not 2 * x = 4 (both uses)")
  return c.done("one gradient object, the sum over both uses (4.0)")


def check_vmap(jax):
  import jax.numpy as jnp
  import numpy as np

  c = Conditions()
  child = Child(jnp.arange(3.0))
  batched = Parent(child, child)
  inside = []

  def same(p):
    inside.append(p.left is p.right)
    return p

  out = jax.vmap(same)(batched)
  c(inside == [True], f"inside, left is right: {inside}")
  c(out.left is out.right, "out.left is not out.right")
  c(out.left is not child, "the output is the input object")
  sums = jax.vmap(lambda p: p.left.x + p.right.x)(batched)
  c(np.allclose(sums, 2 * np.arange(3.0)), f"left + right is {sums}")
  return c.done("left is right inside and out")


def check_scan(jax):
  import jax.numpy as jnp
  import numpy as np

  c = Conditions()
  start = Child(jnp.zeros(2))
  inside = []

  def body(carry, x):
    inside.append(carry.left is carry.right)
    new = Child(carry.left.x + x)
    return Parent(new, new), new

  carry, ys = jax.lax.scan(body, Parent(start, start), jnp.arange(3.0))
  c(inside and all(inside), f"inside the body, left is right: {inside}")
  c(carry.left is carry.right, "the final carry's left is not its right")
  c(carry.left is not start, "the carry is the input object")
  c(np.allclose(carry.left.x, 3.0), f"the carry is {carry.left.x}, not 3")
  c(ys.x.shape == (3, 2), f"ys has shape {ys.x.shape}")
  return c.done("the carry keeps left is right through 3 steps")


def bytes_in_use(device):
  stats = device.memory_stats()
  return stats.get("bytes_in_use") if stats else None


def check_buffers(jax, big_mib):
  import numpy as np

  c = Conditions()
  host = np.ones(int(big_mib * 2**20) // 4, np.float32)
  tree = [Param(host)] * 100
  device = jax.devices()[0]
  gc.collect()
  before, memory = len(jax.live_arrays()), bytes_in_use(device)
  out = jax.block_until_ready(jax.device_put(tree))
  new = len(jax.live_arrays()) - before
  c(new == 1, f"{new} new device buffers, not 1")
  c(out[0] is out[99], "the 100 references came back as copies")
  c(isinstance(out[0].value, jax.Array), "the value is not a jax.Array")
  detail = f"1 new buffer for 100 references to one {big_mib} MiB Param"
  if memory is not None:
    grown = bytes_in_use(device) - memory
    c(
        grown < 2 * host.nbytes,
        f"device memory grew by {grown} bytes, the array is {host.nbytes}",
    )
    detail += f"; device memory +{grown / 2**20:.1f} MiB"
  return c.done(detail)


def check_donation(jax, big_mib):
  import jax.numpy as jnp

  c = Conditions()
  param = Param(jnp.ones(int(big_mib * 2**20) // 4))
  tree = {"a": param, "b": param}
  double = jax.jit(lambda t: jax.tree.map(lambda x: x * 2, t), donate_argnums=0)
  gc.collect()
  before = len(jax.live_arrays())
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.block_until_ready(double(tree))
  c(param.value.is_deleted(), "the donated input buffer is not deleted")
  c(out["a"] is out["b"], "the output holds two Params")
  c(float(out["a"].value[0]) == 2.0, f"the output is {out['a'].value[0]}")
  grown = len(jax.live_arrays()) - before
  c(grown == 0, f"{grown} more live buffers: donated one, expected one out")
  unusable = [str(w.message) for w in caught if "donat" in str(w.message)]
  c(not unusable, f"jax warns: {unusable}")
  return c.done("the input buffer is donated once and deleted; the call works")


def per_call(call, args):
  """bench/bench_peers.py's timing: the median per-call seconds."""
  import bench_peers

  return bench_peers.time_cells({"call": call}, args.calls, args.batches)[
      "call"
  ]


def tied_lm_step(eqx, jax, lm, model_class):
  """One `optax.adamw` step of a fresh model under `eqx.filter_jit`, the
  same inputs every call, so each timed call does the same work."""
  model = model_class(jax.random.key(0))
  opt_state = lm.optimizer.init(eqx.filter(model, eqx.is_array))
  inputs, targets = lm.batch()
  step = eqx.filter_jit(lm.step)
  return lambda: step(model, opt_state, inputs, targets)


def lm_sizes(args, lm, defaults):
  for size in args.lm:
    preset = LM_PRESETS.get(size, "custom")
    if preset == "custom":
      preset = tuple(int(n) for n in size.split(","))
    yield size, preset or defaults


def check_tied_lm(jax, args, timings):
  try:
    import equinox as eqx
    import optax  # noqa: F401  (equinox_tied_lm trains with it)
  except ImportError as e:
    raise Skip(f"no tied-LM timing: Equinox or optax is not importable ({e})")
  import numpy as np
  import equinox_tied_lm as lm

  defaults = (lm.VOCAB, lm.DIM, lm.SEQ, lm.BATCH)
  c = Conditions()

  def resize(sizes):
    lm.VOCAB, lm.DIM, lm.SEQ, lm.BATCH = sizes

  value_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(lm.loss))

  def loss_and_grads(model):
    # Full float32 matmuls: a GPU's default (TF32) would round the two
    # models' different programs apart. The timed steps keep the default.
    with jax.default_matmul_precision("float32"):
      return value_and_grad(model, *lm.batch())

  shared = {}
  # eqx.nn.Shared first: the opt-in below is for the whole process and for
  # good, and Shared is timed as on stock, with eqx.Module not opted in.
  for size, sizes in lm_sizes(args, lm, defaults):
    resize(sizes)
    value, grads = loss_and_grads(lm.SharedLM(jax.random.key(0)))
    shared[size] = (
        float(value),
        np.asarray(grads.embeddings.pytree[0].weight),
        per_call(tied_lm_step(eqx, jax, lm, lm.SharedLM), args),
    )
  jax.tree_util.preserve_relative_identities(eqx.Module)
  for size, sizes in lm_sizes(args, lm, defaults):
    resize(sizes)
    value, grads = loss_and_grads(lm.TiedLM(jax.random.key(0)))
    shared_value, shared_table, shared_s = shared[size]
    c(
        grads.embedding is grads.unembedding,
        f"{size}: two gradient objects for the tied table",
    )
    c(
        np.isclose(float(value), shared_value, rtol=1e-4),
        f"{size}: loss {float(value)}, eqx.nn.Shared's {shared_value}",
    )
    table = np.asarray(grads.embedding.weight)
    scale = float(np.abs(shared_table).max())
    c(
        np.allclose(table, shared_table, rtol=1e-3, atol=1e-3 * scale),
        f"{size}: the table's gradient differs from eqx.nn.Shared's by up to "
        f"{float(np.abs(table - shared_table).max())}",
    )
    del grads
    step = tied_lm_step(eqx, jax, lm, lm.TiedLM)
    _, stepped, _ = step()
    c(
        stepped.embedding is stepped.unembedding,
        f"{size}: the step untied the table",
    )
    del stepped
    opt_in_s = per_call(step, args)
    rows = timings.setdefault("tied LM step: opt-in against eqx.nn.Shared", {})
    shown = ",".join(map(str, sizes))
    rows[size if size == shown else f"{size} {shown}"] = {
        "opt-in us": opt_in_s * 1e6,
        "eqx.nn.Shared us": shared_s * 1e6,
        "ratio": opt_in_s / shared_s,
    }
  resize(defaults)
  return c.done(
      f"sizes {', '.join(args.lm)}: loss and table gradient as "
      "eqx.nn.Shared's, one gradient, the tie kept through the step"
  )


def check_jit_dispatch(args, platform, timings):
  import bench_jit

  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "child.json")
    # --platforms '': the platform of this run (JAX_PLATFORMS, if set, is
    # inherited), not bench_jit's CPU.
    done = subprocess.run(
        [sys.executable, "-E", "-s", bench_jit.__file__]
        + ["--child", "patched", "--child-out", out, "--platforms", ""]
        + ["--rounds", str(args.jit_rounds), "--compile-reps", "1"],
        capture_output=True,
        text=True,
        timeout=900,
        # This process holds jax's preallocated share of the GPU's memory.
        env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
    )
    if done.returncode:
      tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
      raise AssertionError(
          f"bench_jit.py's child exited {done.returncode}: " + " | ".join(tail)
      )
    with open(out) as f:
      result = json.load(f)
  c = Conditions()
  backend = result["info"]["backend"]
  c(backend == platform, f"bench_jit ran on {backend}, not {platform}")
  # Only the unshared case (iv) has its layers apart in the output.
  wrong = [
      name
      for name, ok in result["checks"].items()
      if ok != (name != "iv out shares layers")
  ]
  c(not wrong, f"bench_jit's checks failed: {wrong}")
  cells = {}
  for case in bench_jit.COMMON_CASES + bench_jit.EXTRA_CASES:
    for kind in bench_jit.KINDS:
      times = result["times_us"].get(f"{case}/{kind}")
      if times:
        cells.setdefault(bench_jit.CASE_LABELS[case], {})[kind + " us"] = (
            statistics.median(times)
        )
  timings[f"jit dispatch on {backend}"] = cells
  params = {
      name: stats["hlo_params"] for name, stats in result["compile"].items()
  }
  return c.done(
      f"{len(result['checks'])} sanity checks held on {backend}; HLO "
      f"parameters {params}"
  )


def run_checks(args):
  sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "jax")]
  results, timings = [], {}

  def run(name, check, *check_args):
    start = time.perf_counter()
    try:
      status, detail = "passed", check(*check_args)
    except Skip as e:
      status, detail = "skipped", str(e)
    except Exception as e:  # any failure is the check's, reported, not fatal
      status, detail = "failed", f"{type(e).__name__}: {e}"
      if not isinstance(e, AssertionError):
        traceback.print_exc()
    seconds = time.perf_counter() - start
    results.append(
        {"check": name, "status": status, "detail": detail, "s": seconds}
    )
    print(f"[{status}] {name} ({seconds:.1f} s): {detail}", flush=True)
    return status == "passed"

  if not run("install", check_install, args.expect_dist):
    return finish(args, results, timings, "jax not usable")
  import jax

  register_nodes(jax)
  run("device", check_device, jax, args.platform, bool(args.expect_dist))
  run("jit", check_jit, jax)
  run("grad", check_grad, jax)
  run("vmap", check_vmap, jax)
  run("scan", check_scan, jax)
  run("buffers: device_put", check_buffers, jax, args.big_mib)
  run("buffers: donation", check_donation, jax, args.big_mib)
  run(
      "jit dispatch (bench_jit)",
      check_jit_dispatch,
      args,
      args.platform,
      timings,
  )
  # Last: it opts eqx.Module in, for the rest of the process.
  run("tied LM (equinox)", check_tied_lm, jax, args, timings)
  device = jax.devices()[0]
  return finish(
      args,
      results,
      timings,
      f"{device.device_kind}, {jax.default_backend()}; jax "
      f"{importlib.metadata.version('jax')}",
  )


def finish(args, results, timings, about):
  for name, rows in timings.items():
    print(f"timing: {name}")
    for label, values in rows.items():
      shown = ", ".join(
          f"{key} {value:.3f}" if key == "ratio" else f"{key} {value:.1f}"
          for key, value in values.items()
      )
      print(f"  {label}: {shown}")
  counts = {
      status: sum(r["status"] == status for r in results)
      for status in ("passed", "failed", "skipped")
  }
  summary = (
      f"check_gpu: {counts['passed']} passed, {counts['failed']} failed, "
      f"{counts['skipped']} skipped (device: {about})"
  )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
          {
              "summary": summary,
              "checks": results,
              "timings": timings,
              "python": sys.version.split()[0],
              "argv": sys.argv,
          },
          f,
          indent=1,
      )
  print(summary)
  return 1 if counts["failed"] else 0


def default_platform():
  named = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
  return {"": "gpu", "cuda": "gpu", "rocm": "gpu"}.get(named, named)


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
      "wheels", nargs="?", help="folder of wheels (not with --no-install)"
  )
  parser.add_argument(
      "--no-install",
      action="store_true",
      help="no venv and no install: check this interpreter's jax",
  )
  parser.add_argument(
      "--python",
      default=sys.executable,
      help="the interpreter the venv is made from (default: this one)",
  )
  parser.add_argument(
      "--venv",
      default=str(WORK / "venv"),
      help="the venv to make, emptied first (default %(default)s)",
  )
  parser.add_argument(
      "--no-system-site-packages",
      dest="system_site_packages",
      action="store_false",
      help="a venv without the interpreter's packages (then WHEELS must hold "
      "every dependency)",
  )
  parser.add_argument(
      "--platform",
      default=default_platform(),
      help="the platform jax must use: gpu unless JAX_PLATFORMS names one "
      "(default here: %(default)s)",
  )
  parser.add_argument(
      "--lm",
      action="append",
      metavar="SIZE",
      help="tied-LM size to time, repeatable: tiny (the test's), gpu "
      f"{LM_PRESETS['gpu']}, or V,D,S,B (vocabulary, width, sequence, batch; "
      "default tiny)",
  )
  parser.add_argument(
      "--calls", type=int, default=50, help="calls per timed batch"
  )
  parser.add_argument(
      "--batches", type=int, default=20, help="timed batches per model"
  )
  parser.add_argument(
      "--jit-rounds", type=int, default=20, help="bench_jit.py --rounds"
  )
  parser.add_argument(
      "--big-mib",
      type=float,
      default=256,
      help="MiB of the shared array of the buffer checks (default %(default)s)",
  )
  parser.add_argument("--json", help="write the checks and timings here")
  parser.add_argument(
      "--expect-dist",
      action="append",
      default=[],
      metavar="NAME==VERSION",
      help="a distribution that must be installed at that version "
      "(the install step passes one per wheel)",
  )
  args = parser.parse_args(argv)
  args.lm = args.lm or ["tiny"]
  for size in args.lm:
    if size not in LM_PRESETS and not re.fullmatch(r"\d+(,\d+){3}", size):
      parser.error(f"--lm {size}: expected tiny, gpu or V,D,S,B")
  if args.no_install:
    if args.wheels:
      parser.error("--no-install takes no wheel folder")
    return run_checks(args)
  if not args.wheels:
    parser.error("a wheel folder, or --no-install")
  try:
    return install(args)
  except (CheckError, subprocess.CalledProcessError) as e:
    print(f"check_gpu: install failed: {e}")
    return 1


if __name__ == "__main__":
  sys.exit(main())
