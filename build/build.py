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
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from build_common import DEFAULT_VERSION, REPO, WORK, BuildError, log, run
from jax_series import (
    SERIES_DIGEST_FILE,
    apply_patches,
    read_series,
    recorded_series_digest,
    series_digest,
)
from targets import Target, find_interpreter, resolve_target
from toolchain import build_module, check_platform_tag, release_toolchain
from wheel_files import (
    download,
    libtpu_requirement,
    pack,
    relabel,
    split_wheel_name,
    unpack,
    verify_wheel,
)

SELFCHECK = REPO / "build" / "selfcheck.py"
DEFAULT_LABEL = "relid"
# PEP 440 local label, in the normalized (lower-case, dot-separated) form
# that pip compares and writes into file names.
LABEL_RE = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*")


# --------------------------------------------------------------------------
# The jaxlib wheel: stock jaxlib + jaxlib_patch
# --------------------------------------------------------------------------


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
  (root / dist_info / SERIES_DIGEST_FILE).write_text(
      series_digest(version) + "\n", encoding="utf-8"
  )
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
  # -I: neither the repository nor build/ is on sys.path, only the venv
  # (and examples/, which selfcheck.py adds for the example's classes).
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
      "--jax-only",
      action="store_true",
      help="build the jax wheel only (the patch series applied, seconds): "
      "after an edit of jax_patch/, beside the jaxlib wheels of dist/",
  )
  parser.add_argument(
      "--series-digest",
      action="store_true",
      help="only print the digest of jax_patch/<version>/ that a jax wheel "
      f"built from it records (its dist-info's {SERIES_DIGEST_FILE}), and exit",
  )
  parser.add_argument(
      "--recorded-series",
      metavar="WHEEL",
      type=Path,
      help="only print the series digest that the jax wheel WHEEL records "
      "(an empty line if none), and exit",
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
  if args.jax_only:
    log(f"written: {jax_wheel} (--jax-only)")
    return

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
    elif args.series_digest:
      print(series_digest(args.version))
    elif args.recorded_series:
      print(recorded_series_digest(args.recorded_series))
    else:
      build(args)
  except BuildError as e:
    print(f"build.py: error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
