"""The record of ties split during a public call keeps nothing alive: under
`jax.checking_leaks()`, a jitted function that calls a jitted custom_vjp
returning one object twice (an inner trace whose unflatten builds the tie
apart) leaks no tracer, as on stock; the split itself is told, where the
inner jit's trace of the custom_vjp returns it."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
from jax._src import test_util as jtu

from shared_nodes import Param


@jax.custom_vjp
def twice(x):
  node = Param(x)
  return {"a": node, "b": node}


twice.defvjp(
    lambda x: (twice(x), None), lambda _, g: (g["a"].value + g["b"].value,)
)


class SplitRecordTest(jtu.JaxTestCase):

  def test_an_inner_trace_leaks_no_tracer(self):
    x = jnp.ones(2)
    with (
        jax.checking_leaks(),
        self.assertWarnsRegex(
            jax.tree_util.SplitTieWarning,
            r"jax.custom_vjp split a tie: .* result\['a'\] and "
            r"result\['b'\]",
        ),
    ):
      out = jax.jit(lambda x: jax.jit(twice)(x))(x)
    self.assertAllClose(out["a"].value, x)
    self.assertAllClose(out["b"].value, x)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
