"""build/jax_series.py's series digest: what a jax wheel records of the
series it was built from, so that tests/run.sh --quick can tell a stale
wheel and build it again."""

import sys
import zipfile
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[1] / "build"
sys.path.insert(0, str(BUILD))

import jax_series  # noqa: E402
from build_common import BuildError  # noqa: E402


@pytest.fixture
def series(tmp_path, monkeypatch):
  """A made-up jax_patch/9.9 with two patches; returns its folder."""
  folder = tmp_path / "9.9"
  folder.mkdir()
  (folder / "0001-a.patch").write_text("first\n")
  (folder / "0002-b.patch").write_text("second\n")
  (folder / "series").write_text("0001-a.patch\n0002-b.patch\n")
  monkeypatch.setattr(jax_series, "PATCH_ROOT", tmp_path)
  return folder


def test_the_digest_changes_with_any_edit_of_the_series(series):
  digests = {jax_series.series_digest("9.9")}
  (series / "0002-b.patch").write_text("second, edited\n")
  digests.add(jax_series.series_digest("9.9"))
  (series / "series").write_text("0002-b.patch\n0001-a.patch\n")
  digests.add(jax_series.series_digest("9.9"))
  (series / "0001-a.patch").rename(series / "0001-renamed.patch")
  (series / "series").write_text("0002-b.patch\n0001-renamed.patch\n")
  digests.add(jax_series.series_digest("9.9"))
  assert len(digests) == 4


def test_the_digest_reads_the_series_only(series):
  before = jax_series.series_digest("9.9")
  (series / "0003-unlisted.patch").write_text("not in the series\n")
  assert jax_series.series_digest("9.9") == before


def test_a_wheel_records_its_digest_or_none(tmp_path):
  recorded = tmp_path / "jax-9.9+relid-py3-none-any.whl"
  with zipfile.ZipFile(recorded, "w") as zf:
    zf.writestr("jax/__init__.py", "")
    zf.writestr(
        f"jax-9.9+relid.dist-info/{jax_series.SERIES_DIGEST_FILE}", "abc\n"
    )
  assert jax_series.recorded_series_digest(recorded) == "abc"
  stock = tmp_path / "jax-9.9-py3-none-any.whl"
  with zipfile.ZipFile(stock, "w") as zf:
    zf.writestr("jax/__init__.py", "")
  assert jax_series.recorded_series_digest(stock) == ""


def test_a_file_that_is_no_wheel_is_named(tmp_path):
  junk = tmp_path / "junk.whl"
  junk.write_text("not a zip")
  with pytest.raises(BuildError, match="junk.whl: not a readable wheel"):
    jax_series.recorded_series_digest(junk)
  with pytest.raises(BuildError, match="missing.whl: not a readable wheel"):
    jax_series.recorded_series_digest(tmp_path / "missing.whl")
