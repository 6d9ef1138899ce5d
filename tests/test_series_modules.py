"""jax_patch/<V>/modules/ holds each module the jax series adds, whole, as
the last patch leaves it: the copy the formatter, the duplicate finder and
the structure checks read. Checked here against the series itself, rebuilt
from the patches' own sections (build/jax_series.py), so that the two
cannot drift."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "build"))

import jax_series  # noqa: E402
from build_common import DEFAULT_VERSION, BuildError  # noqa: E402

MODULES = ROOT / "jax_patch" / DEFAULT_VERSION / jax_series.MODULES


def test_the_modules_folder_holds_what_the_series_adds(tmp_path):
  added = jax_series.rebuild_added_files(
      jax_series.read_series(DEFAULT_VERSION), tmp_path
  )
  kept = sorted(
      p.relative_to(MODULES).as_posix() for p in MODULES.rglob("*.py")
  )
  assert sorted(added) == kept, "run build/patch_series.py export"
  differ = [
      path
      for path in added
      if (tmp_path / path).read_text() != (MODULES / path).read_text()
  ]
  assert differ == [], "run build/patch_series.py export"


def test_sections_are_read_by_their_line_counts():
  # A removed line that starts with "-- " reads "--- " in the diff, and an
  # added one "++ ", "+++ ": the counts, not the look, end a section.
  diff = (
      "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+a\n+++ b/x\n"
      "--- a/pkg/old.py\n+++ b/pkg/old.py\n@@ -1,2 +1,1 @@\n--- b/y\n a\n"
  )
  sections = jax_series.file_sections(diff)
  assert [path for path, _ in sections] == ["pkg/new.py", "pkg/old.py"]
  assert sections[0][1].endswith("+a\n+++ b/x\n")
  assert sections[1][1].endswith("--- b/y\n a\n")


def test_a_series_that_adds_a_file_twice_names_it(tmp_path):
  patch = tmp_path / "0001.patch"
  patch.write_text(
      "description\n\n--- /dev/null\n+++ b/m.py\n@@ -0,0 +1 @@\n+a\n"
      "--- /dev/null\n+++ b/m.py\n@@ -0,0 +1 @@\n+b\n"
  )
  out = tmp_path / "out"
  out.mkdir()
  with pytest.raises(BuildError, match="m.py: a section does not apply"):
    jax_series.rebuild_added_files([patch], out)
