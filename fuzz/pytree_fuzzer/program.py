"""A program: one fresh registry with its own types, the trees and treedefs
made from them, and the operations run on them, each classified."""

from jaxlib_patch import pytree as pt

from pytree_fuzzer import chaos
from pytree_fuzzer.adversaries import (
    NS,
    NS_NAME,
    NT1,
    NT2,
    Aux,
    Boom,
    Dying,
    FakeNT,
    IntFieldNT,
    Key,
    Leaf,
    LongNT,
    ShortNT,
    TrickyAux,
    failing_iter,
    in_callback_mischief,
    make_custom_type,
    make_dataclass_type,
    watch,
)
from pytree_fuzzer.operations import CUM_WEIGHTS_ALL, NESTED_OPS, OPS
from pytree_fuzzer.outcomes import ALLOWED, OracleFailure

_serial = 0


class Program:
  """One registry with its types, trees and treedefs."""

  def __init__(self, runner, index, rng):
    global _serial
    _serial += 1
    self.runner = runner
    self.index = index
    self.serial = _serial
    self.names = []
    flags = [rng.random() < 0.95 for _ in range(5)]
    self.reg = pt.PyTreeRegistry(*flags)
    self.reg_name = f"R{self.serial}"
    self.reg.__module__ = NS_NAME
    self.reg.__name__ = self.reg_name
    setattr(NS, self.reg_name, self.reg)
    self.names.append(self.reg_name)
    self.specs = []  # Registered type specs.
    self.objects = []  # Trees.
    self.lists = []  # Lists inside trees (mutation targets).
    self.dicts = []  # Dicts inside trees.
    self.nodes = []  # Custom/dataclass instances (sharing, mutation).
    self.treedefs = []  # (treedef, leaves or None)
    self.type_count = 0
    for _ in range(rng.randrange(1, 5)):
      self.register_random_type()

  def close(self):
    for name in self.names:
      try:
        delattr(NS, name)
      except AttributeError:
        pass

  # --- Types.

  def register_random_type(self, inside=False):
    rng = chaos.rng
    self.type_count += 1
    name = f"T{self.serial}_{self.type_count}"
    flag = rng.random() < 0.7
    if rng.random() < 0.65:
      spec = make_custom_type(name, flag, rng.random() < 0.6)
    else:
      spec = make_dataclass_type(name, flag)
    self.names.append(name)
    spec.register(self.reg)
    self.specs.append(spec)
    if inside and rng.random() < 0.2:
      spec.register(self.reg)  # A duplicate: ValueError, from a callback.
    return spec

  # --- Trees.

  def gen_leaf(self):
    r = chaos.rng.randrange(12)
    if r < 4:
      return Leaf(chaos.rng.randrange(100))
    if r < 6:
      return chaos.rng.randrange(-3, 100)
    if r == 6:
      return "s"
    if r == 7:
      return 1.5
    if r == 8:
      return watch(Dying(r)) if chaos.rng.random() < 0.5 else Dying(r)
    if r == 9 and self.objects:
      return chaos.rng.choice(self.objects)  # A tree reused whole.
    return Leaf(-r)

  def gen_aux(self):
    r = chaos.rng.randrange(8)
    if r < 3:
      return None
    if r == 3:
      return chaos.rng.randrange(3)
    if r == 4:
      return (
          "meta",
          chaos.rng.randrange(3),
          "\ud800" if chaos.rng.random() < 0.1 else "",
      )
    if r == 5:
      return Aux(chaos.rng.randrange(3))
    return TrickyAux(chaos.rng.randrange(3))

  def gen_key(self, kind):
    if kind == 0:
      return f"k{chaos.rng.randrange(6)}"
    if kind == 1:
      return chaos.rng.randrange(6)
    if kind == 2:
      return Key(chaos.rng.randrange(6))
    return chaos.rng.choice(
        [
            f"k{chaos.rng.randrange(3)}",
            chaos.rng.randrange(3),
            float("nan"),
            None,
            (1, 2),  # Mixed: no total order.
            "\ud800",
            "k\udfff",
        ]
    )  # Lone surrogates.

  def gen_node(self, spec, depth):
    if spec.kind == "custom":
      obj = spec.cls()
      obj.kids = tuple(
          self.gen_tree(depth - 1) for _ in range(chaos.rng.randrange(4))
      )
      obj.aux = self.gen_aux()
    else:
      obj = spec.cls.__new__(spec.cls)
      for f in spec.data_fields:
        setattr(obj, f, self.gen_tree(depth - 1))
      for f in spec.meta_fields:
        setattr(obj, f, self.gen_aux())
      if chaos.rng.random() < 0.02 and spec.data_fields:
        # A missing field: AttributeError from getattr, as a callback error.
        obj.__dict__.pop(spec.data_fields[0], None)
        obj.__dict__.pop("_" + spec.data_fields[0], None)
    if chaos.rng.random() < 0.1:
      watch(obj)
    self.nodes.append(obj)
    if chaos.rng.random() < 0.03:
      # A cycle through this node.
      if spec.kind == "custom":
        obj.kids = obj.kids + ([obj],)
      elif spec.data_fields:
        setattr(obj, spec.data_fields[0], {"c": obj})
    return obj

  def gen_tree(self, depth=3):
    rng = chaos.rng
    r = rng.randrange(20)
    if depth <= 0 or r < 5:
      return self.gen_leaf()
    if r < 9 and self.specs:
      if self.nodes and rng.random() < 0.35:
        return rng.choice(self.nodes)  # Sharing: a node met before.
      return self.gen_node(rng.choice(self.specs), depth)
    n = rng.randrange(4)
    if r < 11:
      lst = [self.gen_tree(depth - 1) for _ in range(n)]
      self.lists.append(lst)
      if rng.random() < 0.02:
        lst.append(lst)  # A cycle of plain containers.
      return lst
    if r < 13:
      return tuple(self.gen_tree(depth - 1) for _ in range(n))
    if r < 15:
      kind = rng.choice((0, 0, 0, 1, 2, 3))
      d = {self.gen_key(kind): self.gen_tree(depth - 1) for _ in range(n)}
      self.dicts.append(d)
      return d
    if r == 15:
      return NT2(self.gen_tree(depth - 1), self.gen_tree(depth - 1))
    if r == 16:
      if rng.random() < 0.7:
        return NT1(self.gen_tree(depth - 1))
      if chaos.skip_known or rng.random() < 0.8:
        return FakeNT((self.gen_tree(depth - 1), 1))
      # `_fields` that do not match the items (finding F3).
      return rng.choice((ShortNT, LongNT, IntFieldNT))(
          (self.gen_tree(depth - 1), 2)
      )
    if r == 17:
      return None
    if r == 18 and self.nodes:
      # The same node several times in one container.
      node = rng.choice(self.nodes)
      return [node, self.gen_tree(depth - 1), node]
    return [self.gen_tree(depth - 1) for _ in range(n)]

  def gen_plain(self, depth):
    """A tree of lists, tuples, dicts with str keys, None and leaves: the
    kinds the proto format holds."""
    r = chaos.rng.randrange(6)
    if depth <= 0 or r < 2:
      return chaos.rng.choice([1, None, Leaf()])
    n = chaos.rng.randrange(3)
    if r == 2:
      return [self.gen_plain(depth - 1) for _ in range(n)]
    if r == 3:
      return tuple(self.gen_plain(depth - 1) for _ in range(n))
    if r == 4:
      return {f"k{i}": self.gen_plain(depth - 1) for i in range(n)}
    return None

  def some_tree(self):
    if self.objects and chaos.rng.random() < 0.6:
      return chaos.rng.choice(self.objects)
    tree = self.gen_tree(chaos.rng.randrange(1, 5))
    self.objects.append(tree)
    if len(self.objects) > 12:
      self.objects.pop(0)
    return tree

  def some_treedef(self):
    if self.treedefs and chaos.rng.random() < 0.7:
      return chaos.rng.choice(self.treedefs)
    try:
      tree = self.some_tree()
      leaves, td = self.reg.flatten(tree)
    except ALLOWED:
      leaves, td = [1], self.reg.flatten(1)[1]
    return self.keep(td, leaves)

  def some_flattening(self, with_path):
    """One of the trees flattened (with the paths if `with_path`) with a
    predicate: (tree, predicate, leaves or pairs, treedef), as many leaves
    as the treedef counts."""
    tree = self.some_tree()
    pred = self.predicate(with_path)
    flatten = self.reg.flatten_with_path if with_path else self.reg.flatten
    items, td = flatten(tree, pred)
    if len(items) != td.num_leaves:
      name = "pairs" if with_path else "leaves"
      raise OracleFailure(f"len({name}) != num_leaves")
    return tree, pred, items, td

  def keep(self, td, leaves):
    entry = (td, leaves)
    self.treedefs.append(entry)
    if len(self.treedefs) > 12:
      self.treedefs.pop(0)
    return entry

  def predicate(self, with_path):
    r = chaos.rng.randrange(6)
    if r == 0:
      return None
    if r <= 2:
      leafy = tuple({chaos.rng.choice(self.specs).cls} if self.specs else ())
      leafy += (Leaf,)
      if with_path:
        return lambda path, x: isinstance(x, leafy)
      return lambda x: isinstance(x, leafy)

    def bad(*args):
      x = args[-1]
      if chaos.now():
        k = chaos.rng.randrange(4)
        if k == 0:
          raise Boom("is_leaf")
        if k == 1:
          return chaos.rng.choice([1, "yes", [], 0])  # Not a bool.
        in_callback_mischief(x)
      return x is None

    return bad

  def leaves_for(self, td, leaves):
    """Leaves to unflatten with: usually the right number."""
    n = td.num_leaves
    if leaves is None or len(leaves) != n:
      leaves = [Leaf(i) for i in range(n)]
    r = chaos.rng.randrange(12)
    if r < 5:
      return list(leaves)
    if r == 5:
      return tuple(leaves)
    if r == 6:
      return iter(list(leaves))
    if r == 7:
      return leaves[:-1] if n else [1]
    if r == 8:
      return list(leaves) + [Leaf()]
    if r == 9:
      return failing_iter(list(leaves))
    if r == 10:
      return [self.gen_tree(1) for _ in range(n)]  # Leaves that are trees.
    return (x for x in leaves)

  # --- Operations.

  def pick_op(self, nested=False):
    if nested:
      return chaos.rng.choice(NESTED_OPS)
    return chaos.rng.choices(OPS, cum_weights=CUM_WEIGHTS_ALL, k=1)[0]

  def execute(self, name, op):
    """Runs one operation and classifies its outcome."""
    runner = self.runner
    runner.executions += 1
    if chaos.depth:
      runner.nested += 1
    chaos.depth += 1
    try:
      op(self)
      outcome = "ok"
    except OracleFailure as e:
      outcome = "FINDING:wrong"
      runner.finding(self, name, "wrong", e)
    except ALLOWED as e:
      outcome = type(e).__name__
    except AttributeError as e:
      # Only from a dataclass field the fuzzer deleted, or a property.
      outcome = "AttributeError"
      if "has no attribute 'd" not in str(e) and "'_d" not in str(e):
        outcome = "FINDING:" + type(e).__name__
        runner.finding(self, name, type(e).__name__, e)
    except BaseException as e:  # noqa: BLE001 -- every other type is a finding.
      if isinstance(e, KeyboardInterrupt):
        raise
      outcome = "FINDING:" + type(e).__name__
      runner.finding(self, name, type(e).__name__, e)
    finally:
      chaos.depth -= 1
    runner.count(name, outcome)
    if runner.verbose:
      print(f"  {'  ' * chaos.depth}{name}: {outcome}", flush=True)
