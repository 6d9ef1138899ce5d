"""build/tree_sites.py: every tree site of the installed jax's jax/_src is in
one of its lists, docs/jax-integration/tree-sites.md shows the lists as they
are, and
the check fails where it must (on small made-up packages).
"""

import importlib.util
import pathlib
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "build" / "tree_sites.py"


def _module():
  spec = importlib.util.spec_from_file_location("tree_sites", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


tree_sites = _module()


# The made-up tree_util's identity registry, defined at module level.
REGISTRY = {("tree_util", "<module>", "*"): ("sharing", "the registry")}


def _declarations(sites=None):
  return tree_sites.Declarations({**REGISTRY, **(sites or {})}, {})


@pytest.fixture(scope="module")
def installed():
  declared = tree_sites.declared_lists()
  return tree_sites.find_sites(tree_sites.installed_jax(), declared), declared


def test_every_site_of_the_installed_jax_is_listed(installed):
  sites, declared = installed
  assert tree_sites.check(sites, declared) == []
  layouts = {tree_sites.layout_of(s, declared) for s in sites}
  assert {"stock", "treedef", "follows", "sharing"} <= layouts


def test_the_doc_section_is_current(installed):
  sites, declared = installed
  text = tree_sites.DOC.read_text()
  assert (
      tree_sites.replace_section(text, tree_sites.render(sites, declared))
      == text
  ), "run python build/tree_sites.py --write-doc"


# A made-up jax: a tree_util with a stock and an identity registry, and a
# module that uses them.
TREE_UTIL = """
from jax._src.lib import pytree

stock_layout_registry = pytree.PyTreeRegistry(keeps_relative_identities=False)
default_registry = pytree.PyTreeRegistry()

def tree_flatten(tree, is_leaf=None):
  return stock_layout_registry.flatten(tree, is_leaf)

def tree_unflatten(treedef, leaves):
  return treedef.unflatten(leaves)

def in_layout_of(treedef, registry):
  return registry
"""

USER = """
from jax._src import tree_util
from jax._src.tree_util import tree_flatten, tree_unflatten

def plain(x):
  leaves, treedef = tree_flatten(x)
  return tree_unflatten(treedef, leaves)

def compared(in_tree, out_tree):
  return in_tree == out_tree

def entry(x):
  return tree_util.default_registry.flatten(x)

class Rule:
  def held(self, registry, x):
    return registry.flatten(x)

def results(in_tree, ans):
  return tree_util.in_layout_of(in_tree, tree_util.stock_layout_registry).flatten(
      ans)

def array(x):
  return x.flatten()

def passed(treedefs, leaves):
  return list(map(tree_unflatten, treedefs, leaves))
"""


def _package(tmp_path, tree_util=TREE_UTIL, user=USER):
  src = tmp_path / "jax" / "_src"
  src.mkdir(parents=True)
  (tmp_path / "jax" / "__init__.py").write_text("")
  (src / "__init__.py").write_text("")
  (src / "tree_util.py").write_text(textwrap.dedent(tree_util))
  (src / "user.py").write_text(textwrap.dedent(user))
  return tmp_path / "jax"


def _by_function(sites, module="user"):
  return {s.function: s for s in sites if s.module == module}


def test_sites_are_found_with_their_layouts(tmp_path):
  sites = tree_sites.find_sites(_package(tmp_path), _declarations())
  kinds = sorted(
      (s.function, s.kind, s.layout) for s in sites if s.module == "user"
  )
  assert kinds == [
      ("Rule.held", "registry.flatten", "param:registry"),
      ("compared", "treedef ==", "treedef"),
      ("entry", "default_registry.flatten", "sharing"),
      ("passed", "tree_util.tree_unflatten (as a value)", "treedef"),
      ("plain", "tree_util.tree_flatten", "stock"),
      ("plain", "tree_util.tree_unflatten", "treedef"),
      ("results", "in_layout_of(...).flatten", "follows"),
  ]


def test_an_undeclared_site_fails_naming_module_function_and_line(tmp_path):
  sites = tree_sites.find_sites(_package(tmp_path), _declarations())
  errors = tree_sites.check(sites, _declarations())
  assert len(errors) == 3, errors
  entry, held, results = sorted(errors, key=lambda e: int(e.split(":")[1]))
  assert entry.startswith("jax/_src/user.py:13: entry: ")
  assert "keeps relative identities" in entry
  assert held.startswith("jax/_src/user.py:17: Rule.held: ")
  assert "cannot name" in held
  assert results.startswith("jax/_src/user.py:20: results: ")
  assert "in_layout_of" in results


def test_declared_sites_pass_and_take_the_declared_layout(tmp_path):
  declared = _declarations(
      {
          ("user", "entry", "default_registry.flatten"): (
              "sharing",
              "an entry point",
          ),
          ("user", "*", "registry.flatten"): ("follows", "the caller's"),
          ("user", "results", "*"): ("follows", "results follow arguments"),
      }
  )
  sites = tree_sites.find_sites(_package(tmp_path), declared)
  assert tree_sites.check(sites, declared) == []
  held = _by_function(sites)["Rule.held"]
  assert tree_sites.layout_of(held, declared) == "follows"


def test_a_declaration_that_matches_nothing_fails(tmp_path):
  declared = _declarations({("user", "gone", "*"): ("sharing", "was here")})
  sites = tree_sites.find_sites(_package(tmp_path), declared)
  errors = tree_sites.check(sites, declared)
  assert any(
      "('user', 'gone', '*')" in e and "matches no site" in e for e in errors
  ), errors


def test_a_tree_function_that_keeps_identities_makes_its_callers_declare(
    tmp_path,
):
  # tree_flatten now keeps relative identities: each call of it must be
  # declared, though the call itself names no identity registry.
  keeping = TREE_UTIL.replace(
      "return stock_layout_registry.flatten",
      "return default_registry.flatten",
  )
  declared = _declarations(
      {("tree_util", "tree_flatten", "*"): ("sharing", "made up")}
  )
  sites = tree_sites.find_sites(_package(tmp_path, keeping), declared)
  errors = tree_sites.check(sites, declared)
  assert len(errors) == 4, errors
  assert any(
      e.startswith(
          "jax/_src/user.py:6: plain: tree_util.tree_flatten "
          "keeps relative identities"
      )
      for e in errors
  )


def test_the_section_is_replaced_between_its_markers():
  text = f"before\n{tree_sites.BEGIN}\nold\n{tree_sites.END}\nafter\n"
  section = f"{tree_sites.BEGIN}\nnew\n{tree_sites.END}\n"
  assert tree_sites.replace_section(text, section) == (
      f"before\n{tree_sites.BEGIN}\nnew\n{tree_sites.END}\nafter\n"
  )


def test_a_registry_that_keeps_identities_is_declared_with_its_layout(tmp_path):
  own = USER + textwrap.dedent("""
      from jax._src.lib import pytree
      own_registry = pytree.PyTreeRegistry()

      def own(x):
        return own_registry.flatten(x)
      """)
  jax_dir = _package(tmp_path, user=own)
  undeclared = _declarations(
      {
          ("user", fn, "*"): ("follows", "made up")
          for fn in ("entry", "Rule.held", "results")
      }
  )
  errors = tree_sites.check(
      tree_sites.find_sites(jax_dir, undeclared), undeclared
  )
  assert [e.split(": ")[1:3] for e in errors] == [
      [
          "<module>",
          "defines own_registry keeps relative identities; declare "
          "('user', '<module>', 'defines own_registry') in "
          "build/tree_sites_declared.py with its reason",
      ],
      [
          "own",
          "own_registry.flatten keeps relative identities; declare "
          "('user', 'own', 'own_registry.flatten') in "
          "build/tree_sites_declared.py with its reason",
      ],
  ], errors
  declared = tree_sites.Declarations(
      undeclared.sites, {"user.own_registry": ("stock", "holds no node")}
  )
  sites = tree_sites.find_sites(jax_dir, declared)
  assert tree_sites.check(sites, declared) == []
  assert _by_function(sites)["own"].layout == "stock"
  gone = tree_sites.Declarations(
      undeclared.sites, {"user.gone_registry": ("stock", "was here")}
  )
  assert any(
      "'defines gone_registry'" in e and "matches no site" in e
      for e in tree_sites.check(sites, gone)
  )
