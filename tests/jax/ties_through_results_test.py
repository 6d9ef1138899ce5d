"""Ties the user made come back from `has_aux`, `jax.checkpoint` and
`jax.vjp`, values are stock's, and a shared DAG costs its nodes.

`has_aux`'s aux is a result of the function, so it is laid out as its
result is (results follow their arguments); `jax.checkpoint` is an entry
point, as `jax.jit` is. Cotangents given per place add up one per object
given: the cotangent tree's own sharing says which places hold one object,
never their values, so the answer cannot jump where two cotangents happen
to be equal. Every test here failed before these rules.
"""

import dataclasses
import warnings

from absl.testing import absltest
from absl.testing import parameterized

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util
from jax._src import test_util as jtu

from shared_nodes import Param


@tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  """A plain container: its two fields tie by holding one Param."""

  a: object
  b: object


def tied_model():
  p = Param(jnp.arange(3.0))
  return Model(p, p)


def untied_twin(model):
  return Model(Param(model.a.value), Param(model.b.value))


def loss(model):
  return jnp.sum(jnp.sin(model.a.value) * model.b.value)


def with_aux(model):
  return loss(model), model


def _aux_of(name, model):
  """The aux that each has_aux API returns for `with_aux` on `model`."""
  if name == "value_and_grad":
    return jax.value_and_grad(with_aux, has_aux=True)(model)[0][1]
  if name == "grad":
    return jax.grad(with_aux, has_aux=True)(model)[1]
  if name == "jacrev":
    return jax.jacrev(with_aux, has_aux=True)(model)[1]
  if name == "jacfwd":
    return jax.jacfwd(with_aux, has_aux=True)(model)[1]
  if name == "jvp":
    return jax.jvp(with_aux, (model,), (model,), has_aux=True)[2]
  if name == "vjp":
    return jax.vjp(with_aux, model, has_aux=True)[2]
  if name == "linearize":
    return jax.linearize(with_aux, model, has_aux=True)[2]
  if name == "jit(value_and_grad)":
    return jax.jit(jax.value_and_grad(with_aux, has_aux=True))(model)[0][1]
  if name == "eqx.filter_value_and_grad":
    return eqx.filter_value_and_grad(with_aux, has_aux=True)(model)[0][1]
  raise ValueError(name)


AUX_APIS = (
    "value_and_grad",
    "grad",
    "jacrev",
    "jacfwd",
    "jvp",
    "vjp",
    "linearize",
    "jit(value_and_grad)",
    "eqx.filter_value_and_grad",
)


class AuxKeepsTiesTest(jtu.JaxTestCase):

  @parameterized.parameters(*AUX_APIS)
  def test_aux_holding_the_model_keeps_its_tie(self, name):
    model = tied_model()
    with warnings.catch_warnings():
      warnings.simplefilter("error", tree_util.SplitTieWarning)
      aux = _aux_of(name, model)
    self.assertIs(aux.a, aux.b)
    self.assertIsNot(aux.a, model.a)
    self.assertArraysEqual(aux.a.value, model.a.value)

  def test_a_training_step_returning_the_model_as_aux_trains_it_tied(self):
    def step(model):
      def objective(m):
        return loss(m), m

      (_, aux), grads = jax.value_and_grad(objective, has_aux=True)(model)
      return jax.tree.map(lambda p, g: p - 0.1 * g, aux, grads)

    model, twin = tied_model(), tied_model()
    for _ in range(3):
      model = step(model)
      twin = jax.tree.map(lambda p, g: p - 0.1 * g, twin, jax.grad(loss)(twin))
    self.assertIs(model.a, model.b)
    self.assertAllClose(model.a.value, twin.a.value)


class CheckpointKeepsTiesTest(jtu.JaxTestCase):

  @parameterized.parameters("checkpoint", "jit(checkpoint)", "remat")
  def test_the_function_and_its_result_see_one_object(self, name):
    model = tied_model()
    seen = []

    def identity(m):
      seen.append(m.a is m.b)
      return m

    wrapped = {
        "checkpoint": jax.checkpoint(identity),
        "jit(checkpoint)": jax.jit(jax.checkpoint(identity)),
        "remat": jax.remat(identity),
    }[name]
    out = wrapped(model)
    self.assertEqual(seen, [True])
    self.assertIs(out.a, out.b)
    self.assertIsNot(out.a, model.a)

  def test_its_gradient_is_the_sum_over_the_uses(self):
    model = tied_model()
    grad = jax.grad(jax.checkpoint(loss))(model)
    self.assertIs(grad.a, grad.b)
    twin_grad = jax.grad(loss)(untied_twin(model))
    self.assertAllClose(grad.a.value, twin_grad.a.value + twin_grad.b.value)

  def test_jit_of_checkpoint_trains_as_jit_does(self):
    def step(model):
      grads = jax.grad(loss)(model)
      return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)

    checkpointed, plain = tied_model(), tied_model()
    for _ in range(3):
      checkpointed = jax.jit(jax.checkpoint(step))(checkpointed)
      plain = jax.jit(step)(plain)
    self.assertIs(checkpointed.a, checkpointed.b)
    self.assertAllClose(checkpointed.a.value, plain.a.value)

  def test_prevent_cse_per_argument_over_a_tie(self):
    p = Param(jnp.arange(3.0))
    f = lambda x, y: (x, y)
    agreeing = jax.checkpoint(f, prevent_cse=(True, True))(p, p)
    self.assertIs(agreeing[0], agreeing[1])
    # Two values for one node cannot be read as one: laid out as stock lays
    # it out, it computes what stock computes, and the split is told in the
    # caller's arguments.
    with self.assertWarnsRegex(
        tree_util.SplitTieWarning,
        r"jax\.checkpoint split a tie: the Param at args\[0\] and args\[1\]",
    ):
      conflicting = jax.checkpoint(f, prevent_cse=(True, False))(p, p)
    self.assertIsNot(conflicting[0], conflicting[1])
    self.assertArraysEqual(conflicting[1].value, p.value)

  def test_a_checkpoint_over_several_arguments_keeps_the_tie_between_them(
      self,
  ):
    p = Param(jnp.arange(3.0))
    out = jax.checkpoint(lambda x, y: (x, y))(p, p)
    self.assertIs(out[0], out[1])
    self.assertLen(
        jax.make_jaxpr(jax.checkpoint(lambda x, y: x))(p, p).in_avals, 1
    )


class CotangentsPerObjectTest(jtu.JaxTestCase):
  """`f_vjp` of a function that returns one node at two places."""

  def setUp(self):
    super().setUp()
    self.p = Param(jnp.ones(3))
    _, self.f_vjp = jax.vjp(lambda a: (a, a), self.p)
    self.o = jnp.arange(3.0)

  def test_two_distinct_nodes_over_one_array_add_up(self):
    # As stock and the unshared twin compute: 2 * o.
    (ct,) = self.f_vjp((Param(self.o), Param(self.o)))
    self.assertAllClose(ct.value, 2 * self.o)

  def test_the_answer_is_continuous_in_the_cotangents(self):
    for scale in (1.0, 1.0 + 1e-3, 2.0):
      (ct,) = self.f_vjp((Param(self.o), Param(scale * self.o)))
      self.assertAllClose(ct.value, (1 + scale) * self.o)

  def test_one_node_given_at_both_places_is_one_cotangent(self):
    given = Param(self.o)
    (ct,) = self.f_vjp((given, given))
    self.assertAllClose(ct.value, self.o)

  def test_as_stock_on_copies_where_nothing_is_shared(self):
    twin_out, twin_vjp = jax.vjp(
        lambda a, b: (a, b), Param(jnp.ones(3)), Param(jnp.ones(3))
    )
    del twin_out
    cts = twin_vjp((Param(self.o), Param(self.o)))
    (ct,) = self.f_vjp((Param(self.o), Param(self.o)))
    self.assertAllClose(ct.value, cts[0].value + cts[1].value)


class DonatedIndicesTest(jtu.JaxTestCase):

  def test_donate_argnums_of_a_lowering_index_its_flat_arguments(self):
    n = Param(jnp.ones(3))
    lowered = jax.jit(lambda a, b: a, donate_argnums=(0, 1)).lower(n, n)
    self.assertEqual(lowered.in_tree.num_leaves, 1)
    self.assertEqual(lowered.donate_argnums, (0,))
    q = Param(jnp.ones(3))
    apart = jax.jit(lambda a, b: a, donate_argnums=1).lower(n, q)
    self.assertEqual(apart.donate_argnums, (1,))


@tree_util.register_pytree_node_class(preserve_relative_identities=True)
class CountedPair:
  """An opted-in node that counts the calls of its flatten."""

  flattens = 0

  def __init__(self, a, b):
    self.a, self.b = a, b

  def tree_flatten(self):
    type(self).flattens += 1
    return (self.a, self.b), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def dag(depth):
  node = Param(jnp.ones(()))
  for _ in range(depth):
    node = CountedPair(node, node)
  return node


class SharedDagCostTest(jtu.JaxTestCase):
  """A DAG of depth d has d + 1 nodes and 2^d places: each transformation
  flattens it a number of times that does not grow with the places."""

  @parameterized.parameters(
      ("grad", lambda n: jax.grad(lambda m: jnp.sum(jax.tree.leaves(m)[0]))(n)),
      (
          "value_and_grad with aux",
          lambda n: jax.value_and_grad(
              lambda m: (jnp.sum(jax.tree.leaves(m)[0]), m), has_aux=True
          )(n),
      ),
      ("checkpoint", lambda n: jax.checkpoint(lambda m: m)(n)),
      ("jit", lambda n: jax.jit(lambda m: m)(n)),
      ("tree.map", lambda n: jax.tree.map(lambda x: x + 1, n)),
  )
  def test_flattens_do_not_grow_with_the_places(self, name, transform):
    del name
    counts = []
    for depth in (8, 16):
      node = dag(depth)
      CountedPair.flattens = 0
      transform(node)
      counts.append(CountedPair.flattens)
    # Linear in the nodes (d flattens a pass, a few passes), where one walk
    # of every place would take 2^16 - 1.
    self.assertLess(counts[1], 40 * 16, counts)
    self.assertLess(counts[1], 4 * counts[0] + 40, counts)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
