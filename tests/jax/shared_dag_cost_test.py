"""A shared structure costs its unique nodes, through every public function.

Each adapter of the public-surface test (surface_table.py: every public
function of jax that takes a tree) is called on arguments that are each a
DAG of `depth` levels (a node held twice by the node above it, `depth`
times: depth + 1 unique nodes, 2**depth places of its one leaf). The node
classes count the calls of their flatten and unflatten functions, which a
walk in stock's layout (a shared node written out at each place) makes once
per place, and a walk that keeps identities once per node. Between two
depths the count must grow about as the unique nodes do, never as the
places do. A count needs no clock, so the test cannot be flaky; the time
itself is bench/bench_shared_dag.py's.
"""

import dataclasses
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax._src import config
from jax._src import test_util as jtu

import surface_nodes as nodes
import surface_programs
import surface_table  # noqa: F401  (registers the adapters)

SHALLOW, DEEP = 2, 6
# Unique nodes grow (DEEP + 1) / (SHALLOW + 1) = 2.3 times, places 16 times.
MOST_GROWTH = 5.0

# The adapters that walk a shared DAG once per place (counted on 2026-12-07,
# the series of this commit), each with why; the test fails when one of
# them becomes linear, so that this stays the list of what is left.
_GIVEN_PER_PLACE = (
    "the adapter itself hands it a tree with a new node at every place "
    "(cotangents or tangents built per place, a branch returning copies): "
    "the tree it is given has as many nodes as places"
)
_RULES_GET_COPIES = (
    "a rule or callback of the user's that stock gives one copy of each "
    "place (custom derivatives, batching and linear-solve rules): the "
    "rule's arguments are written out at each place on purpose"
)
_VALUES_PER_PLACE = (
    "stock's values count each place (ravel_pytree's vector, the solvers' "
    "inner products): walking each node once would change them"
)
_STOCK_LAYOUT_TRACE = (
    "traces the user's function on arguments flattened as stock flattens "
    "them (issue 61: to keep identities, as vmap does)"
)
PER_PLACE = {
    "jax.closure_convert": _RULES_GET_COPIES,
    "jax.custom_batching.custom_vmap": _RULES_GET_COPIES,
    "jax.custom_batching.sequential_vmap": _RULES_GET_COPIES,
    "jax.custom_derivatives.linear_call": _RULES_GET_COPIES,
    "jax.custom_gradient": _RULES_GET_COPIES,
    "jax.custom_jvp": _RULES_GET_COPIES,
    "jax.custom_vjp": _RULES_GET_COPIES,
    "jax.custom_vjp[symbolic_zeros]": _RULES_GET_COPIES,
    "jax.experimental.ode.odeint": _RULES_GET_COPIES,
    "jax.lax.custom_linear_solve": _RULES_GET_COPIES,
    "jax.lax.custom_linear_solve[symmetric]": _RULES_GET_COPIES,
    "jax.lax.custom_root": _RULES_GET_COPIES,
    "jax.experimental.sparse.sparsify": _STOCK_LAYOUT_TRACE,
    "jax.lax.scan[scan3]": _STOCK_LAYOUT_TRACE,
    "jax.flatten_util.ravel_pytree": _VALUES_PER_PLACE,
    "jax.scipy.sparse.linalg.bicgstab": _VALUES_PER_PLACE,
    "jax.scipy.sparse.linalg.cg": _VALUES_PER_PLACE,
    "jax.scipy.sparse.linalg.cg[x0]": _VALUES_PER_PLACE,
    "jax.scipy.sparse.linalg.gmres": _VALUES_PER_PLACE,
    "jax.fwd_and_bwd": _GIVEN_PER_PLACE,
    "jax.jvp[tangents_share_more]": _GIVEN_PER_PLACE,
    "jax.lax.switch": _GIVEN_PER_PLACE,
    "jax.linear_transpose": _GIVEN_PER_PLACE,
    "jax.linearize[tangents_share_more]": _GIVEN_PER_PLACE,
    "jax.vjp": _GIVEN_PER_PLACE,
}


class Counts:
  calls = 0


@dataclasses.dataclass(repr=False, eq=False)
class CountedP(nodes.P):
  """A parameter node whose flatten and unflatten are counted."""


class CountedBox(nodes._Box):  # pylint: disable=protected-access
  """A box of two children whose flatten and unflatten are counted."""


def _counted(flatten_with_keys, unflatten):
  def flatten(node):
    Counts.calls += 1
    return flatten_with_keys(node)

  def build(aux, children):
    Counts.calls += 1
    return unflatten(aux, children)

  return flatten, build


for _cls, _keys in (
    (
        CountedP,
        lambda p: (((jax.tree_util.GetAttrKey("value"), p.value),), None),
    ),
    (
        CountedBox,
        lambda b: (
            tuple(
                zip(
                    (
                        jax.tree_util.SequenceKey(0),
                        jax.tree_util.SequenceKey(1),
                    ),
                    b.c,
                )
            ),
            None,
        ),
    ),
):
  _flatten, _build = _counted(_keys, lambda _, c, cls=_cls: cls(*c))
  jax.tree_util.register_pytree_with_keys(
      _cls, _flatten, _build, preserve_relative_identities=True
  )

FAMILY = nodes.Family(CountedP, CountedBox)


def dag(depth, seed):
  node = CountedP(jnp.full(3, 0.5 + 0.1 * seed, jnp.float32))
  for _ in range(depth):
    node = CountedBox(node, node)
  return node


def count(adapter, depth):
  """The flattens and unflattens of counted nodes that one call of
  `adapter` on DAGs of `depth` levels makes."""
  args = tuple(dag(depth, k) for k in range(adapter.n_args))
  fn = (
      surface_programs.UserFn("keep", FAMILY)
      if adapter.fn_modes != ("-",)
      else None
  )
  Counts.calls = 0
  with config.split_ties("allow"), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out = adapter.call(args, fn, FAMILY)
    jax.block_until_ready(jax.tree.leaves(out))
  return Counts.calls


class SharedDagCostTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (name, name) for name in sorted(surface_programs.ADAPTERS)
  )
  def test_cost_grows_with_unique_nodes(self, name):
    adapter = surface_programs.ADAPTERS[name]
    shallow, deep = count(adapter, SHALLOW), count(adapter, DEEP)
    linear = deep <= MOST_GROWTH * max(shallow, 1)
    if name in PER_PLACE:
      self.assertFalse(linear, f"{name} is linear now: take it off PER_PLACE")
    else:
      self.assertTrue(linear, (name, shallow, deep))


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
