"""Flattening and unflattening: the same outcomes as stock."""

from hypothesis import given
from hypothesis import strategies as st

from test_stock_compat import strategies as S
from test_stock_compat.strategies import KeyedNode, PlainNode, SentinelLeaf
from test_stock_compat.describe import NAMEDTUPLES
from test_stock_compat.deviations import sort_order_is_an_artifact
from test_stock_compat.compare import PROPERTY, both, check_hash_consistency
from test_stock_compat.inputs import (
    LEAF_ITERABLES,
    draw_leafwise_extension,
    draw_mutant,
    f_leaf,
    f_node,
    flatten_with,
    flatten_with_path_with,
    leaf_pool,
    leaf_predicate_names,
    path_predicate_names,
    subtrees,
    treedef_of,
)


@PROPERTY
@given(
    tree=S.trees(mixed_keys=True), flavour=S.flavours, pred=leaf_predicate_names
)
def test_flatten(tree, flavour, pred):
  """flatten: same leaves (by identity, in order), same treedef repr and
  sizes, same predicate/to_iterable calls, same errors."""

  def op(side):
    leaves, treedef = flatten_with(side, flavour, tree, pred)
    assert treedef.num_leaves == len(leaves)
    return [id(x) for x in leaves], leaves, treedef

  s, o = both("flatten", op)
  if s.ok:
    # Consistency of the returned treedef with itself, in both modules.
    both("treedef == itself", lambda side: op(side)[2] == op(side)[2])
    for r in (s, o):
      check_hash_consistency(r.value[2], r.value[2])


@PROPERTY
@given(
    tree=S.trees(mixed_keys=True), flavour=S.flavours, pred=path_predicate_names
)
def test_flatten_with_path(tree, flavour, pred):
  """flatten_with_path: same (key path, leaf) pairs (keys compared by type,
  repr and str; leaves by identity), same treedef, and the treedef equals the
  one from flatten when no predicate is given."""

  def op(side):
    pairs, treedef = flatten_with_path_with(side, flavour, tree, pred)
    return [id(leaf) for _, leaf in pairs], pairs, treedef

  s, _ = both("flatten_with_path", op)
  if s.ok and pred in ("absent", "explicit_none"):
    both(
        "flatten_with_path treedef == flatten treedef",
        lambda side: op(side)[2] == treedef_of(side, flavour, tree),
    )


@PROPERTY
@given(tree=S.trees(mixed_keys=True), flavour=S.flavours)
def test_flatten_one_level(tree, flavour):
  """flatten_one_level and flatten_one_level_with_keys on every subtree:
  same children (and whether the input container itself is returned), same
  aux data, same keys, None for leaves, same errors."""
  for sub in subtrees(tree):

    def plain(side, sub=sub):
      res = side.regs[flavour].flatten_one_level(sub)
      return res, res is not None and res[0] is sub

    def keyed(side, sub=sub):
      return side.regs[flavour].flatten_one_level_with_keys(sub)

    both("flatten_one_level", plain)
    both(
        "flatten_one_level_with_keys",
        keyed,
        place=(
            "test_flatten_one_level/flatten_one_level_with_keys"
            if type(sub) in NAMEDTUPLES
            else None
        ),
    )


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    pred=leaf_predicate_names,
    delta=st.sampled_from([0, 0, 0, -1, 1, 5]),
    kind=st.sampled_from(sorted(LEAF_ITERABLES)),
)
def test_unflatten(tree, flavour, pred, delta, kind):
  """unflatten with fresh sentinel leaves (right and wrong counts, several
  iterable kinds): same rebuilt tree (types, dict order, custom nodes built
  via the same from_iterable calls), or same error; also unflatten(flatten(t))
  round trip."""
  s, _ = both("flatten", lambda side: flatten_with(side, flavour, tree, pred))
  if not s.ok:
    return
  n = s.value[1].num_leaves
  pool = leaf_pool(n + delta)

  def op(side):
    treedef = flatten_with(side, flavour, tree, pred)[1]
    return treedef.unflatten(LEAF_ITERABLES[kind](pool))

  both("unflatten", op)

  def roundtrip(side):
    leaves, treedef = flatten_with(side, flavour, tree, pred)
    return treedef.unflatten(leaves)

  both("unflatten(flatten(tree))", roundtrip)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    how=st.sampled_from(
        ["extension", "extension", "mutant", "mutant", "independent", "same"]
    ),
)
def test_flatten_up_to(data, tree, flavour, how):
  """treedef.flatten_up_to on trees that do and do not have the treedef as a
  prefix: same returned subtrees (by identity where objects), same error
  type and message for every kind of mismatch."""
  if how == "extension":
    full = draw_leafwise_extension(data, tree, flavour)
  elif how == "mutant":
    full = draw_mutant(data, draw_leafwise_extension(data, tree, flavour))
  elif how == "independent":
    full = data.draw(S.trees(), label="independent tree")
  else:
    full = tree

  def op(side):
    out = treedef_of(side, flavour, tree).flatten_up_to(full)
    return [id(x) for x in out], out

  both("flatten_up_to", op)


FLAT_CONTAINERS = {
    "list": list,
    "tuple": tuple,
    "dict": lambda items: {f"k{i}": x for i, x in enumerate(items)},
    "PlainNode": lambda items: PlainNode(list(items), "flat"),
    "KeyedNode": lambda items: KeyedNode(tuple(items), "flat"),
}


@PROPERTY
@given(
    data=st.data(),
    container=st.sampled_from(sorted(FLAT_CONTAINERS)),
    flavour=S.flavours,
    none_positions=st.lists(st.booleans(), max_size=12),
    depth=st.integers(0, 2),
)
def test_flatten_up_to_flat_layer(
    data, container, flavour, none_positions, depth
):
  """flatten_up_to on a container whose children are all leaves or None (the
  layer it matches in place): each None of the treedef independently kept or
  replaced, each leaf replaced by a subtree, the layer nested or not; the same
  subtrees or the same error (the same one of several mismatches) as stock."""
  make = FLAT_CONTAINERS[container]
  prefix = make([None if is_none else 0 for is_none in none_positions])
  items = []
  for is_none in none_positions:
    if is_none:
      items.append(
          data.draw(
              st.sampled_from([None, None, 1, (), [None]]), label="at a None"
          )
      )
    else:
      items.append(data.draw(S.trees(max_leaves=3), label="at a leaf"))
  full = make(items)
  for _ in range(depth):
    prefix, full = [prefix, 0], [full, 7]

  def op(side):
    out = treedef_of(side, flavour, prefix).flatten_up_to(full)
    return [id(x) for x in out], out

  both("flatten_up_to", op)


@PROPERTY
@given(
    junk=S.junk_nodes,
    flavour=st.sampled_from(
        [f for f in S.ALL_FLAVOURS if f not in ("bare", "default")]
    ),
    wrap=st.sampled_from(["bare", "list", "dict", "keyed"]),
    pred=path_predicate_names,
)
def test_misbehaving_custom_nodes(junk, flavour, wrap, pred):
  """Custom nodes whose to_iterable / to_iterable_with_keys raise, return
  non-tuples, wrong-sized tuples, non-iterable children, generators,
  iterables that raise, junk key/leaf pairs, or whose from_iterable raises
  or returns None: every operation gives the same result or error."""
  tree = {
      "bare": junk,
      "list": [1, junk],
      "dict": {"b": junk, "a": (junk,)},
      "keyed": KeyedNode((junk, 2), "m"),
  }[wrap]
  s, _ = both("flatten", lambda side: side.regs[flavour].flatten(tree))
  both(
      "flatten_with_path",
      lambda side: flatten_with_path_with(side, flavour, tree, pred),
      place="test_misbehaving_custom_nodes/flatten_with_path",
  )
  both(
      "flatten_one_level",
      lambda side: side.regs[flavour].flatten_one_level(junk),
  )
  both(
      "flatten_one_level_with_keys",
      lambda side: side.regs[flavour].flatten_one_level_with_keys(junk),
      place="test_misbehaving_custom_nodes/flatten_one_level_with_keys",
  )
  if s.ok:
    pool = leaf_pool(s.value[1].num_leaves)
    both(
        "unflatten",
        lambda side: treedef_of(side, flavour, tree).unflatten(pool),
    )
    both(
        "repr/==/num_nodes",
        lambda side: (lambda t: (repr(t), t == t, t.num_nodes, t.node_data()))(
            treedef_of(side, flavour, tree)
        ),
    )
    both(
        "walk",
        lambda side: treedef_of(side, flavour, tree).walk(f_node, f_leaf, pool),
    )
    both(
        "flatten_up_to(tree)",
        lambda side: treedef_of(side, flavour, tree).flatten_up_to(tree),
    )


_numeric_keys = st.one_of(
    st.integers(-3, 3),
    st.just(float("nan")),
    st.sampled_from([1.0, 0.5, -0.0, True, False, float("inf")]),
)
_frozenset_keys = st.sampled_from(
    [frozenset(), frozenset({1}), frozenset({2}), frozenset({1, 2})]
)
_other_keys = st.sampled_from([None, (1,), ("a",), b"a"])
_any_key = st.one_of(
    _numeric_keys,
    st.text(alphabet="ab", max_size=2),
    _frozenset_keys,
    _other_keys,
)

# Key lists drawn from one family of mutually comparable keys (numbers with
# NaN, strings, frozensets: not totally ordered), or from all of them mixed.
dict_key_lists = st.one_of(
    st.lists(_numeric_keys, max_size=6),
    st.lists(st.text(alphabet="ab", max_size=2), max_size=4),
    st.lists(_frozenset_keys, max_size=4),
    st.lists(_any_key, max_size=4),
)


@PROPERTY
@given(
    keys=dict_key_lists,
    flavour=st.sampled_from(["full", "no_none", "no_dict", "default"]),
    other_keys=dict_key_lists,
)
def test_dict_keys(keys, flavour, other_keys):
  """Dicts with heterogeneous keys (sortable or not, equal-but-different
  types like 1/1.0/True, keys without a total order: NaN, frozensets):
  flatten, flatten_with_path, flatten_up_to
  against a dict with other keys, unflatten, repr, and proto serialization
  all agree with stock."""
  tree = {k: SentinelLeaf(i) for i, k in enumerate(keys)}
  other = {k: SentinelLeaf(10 + i) for i, k in enumerate(other_keys)}
  # Item 6 of the deliberate differences: where the keys have no total
  # order, the candidate orders them with sorted() (checked by oracles).
  sorts = flavour != "no_dict"
  in_tree = sorts and sort_order_is_an_artifact(tree)
  in_other = sorts and sort_order_is_an_artifact(other)

  def at(op, applies):
    return f"test_dict_keys/{op}" if applies else None

  def flattened(op, method, name):
    """Stock's run of the registry's `method` on the dict `name` ("tree" or
    "other"), once compared with the candidate's."""
    subject, applies = (tree, in_tree) if name == "tree" else (other, in_other)
    return both(
        op,
        lambda side: getattr(side.regs[flavour], method)(subject),
        place=at(op, applies),
        ctx={name: subject},
    )[0]

  s = flattened("flatten", "flatten", "tree")
  flattened("flatten other", "flatten", "other")
  flattened("flatten_with_path", "flatten_with_path", "tree")
  flattened("flatten_one_level", "flatten_one_level", "tree")
  if s.ok:
    pool = leaf_pool(s.value[1].num_leaves)
    ctx = {"tree": tree, "other": other, "pool": pool}
    both(
        "unflatten",
        lambda side: treedef_of(side, flavour, tree).unflatten(pool),
        place=at("unflatten", in_tree),
        ctx=ctx,
    )
    both(
        "flatten_up_to(other dict)",
        lambda side: treedef_of(side, flavour, tree).flatten_up_to(other),
        place=at("flatten_up_to(other dict)", in_tree or in_other),
        ctx=ctx,
    )
    both(
        "== other dict",
        lambda side: treedef_of(side, flavour, tree)
        == treedef_of(side, flavour, other),
        place=at("== other dict", in_tree or in_other),
        ctx=ctx,
    )
    both(
        "serialize_using_proto",
        lambda side: treedef_of(side, flavour, tree).serialize_using_proto(),
    )


class Mutator:
  """A custom node whose from_iterable mutates the list of leaves that
  unflatten is reading (the next of MUTATIONS["ops"])."""

  def __init__(self, children):
    self.children = children


MUTATIONS = {"leaves": None, "ops": iter(())}
EXTRA_LEAVES = leaf_pool(3)
LIST_MUTATIONS = {
    "nothing": lambda leaves: None,
    "append": lambda leaves: leaves.append(EXTRA_LEAVES[0]),
    "pop": lambda leaves: leaves and leaves.pop(),
    "pop first": lambda leaves: leaves and leaves.pop(0),
    "insert first": lambda leaves: leaves.insert(0, EXTRA_LEAVES[1]),
    "clear": lambda leaves: leaves.clear(),
    "extend": lambda leaves: leaves.extend(EXTRA_LEAVES),
}


def _mutating_unflatten(_aux, children):
  LIST_MUTATIONS[next(MUTATIONS["ops"], "nothing")](MUTATIONS["leaves"])
  return Mutator(list(children))


MUTATOR_REGISTRIES = {}
for _side in (S.STOCK, S.OURS):
  MUTATOR_REGISTRIES[_side.name] = _side.mod.PyTreeRegistry()
  MUTATOR_REGISTRIES[_side.name].register_node(
      Mutator, lambda m: (m.children, None), _mutating_unflatten
  )

_mutator_trees = st.recursive(
    st.sampled_from(["leaf", None]),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=3).map(tuple),
        st.lists(kids, max_size=3).map(Mutator),
    ),
    max_leaves=12,
)


def _fill(tree, pool):
  """``tree`` with its "leaf" markers replaced by the leaves of ``pool``."""
  if tree == "leaf":
    return next(pool)
  if isinstance(tree, Mutator):
    return Mutator([_fill(c, pool) for c in tree.children])
  if isinstance(tree, (list, tuple)):
    return type(tree)(_fill(c, pool) for c in tree)
  return tree


def _built(x):
  """What unflatten built, with the Mutator nodes made comparable."""
  if isinstance(x, Mutator):
    return ("Mutator", _built(x.children))
  if isinstance(x, (list, tuple)):
    return (type(x).__name__,) + tuple(_built(c) for c in x)
  return x


@PROPERTY
@given(
    tree=_mutator_trees,
    ops=st.lists(st.sampled_from(sorted(LIST_MUTATIONS)), max_size=4),
    delta=st.sampled_from([0, 0, -1, 1]),
)
def test_unflatten_while_from_iterable_mutates_the_leaves(tree, ops, delta):
  """unflatten of a list of leaves that the nodes' from_iterable mutates as
  they are built (the leaves after a node are read after it is built): the
  same tree, with the same leaves at the same places, or the same error."""
  n = sum(1 for _ in _leaf_markers(tree))
  pool = leaf_pool(n + delta)

  def op(side):
    registry = MUTATOR_REGISTRIES[side.name]
    _, treedef = registry.flatten(_fill(tree, iter(leaf_pool(n))))
    leaves = list(pool)
    MUTATIONS["leaves"], MUTATIONS["ops"] = leaves, iter(ops)
    return _built(treedef.unflatten(leaves))

  both("unflatten while from_iterable mutates the leaves", op)


def _leaf_markers(tree):
  if tree == "leaf":
    yield tree
  elif isinstance(tree, Mutator):
    yield from _leaf_markers(tree.children)
  elif isinstance(tree, (list, tuple)):
    for c in tree:
      yield from _leaf_markers(c)
