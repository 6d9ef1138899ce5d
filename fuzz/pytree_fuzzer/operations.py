"""The operations a program runs on the module, with the invariants each
checks when no callback misbehaved, and their weights in a campaign."""

import gc
import pickle

from jaxlib_patch import pytree as pt

from pytree_fuzzer import chaos
from pytree_fuzzer.adversaries import (
    NT2,
    Key,
    Leaf,
    TrickyAux,
    export,
    failing_iter,
    in_callback_mischief,
)
from pytree_fuzzer.outcomes import OracleFailure


def oracle(cond, message):
  if not cond:
    raise OracleFailure(message)


# Each operation may raise; oracle checks run only when no callback
# misbehaved during the operation (`chaos.fired` unchanged).


def op_flatten(prog):
  f0 = chaos.fired
  _, pred, leaves, td = prog.some_flattening(with_path=False)
  prog.keep(td, leaves)
  if chaos.fired != f0 or chaos.rng.random() < 0.5:
    return
  # Round trip: unflatten, then flatten again gives the same treedef, and the
  # very same leaves.
  # (Every value is computed before `chaos.fired` is read: a comparison can run
  # misbehaving user code too.)
  out = td.unflatten(leaves)
  leaves2, td2 = prog.reg.flatten(out, pred)
  same = td2 == td
  up = td.flatten_up_to(out) if pred is None else leaves
  if chaos.fired != f0:
    return
  oracle(same, f"re-flatten of unflatten differs: {td!r} vs {td2!r}")
  oracle(hash(td2) == hash(td), "equal treedefs hash differently")
  oracle(
      len(leaves2) == len(leaves)
      and all(a is b for a, b in zip(leaves, leaves2)),
      "re-flatten gives other leaves",
  )
  oracle(
      len(up) == len(leaves) and all(a is b for a, b in zip(up, leaves)),
      "flatten_up_to(unflatten(td, L)) != L",
  )


def op_flatten_with_path(prog):
  f0 = chaos.fired
  tree, pred, pairs, td = prog.some_flattening(with_path=True)
  if chaos.rng.random() < 0.2:
    # The keys: repr, str, hash, ==, pickle.
    for path, _ in pairs[:4]:
      repr(path)
      [str(k) for k in path]
      hash(path)
      back = pickle.loads(pickle.dumps(path))
      text = repr(path)
      oracle(
          back == path or chaos.fired != f0 or "nan" in text,
          f"a key path does not survive pickling: {text} became {back!r}",
      )
  if chaos.fired != f0 or pred is not None:
    return
  leaves, td2 = prog.reg.flatten(tree)
  same = td2 == td
  if chaos.fired != f0:
    return
  oracle(same, "flatten_with_path and flatten disagree on the treedef")
  oracle(
      all(a is b for (_, a), b in zip(pairs, leaves)),
      "flatten_with_path and flatten disagree on the leaves",
  )


def op_flatten_up_to(prog):
  td, leaves = prog.some_treedef()
  r = chaos.rng.randrange(3)
  if r == 0:
    tree = prog.some_tree()
  else:
    tree = td.unflatten(
        prog.leaves_for(td, leaves)
        if r == 2
        else [Leaf(i) for i in range(td.num_leaves)]
    )
  td.flatten_up_to(tree)


def op_unflatten(prog):
  f0 = chaos.fired
  td, leaves = prog.some_treedef()
  args = prog.leaves_for(td, leaves)
  out = td.unflatten(args)
  if chaos.fired == f0 and chaos.rng.random() < 0.3:
    td2 = prog.reg.flatten(out)[1]
    same = td2 == td
    if (
        chaos.fired == f0
        and isinstance(args, list)
        and all(type(x) in (Leaf, int, str, float) for x in args)
    ):
      oracle(
          same,
          f"flatten(unflatten(td, L)) has another treedef: {td!r} "
          f"became {td2!r}",
      )


def op_walk(prog):
  f0 = chaos.fired
  td, leaves = prog.some_treedef()
  calls = [0]

  def f_node(children, data):
    calls[0] += 1
    if chaos.now():
      in_callback_mischief(None)
      if chaos.rng.random() < 0.3:
        return calls  # The same object for every node.
    return ("N", children, data)

  def f_leaf(x):
    if chaos.now():
      in_callback_mischief(x)
    return x

  out = td.walk(
      f_node,
      f_leaf if chaos.rng.random() < 0.95 else None,
      prog.leaves_for(td, leaves),
  )
  del out
  if chaos.fired == f0:
    state = td.__getstate__()[1]
    expected = sum(1 for e in state if e[0] != 0 and len(e) == 6)
    oracle(
        calls[0] == expected,
        f"walk called f_node {calls[0]} times, expected {expected}",
    )


def op_from_iterable_tree(prog):
  td, leaves = prog.some_treedef()
  n = td.num_leaves
  # An iterable tree: nested lists in the treedef's shape.
  tree = td.walk(
      lambda ch, _: list(ch), lambda x: x, [Leaf(i) for i in range(n)]
  )
  if chaos.rng.random() < 0.3:
    tree = prog.gen_tree(2)  # Junk.
  elif chaos.rng.random() < 0.2 and isinstance(tree, list):
    tree.append(1)
  td.from_iterable_tree(tree)


def op_children(prog):
  f0 = chaos.fired
  td, _ = prog.some_treedef()
  children = td.children()
  data = td.node_data()
  if data is None:
    oracle(children == [], "a leaf with children")
    return
  oracle(
      sum(c.num_leaves for c in children) == td.num_leaves,
      "children do not partition the leaves",
  )
  if len(td.__getstate__()[1][-1]) == 6:  # Not a reference.
    oracle(
        sum(c.num_nodes for c in children) + 1 == td.num_nodes,
        "children do not partition the nodes",
    )
  rebuilt = pt.PyTreeDef.from_node_data_and_children(prog.reg, data, children)
  eq = rebuilt == td
  if chaos.fired == f0:
    oracle(eq, "from_node_data_and_children(node_data(), children()) != td")
    oracle(hash(rebuilt) == hash(td), "rebuilt treedef hashes differently")
  for c in children:
    repr(c)
    c.node_data()


def op_from_node_data_and_children(prog):
  td, _ = prog.some_treedef()
  children = td.children()
  data = td.node_data()
  r = chaos.rng.randrange(8)
  if r == 0 and children:
    children = children[::-1]
  elif r == 1 and children:
    children = children[1:]
  elif r == 2:
    children = children + [prog.some_treedef()[0]]
  elif r == 3 and prog.specs:
    data = (
        chaos.rng.choice(prog.specs).cls,
        pt.SharedReference(chaos.rng.randrange(1, 6)),
    )
  elif r == 4 and data is not None:
    data = (
        data[0],
        chaos.rng.choice(
            [None, (), ["k0"], 7, TrickyAux(1), pt.SharedReference(1)]
        ),
    )
  elif r == 5:
    data = (
        chaos.rng.choice([list, tuple, dict, NT2, type(None), int, Leaf]),
        chaos.rng.choice([None, ["k0", "k1"], ("k0",), 3]),
    )
  elif r == 6:
    children = [c for c in children for _ in range(2)]
  if chaos.rng.random() < 0.1:
    children = failing_iter(list(children))
  pt.PyTreeDef.from_node_data_and_children(prog.reg, data, children)


def op_compose(prog):
  f0 = chaos.fired
  outer, _ = prog.some_treedef()
  inner, _ = prog.some_treedef()
  if chaos.rng.random() < 0.3:
    outer = chaos.rng.choice(outer.children() or [outer])
  composed = outer.compose(inner)
  oracle(
      composed.num_leaves == outer.num_leaves * inner.num_leaves,
      "compose: num_leaves is not the product",
  )
  if chaos.fired == f0 and chaos.rng.random() < 0.3:
    n = composed.num_leaves
    composed.unflatten([Leaf(i) for i in range(n)])


def op_treedef_tuple(prog):
  tds = [prog.some_treedef()[0] for _ in range(chaos.rng.randrange(4))]
  if chaos.rng.random() < 0.3:
    tds = [c for td in tds for c in (td.children() or [td])]
  if chaos.rng.random() < 0.05:
    tds.append(pt.default_registry().flatten([1])[1])  # Another registry.
  td = pt.treedef_tuple(prog.reg, tds)
  oracle(
      td.num_leaves == sum(t.num_leaves for t in tds),
      "treedef_tuple: num_leaves is not the sum",
  )


def op_eq_hash(prog):
  f0 = chaos.fired
  a, _ = prog.some_treedef()
  b, _ = prog.some_treedef()
  if chaos.rng.random() < 0.2:
    b = pickle.loads(pickle.dumps(a))
  eq = a == b
  ne = a != b
  ha, hb = hash(a), hash(b)
  eq_ba = b == a
  eq_aa = a == a
  if chaos.fired == f0:
    oracle(eq != ne, "== and != agree")
    oracle(not eq or ha == hb, "equal treedefs with different hashes")
    oracle(eq_ba == eq, f"== is not symmetric: {a!r} == {b!r} is {eq}")
    oracle(eq_aa, "a treedef is not equal to itself")


def op_repr(prog):
  td, _ = prog.some_treedef()
  text = repr(td)
  oracle(text.startswith("PyTreeDef("), "repr")
  str(td)


def op_pickle(prog):
  f0 = chaos.fired
  td, _ = prog.some_treedef()
  data = pickle.dumps(td, protocol=chaos.rng.choice([2, 4, 5]))
  back = pickle.loads(data)
  eq = back == td
  texts = (repr(td), repr(back))
  if chaos.fired == f0 and "nan" not in texts[0]:  # nan != a new nan.
    oracle(eq, f"pickle round trip changed {texts[0]} into {texts[1]}")
    oracle(hash(back) == hash(td), "pickle round trip changed the hash")
    oracle(texts[0] == texts[1], "pickle changed the repr")


def mutate_state(state):
  reg, nodes = state
  nodes = list(nodes)
  r = chaos.rng.randrange(10)
  if not nodes:
    return (reg, nodes)
  i = chaos.rng.randrange(len(nodes))
  entry = list(nodes[i]) if isinstance(nodes[i], tuple) else [0, 0, 0, 0, 0, 0]
  entry += [0] * (6 - len(entry))
  if r == 0:
    entry[0] = chaos.rng.randrange(-1, 9)
  elif r == 1:
    entry[1] = chaos.rng.randrange(-2, 4)
  elif r == 2:
    entry[2] = chaos.rng.choice([None, ["k0"], [], (), 3, NT2, Leaf()])
  elif r == 3:
    entry[3] = chaos.rng.choice(
        [None, int, Leaf, NT2] + [s.cls for s in chaos.program.specs]
    )
  elif r == 4:
    entry[4:6] = [chaos.rng.randrange(-1, 5), chaos.rng.randrange(-1, 5)]
  elif r == 5:
    if len(entry) == 7:
      entry[6] = chaos.rng.randrange(-2, len(nodes) + 3)
    else:
      entry.append(chaos.rng.randrange(-1, len(nodes) + 2))
  elif r == 6:
    del nodes[i]
    return (reg, nodes)
  elif r == 7:
    nodes.insert(i, nodes[chaos.rng.randrange(len(nodes))])
    return (reg, nodes)
  elif r == 8:
    return (chaos.rng.choice([reg, pt.default_registry(), None, 1]), nodes)
  else:
    entry = entry[: chaos.rng.randrange(len(entry) + 1)]
  nodes[i] = tuple(entry)
  return (reg, nodes)


def op_setstate(prog):
  f0 = chaos.fired
  td, _ = prog.some_treedef()
  state = td.__getstate__()
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  new.__setstate__(state)
  same = new == td
  if chaos.fired == f0:
    oracle(same, "__setstate__(__getstate__()) != td")


def op_setstate_mutated(prog):
  td, _ = prog.some_treedef()
  state = td.__getstate__()
  for _ in range(chaos.rng.randrange(1, 3)):
    state = mutate_state(state)
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  new.__setstate__(state)
  # Whatever was accepted must be usable.
  exercise_treedef(prog, new)


def op_mutate_getstate_in_place(prog):
  """Mutates lists that the module handed out or was handed (finding F2):
  those in __getstate__()'s result, the node data that walk passes to
  f_node, or those in a state after __setstate__ took it.

  On a fresh treedef, kept by no pool: if the module shares such a list, the
  mutation changes the treedef itself, and must not spill into the other
  operations' results.
  """
  td = prog.reg.flatten(prog.gen_tree(3))[1]
  r = chaos.rng.randrange(3)
  if r == 0:
    lists = [entry[2] for entry in td.__getstate__()[1]]
  elif r == 1:
    lists = []
    td.walk(
        lambda c, d: lists.append(d),
        lambda x: x,
        [Leaf(i) for i in range(td.num_leaves)],
    )
  else:
    registry, entries = td.__getstate__()
    entries = [tuple(e) for e in entries]
    new = pt.PyTreeDef.__new__(pt.PyTreeDef)
    new.__setstate__((registry, entries))
    lists = [e[2] for e in entries]
    td = new
  for data in lists:
    if isinstance(data, list):
      r = chaos.rng.randrange(3)
      if r == 0:
        data.clear()
      elif r == 1:
        data.append("extra")
      else:
        data[:] = [Key(1)] * len(data)
  exercise_treedef(prog, td)


def exercise_treedef(prog, td):
  n = td.num_leaves
  ops = (
      lambda: repr(td),
      lambda: hash(td),
      lambda: td == td,
      lambda: td.unflatten([Leaf(i) for i in range(n)]),
      lambda: td.children(),
      lambda: td.node_data(),
      lambda: pickle.loads(pickle.dumps(td)),
      lambda: td.flatten_up_to(prog.some_tree()),
      lambda: td.compose(prog.reg.flatten(1)[1]),
      lambda: td.walk(lambda c, d: c, None, range(n)),
  )
  chaos.rng.choice(ops)()


def op_proto(prog):
  f0 = chaos.fired
  td, _ = prog.some_treedef()
  if chaos.rng.random() < 0.5:
    td = prog.reg.flatten(prog.gen_plain(3))[1]
  data = td.serialize_using_proto()
  back = pt.PyTreeDef.deserialize_using_proto(prog.reg, data)
  same = back == td
  if chaos.fired == f0:
    oracle(same, "proto round trip")


def op_deserialize_proto(prog):
  td = prog.reg.flatten(prog.gen_plain(3))[1]
  data = bytearray(td.serialize_using_proto())
  for _ in range(chaos.rng.randrange(1, 4)):
    r = chaos.rng.randrange(4)
    if r == 0 and data:
      data[chaos.rng.randrange(len(data))] = chaos.rng.randrange(256)
    elif r == 1 and data:
      del data[chaos.rng.randrange(len(data)) :]
    elif r == 2:
      data.insert(chaos.rng.randrange(len(data) + 1), chaos.rng.randrange(256))
    else:
      data += bytes(chaos.rng.randrange(256) for _ in range(3))
  back = pt.PyTreeDef.deserialize_using_proto(prog.reg, bytes(data))
  exercise_treedef(prog, back)


def op_one_level(prog):
  tree = prog.some_tree()
  if chaos.rng.random() < 0.5:
    prog.reg.flatten_one_level(tree)
  else:
    prog.reg.flatten_one_level_with_keys(tree)
  pt.all_leaves(prog.reg, [tree, 1, prog.some_tree()])
  prog.reg.is_node(type(tree))


def op_register(prog):
  r = chaos.rng.randrange(10)
  if r < 6:
    prog.register_random_type()
  elif r < 8 and prog.specs:
    chaos.rng.choice(prog.specs).register(prog.reg)  # Duplicate: ValueError.
  elif r == 8:
    cls = export(type(f"B{prog.serial}_{chaos.rng.randrange(10**9)}", (), {}))
    prog.names.append(cls.__name__)
    prog.reg.register_node(
        cls,
        lambda x: ((), None),
        lambda a, c: cls(),
        preserve_relative_identities=chaos.rng.choice(
            [1, "yes", None, 0.0, True, False]
        ),
    )
  else:
    cls = export(type(f"B{prog.serial}_{chaos.rng.randrange(10**9)}", (), {}))
    prog.names.append(cls.__name__)
    prog.reg.register_dataclass_node(
        cls,
        chaos.rng.choice([["a"], "ab", [1], []]),
        chaos.rng.choice([[], ["m"]]),
        preserve_relative_identities=chaos.rng.choice([True, False, 1]),
    )


def op_gc(prog):
  if chaos.rng.random() < 0.5 and prog.objects:
    prog.objects.pop(chaos.rng.randrange(len(prog.objects)))
  if chaos.rng.random() < 0.3:
    prog.treedefs.clear()
  gc.collect(0)


def op_uninitialized(prog):
  """Methods of a treedef made by __new__ and never set up: TypeError."""
  new = pt.PyTreeDef.__new__(pt.PyTreeDef)
  method = chaos.rng.choice(
      [
          "__repr__",
          "__hash__",
          "children",
          "node_data",
          "__getstate__",
          "serialize_using_proto",
      ]
  )
  getattr(new, method)()


def op_share_check(prog):
  """flatten_up_to on a tree whose sharing differs from the treedef's."""
  if not prog.specs:
    return
  spec = chaos.rng.choice([s for s in prog.specs] or prog.specs)
  a = prog.gen_node(spec, 1)
  b = prog.gen_node(spec, 1)
  box = next((t for t in (list, tuple) if prog.reg.is_node(t)), None)
  if box is None:
    return
  shared = box([a, a] if chaos.rng.random() < 0.5 else [a, b])
  other = box([a, b] if shared[1] is a else [a, a])
  f0 = chaos.fired
  leaves, td = prog.reg.flatten(shared)
  if chaos.fired != f0:
    return
  try:
    td.flatten_up_to(other)
    mismatched = False
  except ValueError:
    mismatched = True
  if chaos.fired == f0 and spec.flag:
    oracle(
        mismatched,
        f"flatten_up_to accepted a tree with other sharing: "
        f"{td!r} from {shared!r}, given {other!r}",
    )


OP_TABLE = [
    ("flatten", op_flatten, 14),
    ("flatten_with_path", op_flatten_with_path, 7),
    ("flatten_up_to", op_flatten_up_to, 7),
    ("unflatten", op_unflatten, 10),
    ("walk", op_walk, 4),
    ("from_iterable_tree", op_from_iterable_tree, 3),
    ("children", op_children, 5),
    ("from_node_data_and_children", op_from_node_data_and_children, 5),
    ("compose", op_compose, 3),
    ("treedef_tuple", op_treedef_tuple, 3),
    ("eq_hash", op_eq_hash, 6),
    ("repr", op_repr, 4),
    ("pickle", op_pickle, 4),
    ("setstate", op_setstate, 2),
    ("setstate_mutated", op_setstate_mutated, 3),
    ("mutate_getstate", op_mutate_getstate_in_place, 1),
    ("proto", op_proto, 2),
    ("deserialize_proto", op_deserialize_proto, 2),
    ("one_level", op_one_level, 3),
    ("register", op_register, 3),
    ("gc", op_gc, 1),
    ("uninitialized", op_uninitialized, 1),
    ("share_check", op_share_check, 3),
]
NESTED_NAMES = {
    "flatten",
    "flatten_with_path",
    "flatten_up_to",
    "unflatten",
    "repr",
    "eq_hash",
    "pickle",
    "register",
    "children",
    "walk",
}
OPS = []
CUM_WEIGHTS_ALL = []
NESTED_OPS = []


def build_tables(skip_known):
  OPS.clear()
  CUM_WEIGHTS_ALL.clear()
  NESTED_OPS.clear()
  total = 0
  for name, fn, weight in OP_TABLE:
    if skip_known and name == "mutate_getstate":
      continue
    OPS.append((name, fn))
    total += weight
    CUM_WEIGHTS_ALL.append(total)
    if name in NESTED_NAMES:
      NESTED_OPS.append((name, fn))


build_tables(False)
