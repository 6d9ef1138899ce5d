"""The C++ module of the jaxlib wheel: built from a clean copy of the
sources with zig's clang for the published wheel's glibc, then checked with
auditwheel against the platform tag the wheel claims."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from build_common import REPO, BuildError, log, run
from targets import Target, parse_manylinux
from wheel_files import split_wheel_name, unpack

# Files of the built jaxlib_patch wheel that go into the jaxlib wheel (the
# C++ sources that setuptools also packs do not).
MODULE_SUFFIXES = {".py", ".pyi", ".so", ".typed"}


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
  # The one long step, which prints nothing while it runs.
  log(
      f"compiling the C++ module for Python {target.python} (about two "
      "minutes on two cores; the first build on a machine also builds zig's "
      "C++ runtime, a few minutes more)"
  )
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
