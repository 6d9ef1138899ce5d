"""Opting in a library's base class is told where it changes code written
for stock JAX: the first object of a class that the opt-in reached through
its base, met at two places of a tree, gives one `TiedByOptInWarning` at the
user's line, naming the places, the base class and the fix (a copy, or
`tree_unshare`), whichever JAX function meets it first. The model of
`eqx.nn.Shared`'s docstring, which holds one `eqx.nn.Linear` at two places
and means two layers, is the case that needs it (issue 44).

Not told: a model without repeated objects, the same model with a copy at
the second place, classes registered with the flag or opted in by name, and
subclasses of the user's own base class.

Each case runs in a fresh process, as a user's script: the warning is given
once per base class in a process.
"""

import json
import os
import textwrap

from absl.testing import absltest
from absl.testing import parameterized

import stock_reference

HERE = os.path.dirname(os.path.abspath(__file__))

# The user's script: argv[1] names the JAX function that meets the tie
# first; it prints the warnings it got as JSON.
SCRIPT = textwrap.dedent("""
    import copy, dataclasses, json, sys, warnings
    sys.path.insert(0, {here!r})
    import jax
    import jax.numpy as jnp
    import equinox as eqx
    jax.tree_util.preserve_relative_identities(eqx.Module)
    import equinox_shared_docstring as docstring

    def loss(model):
      return docstring.loss(model, jnp.ones((2, docstring.WIDTH)))

    MEETS_THE_TIE = {{
        "docstring training": lambda m: docstring.train(m),
        "jax.tree.map": lambda m: jax.tree.map(lambda x: x, m),
        "jax.jit": lambda m: jax.jit(loss)(m),
        "jax.grad": lambda m: jax.grad(loss)(m),
        "eqx.filter_jit": lambda m: eqx.filter_jit(loss)(m),
    }}

    class UsersBase:
      pass

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class UsersLayer(UsersBase):
      w: jax.Array

    @dataclasses.dataclass
    class Flagged:
      w: jax.Array

    jax.tree_util.preserve_relative_identities(UsersBase)
    jax.tree_util.register_dataclass(Flagged, preserve_relative_identities=True)

    class Named(eqx.Module):
      w: jax.Array

    jax.tree_util.preserve_relative_identities(Named)

    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always")
      key = jax.random.key(0)
      # Not told: no repeated object, a copy, the user's own base, the flag,
      # a class opted in by name.
      jax.jit(loss)(docstring.Model(key, copy_linear=True))
      users, flagged = UsersLayer(jnp.ones(2)), Flagged(jnp.ones(2))
      named = Named(jnp.ones(2))
      jax.tree.map(lambda x: x, [users, users, flagged, flagged, named, named])
      MEETS_THE_TIE[sys.argv[1]](docstring.Model(key))
      MEETS_THE_TIE[sys.argv[1]](docstring.Model(key))
    print(json.dumps([
        (w.category.__name__, str(w.message), w.filename, w.lineno)
        for w in told
    ]))
""")


# Libraries' own aliasing, then a tie of the user's in a library's container.
LIBRARY_SCRIPT = textwrap.dedent("""
    import json, warnings
    import jax
    import jax.numpy as jnp
    import equinox as eqx
    import optax
    jax.tree_util.preserve_relative_identities(eqx.Module)

    class Model(eqx.Module):
      w: jax.Array
      b: jax.Array

    def loss(m):
      return jnp.sum((m.w - 2.0) ** 2) + jnp.sum(m.b ** 2)

    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always")
      model = Model(jnp.ones(3), jnp.zeros(3))
      # optax.lbfgs holds one object at two places of its state: in two
      # slots of a tuple, and in two fields of its state record.
      opt = optax.lbfgs()
      state = opt.init(model)
      value_and_grad = optax.value_and_grad_from_state(loss)
      for _ in range(3):
        value, grad = value_and_grad(model, state=state)
        updates, state = opt.update(
            grad, state, model, value=value, grad=grad, value_fn=loss)
        model = optax.apply_updates(model, updates)
      library = len(told)
      layer = eqx.nn.Linear(2, 2, key=jax.random.key(0))
      eqx.filter_jit(lambda s, x: s(x))(eqx.nn.Sequential([layer, layer]),
                                       jnp.ones(2))
    print(json.dumps([library, [str(w.message) for w in told]]))
""")


# Flax NNX: one layer at two places of a module, under plain jax.jit.
NNX_SCRIPT = textwrap.dedent("""
    import json, warnings
    import jax
    import jax.numpy as jnp
    from flax import nnx
    jax.tree_util.preserve_relative_identities(nnx.Pytree)
    jax.tree_util.preserve_relative_identities(nnx.Variable)

    class Twice(nnx.Module):
      def __init__(self, rngs):
        self.first = nnx.Linear(2, 2, rngs=rngs)
        self.last = self.first

    with warnings.catch_warnings(record=True) as told:
      warnings.simplefilter("always")
      jax.jit(lambda m: m.last.kernel.sum())(Twice(nnx.Rngs(0)))
    print(json.dumps([str(w.message) for w in told]))
""")


class TiedByOptInTest(parameterized.TestCase):

  def test_flax_nnx_modules_are_told_naming_nnx_pytree(self):
    told = json.loads(stock_reference.run_child("-c", NNX_SCRIPT))
    told = [m for m in told if "is one object" in m]
    self.assertLen(told, 1)
    self.assertIn("The Linear at ", told[0])
    self.assertIn(".first and ", told[0])
    self.assertIn(".last is one object", told[0])
    self.assertIn("preserve_relative_identities(flax.nnx.Pytree)", told[0])

  def test_a_librarys_aliasing_is_not_told_a_users_tie_in_its_container_is(
      self,
  ):
    library, told = json.loads(stock_reference.run_child("-c", LIBRARY_SCRIPT))
    told = [m for m in told if "is one object" in m]
    self.assertEqual(library, 0, told)
    self.assertLen(told, 1)
    self.assertIn("The Linear at ", told[0])
    self.assertIn(".layers[0] and ", told[0])
    self.assertIn(".layers[1] is one object", told[0])

  def run_script(self, meets_the_tie):
    source = SCRIPT.format(here=HERE)
    # The user's line that called JAX: the lambda's.
    line = next(
        number
        for number, text in enumerate(source.splitlines(), 1)
        if text.lstrip().startswith(f'"{meets_the_tie}":')
    )
    return (
        json.loads(stock_reference.run_child("-c", source, meets_the_tie)),
        line,
    )

  @parameterized.parameters(
      "docstring training",
      "jax.tree.map",
      "jax.jit",
      "jax.grad",
      "eqx.filter_jit",
  )
  def test_told_once_at_the_users_line_naming_places_base_and_fix(
      self, meets_the_tie
  ):
    warned, line = self.run_script(meets_the_tie)
    # Of the ties, and nothing else of them (an accelerator's runtime may
    # warn of its own set-up).
    told = [w for w in warned if w[0].endswith(("TieWarning", "OptInWarning"))]
    self.assertLen(told, 1, warned)
    category, message, filename, lineno = told[0]
    self.assertEqual(category, "TiedByOptInWarning")
    self.assertIn("The Linear at ", message)
    self.assertIn(".linear and ", message)
    self.assertIn(".submodel.linear is one object", message)
    self.assertIn("preserve_relative_identities(equinox.Module)", message)
    self.assertIn("copy.copy", message)
    self.assertIn("jax.tree_util.tree_unshare", message)
    if meets_the_tie == "docstring training":
      # The first JAX call of the training loop, in the user's file.
      self.assertEqual(
          os.path.basename(filename), "equinox_shared_docstring.py"
      )
    else:
      self.assertEqual((filename, lineno), ("<string>", line))


if __name__ == "__main__":
  absltest.main()
