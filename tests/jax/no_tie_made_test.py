"""No tie the user did not make: `jax.tree.map` and `map_with_path` lay
their result out as the first tree, so they never tie places that the first
tree holds as two objects, whatever the other trees share there; they keep
the first tree's ties where every tree's values agree (the same objects),
and tell (here: raise, under jax_split_ties='raise') exactly where the
values split a tie of any of the trees. Generated trees: a dict of places,
each a `Param`, tied in groups differently in each tree, the leaves drawn
from a few arrays so that values agree at some places and not at others.
Values are judged against the map of the trees laid out as stock lays them
out."""

import functools

import jax
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src import config
from jax._src import test_util as jtu
from jax.tree_util import SplitTieError
import numpy as np

from shared_nodes import Param

POOL = [np.full(2, float(k)) for k in range(3)]


@st.composite
def tied_trees(draw, places):
  """({place: Param}, the group of each place): the places of a group hold
  one Param; each group's leaf is one of POOL's arrays."""
  groups = draw(
      st.lists(st.integers(0, places - 1), min_size=places, max_size=places)
  )
  leaves = draw(
      st.lists(
          st.sampled_from(range(len(POOL))), min_size=places, max_size=places
      )
  )
  params = {g: Param(POOL[leaves[g]]) for g in set(groups)}
  return {f"p{k}": params[g] for k, g in enumerate(groups)}, groups


def _add(*xs):
  return sum(xs[1:], xs[0] * 10.0)


def _map(with_path, trees):
  if with_path:
    return jax.tree.map_with_path(lambda path, *xs: _add(*xs), *trees)
  return jax.tree.map(_add, *trees)


class NoTieMadeTest(jtu.JaxTestCase, parameterized.TestCase):

  @settings(max_examples=150, deadline=None)
  @given(
      data=st.data(),
      places=st.integers(2, 5),
      others=st.integers(1, 2),
      with_path=st.booleans(),
  )
  def test_the_result_ties_only_what_the_first_tree_ties(
      self, data, places, others, with_path
  ):
    trees, groups = zip(
        *(data.draw(tied_trees(places)) for _ in range(1 + others))
    )
    names = [f"p{k}" for k in range(places)]
    with config.split_ties("allow"):
      result = _map(with_path, trees)
    expected = _map(with_path, [jax.tree_util.tree_unshare(t) for t in trees])
    for name in names:  # Stock's values, place by place.
      np.testing.assert_array_equal(result[name].value, expected[name].value)
    split = False
    for i, a in enumerate(names):
      for b in names[i + 1 :]:
        tied_first = trees[0][a] is trees[0][b]
        values_agree = all(t[a].value is t[b].value for t in trees)
        # Tied exactly where the first tree ties and nothing tells the
        # places apart; never where the first tree holds two objects.
        self.assertEqual(
            result[a] is result[b], tied_first and values_agree, (a, b, groups)
        )
        # Told: a tie of any tree whose places the values tell apart.
        split |= any(t[a] is t[b] for t in trees) and not values_agree
    # Told exactly where the values split some tree's tie.
    with config.split_ties("raise"):
      if split:
        with self.assertRaises(SplitTieError):
          _map(with_path, trees)
      else:
        _map(with_path, trees)

  @parameterized.parameters("direct", "jit", "vmap", "partial")
  def test_reached_through_a_transformation(self, how):
    # However the map is reached, a tie of the first tree that every tree
    # holds alike is kept, and places the first tree holds apart stay apart.
    def mapped(m, s):
      return jax.tree.map(lambda v, s: v + s, m, {"a": s, "b": s})

    call = {
        "direct": mapped,
        "jit": jax.jit(mapped),
        "vmap": jax.vmap(mapped),
        "partial": functools.partial(mapped),
    }[how]
    x = np.ones((2, 2), np.float32)
    scale = Param(np.ones((2, 2), np.float32))
    p = Param(x)
    with config.split_ties("raise"):
      tied = call({"a": p, "b": p}, scale)
    # (Traced, the two layers' leaves are two tracers, which tell the
    # scale's places apart: that is told, so it is allowed here.)
    with config.split_ties("allow"):
      apart = call({"a": Param(x), "b": Param(x)}, scale)
    self.assertIs(tied["a"], tied["b"])
    self.assertIsNot(apart["a"], apart["b"])
    np.testing.assert_array_equal(apart["a"].value, x + 1.0)

  def test_a_scale_held_once_ties_no_layers(self):
    # The case: two layers around one array, a scale held once.
    zeros = np.zeros(2)
    model = {"a": Param(zeros), "b": Param(zeros)}
    scale = Param(1.0)
    with config.split_ties("raise"):
      moved = jax.tree.map(lambda v, s: v + s, model, {"a": scale, "b": scale})
    self.assertIsNot(moved["a"], moved["b"])
    grads = jax.grad(
        lambda m: jax.numpy.sum((m["a"].value - 1) ** 2)
        + jax.numpy.sum((m["b"].value + 2) ** 2)
    )(moved)
    np.testing.assert_array_equal(grads["a"].value, [0.0, 0.0])
    np.testing.assert_array_equal(grads["b"].value, [6.0, 6.0])


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
