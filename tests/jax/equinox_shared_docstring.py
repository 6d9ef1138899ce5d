"""The model of `eqx.nn.Shared`'s docstring: one `eqx.nn.Linear` object at
two places (`model.linear` and `model.submodel.linear`), which the docstring
says "will start with the same initial parameter values, and then update
independently during training" (stock JAX expands the tree: two copies).

`Model(key, copy_linear=True)` gives the second place a copy of the layer
(`copy.copy`), which keeps the two places independent with the
relative-identity opt-in as well.

Run as a script it trains `Model` for STEPS steps of SGD under
`eqx.filter_jit` and prints the losses as JSON:
equinox_independent_copies_test.py runs it under stock JAX and compares.
"""

import copy
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import training

WIDTH = 4
STEPS = 3
LEARNING_RATE = 0.1


class SubModel(eqx.Module):
  linear: eqx.nn.Linear


class Model(eqx.Module):
  linear: eqx.nn.Linear
  submodel: SubModel

  def __init__(self, key, copy_linear=False):
    linear = eqx.nn.Linear(WIDTH, WIDTH, key=key)
    self.linear = linear
    self.submodel = SubModel(copy.copy(linear) if copy_linear else linear)

  def __call__(self, x):
    return self.submodel.linear(jnp.tanh(self.linear(x)))


def loss(model, x):
  return jnp.mean(jax.vmap(model)(x))


optimizer = optax.sgd(LEARNING_RATE)


def step(model, opt_state, x):
  value, grads = eqx.filter_value_and_grad(loss)(model, x)
  updates, opt_state = optimizer.update(grads, opt_state)
  return value, eqx.apply_updates(model, updates), opt_state


def train(model, after_step=lambda model: None):
  """STEPS steps of SGD; the losses and the trained model."""
  x = jax.random.normal(jax.random.key(1), (8, WIDTH))
  opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
  return training.train(
      eqx.filter_jit(step), (model, opt_state), (x,), STEPS, after_step
  )


if __name__ == "__main__":
  losses, _ = train(Model(jax.random.key(0)))
  print(json.dumps({"losses": losses}))
