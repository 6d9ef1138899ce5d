"""What a build targets: a Python version, its interpreter on this machine,
and the platform tags pip may pick for it."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from build_common import BuildError

LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


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
