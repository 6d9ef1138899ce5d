"""Treedef operations: the same outcomes as stock."""

from hypothesis import given
from hypothesis import strategies as st

from test_stock_compat import strategies as S
from test_stock_compat.strategies import OURS, STOCK, SentinelLeaf
from test_stock_compat.describe import safe
from test_stock_compat.compare import PROPERTY, both, check_hash_consistency
from test_stock_compat.inputs import (
    draw_mutant,
    draw_same_structure,
    f_leaf,
    f_node_raising,
    leaf_pool,
    treedef_of,
)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour_a=S.flavours,
    flavour_b=S.flavours,
    how=st.sampled_from(
        [
            "same_structure",
            "same_structure",
            "mutant",
            "independent",
            "same_tree",
        ]
    ),
)
def test_treedef_equality_and_hash(data, tree, flavour_a, flavour_b, how):
  """== and != between treedefs (same or different registries, equal or
  different structure, against non-treedefs) agree with stock, and within
  each module a == b implies hash(a) == hash(b)."""
  if how == "same_structure":
    other = draw_same_structure(data, tree, flavour_a)
  elif how == "mutant":
    other = draw_mutant(data, tree)
  elif how == "independent":
    other = data.draw(S.trees(), label="independent tree")
  else:
    other = tree
  if data.draw(st.booleans(), label="same registry"):
    flavour_b = flavour_a

  def pair(side):
    return (
        treedef_of(side, flavour_a, tree),
        treedef_of(side, flavour_b, other),
    )

  s, o = both("flatten pair", pair)
  if not s.ok:
    return
  both("a == b", lambda side: pair(side)[0] == pair(side)[1])
  both("a != b", lambda side: pair(side)[0] != pair(side)[1])
  both("b == a", lambda side: pair(side)[1] == pair(side)[0])
  both("a == a", lambda side: (lambda a: a == a)(pair(side)[0]))
  both(
      "a == 5, a != 5, a == None",
      lambda side: (lambda a: (a == 5, a != 5, a == None))(  # noqa: E711
          pair(side)[0]
      ),
  )
  both(
      "hash succeeds",
      lambda side: [type(safe(lambda t=t: hash(t))) is int for t in pair(side)],
  )
  for r, side in ((s, STOCK), (o, OURS)):
    a, b = r.value
    check_hash_consistency(a, a)
    check_hash_consistency(a, pair(side)[0])
    # Only for treedefs of the same registry: stock itself breaks the rule
    # across registries (a dataclass node flattened by two registries that
    # both registered the class compares equal but hashes differently).
    if flavour_a == flavour_b:
      check_hash_consistency(a, b)


@PROPERTY
@given(
    inner=S.trees(max_leaves=5),
    outer=S.trees(max_leaves=6),
    flavour=S.flavours,
    other_flavour=S.flavours,
    same_registry=st.booleans(),
)
def test_compose(inner, outer, flavour, other_flavour, same_registry):
  """outer.compose(inner): same treedef (repr, sizes, equality with the
  treedef of the composed tree), same unflatten result; composing treedefs
  of different registries fails the same way."""
  inner_flavour = flavour if same_registry else other_flavour

  def composed(side):
    return treedef_of(side, flavour, outer).compose(
        treedef_of(side, inner_flavour, inner)
    )

  s, _ = both("compose", composed)
  if not s.ok:
    return
  pool = leaf_pool(s.value.num_leaves)
  both("compose().unflatten", lambda side: composed(side).unflatten(pool))

  # The composed tree itself, built once (with stock) and shared by both.
  outer_leaves, outer_def = STOCK.regs[flavour].flatten(outer)
  whole = outer_def.unflatten([inner] * len(outer_leaves))

  def expected(side):
    return composed(side) == treedef_of(side, flavour, whole)

  both("compose() == treedef of composed tree", expected)


def _decompose(treedef):
  """Recursively (node_data, [children...]) of a treedef."""
  return (
      treedef.node_data(),
      [_decompose(child) for child in treedef.children()],
  )


def _registry_knows_root(side, flavour, treedef):
  """Whether the registry ``flavour`` of ``side`` flattens the root of
  ``treedef`` as a node, as it must to rebuild it (a leaf root needs no
  registration)."""
  if treedef.num_nodes == 1 and treedef.num_leaves == 1:
    return True
  root = treedef.unflatten(leaf_pool(treedef.num_leaves))
  return side.regs[flavour].flatten_one_level(root) is not None


# The draws, alike in form to test_treedef_equality_and_hash's, are this
# test's own: a shared declaration would hide what each test draws.
@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    rebuild_flavour=S.flavours,
)
def test_children_node_data_rebuild(data, tree, flavour, rebuild_flavour):
  """children(), node_data() (recursively), and
  PyTreeDef.from_node_data_and_children round trip (also with another
  registry and with permuted children): same results as stock."""
  both("children", lambda side: treedef_of(side, flavour, tree).children())
  both("node_data", lambda side: treedef_of(side, flavour, tree).node_data())
  both(
      "recursive decomposition",
      lambda side: _decompose(treedef_of(side, flavour, tree)),
  )

  def rebuild(side, registry_flavour=flavour, permute=None):
    treedef = treedef_of(side, flavour, tree)
    children = treedef.children()
    if permute is not None:
      children = [children[i] for i in permute]
    return side.mod.PyTreeDef.from_node_data_and_children(
        side.regs[registry_flavour], treedef.node_data(), children
    )

  s, _ = both("from_node_data_and_children", rebuild)
  both(
      "rebuilt == original",
      lambda side: rebuild(side) == treedef_of(side, flavour, tree),
  )
  pool = leaf_pool(s.value.num_leaves)
  both("rebuilt.unflatten", lambda side: rebuild(side).unflatten(pool))
  both(
      "from_node_data_and_children(other registry)",
      lambda side: rebuild(side, rebuild_flavour),
      place=(
          None
          if _registry_knows_root(STOCK, rebuild_flavour, s.value)
          else "test_children_node_data_rebuild/"
          "from_node_data_and_children(other registry)"
      ),
  )
  n = len(s.value.children())
  if n > 1:
    perm = data.draw(st.permutations(range(n)), label="children order")
    both(
        "from_node_data_and_children(permuted)",
        lambda side: rebuild(side, permute=perm),
    )
    both(
        "permuted.unflatten",
        lambda side: rebuild(side, permute=perm).unflatten(pool),
    )


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    delta=st.sampled_from([0, 0, 0, -1, 1]),
    f_node=st.sampled_from(["normal", "normal", "raising"]),
)
def test_walk(tree, flavour, delta, f_node):
  """treedef.walk(f_node, f_leaf, leaves): same result, same sequence of
  callback calls (arguments included), same errors for wrong leaf counts
  and raising callbacks."""
  node_fn = f_node if f_node == "normal" else f_node_raising
  s, _ = both("flatten", lambda side: treedef_of(side, flavour, tree))
  pool = leaf_pool(s.value.num_leaves + delta)
  both(
      "walk",
      lambda side: treedef_of(side, flavour, tree).walk(node_fn, f_leaf, pool),
  )
  both(
      "walk(generator leaves)",
      lambda side: treedef_of(side, flavour, tree).walk(
          node_fn, f_leaf, (x for x in pool)
      ),
  )


class GenMarker:
  """Stands for 'a fresh generator over these items' in an iterable tree."""

  def __init__(self, items):
    self.items = items


def materialize(x):
  """Turns GenMarkers into fresh generators (one per side)."""
  if isinstance(x, GenMarker):
    return (materialize(i) for i in x.items)
  if type(x) in (list, tuple):
    return type(x)(materialize(i) for i in x)
  return x


def draw_iterable_tree(data, tree, flavour):
  """The 'iterable tree' for from_iterable_tree: every node (as the stock
  registry of ``flavour`` sees it) replaced by an iterable of its children."""
  reg = STOCK.regs[flavour]

  def convert(x):
    res = reg.flatten_one_level(x)
    if res is None:
      return x
    items = [convert(c) for c in res[0]]
    kind = data.draw(
        st.sampled_from(["list", "list", "tuple", "gen"]), label="iterable kind"
    )
    return {"list": items, "tuple": tuple(items), "gen": GenMarker(items)}[kind]

  return convert(tree)


def _iterable_paths(x, prefix=()):
  yield prefix
  if type(x) in (list, tuple):
    for i, item in enumerate(x):
      yield from _iterable_paths(item, prefix + (i,))


def _replace_in_iterable(x, path, new):
  if not path:
    return new
  items = list(x)
  items[path[0]] = _replace_in_iterable(items[path[0]], path[1:], new)
  return type(x)(items)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    corrupt=st.sampled_from([None, None, 5, None, "ab", "drop", "extend"]),
)
def test_from_iterable_tree(data, tree, flavour, corrupt):
  """treedef.from_iterable_tree on iterable trees (lists, tuples,
  generators), optionally corrupted (non-iterables, wrong arity): same
  rebuilt tree or same error."""
  s, _ = both("flatten", lambda side: treedef_of(side, flavour, tree))
  if not s.ok:
    return
  itree = draw_iterable_tree(data, tree, flavour)
  if corrupt is not None:
    path = data.draw(
        st.sampled_from(list(_iterable_paths(itree))), label="corruption path"
    )
    target = itree
    for step in path:
      target = target[step]
    if corrupt == "drop" and type(target) in (list, tuple) and target:
      new = type(target)(list(target)[:-1])
    elif corrupt == "extend" and type(target) in (list, tuple):
      new = type(target)(list(target) + [SentinelLeaf(50)])
    else:
      new = corrupt
    itree = _replace_in_iterable(itree, path, new)
  both(
      "from_iterable_tree",
      lambda side: treedef_of(side, flavour, tree).from_iterable_tree(
          materialize(itree)
      ),
      place="test_from_iterable_tree/from_iterable_tree",
  )


@PROPERTY
@given(
    items=st.lists(st.tuples(S.trees(max_leaves=5), S.flavours), max_size=4),
    flavour=S.flavours,
    same_registry=st.booleans(),
)
def test_treedef_tuple(items, flavour, same_registry):
  """treedef_tuple(registry, treedefs): same result (repr, sizes, unflatten)
  and same error when registries do not match."""

  def op(side):
    defs = [
        treedef_of(side, flavour if same_registry else f, tree)
        for tree, f in items
    ]
    return side.mod.treedef_tuple(side.regs[flavour], defs)

  s, _ = both("treedef_tuple", op)
  if s.ok:
    pool = leaf_pool(s.value.num_leaves)
    both("treedef_tuple().unflatten", lambda side: op(side).unflatten(pool))
    as_tuple = tuple(tree for tree, _ in items)
    both(
        "treedef_tuple() == treedef of tuple",
        lambda side: op(side) == treedef_of(side, flavour, as_tuple),
    )
