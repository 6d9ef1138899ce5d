"""One training step of an Equinox MLP and of a Flax NNX Linear layer.

Run as a script it prints the results as JSON; the peer-library test runs it
under stock JAX and compares with the same steps under the patched JAX, so
the numbers must not depend on anything but the library versions.
"""

import json

import jax
import jax.numpy as jnp

import training

LEARNING_RATE = 0.1


def _data():
  x = jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32).reshape(16, 4)
  y = jnp.stack([jnp.sin(x.sum(axis=1)), jnp.cos(x[:, 0])], axis=1)
  return x, y


def equinox_mlp_step():
  import equinox as eqx

  model = eqx.nn.MLP(
      in_size=4, out_size=2, width_size=8, depth=2, key=jax.random.PRNGKey(0)
  )
  x, y = _data()

  def loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)

  @eqx.filter_jit
  def step(model, x, y):
    value, grads = eqx.filter_value_and_grad(loss)(model, x, y)
    updates = jax.tree.map(lambda g: -LEARNING_RATE * g, grads)
    return value, eqx.apply_updates(model, updates)

  first, model = step(model, x, y)
  second, model = step(model, x, y)
  return {
      "losses": [float(first), float(second)],
      "params": training.as_floats(eqx.filter(model, eqx.is_array)),
  }


def nnx_linear_step():
  from flax import nnx

  model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
  x, y = _data()

  @nnx.jit
  def step(model, x, y):
    def loss(model):
      return jnp.mean((model(x) - y) ** 2)

    value, grads = nnx.value_and_grad(loss)(model)
    params = nnx.state(model, nnx.Param)
    nnx.update(
        model, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    )
    return value

  losses = [float(step(model, x, y)), float(step(model, x, y))]
  return {
      "losses": losses,
      "params": training.as_floats(nnx.state(model, nnx.Param)),
  }


def run_all():
  from jax._src.lib import pytree

  return {
      "pytree_module": pytree.__name__,
      "equinox_mlp": equinox_mlp_step(),
      "nnx_linear": nnx_linear_step(),
  }


if __name__ == "__main__":
  print(json.dumps(run_all()))
