#!/usr/bin/env python3
"""Build the project's custom ``jax`` and ``jaxlib`` wheels.

Both are made from the *published* wheels of a pinned JAX version plus this
repository's code (see ``build/README.md``):

* ``jaxlib-<V>+<label>-...whl``: the stock jaxlib wheel plus the package
  ``jaxlib_patch/`` (``__init__.py`` and the C++ extension ``pytree``), built
  from this repository with ``pip wheel .`` for the target interpreter;
* ``jax-<V>+<label>-py3-none-any.whl``: the stock jax wheel with the patch
  series ``jax_patch/<V>/series`` applied.

Only the distributions' versions carry the local label; ``jaxlib/version.py``
stays as published.  ``python build/build.py`` with no arguments builds for
the running interpreter and this machine, checks the result with pip's
resolver and self-checks it in a fresh virtual environment.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "build" / "_work"
CACHE = WORK / "downloads"
PATCH_ROOT = REPO / "jax_patch"
SELFCHECK = REPO / "build" / "selfcheck.py"

DEFAULT_VERSION = (REPO / "VERSION").read_text(encoding="utf-8").strip()
DEFAULT_LABEL = "relid"
# PEP 440 local label, in the normalized (lower-case, dot-separated) form
# that pip compares and writes into file names.
LABEL_RE = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*")
# Files of the built jaxlib_patch wheel that go into the jaxlib wheel (the
# C++ sources that setuptools also packs do not).
MODULE_SUFFIXES = {".py", ".pyi", ".so", ".typed"}
LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


class BuildError(Exception):
  """A failure with a message meant for the person running the build."""


def log(msg: str) -> None:
  """Print a progress line."""
  print(f"build.py: {msg}", flush=True)


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


# --------------------------------------------------------------------------
# Target: Python version, interpreter, platform tags
# --------------------------------------------------------------------------


@dataclass
class Target:
  """What the wheels are built for."""

  python: str  # "3.11"
  interpreter: Path  # an interpreter of that version (builds the module)
  ext_suffix: str  # e.g. ".cpython-311-x86_64-linux-gnu.so"
  platforms: list  # platform tags pip may pick, best first
  native: bool  # the wheels install on this machine (self-check possible)

  @property
  def pip_flags(self) -> list:
    """The pip options that select wheels for this target."""
    flags = [
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        self.python,
    ]
    for plat in self.platforms:
      flags += ["--platform", plat]
    return flags


def interpreter_candidates(version: str) -> list:
  """Executables that may be Python ``version``: this one, PATH's, then pyenv's."""
  candidates = []
  if version == "{}.{}".format(*sys.version_info[:2]):
    candidates.append(sys.executable)
  on_path = shutil.which(f"python{version}")
  if on_path:
    candidates.append(on_path)
  # pyenv's shims run only the versions selected in the shell; its
  # versions/ folder has all of them, newest patch release last.
  pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
  installed = Path(pyenv_root).glob(f"versions/{version}.*/bin/python{version}")
  candidates += [
      str(p)
      for p in sorted(
          installed,
          key=lambda p: [int(x) for x in re.findall(r"\d+", p.parts[-3])],
          reverse=True,
      )
  ]
  return candidates


def find_interpreter(version: str) -> tuple:
  """Return (path, EXT_SUFFIX) of a working ``python<version>``."""
  probe = (
      "import json, sys, sysconfig; print(json.dumps(["
      "'%d.%d' % sys.version_info[:2], sysconfig.get_config_var('EXT_SUFFIX')]))"
  )
  tried = []
  for exe in interpreter_candidates(version):
    proc = subprocess.run([exe, "-c", probe], text=True, capture_output=True)
    if proc.returncode != 0:
      tried.append(f"{exe}: does not run ({proc.stderr.strip()[:200]})")
      continue
    found, ext_suffix = json.loads(proc.stdout)
    if found != version:
      tried.append(f"{exe}: is Python {found}")
      continue
    return Path(exe), ext_suffix
  raise BuildError(
      f"--python {version}: no working python{version} on PATH or under "
      f"pyenv; building the C++ module needs that interpreter (with its "
      f"headers)" + "".join(f"\n  {t}" for t in tried)
  )


def machine_platform() -> str:
  """This machine's most specific manylinux tag, e.g. manylinux_2_36_x86_64."""
  libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
  if sys.platform != "linux" or not libc or not libc.startswith("glibc "):
    raise BuildError(
        "cannot tell this machine's manylinux tag (glibc Linux only); "
        "pass --platform"
    )
  major, minor = libc.split()[1].split(".")[:2]
  return f"manylinux_{major}_{minor}_{platform.machine()}"


def parse_manylinux(tag: str) -> tuple:
  """Return (glibc minor, arch) of a manylinux tag, or (None, None)."""
  m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
  if m:
    return int(m.group(1)), m.group(2)
  prefix, _, arch = tag.partition("_")
  if prefix in LEGACY_MANYLINUX:
    return LEGACY_MANYLINUX[prefix], arch
  return None, None


def expand_platform(tag: str) -> list:
  """All platform tags that a system of manylinux tag ``tag`` accepts, best first.

  pip's ``--platform`` matches exact tags only, so ``manylinux_2_36_x86_64``
  must be spelled out down to the older manylinux tags it includes.
  """
  minor, arch = parse_manylinux(tag)
  if minor is None:
    return [tag]
  tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 4, -1)]
  tags += [f"{p}_{arch}" for p, m in LEGACY_MANYLINUX.items() if m <= minor]
  return tags


def resolve_target(python: str, args) -> Target:
  """The Target for Python ``python`` ("3.X") and the command-line options."""
  interpreter, ext_suffix = find_interpreter(python)
  machine = machine_platform() if sys.platform == "linux" else None
  platform_tag = args.platform or machine
  if platform_tag is None:
    raise BuildError("pass --platform (a manylinux tag)")
  _, arch = parse_manylinux(platform_tag)
  if arch and arch != platform.machine():
    raise BuildError(
        f"--platform {platform_tag}: the C++ module is compiled on this "
        f"{platform.machine()} machine, it cannot target {arch}"
    )
  native = machine is not None and platform_tag in expand_platform(machine)
  return Target(
      python, interpreter, ext_suffix, expand_platform(platform_tag), native
  )


# --------------------------------------------------------------------------
# Downloads (cached under build/_work/downloads)
# --------------------------------------------------------------------------


def download(requirement: str, target: Target) -> Path:
  """Download the one wheel matching ``requirement`` for ``target``; cached.

  Each (requirement, target) gets its own cache folder, so a later build finds
  the wheel without asking the index again.
  """
  key = re.sub(
      r"[^A-Za-z0-9.-]+", "_", requirement.replace("==", "-").replace("*", "x")
  )
  folder = (
      CACHE / f"{key}-cp{target.python.replace('.', '')}-{target.platforms[0]}"
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


# --------------------------------------------------------------------------
# The jaxlib wheel: stock jaxlib + jaxlib_patch
# --------------------------------------------------------------------------


def source_files() -> list:
  """The repository's files as git sees them (tracked or new, not ignored)."""
  try:
    out = subprocess.run(
        [
            "git",
            "-C",
            REPO,
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        check=True,
        capture_output=True,
    ).stdout
  except (OSError, subprocess.CalledProcessError) as e:
    raise BuildError(f"cannot list the sources with git in {REPO}: {e}") from e
  return [f for f in out.decode().split("\0") if f and (REPO / f).is_file()]


def release_toolchain(platform_tag: str, scratch: Path) -> dict:
  """Environment variables that make setuptools build with zig for ``platform_tag``.

  ``platform_tag`` is a wheel file name's platform part (may be compound).

  The module must run wherever the stock jaxlib wheel installs: zig's clang
  links against the glibc version the tag names (``-target
  x86_64-linux-gnu.2.27`` for manylinux_2_27_x86_64) and links its C++
  runtime (libc++) statically.  Every other flag is setup.py's, from
  ``ZIG_COPTS`` and ``ZIG_LINKOPTS`` of jaxlib_patch/compile_flags.bzl, which
  ``JAXLIB_PATCH_ZIG=1`` selects.  zig comes from the ``ziglang`` package of
  the Python running this script.
  """
  parsed = [parse_manylinux(tag) for tag in platform_tag.split(".")]
  if any(minor is None for minor, _ in parsed):
    raise BuildError(
        f"the stock jaxlib wheel's platform {platform_tag} is not a "
        f"manylinux tag; only those are supported"
    )
  minor, arch = min(parsed)  # a compound tag: its oldest glibc
  try:
    import ziglang  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise BuildError(
        f"building the module for {platform_tag} needs zig: "
        f"{sys.executable} -m pip install -r build/requirements.txt"
    ) from e
  # The zig executable itself: setuptools runs the compiler inside pip's
  # isolated build environment, where the ziglang package is not importable.
  zig = Path(ziglang.__file__).with_name("zig")
  zig_version = run(
      [zig, "version"], "zig version", capture_output=True
  ).stdout.strip()
  folder = scratch / "toolchain"
  folder.mkdir()
  compiler = folder / "zig-c++"
  compiler.write_text(
      "#!/bin/sh\n"
      f"exec {shlex.quote(str(zig))} c++ "
      f'-target {arch}-linux-gnu.2.{minor} "$@"\n'
  )
  compiler.chmod(0o755)
  log(f"toolchain: zig {zig_version} c++ for {arch}-linux-gnu.2.{minor}")
  return {
      "CC": str(compiler),
      "CXX": str(compiler),
      "LDSHARED": f"{compiler} -shared",
      "JAXLIB_PATCH_ZIG": "1",
  }


def build_module(target: Target, scratch: Path, toolchain: dict) -> dict:
  """Build ``jaxlib_patch`` with ``pip wheel .`` from a clean copy of the sources.

  A clean copy keeps stale objects of earlier in-tree builds (setuptools
  does not track headers) out of a release.  ``toolchain`` holds the
  compiler's environment variables.  Returns {arcname: Path}.
  """
  src = scratch / "src"
  for rel in source_files():
    (src / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / rel, src / rel)
  out = scratch / "module-wheel"
  run(
      [
          target.interpreter,
          "-m",
          "pip",
          "wheel",
          "-q",
          "--no-deps",
          "--wheel-dir",
          out,
          src,
      ],
      f"building jaxlib_patch with {target.interpreter}",
      env={**os.environ, **toolchain},
  )
  wheels = list(out.glob("*.whl"))
  if len(wheels) != 1:
    raise BuildError(f"pip wheel produced {len(wheels)} wheels, expected 1")
  unpacked = scratch / "module"
  unpack(wheels[0], unpacked)
  files = {
      p.relative_to(unpacked).as_posix(): p
      for p in sorted((unpacked / "jaxlib_patch").rglob("*"))
      if p.is_file() and p.suffix in MODULE_SUFFIXES
  }
  extension = f"jaxlib_patch/pytree{target.ext_suffix}"
  for needed in ("jaxlib_patch/__init__.py", extension):
    if needed not in files:
      raise BuildError(
          f"the built module wheel lacks {needed} (has {sorted(files)})"
      )
  return files


def check_platform_tag(wheel: Path) -> str:
  """Fail unless ``auditwheel show`` finds ``wheel`` true to its platform tag(s).

  auditwheel reports the oldest manylinux tag whose policy the wheel's
  binaries meet (versioned symbols, libraries outside the policy); each tag
  in the file name must be that one or a newer one of the same architecture.
  """
  _, _, tags = split_wheel_name(wheel)
  done = run(
      [sys.executable, "-m", "auditwheel", "show", "--json", wheel],
      f"auditwheel show {wheel.name} (pip install auditwheel)",
      capture_output=True,
  )
  found = json.loads(done.stdout)["overall_tag"]
  found_minor, found_arch = parse_manylinux(found)
  for tag in tags.split("-")[2].split("."):
    minor, arch = parse_manylinux(tag)
    if (
        minor is None
        or found_minor is None
        or arch != found_arch
        or found_minor > minor
    ):
      raise BuildError(
          f"{wheel.name} claims {tag}, but auditwheel show finds it "
          f"consistent with {found} only"
      )
  return found


def build_jaxlib(
    stock: Path,
    module: dict,
    version: str,
    label: str,
    dist: Path,
    scratch: Path,
) -> Path:
  """Write the custom jaxlib wheel into ``dist``."""
  name, stock_version, tags = split_wheel_name(stock)
  root = scratch / "jaxlib"
  dates = unpack(stock, root)
  if (root / "jaxlib_patch").exists():
    raise BuildError(f"{stock.name} already has a jaxlib_patch/ package")
  dist_info = relabel(root, name, stock_version, label, dates)
  for arcname, path in module.items():
    (root / arcname).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, root / arcname)
  top_level = root / dist_info / "top_level.txt"
  if top_level.exists() and "jaxlib_patch" not in top_level.read_text().split():
    top_level.write_text(
        top_level.read_text().rstrip("\n") + "\njaxlib_patch\n"
    )
  wheel = dist / f"{name}-{version}+{label}-{tags}.whl"
  pack(root, dist_info, wheel, dates)
  return wheel


# --------------------------------------------------------------------------
# The jax wheel: stock jax + jax_patch/<version>/series
# --------------------------------------------------------------------------


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


def pin_jaxlib(metadata: Path, version: str, label: str) -> int:
  """Make every ``Requires-Dist: jaxlib...`` of jax's METADATA ``jaxlib==<version>+<label>``.

  The patched jax imports ``jaxlib_patch``, which only our jaxlib has: with
  stock jax's range (``jaxlib<=V,>=V-1``) pip would keep a stock jaxlib and
  ``import jax`` would fail; with the exact local version pip refuses at
  install time.  Extras' markers stay.  Returns how many lines changed.
  """
  pattern = re.compile(r"Requires-Dist:\s*jaxlib\s*(?:[<>=!~][^;]*)?(;.*)?")
  lines = metadata.read_text(encoding="utf-8").split("\n")
  header_end = lines.index("") if "" in lines else len(lines)
  pinned = 0
  for i in range(header_end):
    m = pattern.fullmatch(lines[i].strip())
    if m:
      lines[i] = f"Requires-Dist: jaxlib=={version}+{label}" + (
          m.group(1) or ""
      )
      pinned += 1
  if not pinned:
    raise BuildError(f"{metadata}: no 'Requires-Dist: jaxlib' line to pin")
  metadata.write_text("\n".join(lines), encoding="utf-8")
  return pinned


def build_jax(
    stock: Path, version: str, label: str, dist: Path, scratch: Path
) -> Path:
  """Write the patched jax wheel, which requires exactly our jaxlib, into ``dist``."""
  name, stock_version, tags = split_wheel_name(stock)
  root = scratch / "jax"
  dates = unpack(stock, root)
  apply_patches(root, read_series(version))
  dist_info = relabel(root, name, stock_version, label, dates)
  pinned = pin_jaxlib(root / dist_info / "METADATA", version, label)
  log(
      f"jax requires jaxlib=={version}+{label} ({pinned} Requires-Dist line(s))"
  )
  wheel = dist / f"{name}-{version}+{label}-{tags}.whl"
  pack(root, dist_info, wheel, dates)
  return wheel


# --------------------------------------------------------------------------
# Checks: pip's resolver, and a self-check in a fresh venv
# --------------------------------------------------------------------------


def check_resolver(
    target: Target, dist: Path, pins: dict, extras: list
) -> list:
  """Resolve our two wheels plus ``extras`` with pip; return [(name, version, source, file)].

  Fails if pip would install anything but our jax/jaxlib for those names.
  """
  requirements = [
      f"{name}=={version}" for name, version in pins.items()
  ] + extras
  with tempfile.TemporaryDirectory(dir=WORK) as tmp:
    report = Path(tmp) / "report.json"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--dry-run",
            "--ignore-installed",
            "--find-links",
            dist,
            *target.pip_flags,
            "--target",
            Path(tmp) / "target",
            "--report",
            report,
            *requirements,
        ],
        "pip's resolver check",
    )
    installs = json.loads(report.read_text())["install"]
  resolved = []
  for item in installs:
    name = item["metadata"]["name"].lower()
    url = item["download_info"]["url"]
    source = "dist/" if url.startswith(dist.as_uri() + "/") else "index"
    filename = urllib.parse.unquote(url.rsplit("/", 1)[-1])
    resolved.append((name, item["metadata"]["version"], source, filename))
  by_name = {name: (version, source) for name, version, source, _ in resolved}
  for name, version in pins.items():
    if by_name.get(name) != (version, "dist/"):
      raise BuildError(
          f"pip's resolver picked {name} {by_name.get(name)}, "
          f"not {version} from {dist}"
      )
  return resolved


def run_selfcheck(target: Target, dist: Path, version: str, label: str) -> None:
  """Install the two wheels in a fresh venv and run build/selfcheck.py there."""
  venv = WORK / f"selfcheck-venv-cp{target.python.replace('.', '')}"
  run(
      [target.interpreter, "-m", "venv", "--clear", venv],
      "creating the self-check venv",
  )
  python = venv / "bin" / "python"
  run(
      [
          python,
          "-m",
          "pip",
          "install",
          "-q",
          "--find-links",
          dist,
          f"jax=={version}+{label}",
          f"jaxlib=={version}+{label}",
      ],
      "installing the wheels into the self-check venv",
  )
  # -I: neither the repository nor build/ is on sys.path, only the venv.
  run(
      [python, "-I", SELFCHECK, "--version", version, "--label", label],
      "build/selfcheck.py",
      cwd=venv,
  )


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
  """The command line."""
  parser = argparse.ArgumentParser(
      description="Build dist/jax-<V>+<label> and dist/jaxlib-<V>+<label> wheels from the "
      "published wheels, this repository's jaxlib_patch and jax_patch/<V>/."
  )
  parser.add_argument(
      "--version",
      default=DEFAULT_VERSION,
      help="published jax/jaxlib version (default %(default)s); needs "
      "jax_patch/<version>/series",
  )
  parser.add_argument(
      "--label",
      default=DEFAULT_LABEL,
      help="local version label (default %(default)s)",
  )
  parser.add_argument(
      "--python",
      metavar="3.X[,3.Y...]",
      help="target Pythons, comma-separated (default: this "
      "interpreter's); each needs a working python3.X on PATH or "
      "under pyenv to build the C++ module",
  )
  parser.add_argument(
      "--find-pythons",
      action="store_true",
      help="only print, per --python version, the interpreter found "
      "('3.X PATH') or '3.X missing', and exit",
  )
  parser.add_argument(
      "--platform",
      metavar="TAG",
      help="target manylinux tag (default: this machine's; the jaxlib "
      "wheel keeps the published wheel's tag)",
  )
  parser.add_argument(
      "--cuda",
      choices=["12", "13"],
      help="also fetch the stock jax-cudaNN-plugin and -pjrt wheels",
  )
  parser.add_argument(
      "--tpu",
      action="store_true",
      help="also fetch the libtpu wheel that jax's 'tpu' extra pins",
  )
  parser.add_argument(
      "--no-selfcheck",
      action="store_true",
      help="skip installing the wheels in a venv and running selfcheck.py",
  )
  parser.add_argument(
      "--dist",
      type=Path,
      default=REPO / "dist",
      help="output folder (default: dist/ in the repository)",
  )
  args = parser.parse_args(argv)
  if not LABEL_RE.fullmatch(args.label):
    parser.error(
        f"--label {args.label!r}: use lower-case letters and digits, "
        "optionally dot-separated (a normalized PEP 440 local label)"
    )
  args.python = (args.python or "{}.{}".format(*sys.version_info[:2])).split(
      ","
  )
  for python in args.python:
    if not re.fullmatch(r"3\.\d+", python):
      parser.error(f"--python {python}: expected 3.X")
  if len(set(args.python)) != len(args.python):
    parser.error(f"--python {','.join(args.python)}: a version is named twice")
  return args


def find_pythons(versions: list) -> None:
  """Print each version's interpreter, or that it is missing (for tests/run.sh)."""
  for version in versions:
    try:
      print(f"{version} {find_interpreter(version)[0]}")
    except BuildError:
      print(f"{version} missing")


def build_for_python(
    target: Target,
    args,
    stock_jax: Path,
    dist: Path,
    timings: dict,
) -> tuple:
  """The jaxlib wheel (and the extras) for one Python, checked; returns
  (wheels written, pip's resolution, self-check result)."""

  def timed(name: str, t0: float) -> None:
    timings[f"{name} {target.python}"] = time.monotonic() - t0

  t0 = time.monotonic()
  stock_jaxlib = download(f"jaxlib=={args.version}", target)
  extras = []
  if args.cuda:
    extras = [
        f"jax-cuda{args.cuda}-plugin=={args.version}",
        f"jax-cuda{args.cuda}-pjrt=={args.version}",
    ]
  if args.tpu:
    extras.append(libtpu_requirement(stock_jax))
  stock_extras = [download(req, target) for req in extras]
  timed("downloads", t0)

  with tempfile.TemporaryDirectory(dir=WORK, prefix="scratch-") as tmp:
    scratch = Path(tmp)
    t0 = time.monotonic()
    toolchain = release_toolchain(
        split_wheel_name(stock_jaxlib)[2].split("-")[2], scratch
    )
    module = build_module(target, scratch, toolchain)
    timed("C++ module", t0)
    t0 = time.monotonic()
    jaxlib_wheel = build_jaxlib(
        stock_jaxlib, module, args.version, args.label, dist, scratch
    )
  log(
      f"RECORD verified: {jaxlib_wheel.name} ({verify_wheel(jaxlib_wheel)} files)"
  )
  log(
      f"auditwheel: {jaxlib_wheel.name} is consistent with "
      f"{check_platform_tag(jaxlib_wheel)}"
  )
  timed("repack and audit", t0)
  written = [jaxlib_wheel]
  for wheel in stock_extras:
    shutil.copy2(wheel, dist / wheel.name)
    written.append(dist / wheel.name)

  t0 = time.monotonic()
  full = f"{args.version}+{args.label}"
  resolved = check_resolver(
      target,
      dist,
      {"jax": full, "jaxlib": full},
      ["{}=={}".format(*split_wheel_name(w)[:2]) for w in stock_extras],
  )
  timed("resolver", t0)

  if args.no_selfcheck:
    selfcheck = "skipped (--no-selfcheck)"
  elif not target.native:
    raise BuildError(
        f"the self-check needs wheels that install on this machine, "
        f"not {target.platforms[0]}; pass --no-selfcheck"
    )
  else:
    t0 = time.monotonic()
    run_selfcheck(target, dist, args.version, args.label)
    timed("self-check", t0)
    selfcheck = "passed"
  return written, resolved, selfcheck


def build(args) -> None:
  """Do the whole build; raise BuildError on failure."""
  started = time.monotonic()
  timings = {}
  patches = read_series(args.version)  # fail early on an unknown version
  targets = [resolve_target(python, args) for python in args.python]
  for target in targets:
    log(
        f"target: Python {target.python} ({target.interpreter}), platform "
        f"{target.platforms[0]}, jax/jaxlib {args.version}+{args.label}, "
        f"{len(patches)} jax patch(es)"
    )
  dist = args.dist.resolve()
  dist.mkdir(parents=True, exist_ok=True)
  WORK.mkdir(parents=True, exist_ok=True)

  # jax is pure Python: one wheel serves every target.
  t0 = time.monotonic()
  stock_jax = download(f"jax=={args.version}", targets[0])
  with tempfile.TemporaryDirectory(dir=WORK, prefix="scratch-") as tmp:
    jax_wheel = build_jax(stock_jax, args.version, args.label, dist, Path(tmp))
  log(f"RECORD verified: {jax_wheel.name} ({verify_wheel(jax_wheel)} files)")
  timings["jax wheel"] = time.monotonic() - t0

  results = [
      (
          target,
          *build_for_python(target, args, stock_jax, dist, timings),
      )
      for target in targets
  ]

  print("\n=== summary ===")
  print(f"written to {dist}:")
  for wheel in [jax_wheel] + [
      w for _, written, _, _ in results for w in written
  ]:
    print(f"  {wheel.name:<70} {wheel.stat().st_size / 2**20:8.1f} MiB")
  for target, _, resolved, selfcheck in results:
    print(f"Python {target.python}: pip's resolver (--dry-run) would install:")
    for name, version, source, filename in resolved:
      print(f"  {name:<20} {version:<14} {source:<6} {filename}")
    print(f"Python {target.python}: self-check: {selfcheck}")
  print(
      "time: "
      + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
      + f"; total {time.monotonic() - started:.0f}s"
  )


def main(argv=None) -> int:
  """Entry point: returns the exit status."""
  args = parse_args(argv)
  try:
    if args.find_pythons:
      find_pythons(args.python)
    else:
      build(args)
  except BuildError as e:
    print(f"build.py: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
