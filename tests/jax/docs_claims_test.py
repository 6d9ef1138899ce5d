"""The numbers and claims of README.md and docs/ agree with the code.

docs_test.py runs the documents' code blocks; this file checks what prose
says and no block can: how many patches there are, what `jax.jit` returns,
what `Exported.serialize()` raises, which public names exist, which
benchmark rows the documents copy from docs/benchmarks.md. Each claim is
written in one recognisable phrase that a test here parses, so that a
document that falls behind the code fails. The documents' tables of
measurements and the numbers they quote from them, and the proposal's size
of the C++, are generated (bench/doc_tables.py): a test here runs its
check, and none writes a number by hand.
"""

import collections
import dataclasses
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import jax
import jax.numpy as jnp
from jax import export
from jax import tree_util
import pytest

import docs_test
import stock_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text(encoding="utf-8").strip()
SERIES = ROOT / "jax_patch" / VERSION / "series"
# The documents that tell the project's story; docs/benchmarks.md (and its
# history, docs/benchmarks/) is where their numbers come from. A document
# split into files is read as all of its files (docs_test.PARTS).
STORY = ("README.md", "docs/proposal.md", "docs/api.md", "docs/guide.md")
BENCHMARKS = "docs/benchmarks.md"
PORTABLE_MARKER = "# Portable: runs on stock JAX and on the patched wheels."


def read(doc):
  """The text of a document: of all its files, in reading order."""
  return "\n".join((ROOT / f).read_text() for f in docs_test.files(doc))


def flat(text):
  """`text` with every run of whitespace one space: phrases that a line
  break splits still match."""
  return re.sub(r"\s+", " ", text)


def patches():
  return [line for line in SERIES.read_text().split() if line]


def test_series_lists_every_patch_file():
  files = sorted(p.name for p in SERIES.parent.glob("*.patch"))
  assert patches() == files


def test_patch_series_reads_each_description_up_to_the_first_file():
  # A checkout puts each patch's description in its commit's message and
  # export writes message and diff back: a description that took in a new
  # file's diff (`--- /dev/null`) came back with that diff twice.
  sys.path.insert(0, str(ROOT / "build"))
  try:
    import patch_series  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  for name in patches():
    description, diff = patch_series.split_patch(
        (SERIES.parent / name).read_text()
    )
    assert not re.search(r"^(--- |\+\+\+ |@@ )", description, re.M), name
    assert diff.startswith("--- "), name


def test_patch_count_the_docs_state():
  counts = {
      doc: [int(n) for n in re.findall(r"\b(\d+) patches\b", flat(read(doc)))]
      for doc in STORY
  }
  # The README and the proposal must say it; the others may.
  assert counts["README.md"] and counts["docs/proposal.md"], counts
  for doc, found in counts.items():
    for n in found:
      assert n == len(patches()), (
          f"{doc} says {n} patches; jax_patch/{VERSION}/series has "
          f"{len(patches())}"
      )


def test_the_stock_pins_are_the_version():
  # A requirements file cannot read VERSION, so its pins are checked here.
  pins = re.findall(
      r"^(jax|jaxlib)==(\S+)",
      (ROOT / "tests" / "requirements.txt").read_text(),
      re.MULTILINE,
  )
  assert sorted(pins) == [("jax", VERSION), ("jaxlib", VERSION)], pins


def test_every_patch_is_in_jax_integration():
  text = read("docs/jax-integration.md")
  missing = [
      name for name in patches() if name.removesuffix(".patch") not in text
  ]
  assert not missing, f"docs/jax-integration.md does not list {missing}"


def test_every_patch_is_in_the_proposals_audit():
  proposal = read("docs/proposal.md")
  start = proposal.index("**Where JAX relied on trees.**")
  audit = proposal[start : proposal.index("## Alternatives", start)]
  named = set(re.findall(r"\b(\d{4})\b", audit))
  missing = [name[:4] for name in patches() if name[:4] not in named]
  assert not missing, f"the proposal's audit names no patch {missing}"


def test_jit_type_the_docs_name():
  jitted = type(jax.jit(lambda x: x))
  actual = f"{jitted.__module__}.{jitted.__qualname__}"
  named = {
      doc: re.findall(r"`type\(jax\.jit\(f\)\)` is `([\w.]+)`", flat(read(doc)))
      for doc in STORY
  }
  for doc in ("docs/proposal.md", "docs/api.md", "docs/guide.md"):
    assert named[doc], f"{doc} does not say what type(jax.jit(f)) is"
  for doc, types_named in named.items():
    for name in types_named:
      assert name == actual, f"{doc} names {name}; it is {actual}"


@pytest.mark.parametrize(
    "stale",
    [
        # jax.jit was a Python function around stock's PjitFunction before
        # the C++ front door; it is not any more.
        r"jax\.jit\(f\)` returns a Python function",
        r"returns a Python function around",
        r"about 1\.2 µs",
        r"seed \d{3}",  # local file names of public threads
        r"Not benchmarked here; plain `eqx\.filter_jit`",
        # nnx.jit on an NNX model against jax.jit on a dataclass model (issue
        # 32): bench_nnx_jit.py measures one model.
        r"`nnx\.jit` is 25\.6–32\.7x slower",
        # A file of eqx.nn.Shared stores the table once and loads right; the
        # trap is a file of the untied model (checkpoint_layouts_test.py).
        r"`eqx\.nn\.Shared` \(which stores the table twice\)",
    ],
)
def test_no_story_doc_repeats_a_stale_claim(stale):
  for doc in STORY:
    assert not re.search(stale, flat(read(doc))), f"{doc}: {stale!r}"


def test_export_serialize_error_the_docs_quote():
  quoted = {
      doc: re.findall(
          r"`Exported\.serialize\(\)` raises `(\w+): ([^`]+)`", flat(read(doc))
      )
      for doc in STORY
  }
  assert quoted["docs/proposal.md"] and quoted["docs/api.md"], quoted

  @tree_util.register_dataclass(preserve_relative_identities=True)
  @dataclasses.dataclass
  class Box:
    value: jax.Array

  box = Box(jnp.ones(2))
  exported = export.export(jax.jit(lambda a, b: a.value + b.value))(box, box)
  with pytest.raises(Exception) as info:
    exported.serialize()
  for doc, pairs in quoted.items():
    for type_name, start in pairs:
      assert type(info.value).__name__ == type_name, doc
      assert str(info.value).startswith(
          start
      ), f"{doc} quotes {start!r}; the message is {str(info.value)!r}"


def test_the_flatbuffers_requirement_api_md_states():
  # Exported.serialize() imports flatbuffers, which no jax wheel requires:
  # api.md tells its readers to install it, quoting jax's ImportError, and
  # the tests' requirements install it for docs_test.py's run of that block.
  api = flat(read("docs/api.md"))
  assert "`pip install flatbuffers`" in api
  quoted = re.search(r"`ImportError: ([^`]+)`", api)
  assert quoted, "api.md does not quote the ImportError"
  serialization = (
      pathlib.Path(jax.__file__).parent / "_src/export/serialization.py"
  )
  assert quoted.group(1) in flat(serialization.read_text())
  assert not [
      r for r in importlib.metadata.requires("jax") if "flatbuffers" in r
  ], "jax now requires flatbuffers: api.md's line is no longer needed"
  requirements = (ROOT / "tests" / "jax" / "requirements.txt").read_text()
  assert "flatbuffers" in requirements.split()


def test_public_names_the_docs_list_exist():
  for doc in STORY:
    text = read(doc)
    # jax's docs/jax.tree_util.rst is a file, not a name.
    pattern = r"\bjax\.tree_util\.([A-Za-z_]\w*)(?!\w*\.rst)"
    for name in set(re.findall(pattern, text)) - {"rst"}:
      assert hasattr(tree_util, name), f"{doc}: jax.tree_util.{name}"
    for name in set(re.findall(r"\bjax\.tree\.([A-Za-z_]\w*)", text)):
      assert hasattr(jax.tree, name), f"{doc}: jax.tree.{name}"


def new_tree_util_names():
  """The names the patch series adds to jax/tree_util.py's exports (a name
  that a patch only moves to another import is not new)."""
  count = collections.Counter()
  for name in patches():
    text = (SERIES.parent / name).read_text()
    for hunk in re.split(r"^--- ", text, flags=re.M)[1:]:
      if hunk.startswith("a/jax/tree_util.py"):
        count.update(re.findall(r"^\+\s+(\w+) as \1,$", hunk, flags=re.M))
        count.subtract(re.findall(r"^-\s+(\w+) as \1,$", hunk, flags=re.M))
  return {name for name, n in count.items() if n > 0}


def test_new_public_names_are_documented_and_get_rst_entries():
  new = new_tree_util_names()
  assert new >= {"preserve_relative_identities", "tree_unshare"}, new
  proposal = read("docs/proposal.md")
  rst = re.search(r"```diff\n(.*?)```", proposal, flags=re.S)
  assert rst, "the proposal gives no .rst entries"
  entries = set(re.findall(r"^\+\s+(\w+)$", rst.group(1), flags=re.M))
  assert entries == new
  api = read("docs/api.md")
  for name in new:
    assert hasattr(tree_util, name)
    assert f"jax.tree_util.{name}" in api, f"api.md does not document {name}"


def table_rows(text):
  return [
      line.strip()
      for line in text.splitlines()
      if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line)
  ]


def test_the_proposals_benchmark_tables_copy_benchmarks_md():
  proposal = read("docs/proposal.md")
  performance = proposal[
      proposal.index("## Performance") : proposal.index("## How it ships")
  ]
  measured = set(table_rows(read(BENCHMARKS)))
  rows = table_rows(performance)
  assert len(rows) > 10
  for row in rows:
    assert row in measured, f"not a row of benchmarks.md: {row}"


GENERATOR = ROOT / "bench" / "doc_tables.py"
GENERATED = re.compile(
    r"<!-- generated by bench/doc_tables\.py from ([\w./-]+) \(([\w-]+)\)"
    r": do not edit -->(.*?)<!-- end generated -->",
    re.S,
)


def run_generator(*args):
  return subprocess.run(
      [sys.executable, str(GENERATOR), *map(str, args)],
      capture_output=True,
      text=True,
      cwd=ROOT,
  )


def test_generated_parts_are_what_the_measurements_make():
  # The tables and numbers between bench/doc_tables.py's markers are what
  # it makes of bench/results/*.json and of jaxlib_patch/: after a new
  # measurement or a change of the C++, `python bench/doc_tables.py`
  # rewrites them.
  done = run_generator("--check")
  assert done.returncode == 0, done.stdout + done.stderr


def change_a_number(text):
  """`text` with one number of its first generated part changed: the first
  with a decimal point, else the first."""
  part = GENERATED.search(text)
  assert part, "no generated part"
  body = part.group(3)
  number = re.search(r"\d+\.\d+", body) or re.search(r"\d+", body)
  at = part.start(3) + number.end() - 1
  changed = str((int(text[at]) + 1) % 10)
  return text[:at] + changed + text[at + 1 :]


@pytest.mark.parametrize(
    "doc", ["docs/benchmarks.md", "docs/proposal/upstream-change.md"]
)
def test_the_check_finds_a_changed_number(doc, tmp_path):
  copy = tmp_path / pathlib.Path(doc).name
  copy.write_text(change_a_number((ROOT / doc).read_text()))
  done = run_generator("--check", copy)
  assert done.returncode == 1, done.stdout + done.stderr
  assert f"{copy}:" in done.stdout and "differs" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "doc, row_start, told",
    [
        # Every C++ file in one row of the proposal's table of sizes.
        (
            "docs/proposal/upstream-change.md",
            "| registry: ",
            "in none ['registry.cc']",
        ),
        # Every patch in one row of the series' table.
        (
            "docs/jax-integration.md",
            "| `0005-",
            "missing ['0005-prefix-specs-over-shared-nodes']",
        ),
    ],
)
def test_the_check_finds_a_row_a_size_table_lacks(
    doc, row_start, told, tmp_path
):
  text = (ROOT / doc).read_text()
  rows = [l for l in text.splitlines() if l.startswith(row_start)]
  assert len(rows) == 1
  copy = tmp_path / pathlib.Path(doc).name
  copy.write_text(text.replace(rows[0] + "\n", ""))
  done = run_generator("--check", copy)
  assert done.returncode == 1
  assert told in done.stdout, done.stdout


def test_series_sizes_count_what_each_patch_adds_and_deletes():
  # The table's counts are the diff lines, file headers and the
  # description aside: checked here against git's own count of each patch.
  table = read("docs/jax-integration.md")
  for name in patches():
    stat = subprocess.run(
        ["git", "apply", "--numstat", str(ROOT / "jax_patch" / VERSION / name)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    rows = [r.split("\t") for r in stat if r]
    files, added, deleted = (
        len(rows),
        sum(int(r[0]) for r in rows),
        sum(int(r[1]) for r in rows),
    )
    row = f"`{name.removesuffix('.patch')}` |"
    (line,) = [l for l in table.splitlines() if l.startswith(f"| {row}")]
    assert line.endswith(f"| {files} | {added} | {deleted} |"), (line, stat)


def test_every_result_file_makes_a_generated_part():
  sources = {
      source
      for doc in STORY + (BENCHMARKS,)
      for source, _, _ in GENERATED.findall(read(doc))
  }
  results = {
      p.relative_to(ROOT).as_posix()
      for p in (ROOT / "bench" / "results").glob("*.json")
  }
  assert results <= sources, results - sources
  # The proposal's size of the C++ is counted, not written.
  kinds = {kind for _, kind, _ in GENERATED.findall(read("docs/proposal.md"))}
  assert {"cxx-total", "cxx-sizes-table"} <= kinds, kinds


def prose(text):
  """`text` less its code blocks, table rows and generated parts."""
  text = GENERATED.sub("", text)
  text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
  return "\n".join(l for l in text.splitlines() if not l.startswith("|"))


@pytest.mark.parametrize("doc", STORY)
def test_ratios_the_story_docs_quote_are_measured(doc):
  # A ratio written by hand in a story document (of a measurement that has
  # no --json output: docs/benchmarks/'s history, the counts) must be one
  # that the benchmark documents state; a range (0.05–0.08x) may join two
  # cells.
  measured = flat(read(BENCHMARKS))
  quoted = re.findall(r"\b\d+\.\d+(?:–\d+\.\d+)?x\b", prose(read(doc)))
  for ratio in sorted(set(quoted)):
    parts = ratio.rstrip("x").split("–")
    assert ratio in measured or all(
        p in measured for p in parts
    ), f"{doc} quotes {ratio}, which no benchmark document has"


# Paths the documents name in a jax checkout, not in this repository.
JAX_CHECKOUT_PATHS = {
    "build/test-requirements.txt",
    "docs/custom_pytrees.md",
    "docs/jax.tree_util.rst",
    "tests/documentation_coverage_test.py",
    "tests/tree_util_test.py",
}


def test_paths_the_docs_name_exist():
  pattern = re.compile(
      r"`((?:bench|tests|jaxlib_patch|jax_patch|build|fuzz|examples|docs)"
      r"/[\w./-]*\.\w+)`"
  )
  missing = [
      (doc, path)
      for doc in STORY
      for path in sorted(set(pattern.findall(read(doc))) - JAX_CHECKOUT_PATHS)
      if not (ROOT / path).exists()
  ]
  assert not missing, missing


def slug(heading):
  """The anchor GitHub gives a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def test_links_to_sections_land_on_headings():
  for doc in STORY + (BENCHMARKS,):
    for part in docs_test.files(doc):
      here = ROOT / part
      text = here.read_text()
      for target, anchor in re.findall(r"\]\(([\w./-]*)#([\w-]+)\)", text):
        path = (here.parent / target) if target else here
        headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)
        assert anchor in {
            slug(h) for h in headings
        }, f"{part}: {target}#{anchor}"


def test_readme_says_what_the_build_and_benchmarks_need():
  readme = flat(read("README.md"))
  assert "network access to the package index" in readme
  assert re.search(r"bench/bench_pytree\.py`[^.]*needs `optree`", readme)


@pytest.mark.parametrize("doc", STORY)
def test_no_python_block_imports_a_module_twice(doc):
  for _, block in docs_test.document_blocks(doc):
    imports = [
        line.strip()
        for line in block.source.splitlines()
        if re.match(r"\s*(import|from) \S+", line)
    ]
    twice = {line for line in imports if imports.count(line) > 1}
    assert not twice, f"{doc} line {block.first_line}: {twice}"


def test_readme_python_blocks_run():
  # docs_test.py runs the three documents of docs/; the README's example is
  # the first code a reader copies, so it runs too.
  module = types.ModuleType("docs_readme")
  sys.modules[module.__name__] = module
  try:
    blocks = docs_test.python_blocks("README.md")
    assert blocks
    for block in blocks:
      source = "\n" * (block.first_line - 1) + block.source
      exec(compile(source, str(ROOT / "README.md"), "exec"), module.__dict__)
  finally:
    del sys.modules[module.__name__]


def portable_block():
  blocks = [
      b
      for _, b in docs_test.document_blocks("docs/guide.md")
      if b.source.startswith(PORTABLE_MARKER)
  ]
  assert len(blocks) == 1, "the guide's portable block is missing"
  return blocks[0].source


def run_isolated(python, source):
  # -E -s: nothing of this environment (PYTHONPATH, user site) leaks in; run
  # from an empty folder so that no checkout shadows the installed jax.
  done = subprocess.run(
      [python, "-E", "-s", "-c", source],
      env=stock_reference.child_environment(),
      capture_output=True,
      text=True,
      cwd=pathlib.Path(os.sep),
  )
  assert done.returncode == 0, done.stderr[-2000:]


def test_portable_block_runs_on_the_patched_wheels():
  run_isolated(sys.executable, portable_block())


def test_portable_block_runs_on_stock_jax():
  python = os.environ.get("JAXLIB_PATCH_STOCK_PYTHON")
  if not python:
    pytest.skip("JAXLIB_PATCH_STOCK_PYTHON (stock jax 0.10.2) is not set")
  check = textwrap.dedent("""
      import jax.tree_util
      assert not hasattr(jax.tree_util, "preserve_relative_identities"), (
          "JAXLIB_PATCH_STOCK_PYTHON has the patched jax, not stock's")
      """)
  run_isolated(python, check + portable_block())
