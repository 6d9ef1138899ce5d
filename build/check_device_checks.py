"""check_device.py's checks, each run in the interpreter under test: the
custom wheels installed and on the device, relative identities through jit,
grad, vmap and scan, one buffer for a shared array, donation, and the timed
checks (bench_jit's dispatch, the tied LM against eqx.nn.Shared).

check_device.py puts bench/ and tests/jax/ on sys.path for the timed checks.
"""

import base64
import gc
import hashlib
import importlib.metadata
import inspect
import os
import pathlib
import re
import sys
import warnings

# The example's classes, from examples/ beside build/: check_device.py runs with
# `python -I`, and tests/jax/check_device_test.py loads this file by its path.
sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[1] / "examples")
)
# pylint: disable-next=wrong-import-position
from parent_child import Child, Parent, register as register_example

# --lm presets, (vocabulary, width, sequence, batch); "tiny" is the size
# tests/jax/equinox_tied_lm.py defines, where dispatch dominates, "gpu" one
# where the device's work does.
LM_PRESETS = {"tiny": None, "gpu": (32768, 1024, 512, 16)}


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


class Param:
  """An opted-in wrapper of one array, as a model ties a weight with."""

  def __init__(self, value):
    self.value = value


def register_nodes(jax):
  """The example's classes: Child opted in, Parent not (the sharing is the
  child's); and Param."""
  register = jax.tree_util.register_pytree_node
  register_example(register)
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
  versions, overlaid = {}, []
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
    if not imported_apart(name, module):
      continue
    # Over a machine's stock jaxlib (check_device_install.py's overlay) the
    # custom distribution records stock's files, which are imported from
    # where the machine has them: they must be those, byte for byte.
    checked, differ = files_as_recorded(name, module)
    c(
        checked and not differ,
        f"{name} is imported from {module.__file__}, apart from its "
        f"distribution {version}, and of the {checked} files it records "
        f"{len(differ)} differ there: {differ[:3]}",
    )
    overlaid.append(f"{name}'s {checked} files as recorded")
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
      + "".join(f"; {what}" for what in overlaid)
  )


def files_as_recorded(name, module):
  """(how many files of package `name` its distribution's RECORD lists with
  a hash, [those that differ where `module` is imported from])."""
  root = pathlib.Path(module.__file__).resolve().parents[1]
  checked, differ = 0, []
  for record in importlib.metadata.distribution(name).files or ():
    if record.parts[0] != name or not record.hash:
      continue
    checked += 1
    digest = hashlib.new(record.hash.mode)
    try:
      with open(root / record, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
          digest.update(block)
    except OSError:
      differ.append(str(record))
      continue
    found = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if found != record.hash.value:
      differ.append(str(record))
  return checked, differ


def imported_apart(name, module):
  """Whether package `name` is imported (as `module`) from somewhere else
  than its distribution's folder: jaxlib over a machine's stock files, which
  check_install compares with the distribution's RECORD."""
  located = importlib.metadata.distribution(name).locate_file(
      f"{name}/__init__.py"
  )
  return os.path.realpath(located) != os.path.realpath(module.__file__)


def accelerator_dists():
  """The accelerator plugins' distributions, each the one that imports (the
  first on sys.path: the venv's before the machine's)."""
  found = {}
  for dist in importlib.metadata.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
    if re.match(r"jax-(cuda|rocm)|libtpu", name):
      found.setdefault(name, f"{name} {dist.version}")
  return sorted(found.values())


def on_platform(backend, platform):
  """Whether `backend` is what --platform asks for."""
  return backend != "cpu" if platform == "accelerator" else backend == platform


def check_device(jax, platform, in_venv):
  import jax.numpy as jnp

  c = Conditions()
  devices = jax.devices()
  backend = jax.default_backend()
  c(
      on_platform(backend, platform),
      f"jax's backend is {backend}, not {platform}",
  )
  c(
      all(d.platform == backend for d in devices),
      f"devices {devices}, not {platform}",
  )
  x = jnp.arange(4.0) + 1
  c(x.devices() == {devices[0]}, f"a result lies on {x.devices()}")
  c(float(x.sum()) == 10.0, f"arange(4) + 1 sums to {float(x.sum())}")
  if in_venv:
    prefix = os.path.realpath(sys.prefix) + os.sep
    overlaid = [
        name
        for name in ("jax", "jaxlib")
        if imported_apart(name, sys.modules[name])
    ]
    outside = sorted(
        f"{name} ({module.__file__})"
        for name, module in list(sys.modules.items())
        if re.fullmatch(
            r"jax|jaxlib|jaxlib_patch|jax_plugins|jax_(cuda|rocm)\d+_plugin",
            name.split(".")[0],
        )
        and name.split(".")[0] not in overlaid
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


def tied(child):
  """`child`, and a Parent whose left and right are that one Child."""
  return child, Parent(child, child)


def check_jit(jax):
  import jax.numpy as jnp

  c = Conditions()
  child, parent = tied(Child(jnp.array(2.0)))
  # examples/demo.py's jit calls, which the demo spells out for a reader.
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
  child, parent = tied(Child(jnp.array(2.0)))
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
  child, batched = tied(Child(jnp.arange(3.0)))
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
  # The tie of TiedLM is meant: acknowledged, as its user would.
  warnings.filterwarnings("ignore", category=jax.tree_util.TiedByOptInWarning)
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
