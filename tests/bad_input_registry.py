"""The registry and helpers that the bad-input tests share
(test_bad_input.py, test_bad_pickled_states.py,
test_bad_protos_and_references.py): nodes whose callbacks and aux data
misbehave, opted in on one registry, a treedef with sharing, and a walk of
every operation over a treedef that may raise but must not crash.
"""

from __future__ import annotations

import pickle

from hypothesis import HealthCheck, settings

from jaxlib_patch import pytree as pt
from nodes import DNode, Leaf, PNode, register_all

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# What a rejected input may raise.  Never SystemError (a C-API misuse, or the
# module's InternalError: a bug), never a crash.
CLEAN = (ValueError, TypeError)


class AuxNode:
  """Opted-in custom node with keys whose node data is exactly ``aux``: the
  tests hand the module aux data that misbehaves itself (nodes.KNode wraps
  its tag in a tuple, whose comparison and hash would stand in between)."""

  def __init__(self, *children, aux=None):
    self.children = children
    self.aux = aux


class Junk:
  """Opted-in node whose flatten functions return ``self.result``."""

  def __init__(self, result):
    self.result = result


def junk_result(node):
  result = node.result
  if isinstance(result, type) and issubclass(result, BaseException):
    raise result("from the flatten function")
  if callable(result):
    return result()
  return result


REG = register_all(pt.PyTreeRegistry(), opt_in=True)
# Pickled treedefs name their registry by module and name.
REG.__module__ = __name__
REG.__name__ = "REG"
REG.register_node(
    AuxNode,
    lambda n: (n.children, n.aux),
    lambda aux, ch: AuxNode(*ch, aux=aux),
    lambda n: (
        tuple((pt.FlattenedIndexKey(i), c) for i, c in enumerate(n.children)),
        n.aux,
    ),
    preserve_relative_identities=True,
)
REG.register_node(
    Junk,
    junk_result,
    lambda aux, ch: Junk(None),
    junk_result,
    preserve_relative_identities=True,
)


def shared_treedef():
  """A treedef with sharing: [n, {'k': n}, DNode(d), d] with d a DNode."""
  n = AuxNode(Leaf(), PNode("o", [Leaf()]))
  d = DNode(Leaf(), None, 3)
  return REG.flatten([n, {"k": n}, DNode(d, None, 0), d])[1]


def exercise(td):
  """Runs every operation on a treedef; each may raise, none may crash."""
  outcomes = []

  def attempt(fn, *args):
    try:
      outcomes.append(fn(*args))
    except SystemError:
      raise
    except (
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        IndexError,
        pickle.PicklingError,
    ):
      outcomes.append(None)

  attempt(repr, td)
  attempt(hash, td)
  attempt(lambda: td == td)
  attempt(lambda: td.num_leaves + td.num_nodes)
  attempt(lambda: [(c.node_data(), repr(c)) for c in td.children()])
  attempt(td.node_data)
  attempt(
      lambda: pt.PyTreeDef.from_node_data_and_children(
          REG, td.node_data(), td.children()
      )
      == td
  )
  attempt(lambda: td.unflatten([Leaf()] * td.num_leaves))
  attempt(lambda: td.flatten_up_to(td.unflatten([Leaf()] * td.num_leaves)))
  attempt(
      lambda: td.walk(
          lambda c, d: (c, d), lambda x: x, [Leaf()] * td.num_leaves
      )
  )
  attempt(lambda: td.compose(REG.flatten((1, 2))[1]))
  attempt(lambda: REG.flatten((1,))[1].compose(td))
  attempt(lambda: pickle.loads(pickle.dumps(td)) == td)
  attempt(lambda: td.serialize_using_proto())
  assert len(outcomes) == N_OPERATIONS
  return outcomes


N_OPERATIONS = 14
