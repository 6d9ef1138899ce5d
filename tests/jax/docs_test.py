"""The ```python blocks of docs/guide.md, docs/api.md and docs/proposal.md run.

Each of these documents is split into files (PARTS: the top-level file and
the parts it links, in reading order). A document's blocks run in that
order, in one fresh module namespace per document (a block may use what an
earlier block of the same document, in any of its files, defined). A block whose fence is preceded (on the last non-blank line) by
``<!-- not run -->`` is skipped; other fences (```sh, ```text, ...) are not
Python and are never run. The blocks carry their own ``assert``s, so a
document whose examples no longer match the code fails here.

Tracebacks point into the Markdown file at the block's own line numbers.
"""

import ast
import importlib.metadata
import pathlib
import re
import sys
import textwrap
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = (
    "docs/guide.md",
    "docs/api.md",
    "docs/proposal.md",
    "docs/architecture.md",
)
# Each long document and the files it is split into, in reading order.
PARTS = {
    "docs/guide.md": (
        "docs/guide.md",
        "docs/guide/what-to-expect.md",
        "docs/guide/stock-jax-and-checkpoints.md",
        "docs/guide/troubleshooting.md",
    ),
    "docs/api.md": (
        "docs/api.md",
        "docs/api/pytreedef.md",
        "docs/api/tree-functions.md",
        "docs/api/transformations.md",
    ),
    "docs/proposal.md": (
        "docs/proposal.md",
        "docs/proposal/referential-transparency.md",
        "docs/proposal/alternatives.md",
        "docs/proposal/upstream-change.md",
    ),
    "docs/jax-integration.md": (
        "docs/jax-integration.md",
        "docs/jax-integration/jit.md",
        "docs/jax-integration/tree-sites.md",
    ),
    "docs/compatibility.md": (
        "docs/compatibility.md",
        "docs/compatibility/earlier-series.md",
    ),
    "docs/benchmarks.md": (
        "docs/benchmarks.md",
        "docs/benchmarks/how-each-benchmark-measures.md",
        "docs/benchmarks/history-2026-12-07.md",
        "docs/benchmarks/history-2026-12-06.md",
        "docs/benchmarks/history-2026-12-04.md",
        "docs/benchmarks/history-2026-12-02-to-12-03.md",
        "docs/benchmarks/history-2026-12-01-to-12-02.md",
        "docs/benchmarks/history-2026-12-01.md",
        "docs/benchmarks/history-2026-11.md",
    ),
}
NOT_RUN = "<!-- not run -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


class Block:

  def __init__(self, language, first_line, lines, skipped):
    self.language = language
    self.first_line = first_line  # 1-based line of the first code line
    self.source = textwrap.dedent("\n".join(lines))
    self.skipped = skipped


def fenced_blocks(text):
  """All fenced code blocks of a Markdown text, in order."""
  lines = text.splitlines()
  blocks = []
  i = 0
  while i < len(lines):
    m = FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    fence, info = m.group("fence"), m.group("info").strip()
    language = info.split()[0].lower() if info else ""
    previous = next((l.strip() for l in reversed(lines[:i]) if l.strip()), "")
    start = i + 1
    j = start
    while j < len(lines):
      close = FENCE.match(lines[j])
      if (
          close
          and close.group("fence")[0] == fence[0]
          and len(close.group("fence")) >= len(fence)
          and not close.group("info").strip()
      ):
        break
      j += 1
    else:
      raise AssertionError(f"unclosed code fence at line {i + 1}")
    blocks.append(
        Block(language, start + 1, lines[start:j], previous == NOT_RUN)
    )
    i = j + 1
  return blocks


def files(doc):
  """The files of a document: itself and its parts, in reading order."""
  return PARTS.get(doc, (doc,))


def python_blocks(doc):
  """The python blocks of one file (a part is a file of its own)."""
  return [
      b
      for b in fenced_blocks((ROOT / doc).read_text())
      if b.language in ("python", "py")
  ]


def document_blocks(doc):
  """(file, block) for every python block of a document and its parts."""
  return [(f, b) for f in files(doc) for b in python_blocks(f)]


@pytest.mark.parametrize("doc", DOCS)
def test_doc_has_python_examples(doc):
  blocks = [b for _, b in document_blocks(doc)]
  assert [b for b in blocks if not b.skipped], f"{doc} has no python block"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_python_blocks_run(doc):
  path = ROOT / doc
  name = "docs_" + path.stem
  module = types.ModuleType(name)
  module.__file__ = str(path)
  # A real module in sys.modules: classes defined by the blocks can be
  # pickled by reference, and dataclasses find their module.
  sys.modules[name] = module
  try:
    for number, (part, block) in enumerate(document_blocks(doc), 1):
      if block.skipped:
        continue
      # Pad so that line numbers in tracebacks are the Markdown file's.
      source = "\n" * (block.first_line - 1) + block.source
      code = compile(source, str(ROOT / part), "exec")
      try:
        exec(code, module.__dict__)  # pylint: disable=exec-used
      except BaseException as e:
        raise AssertionError(
            f"{part}: python block {number} (line {block.first_line}) "
            f"failed: {type(e).__name__}: {e}"
        ) from e
  finally:
    del sys.modules[name]


def test_few_blocks_are_marked_not_run():
  skipped = [
      (part, b.first_line)
      for doc in DOCS
      for part, b in document_blocks(doc)
      if b.skipped
  ]
  assert len(skipped) <= 3, f"too many python blocks marked not run: {skipped}"


@pytest.mark.parametrize("doc", [f for doc in PARTS for f in files(doc)])
def test_doc_images_and_local_links_exist(doc):
  path = ROOT / doc
  text = path.read_text()
  for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
    if re.match(r"^[a-z]+:", target):
      continue  # a URL
    assert (path.parent / target).exists(), f"{doc} links to missing {target}"


@pytest.mark.parametrize("doc", sorted(PARTS))
def test_split_documents_link_their_parts(doc):
  # A document split into files links each part from its top-level file,
  # and no file of it is longer than the project's limit.
  text = (ROOT / doc).read_text()
  for part in files(doc)[1:]:
    relative = pathlib.Path(part).relative_to(pathlib.Path(doc).parent)
    assert f"]({relative.as_posix()}" in text, f"{doc} does not link {part}"
  for part in files(doc):
    lines = len((ROOT / part).read_text().splitlines())
    assert lines <= 600, f"{part} has {lines} lines"


def test_no_document_is_over_the_limit():
  # Split or not, every page keeps to the project's 600 lines.
  for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
    lines = len(path.read_text().splitlines())
    assert lines <= 600, f"{path.relative_to(ROOT)} has {lines} lines"


def test_every_part_is_listed():
  listed = {f for doc in PARTS for f in files(doc)[1:]}
  on_disk = {
      p.relative_to(ROOT).as_posix()
      for doc in PARTS
      for p in (ROOT / doc).with_suffix("").glob("*.md")
  }
  assert listed == on_disk, listed ^ on_disk


def test_readme_links_the_docs_and_names_the_plot_command():
  readme = (ROOT / "README.md").read_text()
  for doc in DOCS:
    assert doc in readme, f"README.md does not link {doc}"
  assert "python bench/plots.py" in readme


def _imported_packages(source):
  """The top-level packages a block imports."""
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      names.add(node.module.split(".")[0])
  return names


def test_docs_requirements_install_what_the_examples_import():
  # A reader who installs docs/requirements.txt beside the wheels, as the
  # README says, can run every example: no ModuleNotFoundError.
  required = {
      re.split(r"[=<>\[ ]", line)[0].strip()
      for line in (ROOT / "docs" / "requirements.txt").read_text().splitlines()
      if line.strip() and not line.startswith("#")
  }
  provides = {"orbax-checkpoint": "orbax"}
  importable = {provides.get(name, name) for name in required}
  # Ours, numpy (jax's dependency), and the standard library.
  importable |= {"jax", "jaxlib", "jaxlib_patch", "numpy"}
  importable |= set(sys.stdlib_module_names)
  missing = {
      f"{doc}: {package}"
      for doc in DOCS
      for _, block in document_blocks(doc)
      if not block.skipped
      for package in _imported_packages(block.source) - importable
  }
  assert sorted(missing) == []
  # Each pinned version is the one these tests run with.
  for line in (ROOT / "docs" / "requirements.txt").read_text().splitlines():
    if "==" in line and not line.startswith("#"):
      name, version = line.split("==")
      assert importlib.metadata.version(name) == version.strip(), name
  readme = (ROOT / "README.md").read_text()
  assert "docs/requirements.txt" in readme and ".venv/bin/activate" in readme
