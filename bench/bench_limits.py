"""Linear-time checks of the pytree module, as timings (not a test).

The test suite checks what can be counted (node data of a shared node is
compared and printed once, tests/test_limits.py); how the time grows with
size is measured here:

- repr of a 50,000-deep treedef against a 5,000-deep one;
- hash, ==, repr, flatten, unflatten, flatten_up_to and walk of 100,000
  references to one shared node against 10,000;
- broadcast_flattened_prefix (prefix specs: in_axes, shardings, donation)
  over a chain of doubly shared levels (each level holds the level below
  twice: 2**depth occurrences of the bottom), 10,000 levels against 1,000,
  with a prefix leaf at the root and with a prefix of the same sharing (what
  `jax.tree.map(lambda _: 0, tree)` makes); depth 40 is printed too, in
  milliseconds.

Linear growth is about 10x for 10x the size, quadratic 100x; the script
prints each ratio and PASS when it is under 30x.

Usage: python bench/bench_limits.py
"""

import gc
import sys
import time

from jaxlib_patch import pytree as pt

LIMIT = 30


def best_per_call(fn, calls, rounds=5):
  """The best of `rounds` rounds of `calls` calls, per call, GC paused."""
  gc.collect()
  gc.disable()
  try:
    best = float("inf")
    for _ in range(rounds):
      start = time.perf_counter()
      for _ in range(calls):
        fn()
      best = min(best, (time.perf_counter() - start) / calls)
    return best
  finally:
    gc.enable()


def deep_list_treedef(registry, depth):
  """A `depth`-deep chain of one-item lists, built from a pickled state."""
  nodes = [(0, 0, None, None, 1, 1)]
  nodes += [(4, 1, None, None, 1, i + 2) for i in range(depth)]
  treedef = pt.PyTreeDef.__new__(pt.PyTreeDef)
  treedef.__setstate__((registry, nodes))
  return treedef


class Shared:

  def __init__(self, aux, *children):
    self.aux = aux
    self.children = children


def references_timings(registry, n):
  tree = [Shared("aux", 1, 2)] * n
  leaves, td = registry.flatten(tree)
  _, td2 = registry.flatten([Shared("aux", 1, 2)] * n)
  out = td.unflatten(leaves)
  calls = max(1, 200_000 // n)
  return {
      "hash": best_per_call(lambda: hash(td), calls),
      "==": best_per_call(lambda: td == td2, calls),
      "repr": best_per_call(lambda: repr(td), calls),
      "flatten": best_per_call(lambda: registry.flatten(tree), calls),
      "unflatten": best_per_call(lambda: td.unflatten(leaves), calls),
      "flatten_up_to": best_per_call(lambda: td.flatten_up_to(out), calls),
      "walk": best_per_call(
          lambda: td.walk(lambda c, d: c, lambda x: x, leaves), calls
      ),
  }


def doubly_shared_chain(registry, depth):
  node = Shared("bottom", 1.0)
  for _ in range(depth):
    node = Shared("level", node, node)
  return registry.flatten(node)[1]


def prefix_timings(registry, depth):
  full = doubly_shared_chain(registry, depth)
  leaf_prefix = registry.flatten(0)
  same_sharing = registry.flatten(full.unflatten([0] * full.num_leaves))
  return {
      name: best_per_call(
          lambda: full.broadcast_flattened_prefix(prefix, leaves), 20, rounds=9
      )
      for name, (leaves, prefix) in (
          ("a prefix leaf", leaf_prefix),
          ("the same sharing", same_sharing),
      )
  }


def report(name, small, large):
  ratio = large / small
  verdict = "PASS" if ratio < LIMIT else "FAIL"
  print(
      f"{verdict}  {name:<32} {small * 1e3:9.3f} ms -> {large * 1e3:9.3f} ms"
      f"  ({ratio:5.1f}x for 10x the size; limit {LIMIT}x)"
  )


def main():
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 50_000))
  registry = pt.PyTreeRegistry()
  registry.register_node(
      Shared,
      lambda s: (s.children, s.aux),
      lambda aux, ch: Shared(aux, *ch),
      preserve_relative_identities=True,
  )
  report(
      "repr, 5,000 -> 50,000 deep",
      *(
          best_per_call(lambda: repr(td), 3)
          for td in (
              deep_list_treedef(registry, 5_000),
              deep_list_treedef(registry, 50_000),
          )
      ),
  )
  small = references_timings(registry, 10_000)
  large = references_timings(registry, 100_000)
  for op in small:
    report(f"{op}, 10,000 -> 100,000 refs", small[op], large[op])
  for name, seconds in prefix_timings(registry, 40).items():
    print(f"      prefix broadcast, {name}, depth 40: {seconds * 1e3:.3f} ms")
  small = prefix_timings(registry, 1_000)
  large = prefix_timings(registry, 10_000)
  for name in small:
    report(f"prefix, {name}, 1,000 -> 10,000 deep", small[name], large[name])


if __name__ == "__main__":
  main()
