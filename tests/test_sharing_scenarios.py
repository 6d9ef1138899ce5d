"""The seed scenarios of relative identities, each a plain test.

They follow the examples of the README and ``docs/semantics.md`` on
``jaxlib_patch.pytree`` directly (no jax): the Parent/Child example, one
object passed as two arguments, sharing seen through non-opted-in nodes,
``is_leaf``, cycles, and sharing mismatches in ``flatten_up_to``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import sys

import pytest

from jaxlib_patch import pytree as pt

# The README's Parent/Child (an opted-in Child, shared, in a Parent), as
# examples/demo.py and the wheels' checks use them.
sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[1] / "examples")
)
# pylint: disable-next=wrong-import-position
from parent_child import Child, Parent, register as register_example


class Array:
  """Stands for a jax array: a leaf compared by identity."""

  def __init__(self, value):
    self.value = value

  def __repr__(self):
    return f"Array({self.value!r})"


class Module:
  """Opted-in, registered with keys: a bag of named fields."""

  def __init__(self, **fields):
    self.fields = fields


class MyTuple:
  """A custom node registered WITHOUT the flag: plain tree semantics."""

  def __init__(self, *items):
    self.items = items


@dataclasses.dataclass
class Param:
  """An opted-in dataclass wrapping a bare array, as the docs recommend."""

  value: object


class SelfHolder:
  """Opted-in; used to build cycles."""

  def __init__(self, content=None):
    self.content = content


class Fresh:
  """Opted-in; its flatten function makes a new Child at every call."""


def make_registry():
  r = pt.PyTreeRegistry()
  # Parent opted in as well, as it always was in these scenarios.
  register_example(r.register_node, parent_opts_in=True)
  r.register_node(
      Module,
      lambda m: (
          tuple(m.fields[k] for k in sorted(m.fields)),
          tuple(sorted(m.fields)),
      ),
      lambda names, ch: Module(**dict(zip(names, ch))),
      lambda m: (
          tuple((pt.GetAttrKey(k), m.fields[k]) for k in sorted(m.fields)),
          tuple(sorted(m.fields)),
      ),
      preserve_relative_identities=True,
  )
  r.register_node(
      MyTuple, lambda t: (t.items, None), lambda _, ch: MyTuple(*ch)
  )
  r.register_dataclass_node(
      Param, ["value"], [], preserve_relative_identities=True
  )
  r.register_node(
      SelfHolder,
      lambda s: ((s.content,), None),
      lambda _, ch: SelfHolder(*ch),
      preserve_relative_identities=True,
  )
  r.register_node(
      Fresh,
      lambda f: ((Child(Array(0)),), None),
      lambda _, ch: Fresh(),
      preserve_relative_identities=True,
  )
  return r


REG = make_registry()


def test_parent_child_example():
  """The README's example: out.left is out.right, and both are new objects."""
  child = Child(x=Array(1.0))
  parent = Parent(left=child, right=child)
  leaves, td = REG.flatten(parent)
  assert leaves == [child.x]
  assert td.num_leaves == 1
  assert repr(td) == (
      "PyTreeDef(CustomNode(Parent[None], "
      "[#1=CustomNode(Child[None], [*]), #1#]))"
  )
  out = td.unflatten(leaves)
  assert out.left is out.right
  assert out is not parent and out.left is not child
  assert out.left.x is child.x
  # And again with new leaves: still one Child.
  out2 = td.unflatten([Array(2.0)])
  assert out2.left is out2.right and out2.left.x.value == 2.0


def test_parent_child_unshared_is_a_different_treedef():
  """Two equal but distinct children: a plain tree, not equal to the shared."""
  unshared = Parent(Child(Array(1.0)), Child(Array(1.0)))
  leaves, td = REG.flatten(unshared)
  assert len(leaves) == 2
  out = td.unflatten(leaves)
  assert out.left is not out.right
  child = Child(Array(1.0))
  assert REG.flatten(Parent(child, child))[1] != td


def test_same_module_as_two_arguments():
  """f(m, m): flattening (m, m) gives one copy of m's leaves."""
  m = Module(w=Array(1), b=Array(2))
  args = (m, m)
  leaves, td = REG.flatten(args)
  assert leaves == [m.fields["b"], m.fields["w"]]
  out = td.unflatten(leaves)
  assert type(out) is tuple and len(out) == 2
  assert out[0] is out[1]
  assert out[0] is not m
  # Across positional and keyword arguments too: one scope per flatten.
  leaves, td = REG.flatten(((m,), {"m": m}))
  assert len(leaves) == 2
  out_args, out_kwargs = td.unflatten(leaves)
  assert out_args[0] is out_kwargs["m"]
  # Paths: the first occurrence's.
  with_path, _ = REG.flatten_with_path(((m,), {"m": m}))
  assert [path for path, _ in with_path] == [
      (pt.SequenceKey(0), pt.SequenceKey(0), pt.GetAttrKey("b")),
      (pt.SequenceKey(0), pt.SequenceKey(0), pt.GetAttrKey("w")),
  ]


def test_separate_calls_are_separate_scopes():
  """Sharing is seen within one flatten, never across two calls."""
  m = Module(w=Array(1))
  leaves1, td1 = REG.flatten(m)
  leaves2, td2 = REG.flatten(m)
  assert td1 == td2 and "#" not in repr(td1)
  assert td1.unflatten(leaves1) is not td2.unflatten(leaves2)


def test_sharing_through_a_non_opted_in_node():
  """MyTuple(MyTuple(m, m), MyTuple(m, m)), MyTuple plain: one m."""
  m = Module(w=Array(1))
  tree = MyTuple(MyTuple(m, m), MyTuple(m, m))
  leaves, td = REG.flatten(tree)
  assert leaves == [m.fields["w"]]
  out = td.unflatten(leaves)
  assert isinstance(out, MyTuple)
  ms = [
      out.items[0].items[0],
      out.items[0].items[1],
      out.items[1].items[0],
      out.items[1].items[1],
  ]
  assert all(x is ms[0] for x in ms)
  assert ms[0] is not m
  # The non-opted-in MyTuple nodes themselves are rebuilt separately.
  same = MyTuple(m, m)
  out = REG.flatten(MyTuple(same, same))[1].unflatten(leaves)
  assert out.items[0] is not out.items[1]
  assert out.items[0].items[0] is out.items[1].items[1]


def test_shared_param_wrapping_a_bare_array():
  """A bare array shared through lists is two leaves; wrapped in Param, one."""
  array = Array(3)
  assert len(REG.flatten([array, array])[0]) == 2
  param = Param(array)
  leaves, td = REG.flatten([param, {"p": param}])
  assert leaves == [array]
  out = td.unflatten([Array(4)])
  assert out[0] is out[1]["p"]
  assert repr(td) == "PyTreeDef([#1=CustomNode(Param[()], [*]), {'p': #1#}])"


def test_is_leaf_claims_a_shared_node():
  """An object that is_leaf claims is a leaf, shared or not."""
  child = Child(Array(1))
  parent = Parent(child, child)
  leaves, td = REG.flatten(parent, lambda x: isinstance(x, Child))
  assert leaves == [child, child]
  assert repr(td) == "PyTreeDef(CustomNode(Parent[None], [*, *]))"
  out = td.unflatten(leaves)
  assert out.left is child and out.right is child
  # Claiming only the second occurrence: the first is still a node.
  seen = []

  def second_only(x):
    if isinstance(x, Child):
      seen.append(x)
      return len(seen) == 2
    return False

  leaves, td = REG.flatten(parent, second_only)
  assert leaves == [child.x, child]
  assert "#" not in repr(td)


def test_cycle_direct_raises_value_error_naming_type():
  """An opted-in object that contains itself: ValueError naming its type."""
  holder = SelfHolder()
  holder.content = holder
  with pytest.raises(ValueError, match="SelfHolder"):
    REG.flatten(holder)
  with pytest.raises(ValueError, match="SelfHolder"):
    REG.flatten_with_path([holder])


def test_cycle_through_a_list_raises_value_error_naming_type():
  """The cycle goes through plain containers and another opted-in node."""
  holder = SelfHolder()
  holder.content = [1, {"a": (Child(holder),)}]
  with pytest.raises(ValueError, match="SelfHolder"):
    REG.flatten(holder)
  holder.content = [1, [holder]]
  with pytest.raises(ValueError, match="SelfHolder"):
    REG.flatten((holder, holder))
  # Shared without a cycle is fine.
  inner = SelfHolder(Array(1))
  outer = SelfHolder([inner, inner])
  leaves, td = REG.flatten(outer)
  assert len(leaves) == 1


def test_flatten_up_to_sharing_mismatch():
  """x must share where the treedef does; the error names the paths."""
  child = Child(Array(1))
  td = REG.flatten(Parent(child, child))[1]
  assert td.flatten_up_to(Parent(child, child)) == [child.x]
  other = Child(Array(1))
  td.flatten_up_to(Parent(other, other))
  # The treedef shares, the tree does not.
  with pytest.raises(ValueError, match=r"tree") as info:
    td.flatten_up_to(Parent(child, Child(Array(1))))
  assert "shar" in str(info.value)
  # The treedef does not share, the tree does.
  td_unshared = REG.flatten(Parent(Child(Array(1)), Child(Array(2))))[1]
  with pytest.raises(ValueError, match=r"tree") as info:
    td_unshared.flatten_up_to(Parent(child, child))
  assert "Child" in str(info.value)
  # Deeper: the path names the dict key.
  m = Module(a=child, b=child)
  td = REG.flatten({"mod": m})[1]
  with pytest.raises(ValueError, match=r"tree\['mod'\]"):
    td.flatten_up_to({"mod": Module(a=child, b=Child(Array(1)))})


def test_flatten_up_to_as_prefix_spec():
  """A prefix spec (in_axes-like) gives one value per shared node."""
  child = Child(Array(1))
  td = REG.flatten(Parent(child, child))[1]
  spec = td.unflatten([0])
  assert spec.left is spec.right
  assert td.flatten_up_to(spec) == [0]
  # Two different values for the one shared node: rejected.
  with pytest.raises(ValueError, match="tree"):
    td.flatten_up_to(Parent(Child(0), Child(1)))


def test_fresh_objects_made_by_flatten_functions_never_fake_a_share():
  """Children created anew at each flatten call are distinct nodes."""
  tree = [Fresh() for _ in range(200)]
  leaves, td = REG.flatten(tree)
  assert len(leaves) == 200
  assert "#" not in repr(td)
  out = td.unflatten(leaves)
  assert len({id(o) for o in out}) == 200


@pytest.mark.parametrize(
    "sizes",
    [
        (5, 300, 5, 2000, 1, 50),
        # Past the table a thread keeps between flattens, then small again.
        (40_000, 3, 20_000, 2),
    ],
)
def test_no_identity_outlives_its_flatten(sizes):
  """Each flatten starts knowing no object: the objects of one flatten are
  freed before the next, whose new objects reuse their addresses, and none
  of them is taken for an earlier one. Every child is listed twice, in
  opposite orders, so each flatten also checks that every reference points
  at its own first occurrence."""
  for size in sizes * 3:
    children = [Child(Array(i)) for i in range(size)]
    leaves, td = REG.flatten([children, children[::-1]])
    assert len(leaves) == size
    assert td.num_nodes == 3 + 3 * size
    assert len(td.shared_references()) == size
    first, second = td.unflatten(leaves)
    assert [c.x.value for c in first] == list(range(size))
    assert all(a is b for a, b in zip(first, reversed(second)))
    del children, first, second


class DiesFlattening:
  """Opted-in; when freed it flattens an opted-in tree of its own."""

  results = []

  def __del__(self):
    child = Child(Array(7))
    leaves, td = REG.flatten(Parent(child, child))
    DiesFlattening.results.append((len(leaves), len(td.shared_references())))


def test_flatten_from_a_finalizer_run_as_a_flatten_ends():
  """A flatten function's fresh children die when the flatten releases
  them, after its last node: their finalizers flatten trees with sharing of
  their own, each with identities of its own."""
  reg = pt.PyTreeRegistry()
  reg.register_node(
      Fresh,
      lambda f: ((DiesFlattening(), DiesFlattening()), None),
      lambda _, ch: Fresh(),
      preserve_relative_identities=True,
  )
  reg.register_node(
      DiesFlattening,
      lambda d: ((), None),
      lambda _, ch: DiesFlattening(),
      preserve_relative_identities=True,
  )
  DiesFlattening.results.clear()
  for _ in range(3):
    leaves, td = reg.flatten([Fresh() for _ in range(50)])
    assert leaves == []
    assert td.num_nodes == 1 + 50 * 3
    assert not td.has_shared_nodes
  assert DiesFlattening.results == [(1, 1)] * 300


def test_shared_subtrees_are_visited_once():
  """A chain of 300 nodes each holding the previous one twice.

  Visiting every occurrence would take 2**300 steps; with sharing each node
  is flattened, checked and built once: one call of to_iterable per unique
  node in flatten and in flatten_up_to, one of from_iterable in unflatten.
  """
  calls = {"flatten": 0, "unflatten": 0}

  class Twice:

    def __init__(self, a, b):
      self.a, self.b = a, b

  def flatten_fn(t):
    calls["flatten"] += 1
    return (t.a, t.b), None

  def unflatten_fn(_, children):
    calls["unflatten"] += 1
    return Twice(*children)

  reg = pt.PyTreeRegistry()
  reg.register_node(
      Twice, flatten_fn, unflatten_fn, preserve_relative_identities=True
  )
  node = Array(0)
  for _ in range(300):
    node = (
        Twice(node, node) if isinstance(node, Twice) else Twice(node, Array(1))
    )
  leaves, td = reg.flatten(node)
  assert calls["flatten"] == 300
  assert len(leaves) == 2 and td.num_leaves == 2
  assert td.num_nodes == 2 + 300 + 299
  out = td.unflatten(leaves)
  assert calls["unflatten"] == 300
  level = out
  for _ in range(299):
    assert level.a is level.b
    level = level.a
  calls["flatten"] = 0
  assert td.flatten_up_to(out) == leaves
  assert calls["flatten"] == 300
  assert len(repr(td)) < 100_000
  walked = td.walk(lambda c, _: c, lambda v: v, leaves)
  assert walked[0] is walked[1]


def test_pickled_example_keeps_sharing():
  """Pickle of the Parent/Child treedef round-trips with its sharing."""
  REG.__module__ = __name__
  REG.__name__ = "REG"
  child = Child(Array(1))
  td = REG.flatten(Parent(child, child))[1]
  back = pickle.loads(pickle.dumps(td))
  assert back == td and sys.modules[__name__].REG is REG
  out = back.unflatten([Array(2)])
  assert out.left is out.right


# ---------------------------------------------------------------------------
# Rebuilding a treedef from some of its children (jax removes static
# arguments this way: from_node_data_and_children over the kept children).
# ---------------------------------------------------------------------------


def rebuild(td, keep):
  """`td` rebuilt from the children whose index is in `keep`, recursively:
  `keep` maps a child's index to True (whole) or to the `keep` of its own."""
  children = td.children()
  kept = [
      children[i] if sub is True else rebuild(children[i], sub)
      for i, sub in keep.items()
  ]
  node_type, data = td.node_data()
  if node_type is dict:
    data = [data[i] for i in keep]
  return pt.PyTreeDef.from_node_data_and_children(REG, (node_type, data), kept)


def test_leaving_out_a_sibling_between_a_node_and_its_reference():
  """jit(f, static_argnums=1)(p, 2, p): the reference is re-aimed at p."""
  child = Child(Array(1))
  td = REG.flatten((child, 2, child))[1]
  without_static = rebuild(td, {0: True, 2: True})
  assert without_static == REG.flatten((child, child))[1]
  out = without_static.unflatten([Array(3)])
  assert out[0] is out[1]


def test_leaving_out_siblings_at_every_depth():
  """Args and kwargs cut apart and put back; a kwarg refers into the args."""
  child, other = Child(Array(1)), Child(Array(2))
  tree = ((child, "static", other), {"a": "static", "b": other, "c": child})
  td = REG.flatten(tree)[1]
  rebuilt = rebuild(td, {0: {0: True, 2: True}, 1: {1: True, 2: True}})
  expected = REG.flatten(((child, other), {"b": other, "c": child}))[1]
  assert rebuilt == expected
  out = rebuilt.unflatten([Array(3), Array(4)])
  assert out[0][0] is out[1]["c"] and out[0][1] is out[1]["b"]
  assert out[0][0] is not out[0][1]


def test_children_in_another_order_keep_their_references():
  """A reference follows its object, not its old position."""
  child = Child(Array(1))
  td = REG.flatten([child, Array(0), Parent(child, child)])[1]
  first, leaf, parent = td.children()
  rebuilt = pt.treedef_tuple(REG, [first, parent, leaf])
  assert rebuilt == REG.flatten((child, Parent(child, child), Array(0)))[1]


def test_a_reference_whose_target_is_left_out_stays_external():
  """Until its target is assembled in front of it again; never a wrong node."""
  child, other = Child(Array(1)), Child(Array(2))
  td = REG.flatten((child, other, child))[1]
  first, second, third = td.children()
  alone = pt.treedef_tuple(REG, [second, third])
  with pytest.raises(ValueError, match="outside"):
    alone.unflatten([Array(0)])
  # `second` is a Child too: the reference must not land on it.
  assert alone != REG.flatten((other, other))[1]
  # Put back behind its target, the reference finds it again.
  leaf = REG.flatten(Array(0))[1]
  whole = pt.treedef_tuple(REG, [first, leaf, alone])
  assert whole == REG.flatten((child, Array(0), (other, child)))[1]


def test_one_child_twice_is_two_objects():
  """Each copy's reference goes to the nearest node of its object: its own."""
  child = Child(Array(1))
  pair = REG.flatten((child, child))[1]
  twice = pt.treedef_tuple(REG, [pair, pair])
  out = twice.unflatten([Array(1), Array(2)])
  assert out[0][0] is out[0][1] and out[1][0] is out[1][1]
  assert out[0][0] is not out[1][0]
  halves = REG.flatten(((child, child), 0))[1].children()
  twice_cut = pt.treedef_tuple(REG, [halves[0], halves[0]])
  assert twice_cut == twice
