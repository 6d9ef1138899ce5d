"""The training loop and the parameter dump of the models that train under
stock and under patched JAX (equinox_tied_lm.py, nnx_shared_linear.py,
peer_steps.py).

Those files also run as scripts under stock JAX (stock_reference.py puts
their folder on the path), so this module needs nothing but jax and numpy.
"""

import jax
import numpy as np


def train(step, state, data, steps, after_step):
  """Calls `step(*state, *data)` `steps` times, each time on the state the
  call before returned: `step` returns the loss, then the new state, whose
  first item is the model. Returns the losses as floats and the final model;
  `after_step(model)` sees the model after every step."""
  losses = []
  for _ in range(steps):
    value, *state = step(*state, *data)
    losses.append(float(value))
    after_step(state[0])
  return losses, state[0]


def as_floats(tree):
  """The leaves of `tree` as lists of floats, in leaf order: JSON, for a run
  under stock JAX to hand its numbers back."""
  return [
      np.asarray(leaf, np.float64).ravel().tolist()
      for leaf in jax.tree.leaves(tree)
  ]


def lbfgs_steps(params, loss, steps):
  """`params` after `steps` steps of Optax's L-BFGS on `loss`, its value
  and gradient computed by jax.value_and_grad."""
  import optax  # pylint: disable=g-import-not-at-top

  opt = optax.lbfgs()
  state = opt.init(params)
  for _ in range(steps):
    value, grad = jax.value_and_grad(loss)(params)
    updates, state = opt.update(
        grad, state, params, value=value, grad=grad, value_fn=loss
    )
    params = optax.apply_updates(params, updates)
  return params
