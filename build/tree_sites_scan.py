"""The scan behind ``tree_sites.py``: the tree sites of one jax package's
``_src``, found with ``ast``, each with the layout it flattens, unflattens or
compares in. See ``tree_sites.py`` for what a site is and how it is
checked."""

import ast
import dataclasses
import re
from pathlib import Path

# The modules whose functions are tree functions for their callers.
LIBRARY = ("jax._src.tree_util", "jax._src.tree_identities", "jax._src.tree")
# Parsed only to follow their re-exports to the library.
PUBLIC = ("jax.tree", "jax.tree_util")
PYTREE = "jax._src.lib.pytree"
STOCK_PYTREE = "jax._src.lib.stock_pytree"
IN_LAYOUT_OF = "jax._src.tree_util.in_layout_of"

REGISTRY_METHODS = {
    "flatten",
    "flatten_with_path",
    "flatten_one_level",
    "flatten_one_level_with_keys",
}
TREEDEF_METHODS = {
    "unflatten": "unflatten",
    "from_iterable_tree": "unflatten",
    "flatten_up_to": "flatten",
    "broadcast_flattened_prefix": "flatten",
}
# A name a treedef goes by: in_tree, out_tree_, treedef, ft.tree,
# tree_ps_ts; not a node's parts (prefix_tree_meta, full_tree_keys).
TREEDEF_NAME = re.compile(
    r"((^|_)trees?(\d+|_\w*)?_?$|treedef)(?<!meta)"
    r"(?<!keys)(?<!key)(?<!paths)(?<!children)"
)

# Never a treedef: what a comparison with one is not about.
LITERALS = (ast.Constant, ast.Dict, ast.List, ast.Tuple, ast.Set)

STOCK, SHARING, FOLLOWS, TREEDEF, UNKNOWN = (
    "stock",
    "sharing",
    "follows",
    "treedef",
    "unknown",
)
# What a function holding sites of several layouts is, for its callers.
PRECEDENCE = (SHARING, "param", FOLLOWS, UNKNOWN, STOCK, TREEDEF)


@dataclasses.dataclass(frozen=True)
class Site:
  module: str  # relative to jax._src: "lax.control_flow.loops"
  function: str  # the enclosing qualified name, or "<module>"
  kind: str  # the call: "identity_tracing_registry.flatten", "treedef =="
  op: str  # flatten, unflatten, compare or reference
  layout: str  # STOCK, SHARING, FOLLOWS, TREEDEF, UNKNOWN or "param:NAME"
  line: int
  must_declare: bool
  path: str = dataclasses.field(default="", compare=False)

  @property
  def key(self):
    return (self.module, self.function, self.kind)


@dataclasses.dataclass(frozen=True)
class Summary:
  """What a call of a library function is to its caller."""

  op: str
  layout: str  # as Site.layout; "param:NAME" takes the caller's argument
  params: tuple = ()  # the parameter names, for a positional argument
  default: str = STOCK  # the layout of the parameter's default


class Source:
  """The parsed modules of a jax package and the names each one binds."""

  def __init__(self, jax_dir: Path, declared_registries: dict):
    self.trees, self.names, self.paths = {}, {}, {}
    # jax.experimental too: its public functions take the user's trees.
    for folder in ("_src", "experimental"):
      for path in sorted((jax_dir / folder).rglob("*.py")):
        self._add(path, jax_dir.parent)
    for public in PUBLIC:
      path = jax_dir.parent / (public.replace(".", "/") + ".py")
      if path.exists():
        self._add(path, jax_dir.parent)
    self.definitions = {
        f"{module}.{node.name}"
        for module, tree in self.trees.items()
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }
    self.flags = self._registries()
    self.registries = dict(self.flags)
    for name, (layout, _) in declared_registries.items():
      if f"jax._src.{name}" in self.registries:
        self.registries[f"jax._src.{name}"] = layout

  def _add(self, path: Path, root: Path):
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
      parts.pop()
    module = ".".join(parts)
    tree = ast.parse(path.read_text(), str(path))
    self.trees[module] = tree
    self.paths[module] = path.relative_to(root).as_posix()
    self.names[module] = _bound_names(tree, module, is_package)

  def canonical(self, dotted: str) -> str:
    """``dotted`` with every re-export and module-level alias followed."""
    for _ in range(10):
      parts = dotted.split(".")
      for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in self.names:
          target = self.names[module].get(parts[cut])
          if target and target != f"{module}.{parts[cut]}":
            dotted = ".".join([target] + parts[cut + 1 :])
            break
          return dotted
      else:
        return dotted
    return dotted

  def _registries(self) -> dict:
    """Every module-level registry, by its canonical name, with the layout
    its flag (or its being stock's) gives it."""
    found = {}
    for module, tree in self.trees.items():
      for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
          continue
        made_by = self.resolve(module, node.value.func) or ""
        flag = {k.arg: k.value for k in node.value.keywords}.get(
            "keeps_relative_identities"
        )
        name = f"{module}.{node.targets[0].id}"
        # `origin.twin(keeps_relative_identities=...)`: a registry of its
        # own layout over the registrations of one found above.
        func = node.value.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "twin"
            and isinstance(func.value, ast.Name)
            and f"{module}.{func.value.id}" in found
        ):
          keeps = isinstance(flag, ast.Constant) and flag.value is True
          found[name] = SHARING if keeps else STOCK
        elif made_by == self.canonical(f"{STOCK_PYTREE}.PyTreeRegistry"):
          found[name] = STOCK
        elif made_by in (
            self.canonical(f"{PYTREE}.PyTreeRegistry"),
            self.canonical(f"{PYTREE}.default_registry"),
        ):
          keeps = not (isinstance(flag, ast.Constant) and flag.value is False)
          found[name] = SHARING if keeps else STOCK
    return found

  def resolve(self, module: str, expr, params=frozenset()) -> str | None:
    """The canonical dotted name ``expr`` refers to, if a module binds it."""
    if isinstance(expr, ast.Name):
      if expr.id in params:
        return None
      bound = self.names[module].get(expr.id)
      return self.canonical(bound) if bound else None
    if isinstance(expr, ast.Attribute):
      base = self.resolve(module, expr.value, params)
      return self.canonical(f"{base}.{expr.attr}") if base else None
    return None


def _bound_names(tree: ast.Module, module: str, is_package: bool) -> dict:
  """Local name -> dotted name: imports anywhere in the module, then its own
  top-level definitions and aliases (``generate_key_paths = tree_leaves``)."""
  names = {}
  package = module if is_package else module.rpartition(".")[0]
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        if alias.asname:
          names[alias.asname] = alias.name
        else:
          top = alias.name.split(".")[0]
          names[top] = top
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      for alias in node.names:
        names[alias.asname or alias.name] = f"{base}.{alias.name}"
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names[node.name] = f"{module}.{node.name}"
    elif (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
    ):
      target = node.targets[0].id
      value = node.value
      if isinstance(value, ast.Name) and value.id in names:
        names[target] = names[value.id]
      else:
        names[target] = f"{module}.{target}"
  return names


def _short(dotted: str) -> str:
  return dotted.removeprefix("jax._src.")


class Scan(ast.NodeVisitor):
  """The sites of one module, given the summaries of the library's
  functions."""

  def __init__(self, source: Source, module: str, summaries: dict):
    self.source, self.module, self.summaries = source, module, summaries
    self.sites: list[Site] = []
    self.scopes: list[str] = []
    self.params: list[set] = []
    self.consumed: set[int] = set()

  # --- where we are ---

  def _function(self) -> str:
    return ".".join(self.scopes) or "<module>"

  def _in_params(self) -> frozenset:
    return frozenset().union(*self.params) if self.params else frozenset()

  def _add(self, node, kind, op, layout, must_declare):
    self.sites.append(
        Site(
            _short(self.module),
            self._function(),
            kind,
            op,
            layout,
            node.lineno,
            must_declare,
            self.source.paths[self.module],
        )
    )

  def _resolve(self, expr) -> str | None:
    return self.source.resolve(self.module, expr, self._in_params())

  def visit_FunctionDef(self, node):
    for decorator in node.decorator_list:
      self.visit(decorator)
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    for default in args.defaults + [d for d in args.kw_defaults if d]:
      self.visit(default)
    self.scopes.append(node.name)
    self.params.append(
        {a.arg for a in every} | {a.arg for a in (args.vararg, args.kwarg) if a}
    )
    for statement in node.body:
      self.visit(statement)
    self.scopes.pop(), self.params.pop()

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_Assign(self, node):
    """A registry that keeps relative identities, defined at module level:
    declared, like its uses, where its flag does not tell its layout."""
    target = node.targets[0]
    name = f"{self.module}.{getattr(target, 'id', '')}"
    if not self.scopes and self.source.flags.get(name) == SHARING:
      self._add(node, f"defines {target.id}", "registry", SHARING, True)
    self.generic_visit(node)

  def visit_ClassDef(self, node):
    self.scopes.append(node.name)
    self.generic_visit(node)
    self.scopes.pop()

  # --- what a registry expression is ---

  def registry_layout(self, expr) -> tuple[str, str, bool]:
    """(layout, label, must_declare) of a registry given as ``expr``."""
    if isinstance(expr, ast.Call) and self._resolve(expr.func) == IN_LAYOUT_OF:
      self.consumed.add(id(expr))
      self.consumed.add(id(expr.func))
      return FOLLOWS, "in_layout_of(...)", True
    if isinstance(expr, ast.Name) and expr.id in self._in_params():
      return f"param:{expr.id}", expr.id, self.module not in LIBRARY
    name = self._resolve(expr)
    if name in self.source.registries:
      self.consumed.add(id(expr))
      layout = self.source.registries[name]
      return layout, name.rpartition(".")[2], layout == SHARING
    return UNKNOWN, ast.unparse(expr), True

  # --- the sites ---

  def visit_Call(self, node):
    func = node.func
    callee = self._resolve(func)
    if callee == IN_LAYOUT_OF:
      self.consumed.add(id(func))
      if id(node) not in self.consumed:  # Not a registry for a site here.
        self._add(node, "in_layout_of", "reference", FOLLOWS, True)
    elif callee in self.summaries:
      self.consumed.add(id(func))
      self._library_call(node, callee, self.summaries[callee])
    elif not isinstance(func, ast.Attribute) or self._no_tree_object(func):
      pass
    elif func.attr in REGISTRY_METHODS:
      self._registry_call(node, func)
    elif func.attr in TREEDEF_METHODS:
      self._add(
          node, f".{func.attr}", TREEDEF_METHODS[func.attr], TREEDEF, False
      )
    self.generic_visit(node)

  def _no_tree_object(self, func: ast.Attribute) -> bool:
    """Whether ``func``'s object is no registry or treedef: a module's or
    class's function (``util.flatten``), something not jax's (``np``)."""
    name = self._resolve(func.value)
    return name is not None and (
        name in self.source.trees
        or name in self.source.definitions
        or not name.startswith("jax.")
    )

  def _registry_call(self, node, func):
    # A registry's methods take the tree first; an array's .flatten() takes
    # none.
    if not node.args:
      return
    receiver = func.value
    layout, label, must_declare = self.registry_layout(receiver)
    if isinstance(receiver, ast.Call) and layout == UNKNOWN:
      label = ast.unparse(receiver.func) + "(...)"
    self._add(node, f"{label}.{func.attr}", "flatten", layout, must_declare)

  def _library_call(self, node, callee, summary):
    kind, layout = _short(callee), summary.layout
    must_declare = layout == SHARING
    if layout.startswith("param:"):
      param = layout.removeprefix("param:")
      given = {k.arg: k.value for k in node.keywords}.get(param)
      if given is None and param in summary.params:
        index = summary.params.index(param)
        if index < len(node.args) and not any(
            isinstance(a, ast.Starred) for a in node.args[: index + 1]
        ):
          given = node.args[index]
      if given is None:
        layout, must_declare = summary.default, summary.default == SHARING
      else:
        layout, label, must_declare = self.registry_layout(given)
        kind = f"{kind}[{label}]"
    self._add(node, kind, summary.op, layout, must_declare)

  def visit_Compare(self, node):
    operands = [node.left] + node.comparators
    for op, left, right in zip(node.ops, operands, operands[1:]):
      if (
          isinstance(op, (ast.Eq, ast.NotEq))
          and not any(isinstance(x, LITERALS) for x in (left, right))
          and any(self._looks_like_treedef(x) for x in (left, right))
      ):
        symbol = "==" if isinstance(op, ast.Eq) else "!="
        self._add(node, f"treedef {symbol}", "compare", TREEDEF, False)
    self.generic_visit(node)

  def _looks_like_treedef(self, expr) -> bool:
    if isinstance(expr, ast.Call):
      callee = self._resolve(expr.func) or ""
      if callee.endswith("tree_structure") or callee.endswith(".unshared"):
        return True
      expr = expr.func
    if isinstance(expr, ast.Attribute) and expr.attr == "unshared":
      return True
    name = (
        expr.id
        if isinstance(expr, ast.Name)
        else expr.attr
        if isinstance(expr, ast.Attribute)
        else ""
    )
    return bool(TREEDEF_NAME.search(name.lower()))

  def visit_Name(self, node):
    if not isinstance(node.ctx, ast.Store):  # A definition is no use.
      self._reference(node)

  def visit_Attribute(self, node):
    if isinstance(node.ctx, ast.Store) or not self._reference(node):
      self.generic_visit(node)

  def _reference(self, node) -> bool:
    """A use of a tree function, an identity registry or in_layout_of
    that is not a call already listed (a function passed as a value, a
    registry handed to other code)."""
    if id(node) in self.consumed:
      return True
    name = self._resolve(node)
    if name is None:
      return False
    if name in self.summaries:
      summary = self.summaries[name]
      layout = summary.layout
      if layout.startswith("param:"):
        layout = summary.default
      self._add(
          node,
          f"{_short(name)} (as a value)",
          summary.op,
          layout,
          layout == SHARING,
      )
      return True
    # tree_identities' tree functions are summaries above; its other names
    # (an exception, a helper) are no tree site.
    if self.source.registries.get(name) == SHARING or name == IN_LAYOUT_OF:
      layout = FOLLOWS if name == IN_LAYOUT_OF else SHARING
      self._add(node, f"{_short(name)} (as a value)", "reference", layout, True)
      return True
    return False


def library_summaries(source: Source, declared) -> dict:
  """The library's tree functions (those holding a site), by canonical name:
  found again until nothing changes, since they call one another."""
  summaries: dict = {}
  for _ in range(10):
    found = {}
    for module in LIBRARY:
      if module not in source.trees:
        continue
      scan = Scan(source, module, summaries)
      scan.visit(source.trees[module])
      by_function: dict = {}
      for site in scan.sites:
        top = site.function.split(".")
        # A method is FlatTree.flatten; a nested function is its parent's;
        # a site in a class's body is no function's.
        depth = 2 if _is_class(source.trees[module], top[0]) else 1
        if top[0] != "<module>" and len(top) >= depth:
          by_function.setdefault(".".join(top[:depth]), []).append(site)
      for function, sites in by_function.items():
        found[f"{module}.{function}"] = _summary_of(
            source, module, function, sites, declared
        )
    if found == summaries:
      return summaries
    summaries = found
  return summaries


def _is_class(tree: ast.Module, name: str) -> bool:
  return any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body)


def _summary_of(source, module, function, sites, declared) -> Summary:
  layouts = [declared.get(s.key, (s.layout,))[0] for s in sites]
  ops = {s.op for s in sites}
  op = next(
      (o for o in ("flatten", "unflatten", "compare") if o in ops), "reference"
  )
  layout = next(l for p in PRECEDENCE for l in layouts if l.startswith(p))
  definition = _definition(source.trees[module], function)
  params, default = (), STOCK
  if definition is not None:
    args = definition.args
    params = tuple(a.arg for a in args.posonlyargs + args.args)
    if params[:1] in (("self",), ("cls",)):  # Not passed by the caller.
      params = params[1:]
    if layout.startswith("param:"):
      default = _default_layout(
          source, module, definition, layout.removeprefix("param:")
      )
  return Summary(op, layout, params, default)


def _definition(tree, function):
  nodes = tree.body
  found = None
  for part in function.split("."):
    found = next(
        (
            n
            for n in nodes
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part
        ),
        None,
    )
    if found is None:
      return None
    nodes = found.body
  return found if isinstance(found, ast.FunctionDef) else None


def _default_layout(source, module, definition, param) -> str:
  args = definition.args
  positional = args.posonlyargs + args.args
  pairs = list(
      zip(positional[len(positional) - len(args.defaults) :], args.defaults)
  ) + list(zip(args.kwonlyargs, args.kw_defaults))
  for arg, default in pairs:
    if arg.arg == param and default is not None:
      name = source.resolve(module, default)
      return source.registries.get(name, UNKNOWN)
  return UNKNOWN
