"""What every step of the wheel build shares: the repository's folders, the
error type the build reports, progress lines and running a command.

``build.py`` and ``patch_series.py`` both import it (``build/`` is on
``sys.path`` when either runs as a script).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "_work"
CACHE = WORK / "downloads"
PATCH_ROOT = REPO / "jax_patch"

DEFAULT_VERSION = (REPO / "VERSION").read_text(encoding="utf-8").strip()


class BuildError(Exception):
  """A failure with a message meant for the person running the build."""


def log(msg: str) -> None:
  """Print a progress line."""
  print(f"{Path(sys.argv[0]).name}: {msg}", flush=True)


def shorten(command: str) -> str:
  """Abbreviate a command line's run of ``--platform`` options for display."""

  def fold(m: re.Match) -> str:
    tags = m.group(0).split()[1::2]
    more = f" (+{len(tags) - 1} older)" if len(tags) > 1 else ""
    return f"--platform {tags[0]}{more} "

  return re.sub(r"(?:--platform \S+ )+", fold, command + " ").rstrip()


def run(cmd: list, what: str, **kwargs) -> subprocess.CompletedProcess:
  """Run ``cmd`` (check=True); turn a failure into a BuildError naming ``what``."""
  cmd = [str(c) for c in cmd]
  print("  $ " + shorten(" ".join(cmd)), flush=True)
  try:
    return subprocess.run(cmd, check=True, text=True, **kwargs)
  except FileNotFoundError as e:
    raise BuildError(f"{what}: command not found: {cmd[0]}") from e
  except subprocess.CalledProcessError as e:
    details = "\n".join(s for s in (e.stdout, e.stderr) if s)
    raise BuildError(
        f"{what} failed (exit {e.returncode}): {' '.join(cmd)}"
        + (f"\n{details.strip()}" if details else "")
    ) from e
