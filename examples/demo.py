"""The parent/child example of the specification, through jit, grad and vmap.

Run by the README's first command inside the venv that holds the custom
wheels; prints each property it checks and exits non-zero if one fails.
"""

import os
import sys

import jax
import jax.numpy as jnp

# The example's classes lie beside this file, a folder that `python -I`
# leaves off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=wrong-import-position
from parent_child import Child, Parent, register

# Child opted in, Parent not: the sharing is the child's.
register(jax.tree_util.register_pytree_node)

failures = 0


def check(what, ok):
  global failures
  failures += not ok
  print(f"  [{'ok' if ok else 'FAIL'}] {what}")


child = Child(jnp.array(2.0))
parent = Parent(child, child)

print("jax.jit")
# Spelled out for a reader, though build/check_device_checks.py's check_jit
# makes the same calls (and checks more, on a device).
seen_inside = []


@jax.jit
def identity(p):
  seen_inside.append(p.left is p.right)
  return p


for call in ("first call (trace)", "second call (cached)"):
  out = identity(parent)
  check(f"{call}: out.left is out.right", out.left is out.right)
  check(
      f"{call}: out is a new object",
      out is not parent and out.left is not child,
  )
check("inside the trace: p.left is p.right", all(seen_inside))
check("one trace for both calls", len(seen_inside) == 1)

print("jax.grad")
grads = jax.grad(lambda p: p.left.x * p.right.x)(parent)
check("the shared child has one gradient object", grads.left is grads.right)
check(
    "its gradient is the sum over both uses: 2 * x = 4",
    float(grads.left.x) == 4.0,
)

print("jax.vmap")
batched = Parent(*(2 * [Child(jnp.arange(3.0))]))
out = jax.vmap(lambda p: Parent(p.left, Child(p.right.x + 1)))(batched)
check(
    "out.left keeps the input's leaf",
    bool((out.left.x == jnp.arange(3.0)).all()),
)
shared = jax.vmap(lambda p: p)(batched)
check("sharing survives vmap", shared.left is shared.right)

print("jax.tree.map")
mapped = jax.tree.map(lambda x: x + 1, parent)
check("one call per unique leaf, sharing kept", mapped.left is mapped.right)
check("one leaf", len(jax.tree.leaves(parent)) == 1)

print("all checks passed" if not failures else f"{failures} check(s) failed")
raise SystemExit(1 if failures else 0)
