"""build/series_undos.py counts the lines a patch takes back from an earlier
patch, and none that it takes from stock jax."""

import subprocess
import sys
from pathlib import Path

BUILD = Path(__file__).resolve().parents[1] / "build"
sys.path.insert(0, str(BUILD))

import series_undos  # noqa: E402
from patch_series import STOCK_SUBJECT  # noqa: E402


def commit(folder, message, text):
  (folder / "module.py").write_text(text)
  for args in (("add", "-A"), ("commit", "-q", "-m", message)):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=folder,
        check=True,
    )


def test_a_later_patch_that_rewrites_an_earlier_ones_line_is_counted(
    tmp_path,
):
  subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
  commit(tmp_path, STOCK_SUBJECT.format(version="9.9"), "a\nb\nc\n")
  commit(tmp_path, "first", "a\nb\nadded\nc\nkept\n")
  # Rewrites its own line, one of stock's and one of the first patch's.
  commit(tmp_path, "second", "a\nB\nc\nkept\nmine\n")
  commit(tmp_path, "third", "a\nB\nc\nkept\nMINE\n")
  assert series_undos.undone_lines(tmp_path, "9.9") == {
      (1, 2): 1,
      (2, 3): 1,
  }
