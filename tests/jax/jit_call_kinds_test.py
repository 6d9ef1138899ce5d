"""jax.jit's C++ fast path takes the calls stock's takes, kind by kind.

jit_call_kinds.py calls jax.jit with each kind of argument a user passes
(arrays, numpy values, Python scalars, bfloat16, complex, typed and raw PRNG
keys, None, keyword and static arguments, containers, dataclasses,
`Partial`, a sharded array, a weak-typed array, no arguments, an opted-in
model) and reports each jitted function's C++ cache size and cache misses.
It runs here twice, each time in a child process with two virtual CPU
devices: under this interpreter (the custom wheels) and under stock jax
0.10.2 (JAXLIB_PATCH_STOCK_PYTHON). A kind whose cached calls stock serves
in C++ and ours sends to Python every time shows as fewer cache entries and
more misses here. Nothing is timed: the counts are the same on every run.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest

import stock_reference

# Run, not imported: it sets its own device flags before it imports jax.
SCRIPT = os.path.join(os.path.dirname(__file__), "jit_call_kinds.py")


def run_kinds(python):
  """What jit_call_kinds.py prints under `python`, isolated as
  stock_reference runs stock's scripts: (calls of each call, results by
  kind)."""
  done = subprocess.run(
      [python, "-E", "-s", SCRIPT],
      env=stock_reference.child_environment(),
      capture_output=True,
      text=True,
      check=True,
  )
  printed = json.loads(done.stdout)
  return printed["calls"], printed["kinds"]


class JitCallKindsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.calls, cls.ours = run_kinds(sys.executable)
    _, cls.stock = run_kinds(
        stock_reference.stock_python("stock jax 0.10.2 and jaxlib 0.10.2")
    )

  def test_the_same_kinds_on_both_sides(self):
    self.assertEqual(sorted(self.ours), sorted(self.stock))
    self.assertGreater(len(self.ours), 30)

  def test_each_kind_caches_in_cpp_as_on_stock(self):
    # Typed PRNG keys are a leaf to tracing and a node to stock's dispatch:
    # the fast path must flatten them as stock's does, or every call on one
    # misses the C++ cache and runs Python.
    differ = {
        name: (
            (self.ours[name]["cache_size"], self.ours[name]["misses"]),
            (self.stock[name]["cache_size"], self.stock[name]["misses"]),
        )
        for name in self.stock
        if (self.ours[name]["cache_size"], self.ours[name]["misses"])
        != (self.stock[name]["cache_size"], self.stock[name]["misses"])
    }
    self.assertEqual(differ, {}, "kind: ((ours cache size, misses), (stock's))")

  def test_every_kind_is_cached_at_all(self):
    # Stock serves each kind's repeated calls from its C++ cache; a kind
    # that misses every call here would make the comparison above vacuous.
    for name, result in self.stock.items():
      self.assertGreater(result["cache_size"], 0, name)
      self.assertLess(result["misses"], self.calls, name)

  def test_cached_calls_return_the_first_calls_results_and_stocks(self):
    for name in self.stock:
      for ours, stock in zip(
          self.ours[name]["outputs"], self.stock[name]["outputs"]
      ):
        self.assertEqual(ours["last"], ours["first"], name)
        self.assertEqual(ours["first"], stock["first"], name)


if __name__ == "__main__":
  absltest.main()
