"""docs/architecture.svg is drawn from the code as it is: every C++ file in
one concern, the series' patches and modules, the tie policy's switches."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "build" / "architecture.py"


def test_the_picture_is_current():
  done = subprocess.run(
      [sys.executable, SCRIPT, "--check"], capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr


def test_the_picture_names_what_the_code_holds():
  svg = (ROOT / "docs" / "architecture.svg").read_text()
  for cxx in (ROOT / "jaxlib_patch").glob("*.[ch]*"):
    if cxx.suffix in (".cc", ".h"):
      assert f">{cxx.name} (" in svg, cxx.name
  assert "the tie policy" in svg and "7. Splits nobody listed" in svg
