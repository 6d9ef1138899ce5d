"""A Flax NNX model that uses one `nnx.Linear` object in two places, trained
with `nnx.Optimizer` and optax.adamw.

Run as a script it trains under `nnx.jit` (graph mode: NNX finds the shared
layer itself) and prints the losses and final parameters as JSON:
nnx_sharing_test.py runs it under stock JAX and compares.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np

from flax import nnx
import optax

STEPS = 20
LEARNING_RATE = 1e-2


class Model(nnx.Module):
  """`first` and `last` are one layer."""

  def __init__(self, rngs):
    self.first = nnx.Linear(4, 4, rngs=rngs)
    self.middle = nnx.Linear(4, 4, rngs=rngs)
    self.last = self.first

  def __call__(self, x):
    return self.last(jax.nn.tanh(self.middle(self.first(x))))


def data():
  x = jnp.linspace(-1.0, 1.0, 32, dtype=jnp.float32).reshape(8, 4)
  return x, jnp.sin(2.0 * x)


def loss(model, x, y):
  return jnp.mean((model(x) - y) ** 2)


def new_model_and_optimizer():
  model = Model(nnx.Rngs(0))
  return model, nnx.Optimizer(model, optax.adamw(LEARNING_RATE),
                              wrt=nnx.Param)


def train_graph_mode(after_step=lambda model: None):
  """STEPS steps under `nnx.jit`, which updates the model in place."""
  model, optimizer = new_model_and_optimizer()

  @nnx.jit
  def step(model, optimizer, x, y):
    value, grads = nnx.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value

  x, y = data()
  losses = []
  for _ in range(STEPS):
    losses.append(float(step(model, optimizer, x, y)))
    after_step(model)
  return losses, model


def train_tree_mode(after_step=lambda model: None):
  """STEPS steps under plain `jax.jit`: the model and optimizer are pytrees,
  passed in and returned."""
  model, optimizer = new_model_and_optimizer()

  @jax.jit
  def step(model, optimizer, x, y):
    value, grads = jax.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value, model, optimizer

  x, y = data()
  losses = []
  for _ in range(STEPS):
    value, model, optimizer = step(model, optimizer, x, y)
    losses.append(float(value))
    after_step(model)
  return losses, model


def parameters(model):
  """The model's parameters (the shared layer's once) as lists of floats."""
  return [np.asarray(leaf, np.float64).ravel().tolist()
          for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))]


if __name__ == "__main__":
  losses, model = train_graph_mode()
  print(json.dumps({"losses": losses, "parameters": parameters(model)}))
