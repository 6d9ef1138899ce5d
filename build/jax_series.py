"""The jax patch series, ``jax_patch/<V>/series``: which patch files it
lists, and applying them to the published jax wheel's files.

``build.py`` applies the series to build the jax wheel; ``patch_series.py``
applies it one patch a commit to make a git checkout of the series, from the
published wheel that ``build.py`` cached.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from build_common import CACHE, PATCH_ROOT, REPO, BuildError, log, run
from wheel_files import cache_key


def read_series(version: str) -> list:
  """The patch files of ``jax_patch/<version>/series``, in order."""
  folder = PATCH_ROOT / version
  series = folder / "series"
  if not series.is_file():
    supported = sorted(p.parent.name for p in PATCH_ROOT.glob("*/series"))
    raise BuildError(
        f"no {series.relative_to(REPO)}: version {version} is not supported "
        f"(supported: {', '.join(supported) or 'none'})"
    )
  patches = []
  for lineno, line in enumerate(series.read_text().splitlines(), 1):
    entry = line.split("#", 1)[0].strip()
    if not entry:
      continue
    path = folder / entry
    if not path.is_file():
      raise BuildError(
          f"{series.relative_to(REPO)}:{lineno}: no patch file {entry}"
      )
    patches.append(path)
  return patches


def apply_patches(root: Path, patches: list) -> None:
  """Apply ``patches`` in order with ``patch -p1``, each dry-run first.

  No fuzz is allowed (the patches are for one pinned version), and no backup
  or reject files are written.
  """
  if shutil.which("patch") is None:
    raise BuildError("the 'patch' program is missing (apt-get install patch)")
  base = [
      "patch",
      "-p1",
      "--batch",
      "--forward",
      "--fuzz=0",
      "--no-backup-if-mismatch",
      "-d",
      root,
      "-i",
  ]
  for path in patches:
    rel = path.relative_to(REPO)
    dry = subprocess.run(
        base + [path, "--dry-run"], text=True, capture_output=True
    )
    if dry.returncode != 0:
      raise BuildError(
          f"patch {rel} does not apply to the stock jax wheel:\n"
          f"{(dry.stdout + dry.stderr).strip()}"
      )
    run(base + [path, "--quiet"], f"applying {rel}")
    log(f"applied {rel}")


def cached_stock_jax(version: str) -> Path:
  """The published jax wheel of ``version`` that ``build.py`` downloaded."""
  found = sorted(
      CACHE.glob(
          f"{cache_key(f'jax=={version}')}-*/jax-{version}-py3-none-any.whl"
      )
  )
  if not found:
    raise BuildError(
        f"no jax {version} wheel under {CACHE.relative_to(REPO)}: run "
        "build/build.py once, or pass --wheel"
    )
  return found[0]
