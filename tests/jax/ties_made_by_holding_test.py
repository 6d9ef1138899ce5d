"""A loop tells a split tie only where the user's model made it.

A carry may tie places in two ways. The user's model holds one opted-in
node in two containers (a shared layer); code that keeps a reference to a
tree it was given holds one container that does not keep identities at two
places (an optimizer's ``params0 = params``, one zeros tree in three fields
of its state), and every opted-in node inside is then one object at both.
A loop whose body updates the places apart computes what stock computes on
copies either way, and gives back the places apart; it tells the user's
tie, and says nothing of the other, which the user never made (issue 61,
case 3: optax.contrib's prodigy, mechanize and cocob in the user's
lax.scan warned, and raised under jax_split_ties='raise').

The cases are generated: each kind of container, each loop, a tie made by
holding a container twice or by the model itself, and the values and
sharing of the result checked against the loop run on unshared copies.
"""

import collections
import dataclasses
import itertools
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
from jax._src import config
from jax._src import test_util as jtu

from shared_nodes import Param

Pair = collections.namedtuple("Pair", "first second")


@dataclasses.dataclass
class Plain:
  """A registered class that does not keep identities."""

  first: object
  second: object


jax.tree_util.register_dataclass(Plain, ["first", "second"], [])

CONTAINERS = {
    "dict": lambda a, b: {"first": a, "second": b},
    "list": lambda a, b: [a, b],
    "tuple": lambda a, b: (a, b),
    "namedtuple": Pair,
    "plain_class": Plain,
}


def _places(container):
  """The two children of a container of CONTAINERS."""
  if isinstance(container, dict):
    return container["first"], container["second"]
  if isinstance(container, Plain):
    return container.first, container.second
  return container[0], container[1]


def carry_of(kind, made_by):
  """A carry of two slots, (model, state), that ties Params between them.

  `made_by` "holding": the state holds the model's container itself, as a
  library that keeps the tree it was given. "model": the model's Param
  sits in two containers of its own."""
  make = CONTAINERS[kind]
  model = make(Param(jnp.ones(3)), Param(jnp.full(3, 2.0)))
  if made_by == "holding":
    return model, {"kept": model, "step": Param(jnp.zeros(()))}
  shared = _places(model)[0]
  return model, {
      "kept": make(shared, Param(jnp.full(3, 3.0))),
      "step": Param(jnp.zeros(())),
  }


def body(carry):
  """Moves the model on and keeps the state's copy: the tie splits."""
  model, state = carry
  moved = jax.tree.map(lambda x: x * 1.5 + 1.0, model)
  step = Param(state["step"].value + 1.0)
  return moved, {"kept": state["kept"], "step": step}


LOOPS = {
    "scan": lambda c: lax.scan(lambda c, _: (body(c), None), c, None, length=3)[
        0
    ],
    "while_loop": lambda c: lax.while_loop(
        lambda c: c[1]["step"].value < 3, body, c
    ),
    "fori_loop": lambda c: lax.fori_loop(0, 3, lambda i, c: body(c), c),
}


def _split_warnings(caught):
  return [
      w for w in caught if issubclass(w.category, jax.tree_util.SplitTieWarning)
  ]


class TiesMadeByHoldingTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f"{loop}_{kind}_{made_by}", loop, kind, made_by)
      for loop, kind, made_by in itertools.product(
          LOOPS, CONTAINERS, ("holding", "model")
      )
  )
  def test_told_where_the_model_made_the_tie(self, loop, kind, made_by):
    carry = carry_of(kind, made_by)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      out = LOOPS[loop](carry)
    told = _split_warnings(caught)
    if made_by == "model":
      self.assertNotEmpty(told)
      self.assertIn("split a tie", str(told[0].message))
    else:
      self.assertEqual(told, [])
      with config.split_ties("raise"):
        LOOPS[loop](carry)  # Nothing to raise either.
    # The values are the loop's on copies; the split places are apart.
    expected = LOOPS[loop](jax.tree_util.tree_unshare(carry))
    got_leaves = jax.tree.leaves(jax.tree_util.tree_unshare(out))
    want_leaves = jax.tree.leaves(expected)
    self.assertLen(got_leaves, len(want_leaves))
    for got, want in zip(got_leaves, want_leaves):
      np.testing.assert_allclose(got, want)
    model, state = out
    self.assertIsNot(_places(model)[0], _places(state["kept"])[0])

  @parameterized.parameters("prodigy", "mechanize", "cocob")
  def test_optax_states_that_keep_params_are_quiet(self, name):
    import optax  # pylint: disable=g-import-not-at-top
    from optax import contrib  # pylint: disable=g-import-not-at-top

    opt = {
        "prodigy": lambda: contrib.prodigy(1.0),
        "mechanize": lambda: contrib.mechanize(optax.adam(1e-2)),
        "cocob": contrib.cocob,
    }[name]()
    params = {"w": Param(jnp.ones(3)), "b": Param(jnp.zeros(3))}
    loss = lambda p: jnp.sum((2.0 * p["w"].value + p["b"].value - 1.0) ** 2)

    def step(carry):
      p, s = carry
      updates, s = opt.update(jax.grad(loss)(p), s, p)
      return optax.apply_updates(p, updates), s

    carry = (params, opt.init(params))
    with config.split_ties("raise"):
      scanned, _ = lax.scan(lambda c, _: (step(c), None), carry, None, length=3)
    stepped = carry
    for _ in range(3):
      stepped = jax.jit(step)(stepped)
    for got, want in zip(jax.tree.leaves(scanned), jax.tree.leaves(stepped)):
      np.testing.assert_allclose(got, want, rtol=1e-6)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
