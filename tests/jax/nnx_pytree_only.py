"""Flax NNX with `nnx.Pytree` opted in and `nnx.Variable` not: a `Param`
shared by two layers (`second.kernel = first.kernel`) is two leaves under
plain JAX transformations, so the gradients of `jax.grad` hold two kernels
where `nnx.Optimizer`'s state holds one, and `optimizer.update` fails in
optax's `jax.tree.map`. Then `nnx.Variable` is opted in too, and the same
step runs.

The opt-ins cannot be undone, and the other NNX tests opt in both classes,
so nnx_variable_hint_test.py runs this file in a process of its own. It
prints, as JSON, the leaves of the tied model and the error (or "ok") of an
Adam step under each opt-in (Adam's moments are trees of the parameters,
which optax maps over together with the gradients).
"""

import json

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class TiedKernel(nnx.Module):

  def __init__(self, rngs):
    self.first = nnx.Linear(2, 2, rngs=rngs)
    self.second = nnx.Linear(2, 2, rngs=rngs)
    self.second.kernel = self.first.kernel  # one Param, two layers

  def __call__(self, x):
    return self.second(self.first(x))


@jax.jit
def train_step(model, optimizer, x):
  grads = jax.grad(lambda m: (m(x) ** 2).sum())(model)
  optimizer.update(model, grads)
  return model, optimizer


def one_step():
  """The leaves of a new tied model, and what one training step says."""
  model = TiedKernel(nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
  leaves = len(jax.tree.leaves(model))
  try:
    train_step(model, optimizer, jnp.ones((1, 2)))
  except ValueError as error:
    return leaves, str(error)
  return leaves, "ok"


if __name__ == "__main__":
  report = {}
  jax.tree_util.preserve_relative_identities(nnx.Pytree)
  report["pytree only"] = one_step()
  jax.tree_util.preserve_relative_identities(nnx.Variable)
  report["pytree and variable"] = one_step()
  print(json.dumps(report))
