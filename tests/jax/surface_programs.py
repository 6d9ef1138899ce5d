"""The programs of the public-surface test: sharing patterns, user functions,
the adapters' registry, and the cases generated from them.

A case is one API adapter called on arguments built by one sharing pattern,
with user functions of one sharing mode, under one differentiation mode. It
is run twice in one process, on opted-in nodes (`OPTED`) and on their twins
not opted in (`PLAIN`), and for a sample once more on stock JAX in a child
process (`surface_stock.py`); the results are compared place by place
(`surface_oracle.py`).
"""

import dataclasses
import random
import zlib

import jax
import jax.numpy as jnp
import numpy as np

import surface_nodes as nodes

# How one object is placed in the arguments. Each argument is a tree of
# nodes holding float32 arrays of shape (3,).
PATTERNS_ONE = ("distinct", "within", "model", "nested")
PATTERNS = ("distinct", "within", "across", "model", "nested")
# What the user's functions return: the sharing they were given, none, or
# more (one new node at every place of a node).
FN_MODES = ("keep", "less", "more")
# The whole program as is, or differentiated with respect to all arguments.
DIFF_MODES = ("none", "grad", "jvp", "vjp")
ONE_SHOT = ("none",)
NO_GRAD = ("none", "jvp")  # no reverse mode (while_loop, ...)
NO_JVP = ("none", "grad", "vjp")  # no forward mode (custom_vjp, ...)


def build_args(pattern, fam, n_args, rng):
  """`n_args` arguments sharing as `pattern` says:

  distinct: no node twice; within: one node at two places of the first
  argument; across: one node in the first and in the last argument; model:
  one model (a box of two nodes) passed as every argument (twice in the one
  argument if there is one); nested: one node twice in a box and once
  beside it."""
  new = lambda: fam.node(jnp.asarray(rng.normal(size=3), jnp.float32))
  args = [(new(), new()) for _ in range(n_args)]
  if pattern == "within":
    p = new()
    args[0] = (p, p)
  elif pattern == "across":
    p = new()
    args[0] = (p, new())
    args[-1] = (new(), p)
  elif pattern == "model":
    model = fam.box(new(), new())
    args = [model] * n_args if n_args > 1 else [(model, model)]
  elif pattern == "nested":
    p = new()
    args[0] = (fam.box(p, p), p)
  elif pattern != "distinct":
    raise ValueError(pattern)
  return tuple(args)


def smooth(x):
  return 0.5 * jnp.sin(x) + 0.75 * x


def linear(x):
  return 1.5 * x


class UserFn:
  """The user's function of a case: `tree(t)` applies `g` to each leaf of
  `t` and returns `t`'s nodes with the sharing of `mode`; `zip(g, *trees)`
  does so with `g` of the leaves at each place of trees of one shape (for
  "keep", a node is one object where every tree ties it)."""

  def __init__(self, mode, fam):
    self.mode = mode
    self.fam = fam

  def tree(self, t, g=smooth):
    return self.zip(g, t)

  def zip(self, g, *trees):
    if self.mode == "keep":
      return nodes.map_nodes(g, *trees)
    if self.mode == "less":
      return nodes.map_nodes(g, *trees, keep_ties=False)
    if self.mode == "more":
      return nodes.map_nodes(g, *trees, node_fn=self._one_node_per_kind())
    raise ValueError(self.mode)

  def _one_node_per_kind(self):
    """A node_fn that puts one object at every place of a parameter node of
    one shape and dtype: the first one rebuilt."""
    first = {}

    def one(new):
      if not isinstance(new, self.fam.node):
        return new
      value = new.value
      kind = (getattr(value, "shape", None), getattr(value, "dtype", None))
      return first.setdefault(kind, new)

    return one

  def numpy(self, t):
    """`tree` for a host callback: numpy leaves."""
    return self.tree(
        t,
        g=lambda x: np.asarray(
            0.5 * np.sin(x) + 0.75 * np.asarray(x), np.float32
        ),
    )


@dataclasses.dataclass(frozen=True)
class Adapter:
  """One API as the cases call it: `call(args, fn, fam)` returns the
  result (a tree, or a tuple of oracle parts); `n_args` trees are built by
  the pattern; `fn_modes` are the sharing modes of its user functions (one
  "-" if it takes none); `diffs` the differentiation modes it supports;
  `cost` how many cases it gets (`QUOTAS`)."""

  api: str
  call: object
  n_args: int
  fn_modes: tuple
  diffs: tuple
  patterns: tuple
  cost: str


# Cases per adapter: every combination for the cheap ones (the tree
# functions run no XLA computation of their own), else a covering of the
# patterns, modes and differentiations drawn from a fixed seed, so that the
# whole table runs in a few minutes.
QUOTAS = {"cheap": None, "normal": 7, "heavy": 3}

ADAPTERS = {}


def adapter(
    api,
    n_args=2,
    fns=True,
    diffs=DIFF_MODES,
    patterns=None,
    fn_modes=FN_MODES,
    cost="normal",
):
  """Registers `call` as the adapter of `api` (a public name, with a
  bracketed variant where one API has several)."""

  def register(call):
    if api in ADAPTERS:
      raise ValueError(f"two adapters for {api}")
    ADAPTERS[api] = Adapter(
        api,
        call,
        n_args,
        tuple(fn_modes) if fns else ("-",),
        tuple(diffs),
        tuple(patterns or (PATTERNS if n_args > 1 else PATTERNS_ONE)),
        cost,
    )
    return call

  return register


@dataclasses.dataclass(frozen=True)
class Case:
  api: str
  pattern: str
  fn_mode: str
  diff: str

  @property
  def id(self):
    return f"{self.api}-{self.pattern}-{self.fn_mode}-{self.diff}"

  @property
  def seed(self):
    return zlib.crc32(self.id.encode())


def cases():
  """The table: for each adapter, its combinations of pattern, user
  function mode and differentiation, all of them or as many as its quota
  allows, chosen to cover each pattern, mode, differentiation and pairs of
  them first."""
  out = []
  for name in sorted(ADAPTERS):
    a = ADAPTERS[name]
    every = [
        Case(name, p, m, d)
        for p in a.patterns
        for m in a.fn_modes
        for d in a.diffs
    ]
    quota = QUOTAS[a.cost]
    if quota is None or quota >= len(every):
      out += every
      continue
    random.Random(f"31:{name}").shuffle(every)
    out += _covering(every, quota)
  return out


def _covering(candidates, quota):
  """`quota` of the candidates, each chosen to add the most aspects not yet
  covered (ties: the earliest)."""

  def aspects(c):
    return {
        ("p", c.pattern),
        ("m", c.fn_mode),
        ("d", c.diff),
        ("pm", c.pattern, c.fn_mode),
        ("pd", c.pattern, c.diff),
    }

  chosen, covered = [], set()
  remaining = list(candidates)
  while remaining and len(chosen) < quota:
    best = max(remaining, key=lambda c: len(aspects(c) - covered))
    remaining.remove(best)
    chosen.append(best)
    covered |= aspects(best)
  return chosen


def tangents_like(args):
  """Tangents sharing as the arguments do."""
  return nodes.map_nodes(lambda x: 0.5 * jnp.ones_like(x), args)


def run_case(case, fam):
  """The case's result on the node family `fam`."""
  return run_case_with_args(case, fam)[1]


def run_case_with_args(case, fam):
  """The case's arguments, and its result on the node family `fam`."""
  args, program = case_program(case, fam)
  return args, _run(case, program, args)


def case_program(case, fam):
  """The case's arguments on the node family `fam`, and its program: the
  public function called on them, before any derivative is taken."""
  a = ADAPTERS[case.api]
  args = build_args(
      case.pattern, fam, a.n_args, np.random.default_rng(case.seed)
  )
  fn = UserFn(case.fn_mode, fam) if case.fn_mode != "-" else None
  return args, lambda *xs: a.call(xs, fn, fam)


def _run(case, program, args):
  if case.diff == "none":
    return program(*args)
  scalar = lambda *xs: nodes.loss(program(*xs))
  argnums = tuple(range(len(args)))
  if case.diff == "grad":
    return summed(jax.grad(scalar, argnums=argnums)(*args), args)
  if case.diff == "jvp":
    return jax.jvp(scalar, args, tangents_like(args))
  if case.diff == "vjp":
    out, f_vjp = jax.vjp(scalar, *args)
    return out, summed(f_vjp(jnp.float32(1.0)), args)
  raise ValueError(case.diff)


@dataclasses.dataclass
class Part:
  """A piece of a result and how the oracle reads it.

  same: each place equals the reference's; summed: the derivative with
  respect to `inputs[0]` (of its shape, or for `depth` 2 of its shape at
  each place, a Hessian), each place the sum of the reference's over the
  places that hold one node in the input (a tied node is one variable: its
  gradient is the sum of its copies'); first: each place the
  reference's at the first place of its node where every tree of `inputs`
  ties it (a shared node is mapped once, under its first path); unique: a
  list with one entry per place of `inputs[0]` that is not a later copy of a
  tied node (the public tree functions' leaves)."""

  kind: str
  value: object
  inputs: tuple = ()
  is_leaf: object = None
  depth: int = 1


def summed(x, wrt, depth=1):
  return Part("summed", x, (wrt,), depth=depth)


def first(x, *inputs, is_leaf=None):
  return Part("first", x, inputs, is_leaf)


def unique(values, tree, is_leaf=None):
  return Part("unique", list(values), (tree,), is_leaf)


def parts(result):
  """A result as a list of parts; a bare tree is one `same` part."""
  if isinstance(result, Part):
    return [result]
  if isinstance(result, tuple) and any(isinstance(r, Part) for r in result):
    return [p for r in result for p in parts(r)]
  return [Part("same", result)]


def body(fn, xs):
  """The user's function of several arguments: each leaf through `fn`,
  mixed with a scalar of all of them (counted per place, as stock does)."""
  total = sum(jnp.sum(x) for x in nodes.places(xs) if nodes.is_float_leaf(x))
  return fn.tree(xs, g=lambda x: smooth(x) + 0.1 * total)


def scalar_of(fn):
  """A loss of the user's function: what the grad family differentiates."""
  return lambda *xs: nodes.loss(body(fn, xs))


def cotangents(out, fam, tie_all=False):
  """Cotangents for `out`, each place its own weight, read per position:
  a new node at every place, or with `tie_all` one object at every place of
  a parameter node of `fam` (sharing more than `out` does)."""
  weights = iter(range(10_000))
  weigh = lambda x: (1.0 + 0.5 * next(weights)) * jnp.ones_like(x)
  return UserFn("more" if tie_all else "less", fam).tree(out, g=weigh)
