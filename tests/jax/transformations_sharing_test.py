"""Autodiff, vmap and control flow over pytrees with shared nodes."""

import dataclasses


import jax

from absl.testing import absltest
from absl.testing import parameterized

import jax.numpy as jnp
from jax import lax
from jax import tree_util
from jax._src import config
from jax._src import test_util as jtu

from shared_nodes import Param


@tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  """Encoder and decoder weights: tied when both hold one Param."""

  enc: Param
  dec: Param
  bias: Param


def tied_model(w, b):
  p = Param(w)
  return Model(p, p, Param(b))


def untied_model(w, b):
  return Model(Param(w), Param(w), Param(b))


def loss(model, x):
  h = jnp.tanh(x @ model.enc.value + model.bias.value[None, :])
  return jnp.sum((h @ model.dec.value.T) ** 2)


def _inputs():
  w = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3)
  b = jnp.linspace(0.0, 0.5, 3, dtype=jnp.float32)
  x = jnp.linspace(-2.0, 2.0, 8, dtype=jnp.float32).reshape(2, 4)
  return w, b, x


def _grad_by(api):
  if api == "grad":
    return lambda f, *args: jax.grad(f)(*args)
  if api == "value_and_grad":
    return lambda f, *args: jax.value_and_grad(f)(*args)[1]
  if api == "vjp":
    return lambda f, *args: jax.vjp(f, *args)[1](jnp.float32(1.0))[0]
  if api == "jit_grad":
    return lambda f, *args: jax.jit(jax.grad(f))(*args)
  raise ValueError(api)


class AutodiffSharingTest(jtu.JaxTestCase):

  @parameterized.parameters("grad", "value_and_grad", "vjp", "jit_grad")
  def test_tied_weights_gradient_is_sum_of_uses(self, api):
    w, b, x = _inputs()
    grad = _grad_by(api)
    g_tied = grad(loss, tied_model(w, b), x)
    g_untied = grad(loss, untied_model(w, b), x)
    self.assertIs(g_tied.enc, g_tied.dec)
    self.assertLen(jax.tree.leaves(g_tied), 2)  # the tied weight, the bias
    self.assertAllClose(
        g_tied.enc.value, g_untied.enc.value + g_untied.dec.value
    )
    self.assertAllClose(g_tied.bias.value, g_untied.bias.value)

  def test_tied_weights_across_arguments(self):
    w, _, x = _inputs()
    p = Param(w)
    f = lambda a, b: jnp.sum(jnp.sin(x @ a.value) * (x @ b.value))
    ga, gb = jax.grad(f, argnums=(0, 1))(p, p)
    self.assertIs(ga, gb)
    ua, ub = jax.grad(f, argnums=(0, 1))(Param(w), Param(w))
    self.assertAllClose(ga.value, ua.value + ub.value)

  def test_jvp_tangents_share(self):
    w, b, x = _inputs()
    model = tied_model(w, b)
    tangent = jax.tree.map(jnp.ones_like, model)
    self.assertIs(tangent.enc, tangent.dec)
    out, out_dot = jax.jvp(
        lambda m: Model(m.dec, m.enc, m.bias), (model,), (tangent,)
    )
    self.assertIs(out.enc, out.dec)
    self.assertIs(out_dot.enc, out_dot.dec)
    y, y_dot = jax.jvp(lambda m: loss(m, x), (model,), (tangent,))
    untied = untied_model(w, b)
    y2, y2_dot = jax.jvp(
        lambda m: loss(m, x), (untied,), (jax.tree.map(jnp.ones_like, untied),)
    )
    self.assertAllClose(y, y2)
    self.assertAllClose(y_dot, y2_dot)

  @parameterized.parameters(False, True)
  def test_custom_vjp_cotangents_of_a_shared_node_add_up(self, none_for_b):
    @jax.custom_vjp
    def f(a, b):
      return jnp.sum(a.value * b.value)

    def f_fwd(a, b):
      return f(a, b), (a, b)

    def f_bwd(res, g):
      a, b = res
      return Param(g * b.value), None if none_for_b else Param(g * a.value)

    f.defvjp(f_fwd, f_bwd)
    p = Param(jnp.arange(3.0))
    # Differentiating one argument only: the other is a constant.
    self.assertAllClose(jax.grad(f)(p, p).value, jnp.arange(3.0))
    # Both: one cotangent for the shared node, the sum over its positions.
    ga, gb = jax.grad(f, argnums=(0, 1))(p, p)
    self.assertIs(ga, gb)
    self.assertAllClose(
        ga.value, jnp.arange(3.0) * (1.0 if none_for_b else 2.0)
    )

  def test_training_step_keeps_tying(self):
    w, b, x = _inputs()

    @jax.jit
    def step(model):
      grads = jax.grad(loss)(model, x)
      return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)

    model = tied_model(w, b)
    for _ in range(3):
      model = step(model)
      self.assertIs(model.enc, model.dec)
    self.assertLen(jax.tree.leaves(model), 2)


class VmapSharingTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    self.p = Param(jnp.ones((4, 3)))
    self.model = Model(self.p, self.p, Param(jnp.zeros((4, 3))))

  def test_vmap_keeps_sharing(self):
    out = jax.vmap(lambda m: Model(m.dec, m.enc, m.bias))(self.model)
    self.assertIs(out.enc, out.dec)
    self.assertEqual(out.enc.value.shape, (4, 3))

  @parameterized.named_parameters(
      ("leaf", 0),
      ("tuple_of_leaf", (0,)),
      ("unshared_tree", (Model(Param(0), Param(0), Param(0)),)),
      (
          "shared_tree",
          (
              jax.tree.map(
                  lambda _: 0, (lambda p: Model(p, p, Param(1)))(Param(1))
              ),
          ),
      ),
  )
  def test_consistent_in_axes(self, in_axes):
    f = jax.vmap(
        lambda m: m.enc.value * m.dec.value + m.bias.value, in_axes=in_axes
    )
    self.assertAllClose(f(self.model), jnp.ones((4, 3)))

  def test_conflicting_in_axes(self):
    spec = (Model(Param(0), Param(None), Param(0)),)
    f = lambda m: jnp.sum(m.enc.value) + jnp.sum(m.dec.value)
    with self.assertRaisesRegex(ValueError, "vmap in_axes.*more than once"):
      jax.vmap(f, in_axes=spec)(self.model)
    # Allowed, each place gets a copy, as on stock.
    twins = Model(Param(self.p.value), Param(self.p.value), self.model.bias)
    with config.split_ties("allow"):
      out = jax.vmap(f, in_axes=spec)(self.model)
    self.assertAllClose(out, jax.vmap(f, in_axes=spec)(twins))

  def test_in_axes_across_arguments(self):
    f = lambda a, b: a.value + b.value
    self.assertAllClose(
        jax.vmap(f, in_axes=(1, 1))(self.p, self.p), jnp.full((3, 4), 2.0)
    )
    with self.assertRaisesRegex(ValueError, "more than once"):
      jax.vmap(f, in_axes=(0, 1))(self.p, self.p)
    g = lambda a, b: jnp.sum(a.value) + jnp.sum(b.value)
    with config.split_ties("allow"):
      out = jax.vmap(g, in_axes=(0, None))(self.p, self.p)
    copy = Param(self.p.value)
    self.assertAllClose(out, jax.vmap(g, in_axes=(0, None))(self.p, copy))

  def test_out_axes(self):
    f = lambda x: (lambda p: Model(p, p, Param(x)))(Param(2 * x))
    out = jax.vmap(f, out_axes=Model(Param(1), Param(1), Param(0)))(
        jnp.ones((4, 3))
    )
    self.assertIs(out.enc, out.dec)
    self.assertEqual(out.enc.value.shape, (3, 4))
    self.assertEqual(out.bias.value.shape, (4, 3))
    with self.assertRaisesRegex(ValueError, "out_axes.*more than once"):
      jax.vmap(f, out_axes=Model(Param(1), Param(0), Param(0)))(
          jnp.ones((4, 3))
      )


def _tie(value):
  p = Param(value)
  return Model(p, p, Param(jnp.zeros_like(value)))


class ControlFlowSharingTest(jtu.JaxTestCase):

  def test_scan_carries_dag(self):
    def body(carry, x):
      assert carry.enc is carry.dec
      new = _tie(carry.enc.value + x)
      return new, new.enc

    carry, ys = lax.scan(body, _tie(jnp.zeros(2)), jnp.arange(3.0))
    self.assertIs(carry.enc, carry.dec)
    self.assertAllClose(carry.enc.value, jnp.full(2, 3.0))
    self.assertEqual(ys.value.shape, (3, 2))

  def test_scan_body_breaking_sharing_drops_it(self):
    def body(carry, x):
      return (
          Model(
              Param(carry.enc.value + x), Param(carry.dec.value * 2), carry.bias
          ),
          None,
      )

    with self.assertWarnsRegex(
        jax.tree_util.SplitTieWarning, r"jax\.lax\.scan split a tie"
    ):
      out, _ = lax.scan(body, _tie(jnp.ones(2)), jnp.arange(3.0))
    # The carry shares only where the body keeps it: the copies are updated
    # apart, as on stock, and the user is told.
    self.assertIsNot(out.enc, out.dec)
    self.assertAllClose(out.enc.value, jnp.full(2, 4.0))
    self.assertAllClose(out.dec.value, jnp.full(2, 8.0))

  def test_while_loop_carries_dag(self):
    def body(m):
      assert m.enc is m.dec
      return _tie(m.enc.value + 1)

    out = lax.while_loop(lambda m: m.enc.value[0] < 5, body, _tie(jnp.zeros(2)))
    self.assertIs(out.enc, out.dec)
    self.assertAllClose(out.enc.value, jnp.full(2, 5.0))
    # A body that breaks the sharing: the copies are carried apart, told.
    with self.assertWarnsRegex(
        jax.tree_util.SplitTieWarning, r"jax\.lax\.while_loop split a tie"
    ):
      out = lax.while_loop(
          lambda m: m.enc.value[0] < 5,
          lambda m: Model(Param(m.dec.value + 1), m.enc, m.bias),
          _tie(jnp.zeros(2)),
      )
    self.assertIsNot(out.enc, out.dec)
    self.assertAllClose(out.enc.value, jnp.full(2, 5.0))
    self.assertAllClose(out.dec.value, jnp.full(2, 4.0))

  @parameterized.parameters(False, True)
  def test_fori_loop_carries_dag(self, jit):
    def run(m):
      return lax.fori_loop(0, 3, lambda i, m: _tie(m.enc.value * 2), m)

    if jit:
      run = jax.jit(run)
    out = run(_tie(jnp.ones(2)))
    self.assertIs(out.enc, out.dec)
    self.assertAllClose(out.enc.value, jnp.full(2, 8.0))

  def test_cond_carries_dag(self):
    model = _tie(jnp.ones(2))
    for pred in (True, False):
      out = lax.cond(
          pred, lambda m: m, lambda m: Model(m.dec, m.enc, m.bias), model
      )
      self.assertIs(out.enc, out.dec)
    # Branches that share differently: the output shares where both do,
    # and the user is told that the tie is split.
    with self.assertWarnsRegex(
        jax.tree_util.SplitTieWarning,
        r"jax\.lax\.cond split a tie: the Param at result\.enc and "
        r"result\.dec is one object in what a branch returned.* Another "
        r"branch returns two objects",
    ):
      outs = [
          lax.cond(
              pred,
              lambda m: m,
              lambda m: Model(Param(m.dec.value * 2), m.enc, m.bias),
              model,
          )
          for pred in (True, False)
      ]
    for pred, out in zip((True, False), outs):
      self.assertIsNot(out.enc, out.dec)
      self.assertAllClose(out.enc.value, jnp.ones(2) * (1 if pred else 2))
      self.assertAllClose(out.dec.value, jnp.ones(2))

  def test_grad_through_scan_of_tied_weights(self):
    w, b, x = _inputs()

    def total(model):
      def body(c, xi):
        return c + loss(model, xi[None]), None

      return lax.scan(body, jnp.float32(0.0), x)[0]

    g_tied = jax.grad(total)(tied_model(w, b))
    g_untied = jax.grad(total)(untied_model(w, b))
    self.assertIs(g_tied.enc, g_tied.dec)
    self.assertAllClose(
        g_tied.enc.value, g_untied.enc.value + g_untied.dec.value
    )


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
