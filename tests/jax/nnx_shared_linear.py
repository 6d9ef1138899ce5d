"""A Flax NNX model that uses one `nnx.Linear` object in two places, trained
with `nnx.Optimizer` and optax.adamw.

Run as a script it trains under `nnx.jit` (graph mode: NNX finds the shared
layer itself) and prints the losses and final parameters as JSON:
nnx_sharing_test.py runs it under stock JAX and compares.
"""

import json

import jax
import jax.numpy as jnp

from flax import nnx
import optax

import training

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
  return model, nnx.Optimizer(model, optax.adamw(LEARNING_RATE), wrt=nnx.Param)


def train_graph_mode(after_step=lambda model: None):
  """STEPS steps under `nnx.jit`, which updates the model in place."""

  @nnx.jit
  def step(model, optimizer, x, y):
    value, grads = nnx.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value

  def step_in_place(model, optimizer, x, y):
    return step(model, optimizer, x, y), model, optimizer

  return training.train(
      step_in_place, new_model_and_optimizer(), data(), STEPS, after_step
  )


def train_tree_mode(after_step=lambda model: None):
  """STEPS steps under plain `jax.jit`: the model and optimizer are pytrees,
  passed in and returned."""

  @jax.jit
  def step(model, optimizer, x, y):
    value, grads = jax.value_and_grad(loss)(model, x, y)
    optimizer.update(model, grads)
    return value, model, optimizer

  return training.train(
      step, new_model_and_optimizer(), data(), STEPS, after_step
  )


def parameters(model):
  """The model's parameters (the shared layer's once) as lists of floats."""
  return training.as_floats(nnx.state(model, nnx.Param))


if __name__ == "__main__":
  losses, model = train_graph_mode()
  print(json.dumps({"losses": losses, "parameters": parameters(model)}))
