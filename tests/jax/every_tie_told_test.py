"""Every tie a call splits is told, not only the first: a model with two
ties (`p` at a and b, `q` at c and d) split by a map with a mask, a loop
body, a branch of `cond` or of `switch`, each tells both, naming both
places of each, once however many branches keep it."""

import warnings

from absl.testing import absltest
import jax
import jax.numpy as jnp
from jax import lax
from jax._src import test_util as jtu
from jax.tree_util import SplitTieWarning

from shared_nodes import Param


def two_ties():
  p, q = Param(jnp.ones(2)), Param(jnp.zeros(2))
  return {"a": p, "b": p, "c": q, "d": q}


def apart(m):
  """`m` with a node per place, the places' values made different."""
  return {
      k: Param(v.value + 1.0 + i) for i, (k, v) in enumerate(sorted(m.items()))
  }


class EveryTieToldTest(jtu.JaxTestCase):

  def assertTellsBothTies(self, run):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      run()
    told = [
        str(w.message)
        for w in caught
        if issubclass(w.category, SplitTieWarning)
    ]
    for first, second in (("a", "b"), ("c", "d")):
      self.assertTrue(
          any(f"['{first}'] and" in m and f"['{second}']" in m for m in told),
          (first, second, told),
      )

  def test_a_map_with_a_mask(self):
    mask = {"a": 0.0, "b": 1.0, "c": 0.0, "d": 1.0}
    self.assertTellsBothTies(
        lambda: jax.tree.map(
            lambda p, m: p + m,
            two_ties(),
            {k: Param(v) for k, v in mask.items()},
        )
    )

  def test_a_scan_body(self):
    self.assertTellsBothTies(
        lambda: lax.scan(
            lambda c, _: (apart(c), None), two_ties(), None, length=2
        )
    )

  def test_a_while_loop_body(self):
    self.assertTellsBothTies(
        lambda: lax.while_loop(
            lambda c: c["a"].value[0] < 3.0, apart, two_ties()
        )
    )

  def test_a_fori_loop_body(self):
    self.assertTellsBothTies(
        lambda: lax.fori_loop(0, 2, lambda i, c: apart(c), two_ties())
    )

  def test_cond_branches(self):
    m = two_ties()
    self.assertTellsBothTies(lambda: lax.cond(True, lambda c: c, apart, m))

  def test_switch_branches(self):
    m = two_ties()
    self.assertTellsBothTies(lambda: lax.switch(1, [lambda c: c, apart], m))

  def test_each_tie_told_once_however_many_branches_keep_it(self):
    # Three branches keep the ties, one splits them: each tie is one split
    # of the call, told once (it was told once per branch that kept it).
    m = two_ties()
    keep = lambda c: c
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      lax.switch(3, [keep, keep, keep, apart], m)
    told = [
        str(w.message)
        for w in caught
        if issubclass(w.category, SplitTieWarning)
    ]
    self.assertLen(told, 2, told)


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
