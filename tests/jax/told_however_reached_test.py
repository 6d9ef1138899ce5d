"""A split is told however the function that makes it is reached.

A public function that builds the places of one object apart tells the
user where its result reaches them. Called by the user it tells at its
own boundary; handed to a transformation (`jax.jit(f)`, `jax.vmap(f)`,
through `functools.partial`, inside a lambda, or two at once) JAX calls
it, and it leaves its pairs to whoever takes its result: the trace of the
user's function, which tells them (issue 61, case 2: `jax.jit(f)` and
`jax.vmap(f)` of a `custom_vjp` were silent). Every case checks the
values against the function called directly, the places apart, and that
each tie is told once per trace (a call that reuses a cached trace
computes nothing again, and tells nothing), naming the function that split it and
both places.
"""

import functools
import itertools
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from jax._src import test_util as jtu
from jax.tree_util import SplitTieWarning

from shared_nodes import Param


def _returns_one_object_twice(x):
  """Two ties: `p` at a and b, `q` at c and d."""
  p, q = Param(x * 2.0), Param(x + 1.0)
  return {"a": p, "b": p, "c": q, "d": q}


def by_custom_vjp():
  """A fresh custom_vjp function: a new trace, whatever ran before."""
  f = jax.custom_vjp(_returns_one_object_twice)
  f.defvjp(
      lambda x: (f(x), None),
      lambda _, g: (
          2.0 * (g["a"].value + g["b"].value) + g["c"].value + g["d"].value,
      ),
  )
  return f


def by_custom_jvp():
  """A fresh custom_jvp function."""
  f = jax.custom_jvp(_returns_one_object_twice)

  @f.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    out = f(x)
    return out, {k: Param(t * (2.0 if k in "ab" else 1.0)) for k in out}

  return f


SPLITTERS = {
    "custom_vjp": ("jax.custom_vjp", by_custom_vjp),
    "custom_jvp": ("jax.custom_jvp", by_custom_jvp),
}

# How the user reaches the function: each takes it and an argument.
REACHES = {
    "direct": lambda f, x: f(x),
    "jit": lambda f, x: jax.jit(f)(x),
    "vmap": lambda f, x: jax.tree.map(lambda v: v[0], jax.vmap(f)(x[None])),
    "jit_of_partial": lambda f, x: jax.jit(
        functools.partial(lambda scale, y: f(scale * y), 1.0)
    )(x),
    "jit_of_lambda": lambda f, x: jax.jit(lambda y: f(y))(x),
    "jit_of_jit": lambda f, x: jax.jit(lambda y: jax.jit(f)(y))(x),
    "vmap_of_jit": lambda f, x: jax.tree.map(
        lambda v: v[0], jax.vmap(jax.jit(f))(x[None])
    ),
}


class ToldHoweverReachedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f"{splitter}_{reach}", splitter, reach)
      for splitter, reach in itertools.product(SPLITTERS, REACHES)
  )
  def test_every_tie_told_once(self, splitter, reach):
    name, make = SPLITTERS[splitter]
    f = make()  # Traced afresh: a split is told when it is traced.
    x = jnp.arange(3.0)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      out = REACHES[reach](f, x)
    told = [
        str(w.message)
        for w in caught
        if issubclass(w.category, SplitTieWarning)
    ]
    self.assertLen(told, 2, told)
    for first, second in (("a", "b"), ("c", "d")):
      self.assertTrue(
          any(
              m.startswith(name)
              and f"result['{first}'] and " f"result['{second}']" in m
              for m in told
          ),
          (first, told),
      )
    # Stock's values, and the places apart, as the function gives them.
    self.assertIsNot(out["a"], out["b"])
    self.assertIsNot(out["c"], out["d"])
    for key, want in _returns_one_object_twice(x).items():
      np.testing.assert_allclose(out[key].value, want.value)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
