"""The classes of the specification's Parent/Child example: a Parent whose
left and right are one Child.

examples/demo.py runs the example through jax; build/selfcheck.py and
build/check_device_checks.py check installed wheels with it, and
tests/test_sharing_scenarios.py the pytree module. They run it with
`python -I`, or from elsewhere, so each puts this folder on sys.path itself.
The classes are plain, so that each registers them where it tests them:
`register` takes the registration function.
"""


class Child:
  """Opted in: one array field."""

  def __init__(self, x):
    self.x = x


class Parent:
  """Two sub-module fields; opted in where `register` is told so."""

  def __init__(self, left, right):
    self.left = left
    self.right = right


def register(register_node, parent_opts_in=False):
  """Registers Child, opted in, and Parent, only with `parent_opts_in`
  opted in (the README's is not: the sharing is the child's), by
  `register_node`: jax.tree_util.register_pytree_node, or a
  PyTreeRegistry's register_node."""
  register_node(
      Child,
      lambda c: ((c.x,), None),
      lambda _, xs: Child(*xs),
      preserve_relative_identities=True,
  )
  flag = {"preserve_relative_identities": True} if parent_opts_in else {}
  register_node(
      Parent,
      lambda p: ((p.left, p.right), None),
      lambda _, xs: Parent(*xs),
      **flag,
  )
