"""jax.jit while nothing is opted in: stock's dispatch takes the calls as
they are, and computes what the function computes.

nothing_opted_in.py runs in a child process (no opt-in of this process is in
force there) and reports, for calls on custom nodes (`Partial`, a class
registered plainly, one as a keyword, inside a dataclass, beside 100
arrays) and a call with two keywords (the one kind that still takes the
general path), whether each of three calls returned the unjitted value, and
the C++ cache size; then the same after the program's first opt-in, from
which calls on custom nodes take the general path.
"""

import json
import os

from absl.testing import absltest

import stock_reference

SCRIPT = os.path.join(os.path.dirname(__file__), "nothing_opted_in.py")


class NothingOptedInTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.report = json.loads(stock_reference.run_child("-E", "-s", SCRIPT))

  def test_importing_jax_opts_nothing_in(self):
    self.assertFalse(self.report["before"]["has_opt_ins"])
    self.assertTrue(self.report["after"]["has_opt_ins"])

  def test_every_call_computes_the_unjitted_value(self):
    for when in ("before", "after"):
      for name, kind in self.report[when]["kinds"].items():
        self.assertEqual(kind["matched"], [True] * 3, (when, name))

  def test_each_kind_is_one_cache_entry(self):
    # Before the opt-in the leaf dispatch caches each kind; after it a kind
    # on custom nodes is traced once more, for the general dispatch, on a
    # new jitted function here: still one entry each.
    for when in ("before", "after"):
      for name, kind in self.report[when]["kinds"].items():
        self.assertEqual(kind["cache_size"], 1, (when, name))


if __name__ == "__main__":
  absltest.main()
