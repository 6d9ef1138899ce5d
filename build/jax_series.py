"""The jax patch series, ``jax_patch/<V>/series``: which patch files it
lists, and applying them to the published jax wheel's files; the modules it
adds, kept whole in ``jax_patch/<V>/modules/`` so that the formatter and the
other tools read them as files.

``build.py`` applies the series to build the jax wheel; ``patch_series.py``
applies it one patch a commit to make a git checkout of the series, from the
published wheel that ``build.py`` cached.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import zipfile
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


# The file of the jax wheel's dist-info that records the series it was built
# from, so that a stale wheel can be told from a current one.
SERIES_DIGEST_FILE = "RELID_SERIES"


def series_digest(version: str) -> str:
  """A sha256 of ``jax_patch/<version>/series`` and of each patch it lists,
  names included: it changes with any edit of the series."""
  digest = hashlib.sha256((PATCH_ROOT / version / "series").read_bytes())
  for path in read_series(version):
    digest.update(path.name.encode() + b"\0" + path.read_bytes())
  return digest.hexdigest()


def recorded_series_digest(wheel: Path) -> str:
  """The series digest a jax wheel of ``build.py`` records ('' if none)."""
  try:
    with zipfile.ZipFile(wheel) as zf:
      for name in zf.namelist():
        if name.endswith(f".dist-info/{SERIES_DIGEST_FILE}"):
          return zf.read(name).decode("utf-8").strip()
  except (OSError, zipfile.BadZipFile) as e:
    raise BuildError(f"{wheel}: not a readable wheel ({e})") from None
  return ""


# The folder of jax_patch/<V>/ that holds each module the series adds, as the
# last patch leaves it, at its path in jax (written by patch_series.py
# export).
MODULES = "modules"


HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def file_sections(text: str) -> list:
  """The ``(path, section)`` of each file a unified diff touches, in order:
  its ``---``/``+++`` lines and its hunks, read by the hunks' line counts
  (so that a removed line starting with "-- " is never taken for a
  header)."""
  lines = text.splitlines(keepends=True)
  sections, i = [], 0
  while i < len(lines):
    if not (
        lines[i].startswith("--- ")
        and i + 1 < len(lines)
        and lines[i + 1].startswith("+++ b/")
    ):
      i += 1
      continue
    path = lines[i + 1][len("+++ b/") :].rstrip("\n")
    section, i = lines[i : i + 2], i + 2
    while i < len(lines) and (match := HUNK.match(lines[i])):
      old, new = (int(n) if n is not None else 1 for n in match.groups())
      section.append(lines[i])
      i += 1
      while old > 0 or new > 0:
        line = lines[i]
        section.append(line)
        i += 1
        if line.startswith("\\"):
          continue  # "\ No newline at end of file"
        old -= line[0] in " -"
        new -= line[0] in " +"
    sections.append((path, "".join(section)))
  return sections


def patch_command(root: Path) -> list:
  """``patch -p1`` into ``root`` as the series is applied: no fuzz (the
  patches are for one pinned version), no backup or reject files."""
  if shutil.which("patch") is None:
    raise BuildError("the 'patch' program is missing (apt-get install patch)")
  return [
      "patch",
      "-p1",
      "--batch",
      "--forward",
      "--fuzz=0",
      "--no-backup-if-mismatch",
      "-d",
      root,
  ]


def rebuild_added_files(patches: list, root: Path) -> list:
  """Writes into ``root`` each file the series adds (its first section comes
  from /dev/null) from its sections alone, no stock jax needed; returns
  their paths, relative to ``root``, in the order they are added."""
  added: dict = {}
  for patch in patches:
    for path, section in file_sections(patch.read_text()):
      if path in added or section.startswith("--- /dev/null"):
        added.setdefault(path, []).append(section)
  for path, sections in added.items():
    for section in sections:
      done = subprocess.run(
          patch_command(root) + ["--quiet"],
          input=section,
          text=True,
          capture_output=True,
      )
      if done.returncode != 0:
        raise BuildError(
            f"{path}: a section does not apply:\n"
            f"{(done.stdout + done.stderr).strip()}"
        )
  return list(added)


def apply_patches(root: Path, patches: list) -> None:
  """Apply ``patches`` in order with ``patch -p1``, each dry-run first.

  No fuzz is allowed (the patches are for one pinned version), and no backup
  or reject files are written.
  """
  base = patch_command(root) + ["-i"]
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
