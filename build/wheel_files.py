"""Wheel files: the cached downloads of the published wheels, reading their
names and METADATA, and the surgery that unpacks one, relabels its version
and repacks it with a fresh RECORD."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import stat
import sys
import zipfile
from pathlib import Path

from build_common import CACHE, REPO, BuildError, log, run
from targets import Target

# --------------------------------------------------------------------------
# Downloads (cached under build/_work/downloads)
# --------------------------------------------------------------------------


def cache_key(requirement: str) -> str:
  """The start of the cache folder names of ``requirement`` (``jax-0.10.2``
  for ``jax==0.10.2``); the target's Python and platform follow it."""
  return re.sub(
      r"[^A-Za-z0-9.-]+", "_", requirement.replace("==", "-").replace("*", "x")
  )


def download(requirement: str, target: Target) -> Path:
  """Download the one wheel matching ``requirement`` for ``target``; cached.

  Each (requirement, target) gets its own cache folder, so a later build finds
  the wheel without asking the index again.
  """
  folder = CACHE / (
      f"{cache_key(requirement)}-cp{target.python.replace('.', '')}-"
      f"{target.platforms[0]}"
  )
  wheels = sorted(folder.glob("*.whl"))
  if len(wheels) == 1:
    log(f"cached: {wheels[0].relative_to(REPO)}")
    return wheels[0]
  shutil.rmtree(folder, ignore_errors=True)
  partial = folder.with_name(folder.name + ".partial")
  shutil.rmtree(partial, ignore_errors=True)
  partial.mkdir(parents=True)
  run(
      [
          sys.executable,
          "-m",
          "pip",
          "download",
          "-q",
          "--no-deps",
          "--dest",
          partial,
          *target.pip_flags,
          requirement,
      ],
      f"downloading {requirement} for Python {target.python} / {target.platforms[0]}",
  )
  wheels = sorted(partial.glob("*.whl"))
  if len(wheels) != 1:
    raise BuildError(
        f"pip download {requirement} gave {len(wheels)} wheels, expected 1"
    )
  partial.rename(folder)
  log(f"downloaded: {(folder / wheels[0].name).relative_to(REPO)}")
  return folder / wheels[0].name


def split_wheel_name(path: Path) -> tuple:
  """Return (name, version, tags) of a wheel file, tags as 'py-abi-platform'."""
  parts = path.name[: -len(".whl")].split("-")
  if len(parts) not in (5, 6):
    raise BuildError(f"not a wheel file name: {path.name}")
  return parts[0], parts[1], "-".join(parts[-3:])


def read_metadata(wheel: Path) -> str:
  """The METADATA text of a wheel."""
  with zipfile.ZipFile(wheel) as zf:
    names = [
        n
        for n in zf.namelist()
        if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)
    ]
    if len(names) != 1:
      raise BuildError(f"{wheel.name}: expected one */METADATA, found {names}")
    return zf.read(names[0]).decode("utf-8")


def libtpu_requirement(jax_wheel: Path) -> str:
  """The libtpu requirement of jax's ``tpu`` extra, e.g. ``libtpu==0.0.42.*``."""
  pattern = re.compile(
      r"Requires-Dist:\s*(libtpu\b[^;]*);\s*extra\s*==\s*['\"]tpu['\"]\s*$"
  )
  for line in read_metadata(jax_wheel).splitlines():
    m = pattern.match(line.strip())
    if m:
      return m.group(1).replace(" ", "")
  raise BuildError(
      f"{jax_wheel.name}: no 'Requires-Dist: libtpu...; extra == \"tpu\"' line"
  )


# --------------------------------------------------------------------------
# Wheel surgery: unpack, relabel, repack with a fresh RECORD
# --------------------------------------------------------------------------


def record_hash(data: bytes) -> str:
  """The RECORD form of a sha256 digest."""
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
  return "sha256=" + digest.decode("ascii")


def unpack(wheel: Path, root: Path) -> dict:
  """Extract ``wheel`` into ``root`` with its file modes; return {arcname: date_time}."""
  dates = {}
  with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
      if info.is_dir():
        continue
      path = root / info.filename
      zf.extract(info, root)
      mode = (info.external_attr >> 16) & 0o777
      os.chmod(path, mode or 0o644)
      dates[info.filename] = info.date_time
  return dates


def relabel(
    root: Path, name: str, version: str, label: str, dates: dict
) -> str:
  """Rename the dist-info folder and set METADATA's Version to ``version+label``.

  Returns the new dist-info folder name; ``dates`` follows the rename.
  """
  old = f"{name}-{version}.dist-info"
  new = f"{name}-{version}+{label}.dist-info"
  if not (root / old).is_dir():
    raise BuildError(f"stock {name} wheel has no {old}/")
  (root / old).rename(root / new)
  for arcname in [a for a in dates if a.startswith(old + "/")]:
    dates[new + arcname[len(old) :]] = dates.pop(arcname)
  metadata = root / new / "METADATA"
  lines = metadata.read_text(encoding="utf-8").split("\n")
  header_end = lines.index("") if "" in lines else len(lines)
  hits = [i for i in range(header_end) if lines[i].startswith("Version:")]
  if len(hits) != 1 or lines[hits[0]].split(":", 1)[1].strip() != version:
    raise BuildError(
        f"{name} METADATA: expected one 'Version: {version}' header"
    )
  lines[hits[0]] = f"Version: {version}+{label}"
  metadata.write_text("\n".join(lines), encoding="utf-8")
  (root / new / "RECORD").unlink(missing_ok=True)
  return new


def pack(root: Path, dist_info: str, wheel: Path, dates: dict) -> None:
  """Zip ``root`` into ``wheel`` with a RECORD listing every file (RECORD last)."""
  files = sorted(
      p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
  )
  leftovers = [f for f in files if f.endswith((".orig", ".rej"))]
  if leftovers:
    raise BuildError(f"refusing to pack patch leftovers: {leftovers}")
  files.sort(key=lambda f: f.startswith(dist_info + "/"))  # dist-info last
  default_date = max(dates.values(), default=(1980, 1, 1, 0, 0, 0))
  record_name = f"{dist_info}/RECORD"
  record = io.StringIO()
  writer = csv.writer(record, lineterminator="\n")
  tmp = wheel.with_name(wheel.name + ".tmp")
  with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:

    def add(arcname: str, data: bytes, mode: int) -> None:
      info = zipfile.ZipInfo(arcname, dates.get(arcname, default_date))
      info.external_attr = (stat.S_IFREG | mode) << 16
      info.compress_type = zipfile.ZIP_DEFLATED
      zf.writestr(info, data)

    for arcname in files:
      path = root / arcname
      data = path.read_bytes()
      add(arcname, data, stat.S_IMODE(path.stat().st_mode))
      writer.writerow([arcname, record_hash(data), len(data)])
    writer.writerow([record_name, "", ""])
    add(record_name, record.getvalue().encode("utf-8"), 0o644)
  tmp.replace(wheel)


def verify_wheel(wheel: Path) -> int:
  """Check that RECORD lists every file of ``wheel`` with its true hash and size."""
  with zipfile.ZipFile(wheel) as zf:
    names = [n for n in zf.namelist() if not n.endswith("/")]
    records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if len(records) != 1:
      raise BuildError(f"{wheel.name}: expected one RECORD, found {records}")
    rows = {
        row[0]: row
        for row in csv.reader(io.StringIO(zf.read(records[0]).decode()))
    }
    if set(rows) != set(names):
      raise BuildError(
          f"{wheel.name}: RECORD and archive differ: "
          f"{sorted(set(rows) ^ set(names))[:10]}"
      )
    for name in names:
      if name == records[0]:
        continue
      data = zf.read(name)
      if rows[name][1:] != [record_hash(data), str(len(data))]:
        raise BuildError(f"{wheel.name}: wrong RECORD entry for {name}")
  return len(names)
