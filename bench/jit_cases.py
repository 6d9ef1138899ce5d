"""What bench_jit.py times: its cases (trees), its two functions, and the
cells (case x function) each child calls, on jax.jit and, in the patched
child, on Flax NNX's nnx.jit and Equinox's eqx.filter_jit.

The functions import jax when called: bench_jit.py's parent, which reads
the constants, runs on any interpreter.
"""

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


def new_tree_classes(patched):
  """Layer, LayerR (opted in on the patched jax) and Model, registered."""
  from jax import tree_util

  register = tree_util.register_pytree_node

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
  return Layer, LayerR, Model


def array_maker():
  """A function of a shape that returns a new float32 array of that shape,
  from one seeded generator (the same arrays in both children)."""
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(0)

  def arr(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

  return arr


def make_trees(patched, arr):
  """{case: tree} of the common cases but inline, and the shared layer of
  (v)."""
  Layer, LayerR, Model = new_tree_classes(patched)

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
  return trees, shared_layer


def update(t):
  """x + 1 on every distinct leaf object (memo by id, so a leaf that is
  the same tracer at several positions stays one output)."""
  import jax

  memo = {}

  def one(x):
    y = memo.get(id(x))
    if y is None:
      y = memo[id(x)] = x + 1
    return y

  return jax.tree.map(one, t)


def total(t):
  """Sum of the sums of the distinct leaf objects."""
  import jax
  import jax.numpy as jnp

  seen = {id(x): x for x in jax.tree.leaves(t)}
  return sum(jnp.sum(x) for x in seen.values())


# The functions, the same for every case and library.
FUNCTIONS = {"tree": update, "scalar": total}


def first_leaf(out):
  import jax

  return jax.tree.leaves(out)[0]


def make_cells(trees):
  """The jax.jit cells of the common cases, {name: (call, sync, calls per
  batch)}, and {name: the jitted function} of those but inline."""
  import jax

  cells = {}
  jitted = {}
  for case in COMMON_CASES:
    for kind in KINDS:
      if case == "inline":
        cells[f"{case}/{kind}"] = (
            (lambda g=FUNCTIONS[kind], x=trees["i"]: jax.jit(g)(x)),
            first_leaf,
            BATCH_CALLS[case],
        )
        continue
      f = jax.jit(lambda t, _g=FUNCTIONS[kind]: _g(t))
      x = trees[case]
      jitted[f"{case}/{kind}"] = f
      cells[f"{case}/{kind}"] = (
          (lambda f=f, x=x: f(x)),
          first_leaf,
          BATCH_CALLS[case],
      )
  return cells, jitted


def make_nnx_cells(arr, checks, info):
  """The nnx.jit cells of the shared model; their checks into `checks`,
  Flax's version into `info`."""
  import jax
  import jax.numpy as jnp

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


def make_eqx_cells(arr, checks, info):
  """The eqx.filter_jit cells of the shared model, share-through and
  plain; their checks into `checks`, Equinox's version into `info`."""
  import jax
  import jax.numpy as jnp

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
