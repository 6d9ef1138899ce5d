"""Inputs derived from generated trees: leaf predicates, flattening with
them, related trees (mutants, extensions, same structure) and leaf pools."""

import dataclasses

import numpy as np
from hypothesis import strategies as st

from test_stock_compat import strategies as S
from test_stock_compat.strategies import (
    DataNode,
    DataOnly,
    KeyedNode,
    Opaque,
    Pair,
    PlainNode,
    STOCK,
)
from test_stock_compat.describe import NAMEDTUPLES

from test_stock_compat.describe import canon
from test_stock_compat.strategies import SentinelLeaf, log_call

# ---------------------------------------------------------------------------
# Leaf predicates (all log their calls).
# ---------------------------------------------------------------------------


def _pred(name, fn):
  def predicate(x):
    log_call("pred", name, id(x))
    return fn(x)

  return predicate


def _raise_on_tuple(x):
  if type(x) is tuple:
    raise ArithmeticError("predicate failed")
  return False


LEAF_PREDICATES = {
    "absent": None,
    "explicit_none": None,
    "tuples": lambda x: type(x) is tuple,
    "lists_dicts": lambda x: isinstance(x, (list, dict)),
    "custom": lambda x: isinstance(x, (KeyedNode, DataNode, Pair)),
    "never": lambda x: False,
    "returns_None": lambda x: None,
    "short_seq": lambda x: isinstance(x, (tuple, list)) and len(x) < 2,
    "is_None": lambda x: x is None,
    "returns_int": lambda x: 1 if isinstance(x, list) else False,
    "returns_array": lambda x: np.array([True]) if type(x) is dict else False,
    "raises": _raise_on_tuple,
}

leaf_predicate_names = st.sampled_from(sorted(LEAF_PREDICATES))


def make_leaf_predicate(name):
  fn = LEAF_PREDICATES[name]
  return None if fn is None else _pred(name, fn)


def _path_pred(name, fn):
  def predicate(path, x):
    log_call("path_pred", name, canon(path), id(x))
    return fn(path, x)

  return predicate


PATH_PREDICATES = {
    "absent": None,
    "explicit_none": None,
    "depth1": lambda p, x: len(p) >= 1,
    "depth2": lambda p, x: len(p) >= 2,
    "first_index_0": lambda p, x: bool(p)
    and repr(p[0]).startswith("SequenceKey(idx=0"),
    "tuples": lambda p, x: type(x) is tuple,
    "returns_str": lambda p, x: "yes" if len(p) == 1 else False,
    "raises": lambda p, x: _raise_on_tuple(x),
}

path_predicate_names = st.sampled_from(sorted(PATH_PREDICATES))


def make_path_predicate(name):
  fn = PATH_PREDICATES[name]
  return None if fn is None else _path_pred(name, fn)


def flatten_with(side, flavour, tree, pred_name):
  """Calls flatten in the way named by pred_name (absent/None/predicate)."""
  reg = side.regs[flavour]
  if pred_name == "absent":
    return reg.flatten(tree)
  if pred_name == "explicit_none":
    return reg.flatten(tree, None)
  return reg.flatten(tree, leaf_predicate=make_leaf_predicate(pred_name))


def flatten_with_path_with(side, flavour, tree, pred_name):
  reg = side.regs[flavour]
  if pred_name == "absent":
    return reg.flatten_with_path(tree)
  if pred_name == "explicit_none":
    return reg.flatten_with_path(tree, leaf_predicate=None)
  return reg.flatten_with_path(tree, make_path_predicate(pred_name))


def treedef_of(side, flavour, tree):
  return side.regs[flavour].flatten(tree)[1]


# ---------------------------------------------------------------------------
# Python-level navigation of generated trees (to build related inputs).
# ---------------------------------------------------------------------------


def py_children(x):
  """(step, child) pairs for the container kinds the strategies build."""
  t = type(x)
  if t in (tuple, list) or t in NAMEDTUPLES:
    return list(enumerate(x))
  if t is dict:
    return list(x.items())
  if t in (KeyedNode, PlainNode):
    return list(enumerate(x.children))
  if t is DataNode:
    return [("x", x.x), ("y", x.y)]
  if t is DataOnly:
    return [("a", x.a)]
  return []


def subtree_paths(x, prefix=()):
  """All paths (tuples of steps) to subtrees of x, the root included."""
  yield prefix
  for step, child in py_children(x):
    yield from subtree_paths(child, prefix + (step,))


def subtrees(x):
  yield x
  for _, child in py_children(x):
    yield from subtrees(child)


def get_at(x, path):
  for step in path:
    x = dict(py_children(x))[step]
  return x


def replace_child(x, step, new):
  """A copy of container x with child ``step`` replaced by ``new``."""
  t = type(x)
  if t in (tuple, list):
    items = list(x)
    items[step] = new
    return t(items)
  if t in NAMEDTUPLES:
    items = list(x)
    items[step] = new
    return t(*items)
  if t is dict:
    d = dict(x)
    d[step] = new
    return d
  if t in (KeyedNode, PlainNode):
    items = list(x.children)
    items[step] = new
    return t(tuple(items) if t is KeyedNode else items, x.meta)
  if t in (DataNode, DataOnly):
    return dataclasses.replace(x, **{step: new})
  raise AssertionError(t)


def replace_at(x, path, new):
  if not path:
    return new
  step = path[0]
  child = dict(py_children(x))[step]
  return replace_child(x, step, replace_at(child, path[1:], new))


def mutations(node):
  """Names of the structural mutations applicable to ``node``."""
  t = type(node)
  names = ["replace_leaf", "replace_none", "replace_tree"]
  if t in (tuple, list):
    names += ["append", "swap_seq_type"] + (["drop"] if node else [])
  if t is dict:
    names += ["add_key"] + (["drop_key"] if node else [])
  if t in (KeyedNode, PlainNode):
    names += ["change_meta", "swap_custom", "append_child"]
  if t in NAMEDTUPLES:
    names += ["namedtuple_to_tuple"]
  if t is DataNode:
    names += ["change_tag"]
  return names


def mutate(node, name, data):
  """Applies mutation ``name`` to node, drawing what is needed from data."""
  t = type(node)
  if name == "replace_leaf":
    return Opaque("mutant")
  if name == "replace_none":
    return None
  if name == "replace_tree":
    return data.draw(S.trees(max_leaves=4), label="replacement")
  if name == "append":
    return t(list(node) + [SentinelLeaf(99)])
  if name == "drop":
    return t(list(node)[:-1])
  if name == "swap_seq_type":
    return list(node) if t is tuple else tuple(node)
  if name == "add_key":
    key = data.draw(st.one_of(S.str_keys, S.int_keys), label="new key")
    return {**node, key: SentinelLeaf(98)}
  if name == "drop_key":
    d = dict(node)
    d.pop(next(iter(d)))
    return d
  if name == "change_meta":
    return t(node.children, ("changed", node.meta))
  if name == "swap_custom":
    other = PlainNode if t is KeyedNode else KeyedNode
    return other(tuple(node.children), node.meta)
  if name == "append_child":
    return t(tuple(node.children) + (SentinelLeaf(97),), node.meta)
  if name == "namedtuple_to_tuple":
    return tuple(node)
  if name == "change_tag":
    return DataNode(node.x, node.y, ("changed", node.tag))
  raise AssertionError(name)


def draw_mutant(data, tree):
  """tree with one randomly chosen subtree structurally changed."""
  paths = list(subtree_paths(tree))
  path = data.draw(st.sampled_from(paths), label="mutation path")
  node = get_at(tree, path)
  name = data.draw(st.sampled_from(mutations(node)), label="mutation")
  return replace_at(tree, path, mutate(node, name, data))


def draw_leafwise_extension(data, tree, flavour):
  """A tree that has ``tree`` as a prefix: each leaf replaced by a subtree.

  Built with the stock module (input construction only).
  """
  leaves, treedef = STOCK.regs[flavour].flatten(tree)
  replacements = data.draw(
      st.lists(
          S.trees(max_leaves=3), min_size=len(leaves), max_size=len(leaves)
      ),
      label="leaf replacements",
  )
  return treedef.unflatten(replacements)


def draw_same_structure(data, tree, flavour):
  """A tree with the structure of ``tree`` (for flavour) but other leaves."""
  leaves, treedef = STOCK.regs[flavour].flatten(tree)
  new_leaves = data.draw(
      st.lists(
          S.leaves.filter(lambda v: v is not None),
          min_size=len(leaves),
          max_size=len(leaves),
      ),
      label="other leaves",
  )
  return treedef.unflatten(new_leaves)


def leaf_pool(n):
  return [SentinelLeaf(i) for i in range(max(n, 0))]


LEAF_ITERABLES = {
    "list": list,
    "tuple": tuple,
    "generator": lambda leaves: (x for x in leaves),
    "iterator": iter,
    "raising": lambda leaves: _raising_after(leaves),
}


def _raising_after(leaves):
  yield from leaves
  raise KeyError("leaf iterator failed")


# walk callbacks (the first two log their calls).


def f_node(node, data):
  log_call("f_node", canon(node), canon(data))
  return ("N", node, data)


def f_leaf(x):
  log_call("f_leaf", id(x))
  return ("L", x)


def f_node_raising(node, data):
  raise OverflowError("f_node failed")
