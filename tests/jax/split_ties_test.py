"""A tie stays a tie where the inputs cannot tell its places apart, and a
tie the user made that is split is reported (jax_split_ties).

A shared node stays one node in jax.tree.map's result wherever every tree
holds the very same objects at its places; where the values differ, the
places are mapped apart (what stock computes on copies) and the user is
told, at the user's line as Python's warnings decide, with both key paths:
a warning by default, SplitTieError under "raise", nothing under "allow". Library code
that aliases objects incidentally (the solvers, Optax's L-BFGS, Equinox's
loops) never triggers it.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax._src import config
from jax._src import test_util as jtu
from jax._src.tree_util import SharedPrefixError

import training
from shared_nodes import Param


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  a: object
  b: object
  c: object


def tied_model():
  w = Param(jnp.ones((2, 2)))
  return Model(a=w, b=w, c=Param(jnp.ones(2)))


def loss(m):
  return jnp.sum(m.a.value @ m.b.value) + jnp.sum(m.c.value**2)


class SplitTiesTest(jtu.JaxTestCase):

  def setUp(self):
    super().setUp()
    jax.config.update("jax_split_ties", "raise")

  def tearDown(self):
    jax.config.update("jax_split_ties", "warn")
    super().tearDown()

  def test_a_mask_keeps_the_tie_where_its_layout_does(self):
    import optax  # pylint: disable=g-import-not-at-top

    m = tied_model()
    flag = Param(True)
    masks = {
        # Leaves at the parameters' places: the parameters pass through.
        "bools": Model(True, True, False),
        # One node where the model has one.
        "tied": Model(flag, flag, Param(False)),
        # Built from the model: its ties.
        "mapped": jax.tree.map(lambda p: p.ndim == 2, m),
    }
    for name, mask in masks.items():
      with self.subTest(name):
        tx = optax.chain(
            optax.masked(optax.add_decayed_weights(0.1), mask),
            optax.sgd(0.1),
        )
        updates, _ = tx.update(jax.grad(loss)(m), tx.init(m), m)
        new = optax.apply_updates(m, updates)
        self.assertIs(new.a, new.b)

  def test_a_hand_built_mask_with_a_node_per_place_is_told(self):
    import optax  # pylint: disable=g-import-not-at-top

    # The masked updates are laid out as the mask, which holds two objects
    # where the model holds one: optax.masked's merge of them with the
    # updates splits the updates' tie, and says so.
    m = tied_model()
    mask = Model(Param(True), Param(True), Param(False))
    tx = optax.chain(
        optax.masked(optax.add_decayed_weights(0.1), mask), optax.sgd(0.1)
    )
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError, r"at rest\[1\]\.a and rest\[1\]\.b"
    ):
      tx.update(jax.grad(loss)(m), tx.init(m), m)

  def test_updates_rebuilt_around_the_same_array_keep_the_tie(self):
    import optax  # pylint: disable=g-import-not-at-top

    m = tied_model()
    g = jnp.full((2, 2), 0.5)
    updates = Model(Param(g), Param(g), Param(jnp.zeros(2)))
    new = optax.apply_updates(m, updates)
    self.assertIs(new.a, new.b)
    np.testing.assert_allclose(new.a.value, 1.5)

  def test_a_map_that_splits_a_tie_names_both_places(self):
    m = tied_model()
    other = Model(Param(1.0), Param(2.0), Param(3.0))
    add = lambda x, y: x + y
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError, r"at tree\.a and tree\.b"
    ) as raised:
      jax.tree.map(add, m, other)
    # Raised as itself, not while handling another error, and worded for
    # the setting that raised it.
    self.assertIsNone(raised.exception.__context__)
    self.assertIn(
        "It is an error under jax_split_ties='raise'", str(raised.exception)
    )
    self.assertNotIn("makes this an error", str(raised.exception))
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError, r"at rest\[0\]\.a and rest\[0\]\.b"
    ):
      jax.tree.map(add, other, m)
    jax.config.update("jax_split_ties", "warn")
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("default")  # Python's: once a line and message.
      for _ in range(2):
        new = jax.tree.map(add, m, other)
    self.assertIsNot(new.a, new.b)
    np.testing.assert_allclose(new.b.value, 3.0)
    (warning,) = [
        w for w in caught if w.category is jax.tree_util.SplitTieWarning
    ]
    self.assertIn("jax.tree.map split a tie", str(warning.message))
    self.assertIn("built before the class was opted in", str(warning.message))
    self.assertIn("'raise') makes this an error", str(warning.message))
    self.assertEqual(warning.filename, __file__)  # The caller's line.
    jax.config.update("jax_split_ties", "allow")
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      jax.tree.map(lambda x, y: x * y, m, other)

  def test_an_optimizer_state_made_before_the_opt_in_is_reported(self):
    import optax  # pylint: disable=g-import-not-at-top

    m = tied_model()
    # As if made before the opt-in: a moment per place.
    state = optax.adam(0.1).init(jax.tree_util.tree_unshare(m))
    with self.assertRaisesRegex(jax.tree_util.SplitTieError, "split a tie"):
      optax.adam(0.1).update(jax.grad(loss)(m), state, m)

  def test_a_loop_body_that_splits_the_carry_names_the_initial_value(self):
    w = Param(jnp.ones(2))

    def body(carry, _):
      a, b = carry
      return (Param(a.value + 1), Param(b.value * 2)), None

    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError,
        r"jax\.lax\.scan .* at init\[0\] and init\[1\]",
    ):
      jax.lax.scan(body, (w, w), None, length=2)
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError,
        r"while_loop .* init_val\[0\] and init_val\[1\]",
    ):
      jax.lax.while_loop(
          lambda c: c[0].value[0] < 3,
          lambda c: (Param(c[0].value + 1), Param(c[1].value * 2)),
          (w, w),
      )
    kept, _ = jax.lax.scan(
        lambda c, _: ((n := Param(c[0].value + 1), n), None),
        (w, w),
        None,
        length=2,
    )
    self.assertIs(kept[0], kept[1])

  def test_scan3_keeps_the_carrys_tie_or_tells_as_scan_does(self):
    w = Param(jnp.ones(2))

    def splits(carry, x):
      a, b = carry
      return (Param(a.value + x), Param(b.value * 2)), a.value

    def keeps(carry, x):
      y = carry[0].value * 2 + x
      return (Param(y), Param(y)), y

    with config.scan3(True):
      with self.assertRaisesRegex(
          jax.tree_util.SplitTieError,
          r"jax\.lax\.scan .* at init\[0\] and init\[1\]",
      ):
        jax.lax.scan(splits, (w, w), jnp.arange(3.0))
      (a, b), ys = jax.lax.scan(keeps, (w, w), jnp.arange(3.0))
      self.assertIs(a, b)
      np.testing.assert_allclose(ys[:, 0], [2.0, 5.0, 12.0])
      jax.config.update("jax_split_ties", "allow")
      (a, b), ys = jax.lax.scan(splits, (w, w), jnp.arange(3.0))
    # Stock's values: a copy per place.
    self.assertIsNot(a, b)
    np.testing.assert_allclose(a.value, [4.0, 4.0])
    np.testing.assert_allclose(b.value, [8.0, 8.0])
    np.testing.assert_allclose(ys[:, 0], [1.0, 1.0, 2.0])

  def test_a_loop_body_returning_the_same_values_at_both_places_keeps_the_tie(
      self,
  ):
    # Two nodes around one traced value: nothing tells the places apart.
    w = Param(jnp.ones(2))

    def step(carry, x):
      a, b = carry
      y = a.value * x + b.value
      return (Param(y), Param(y)), y

    (a, b), ys = jax.lax.scan(step, (w, w), jnp.arange(1.0, 4.0))
    self.assertIs(a, b)
    np.testing.assert_allclose(ys[:, 0], [2.0, 6.0, 24.0])

    def body(carry):
      i, (a, b) = carry
      y = a.value * 2 + b.value
      return i + 1, (Param(y), Param(y))

    for loop in (
        lambda: jax.lax.while_loop(lambda c: c[0] < 3, body, (0, (w, w))),
        lambda: jax.lax.fori_loop(0, 3, lambda _, c: body(c), (0, (w, w))),
    ):
      _, (a, b) = loop()
      self.assertIs(a, b)
      np.testing.assert_allclose(a.value, [27.0, 27.0])

  def test_branches_returning_the_same_values_at_both_places_keep_the_tie(
      self,
  ):
    w = Param(jnp.array([1.0, 2.0]))
    tied = lambda a: (a, a)
    same = lambda a: (a, Param(a.value))  # one traced value at both places
    other = lambda a: (a, Param(a.value + 1))
    for pred in (True, False):
      first, second = jax.lax.cond(pred, tied, same, w)
      self.assertIs(first, second)
      # A branch that returns other values there splits the tie the other
      # returns: told.
      with self.assertRaisesRegex(
          jax.tree_util.SplitTieError,
          r"jax\.lax\.cond split a tie: the Param at result\[0\] and "
          r"result\[1\] is one object in what a branch returned",
      ):
        jax.lax.cond(pred, tied, other, w)
      with config.split_ties("allow"):
        first, second = jax.lax.cond(pred, tied, other, w)
      self.assertIsNot(first, second)
      np.testing.assert_allclose(
          second.value, [1.0, 2.0] if pred else [2.0, 3.0]
      )
    for index in range(3):
      first, second = jax.lax.switch(
          index, [tied, same, lambda a: (Param(a.value), Param(a.value))], w
      )
      self.assertIs(first, second)
    # One object at both places: its gradient is the sum over them.
    grad = jax.grad(
        lambda w: jnp.sum(
            sum(x.value for x in jax.lax.cond(True, tied, same, w))
        )
    )(w)
    np.testing.assert_allclose(grad.value, [2.0, 2.0])

  def test_a_vmap_spec_that_splits_a_node_is_told_and_runs_only_when_allowed(
      self,
  ):
    import equinox as eqx  # pylint: disable=g-import-not-at-top

    w = Param(jnp.ones((3, 2)))
    pair = Model(w, w, None)
    twins = Model(Param(w.value), Param(w.value), None)
    spec = (Model(0, None, None),)
    f = lambda m: jnp.sum(m.a.value) + jnp.sum(m.b.value)
    expected = jax.vmap(f, in_axes=spec)(twins)
    # Under "raise" (this class's setting) both refuse with a SplitTieError,
    # naming both places; jax.vmap's is also the SharedPrefixError it words.
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError, r"args\[0\]\.a and .*\.b"
    ) as refused:
      jax.vmap(f, in_axes=spec)(pair)
    self.assertIsInstance(refused.exception, SharedPrefixError)
    self.assertEqual(refused.exception.values, (0, None))
    with self.assertRaisesRegex(jax.tree_util.SplitTieError, r"\.a and .*\.b"):
      eqx.filter_vmap(f, in_axes=spec)(pair)
    # By default jax.vmap still refuses a prefix conflict; filter_vmap's
    # jax.tree.map splits the node and warns, naming both places.
    jax.config.update("jax_split_ties", "warn")
    with self.assertRaisesRegex(SharedPrefixError, "'allow'"):
      jax.vmap(f, in_axes=spec)(pair)
    with self.assertWarnsRegex(jax.tree_util.SplitTieWarning, r"\.a and .*\.b"):
      out = eqx.filter_vmap(f, in_axes=spec)(pair)
    np.testing.assert_array_equal(out, expected)
    # Under "allow" both run what stock runs on copies, silently.
    jax.config.update("jax_split_ties", "allow")
    for vmap in (jax.vmap, eqx.filter_vmap):
      with self.subTest(vmap.__name__), warnings.catch_warnings():
        warnings.simplefilter("error")
        out = vmap(f, in_axes=spec)(pair)
      np.testing.assert_array_equal(out, expected)

  def test_the_users_own_tuple_holding_one_node_twice_is_the_users_tie(self):
    # Library code that fills a tuple's slots with one object is not told
    # (above); the same tuple built by the user is the user's tie.
    p = Param(jnp.array([1.0, 2.0]))
    with self.assertRaisesRegex(
        jax.tree_util.SplitTieError, r"at tree\[0\] and tree\[1\]"
    ):
      jax.tree.map(lambda x, y: x * y, (p, p), (Param(1.0), Param(2.0)))

  def test_library_steps_on_untied_and_tied_models_are_not_told(self):
    import equinox as eqx  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top

    # An opted-in model that shares nothing, under a masked chain.
    untied = Model(
        Param(jnp.ones((2, 2))), Param(jnp.ones((2, 2))), Param(jnp.ones(2))
    )
    mask = Model(Param(True), Param(False), Param(False))
    tx = optax.chain(
        optax.masked(optax.add_decayed_weights(0.1), mask), optax.sgd(0.1)
    )
    updates, _ = tx.update(jax.grad(loss)(untied), tx.init(untied), untied)
    new = optax.apply_updates(untied, updates)
    np.testing.assert_allclose(new.c.value, 0.8, rtol=1e-5)  # Not decayed.
    # Equinox's value_and_grad handing the tied model back as aux.
    m = tied_model()
    (value, aux), grad = eqx.filter_value_and_grad(
        lambda m: (loss(m), m), has_aux=True
    )(m)
    self.assertIs(aux.a, aux.b)
    self.assertIs(grad.a, grad.b)
    np.testing.assert_allclose(value, loss(m))

  def test_incidental_aliasing_in_libraries_is_not_reported(self):
    import equinox.internal as eqxi  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top
    from jax.scipy.sparse.linalg import bicgstab, cg, gmres  # pylint: disable=g-import-not-at-top

    # The solvers' carries alias r and p (p = r); on two objects of the
    # user's, nothing is told. (On one object at both places of b, the
    # solution splits the user's tie, and they say so:
    # never_worse_than_stock_test.)
    p = Param(jnp.array([1.0, 2.0]))
    matvec = lambda x: jax.tree.map(lambda v: 2.0 * v, x)
    for solve in (cg, bicgstab, gmres):
      x, _ = solve(matvec, (p, Param(jnp.array([1.0, 2.0]))))
      np.testing.assert_allclose(x[0].value, p.value / 2, rtol=1e-5)
    m = tied_model()
    opt = optax.lbfgs()
    state = opt.init(m)
    value_and_grad = optax.value_and_grad_from_state(loss)
    for _ in range(2):
      value, grad = value_and_grad(m, state=state)
      updates, state = opt.update(
          grad, state, m, value=value, grad=grad, value_fn=loss
      )
      m = optax.apply_updates(m, updates)
    self.assertIs(m.a, m.b)
    # A model that is one node: Optax fills two slots of its state with one
    # object and maps them apart.
    single = training.lbfgs_steps(
        Param(jnp.array([1.0, 2.0])), lambda q: jnp.sum(q.value**2), 2
    )
    np.testing.assert_allclose(single.value, 0.0, atol=1e-5)
    out = eqxi.while_loop(
        lambda c: c[0] < 3,
        lambda c: (c[0] + 1, jax.tree.map(lambda v: v * 2, c[1])),
        (0, (p, p)),
        max_steps=3,
        kind="checkpointed",
    )
    np.testing.assert_allclose(out[1][1].value, 8 * p.value)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
