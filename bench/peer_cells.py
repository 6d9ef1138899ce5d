"""bench_peers.py's cells: the steps of Flax NNX and Equinox models, each
in the patterns that share on stock JAX and, on the patched side, opted in.

Each cell is a call of an already compiled step (or forward), which feeds
the state it returns into the next call, as a training loop does.
"""

import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEEP_LAYERS = 100
PAIRS = 50
LEARNING_RATE = 1e-3


def nnx_models():
  """The NNX models: Deep, one nnx.Linear used as DEEP_LAYERS layers, and
  Pairs, PAIRS affine layers as encoders and again as decoders."""
  import jax.numpy as jnp
  from flax import nnx

  class Deep(nnx.Module):

    def __init__(self, rngs):
      layer = nnx.Linear(8, 8, rngs=rngs)
      for index in range(DEEP_LAYERS):
        setattr(self, f"layer{index:03d}", layer)

    def __call__(self, x):
      for index in range(DEEP_LAYERS):
        x = jnp.tanh(getattr(self, f"layer{index:03d}")(x))
      return x

  class Affine(nnx.Module):

    def __init__(self, rngs):
      self.weight = nnx.Param(1 + 0.1 * rngs.params.normal((4,)))
      self.bias = nnx.Param(jnp.zeros(4))

    def __call__(self, x):
      return jnp.tanh(self.weight * x + self.bias)

  class Pairs(nnx.Module):

    def __init__(self, rngs):
      encoders = [Affine(rngs) for _ in range(PAIRS)]
      self.encoders = nnx.List(encoders)
      self.decoders = nnx.List(reversed(encoders))

    def __call__(self, x):
      return sum(
          decoder(encoder(x))
          for encoder, decoder in zip(self.encoders, self.decoders)
      )

  return Deep, Pairs


def nnx_steps(side):
  """{pattern: make(model_class, x, y) -> call} of the NNX training step:
  split and nnx.jit, and on the patched side plain jax.jit, opted in."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  def loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)

  def update(model, optimizer, x, y):
    value, grads = nnx.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value

  def new_optimizer(model):
    return nnx.Optimizer(model, optax.adamw(LEARNING_RATE), wrt=nnx.Param)

  def opted_in_step(model_class, x, y):
    @jax.jit
    def step(model, optimizer, x, y):
      return update(model, optimizer, x, y), model, optimizer

    model = model_class(nnx.Rngs(0))
    loop = {"model": model, "optimizer": new_optimizer(model)}

    def call():
      value, loop["model"], loop["optimizer"] = step(
          loop["model"], loop["optimizer"], x, y
      )
      return value

    return call

  def split_step(model_class, x, y):
    @jax.jit
    def step(graphdef, state, x, y):
      model, optimizer = nnx.merge(graphdef, state)
      return update(model, optimizer, x, y), nnx.state((model, optimizer))

    model = model_class(nnx.Rngs(0))
    graphdef, state = nnx.split((model, new_optimizer(model)))
    loop = {"state": state}

    def call():
      value, loop["state"] = step(graphdef, loop["state"], x, y)
      return value

    return call

  def nnx_jit_step(model_class, x, y):
    step = nnx.jit(update)
    model = model_class(nnx.Rngs(0))
    optimizer = new_optimizer(model)
    return lambda: step(model, optimizer, x, y)

  steps = {"split": split_step, "nnx.jit": nnx_jit_step}
  if side == "patched":
    steps["jax.jit"] = opted_in_step
  return steps


def nnx_forward(model, pattern, x):
  """The forward call of `model` in `pattern`."""
  import jax
  from flax import nnx

  if pattern == "split":
    graphdef, state = nnx.split(model)
    call = jax.jit(lambda graphdef, state, x: nnx.merge(graphdef, state)(x))
    return lambda: call(graphdef, state, x)
  call = {"jax.jit": jax.jit, "nnx.jit": nnx.jit}[pattern](
      lambda model, x: model(x)
  )
  return lambda: call(model, x)


def nnx_cells(side):
  """{(cell, pattern): call} of the NNX steps of Deep and Pairs, and of
  Deep's forward call."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  if side == "patched":
    jax.tree_util.preserve_relative_identities(nnx.Pytree)
    jax.tree_util.preserve_relative_identities(nnx.Variable)
    acknowledge_ties(jax)
  Deep, Pairs = nnx_models()
  steps = nnx_steps(side)
  inputs = {
      "deep": (Deep, jnp.ones((2, 8)), jnp.zeros((2, 8))),
      "pairs": (Pairs, jnp.ones((8, 4)), jnp.zeros((8, 4))),
  }
  cells = {}
  for model_name, (model_class, x, y) in inputs.items():
    for pattern, make in steps.items():
      cells[f"nnx {model_name} step", pattern] = make(model_class, x, y)
  for pattern in steps:
    cells["nnx deep forward", pattern] = nnx_forward(
        Deep(nnx.Rngs(0)), pattern, inputs["deep"][1]
    )
  return cells


def acknowledge_ties(jax):
  """The models' ties are meant: the warning that tells the first tie an
  opted-in library class makes is acknowledged, as their user would."""
  warnings.filterwarnings("ignore", category=jax.tree_util.TiedByOptInWarning)


def equinox_cells(side):
  """{(cell, pattern): call} of the Equinox steps: eqx.nn.Shared, and on
  the patched side the opt-in."""
  import equinox as eqx
  import jax
  import jax.numpy as jnp

  if side == "patched":
    jax.tree_util.preserve_relative_identities(eqx.Module)
    acknowledge_ties(jax)
  sys.path.insert(0, str(ROOT / "tests" / "jax"))
  import equinox_tied_lm as lm

  class Affine(eqx.Module):
    weight: jax.Array
    bias: jax.Array

    def __call__(self, x):
      return jnp.tanh(self.weight * x + self.bias)

  def encoders(key):
    return tuple(
        Affine(1 + 0.1 * jax.random.normal(k, (4,)), jnp.zeros(4))
        for k in jax.random.split(key, PAIRS)
    )

  def run_pairs(encoders, decoders, x):
    return sum(
        decoder(encoder(x)) for encoder, decoder in zip(encoders, decoders)
    )

  class TiedPairs(eqx.Module):
    encoders: tuple
    decoders: tuple

    def __init__(self, key):
      self.encoders = encoders(key)
      self.decoders = self.encoders[::-1]

    def __call__(self, x):
      return run_pairs(self.encoders, self.decoders, x)

  def pair_arrays(layers):
    return [array for layer in layers for array in (layer.weight, layer.bias)]

  class SharedPairs(eqx.Module):
    layers: eqx.nn.Shared

    def __init__(self, key):
      tied = encoders(key)
      copies = tuple(jax.tree.map(lambda a: a, layer) for layer in tied[::-1])
      self.layers = eqx.nn.Shared(
          (tied, copies),
          where=lambda pair: pair_arrays(pair[1]),
          get=lambda pair: pair_arrays(pair[0][::-1]),
      )

    def __call__(self, x):
      tied, copies = self.layers()
      return run_pairs(tied, copies, x)

  def pairs_step(model, opt_state, x, y):
    def loss(model):
      return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    updates, opt_state = lm.optimizer.update(
        grads, opt_state, eqx.filter(model, eqx.is_array)
    )
    return value, eqx.apply_updates(model, updates), opt_state

  def training_loop(model, step, x, y):
    step = eqx.filter_jit(step)
    loop = {
        "model": model,
        "opt_state": lm.optimizer.init(eqx.filter(model, eqx.is_array)),
    }

    def call():
      value, loop["model"], loop["opt_state"] = step(
          loop["model"], loop["opt_state"], x, y
      )
      return value

    return call

  models = {"Shared": (lm.SharedLM, SharedPairs)}
  if side == "patched":
    models["opt-in"] = (lm.TiedLM, TiedPairs)
  key = jax.random.key(0)
  pairs_batch = (jnp.ones((8, 4)), jnp.zeros((8, 4)))
  cells = {}
  for pattern, (lm_class, pairs_class) in models.items():
    cells["eqx lm step", pattern] = training_loop(
        lm_class(key), lm.step, *lm.batch()
    )
    cells["eqx pairs step", pattern] = training_loop(
        pairs_class(key), pairs_step, *pairs_batch
    )
  return cells
