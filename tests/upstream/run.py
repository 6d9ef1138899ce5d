#!/usr/bin/env python3
"""Run jax's own tests against stock jax 0.10.2 and against the custom wheels.

Usage:
  python3 tests/upstream/run.py JAX_CHECKOUT [--files api_test,pjit_test ...]
      [--stock-venv DIR] [--ours-venv DIR] [--dist DIR] [--out DIR] [--jobs N]
      [--only-ours]

JAX_CHECKOUT is a jax source tree at tag jax-v0.10.2 (its tests/, jaxlib/
pytree_test.py, conftest.py, pyproject.toml and build/test-requirements.txt
are read; nothing of it is copied).  Each selected file runs once in the stock
virtual environment and once in the custom one, with 8 virtual CPU devices;
for each file the script prints both sides' pass/fail/skip counts and every
test that passes on stock and not on ours, with the first line of its error,
and writes the same into OUT/<file>.md (the junit xml and pytest log of each
run stay beside it).  OUT/summary.md gathers the table of the files run so
far.  The virtual environments are created when missing; the custom one gets
the newest wheels of DIST (build/build.py's output) at every run, so that it
always measures what dist/ holds.  Stock's results do not change from one
build of ours to the next: with --only-ours, stock's side is read from the
junit xml an earlier run left in OUT (and reported as not run when there is
none).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
import venv
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
JAX_VERSION = (REPO / "VERSION").read_text(encoding="utf-8").strip()

# The jax test files that exercise pytrees through every layer that flattens
# them (tree utilities, the pytree module, custom rules, jit, batching,
# control flow, export, sharding), the small ones first, and those that
# exercise the Python surface of the object jax.jit returns (pickling and
# copying it, `__wrapped__`, lowering it ahead of time: a search of jax's
# tests for pickle, copy, `_cache_size` and `__wrapped__` finds them, and
# api_test and pjit_test above; debug_info_test skips all its tests at
# this tag); the stock parity of docs/compatibility.md is measured on
# them. A --files entry is one of these names or a path
# relative to the checkout.
DEFAULT_FILES = {
    "tree_util_test": "tests/tree_util_test.py",
    "pytree_test": "jaxlib/pytree_test.py",
    "api_util_test": "tests/api_util_test.py",
    "custom_api_test": "tests/custom_api_test.py",
    "api_test": "tests/api_test.py",
    "pjit_test": "tests/pjit_test.py",
    "mutable_array_test": "tests/mutable_array_test.py",
    "batching_test": "tests/batching_test.py",
    "checkify_test": "tests/checkify_test.py",
    "export_test": "tests/export_test.py",
    "lax_control_flow_test": "tests/lax_control_flow_test.py",
    "shard_map_test": "tests/shard_map_test.py",
    "state_test": "tests/state_test.py",
    "package_structure_test": "tests/package_structure_test.py",
    "pickle_test": "tests/pickle_test.py",
    "aot_test": "tests/aot_test.py",
    "pmap_test": "tests/pmap_test.py",
}

SIDES = ("stock", "ours")
# What stands in for jaxlib._jax.pytree in jaxlib/pytree_test.py, per side
# (see jaxlib_alias.py); stock's test runs against stock's module.
PYTREE_MODULE = {"stock": "", "ours": "jaxlib_patch.pytree"}


class RunnerError(Exception):
  """A failure with a message meant for the person running the script."""


@dataclass
class Outcome:
  """One test's result: passed, failed, error or skipped, and why."""

  status: str
  message: str = ""


@dataclass
class SideResult:
  """One file's run on one side."""

  outcomes: dict[str, Outcome] = field(default_factory=dict)
  note: str = ""  # why the run produced no report, when it did not

  def count(self, *statuses: str) -> int:
    return sum(o.status in statuses for o in self.outcomes.values())

  def counts(self) -> str:
    if self.note:
      return self.note
    return (
        f"{self.count('passed')} / {self.count('failed', 'error')} / "
        f"{self.count('skipped')}"
    )


def first_line(text: str) -> str:
  """The first line of an error; with the next one when it ends in ':'.

  An assertEqual failure's first line is a bare "AssertionError:".
  """
  lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
  if len(lines) > 1 and lines[0].endswith(":"):
    return f"{lines[0]} {lines[1]}"
  return lines[0] if lines else ""


def read_junit(path: Path) -> dict[str, Outcome]:
  """Outcomes by test id (``Class::test``) from pytest's junit xml."""
  outcomes = {}
  for case in ET.parse(path).getroot().iter("testcase"):
    test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
    status, message = "passed", ""
    for child in case:
      if child.tag in ("failure", "error", "skipped"):
        status = {"failure": "failed"}.get(child.tag, child.tag)
        message = first_line(child.get("message") or child.text or "")
        break
    # A test can fail in its call and again in its teardown: keep the worst.
    if test_id not in outcomes or outcomes[test_id].status == "passed":
      outcomes[test_id] = Outcome(status, message)
  return outcomes


def venv_python(venv_dir: Path) -> Path:
  return venv_dir / "bin" / "python"


def pip_install(venv_dir: Path, *args: str) -> None:
  cmd = [str(venv_python(venv_dir)), "-m", "pip", "install", "-q", *args]
  print("  $ " + " ".join(cmd), flush=True)
  if subprocess.run(cmd).returncode:
    raise RunnerError(f"pip install failed in {venv_dir}")


def python_tag(venv_dir: Path) -> str:
  """The CPython tag of a venv's interpreter, as wheel names spell it."""
  return subprocess.run(
      [
          str(venv_python(venv_dir)),
          "-c",
          "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')",
      ],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()


def newest_wheel(dist: Path, pattern: str) -> Path:
  wheels = sorted(dist.glob(pattern), key=lambda p: p.stat().st_mtime)
  if not wheels:
    raise RunnerError(
        f"no {pattern} in {dist}: run `python build/build.py` " "first"
    )
  return wheels[-1]


def prepare_venvs(args) -> dict[str, Path]:
  """Create the two environments when missing; the custom wheels every run."""
  requirements = args.checkout / "build" / "test-requirements.txt"
  if not requirements.is_file():
    raise RunnerError(
        f"{requirements} is missing: the checkout must hold "
        "jax's build/test-requirements.txt"
    )
  venvs = {"stock": args.stock_venv, "ours": args.ours_venv}
  for side, venv_dir in venvs.items():
    if venv_python(venv_dir).exists() or (side == "stock" and args.only_ours):
      continue
    print(f"creating the {side} virtual environment {venv_dir}", flush=True)
    venv.create(venv_dir, with_pip=True)
    pip_install(venv_dir, "-r", str(requirements))
    # Both sides get stock 0.10.2 and its dependencies: the same versions.
    pip_install(venv_dir, f"jax=={JAX_VERSION}", f"jaxlib=={JAX_VERSION}")
  install_custom_wheels(venvs["ours"], args.dist)
  return venvs


def install_custom_wheels(venv_dir: Path, dist: Path) -> None:
  """The newest custom jax and jaxlib wheels of `dist` into a venv."""
  jax_wheel = newest_wheel(dist, "jax-*+*-py3-none-any.whl")
  # build.py may write one jaxlib wheel per Python: take the venv's.
  tag = python_tag(venv_dir)
  jaxlib_wheel = newest_wheel(dist, f"jaxlib-*+*-{tag}-{tag}-*.whl")
  print(f"custom wheels: {jax_wheel.name}, {jaxlib_wheel.name}", flush=True)
  # They replace stock jax and jaxlib; every dependency stays as on stock.
  pip_install(
      venv_dir,
      "--force-reinstall",
      "--no-deps",
      str(jax_wheel),
      str(jaxlib_wheel),
  )


def report_paths(out: Path, stem: str, side: str) -> tuple[Path, Path]:
  """The junit xml (an earlier run's removed) and the log of one run in OUT."""
  junit = out / f"{stem}.{side}.xml"
  junit.unlink(missing_ok=True)
  return junit, out / f"{stem}.{side}.log"


def pytest_command(
    venv_dir: Path, plugin: str, junit: Path, jobs: str, *options: str
) -> list[str]:
  """pytest in the venv with `plugin` (a module of this folder) and
  `options`, writing its junit xml to `junit`, quiet, on `jobs` xdist
  workers ('0': no xdist); the caller appends what to test. Shared with
  run_libraries.py."""
  cmd = [
      str(venv_python(venv_dir)),
      "-P",
      "-m",
      "pytest",
      "-p",
      "no:cacheprovider",
      "-p",
      plugin,
      *options,
      f"--junitxml={junit}",
      "-o",
      "junit_family=xunit1",
      "-q",
  ]
  if jobs != "0":
    cmd += ["-n", jobs]
  return cmd


def run_side(
    args, side: str, venv_dir: Path, test_path: Path, stem: str
) -> SideResult:
  """Run one test file on one side; its junit xml and log land in OUT."""
  junit, log = report_paths(args.out, stem, side)
  cmd = pytest_command(
      venv_dir,
      "jaxlib_alias",
      junit,
      args.jobs,
      f"--rootdir={args.checkout}",
      f"--confcutdir={args.checkout}",
      "-c",
      str(args.checkout / "pyproject.toml"),
  )
  cmd.append(str(test_path))
  env = dict(
      os.environ,
      PYTHONPATH=str(HERE),
      UPSTREAM_PYTREE_MODULE=PYTREE_MODULE[side],
      UPSTREAM_CHECKOUT=str(args.checkout),
      JAX_PLATFORMS="cpu",
      # jax's own flag for virtual CPU devices; the multi-device files
      # (pjit, shard_map, export) ask for 8 and skip tests without them,
      # the Pallas interpreters' skip with more than 1.
      JAX_NUM_CPU_DEVICES=str(args.cpu_devices),
  )
  env.pop("XLA_FLAGS", None)
  # The checkout is not the working directory: its jax/ and jaxlib/ sources
  # must not shadow the installed packages under test (with -P and pytest's
  # importlib import mode, nothing of it lands on sys.path).
  return run_pytest(cmd, env, args.out, args.timeout, log, junit, side)


def add_run_options(parser, jobs: str) -> None:
  """The options of how each side runs, shared with run_libraries.py."""
  parser.add_argument(
      "--jobs",
      default=jobs,
      help="pytest-xdist workers per run ('0': no xdist)",
  )
  parser.add_argument(
      "--only-ours",
      action="store_true",
      help="run only the custom side; stock's results come from OUT's "
      "junit xml of an earlier run",
  )
  parser.add_argument(
      "--timeout",
      type=int,
      default=None,
      help="seconds one pytest run may take",
  )


def run_pytest(
    cmd, env, cwd: Path, timeout: float, log: Path, junit: Path, side: str
) -> SideResult:
  """Run one pytest command, its output into `log`; the result from the junit
  xml it writes to `junit`."""
  started = time.monotonic()
  with open(log, "w") as log_file:
    try:
      subprocess.run(
          cmd,
          cwd=cwd,
          env=env,
          stdout=log_file,
          stderr=subprocess.STDOUT,
          timeout=timeout,
      )
    except subprocess.TimeoutExpired:
      return SideResult(note=f"timed out after {timeout}s")
  minutes = (time.monotonic() - started) / 60
  if not junit.exists():
    return SideResult(note=f"no report (see {log.name})")
  return side_from_junit(junit, side, f"in {minutes:.1f} min")


def side_from_junit(junit: Path, side: str, when: str) -> SideResult:
  result = SideResult(outcomes=read_junit(junit))
  print(f"  {side}: {result.counts()} pass/fail/skip {when}", flush=True)
  return result


def earlier_side(args, side: str, stem: str) -> SideResult:
  """One side's results as an earlier run left them in OUT."""
  junit = args.out / f"{stem}.{side}.xml"
  if not junit.exists():
    return SideResult(note=f"not run (no {junit.name} in {args.out})")
  return side_from_junit(junit, side, "(earlier run)")


def regressions(stock: SideResult, ours: SideResult) -> list[tuple[str, str]]:
  """Tests that pass on stock and do not on ours, with ours' first error."""
  found = []
  for test_id, outcome in stock.outcomes.items():
    if outcome.status != "passed":
      continue
    mine = ours.outcomes.get(test_id)
    if mine is None:
      found.append((test_id, "not run on ours"))
    elif mine.status != "passed":
      found.append((test_id, f"{mine.status}: {mine.message}"))
  return found


def file_report(
    stem: str,
    rel_path: str,
    results: dict[str, SideResult],
    lost: list[tuple[str, str]],
) -> str:
  lines = [
      f"# {rel_path}",
      "",
      f"- stock pass/fail/skip: {results['stock'].counts()}",
      f"- ours pass/fail/skip: {results['ours'].counts()}",
      f"- pass on stock, not on ours: {len(lost)}",
      "",
  ]
  lines += [f"- `{test_id}`: {why}" for test_id, why in lost]
  stock_failures = [
      (t, o.message)
      for t, o in results["stock"].outcomes.items()
      if o.status in ("failed", "error")
  ]
  if stock_failures:
    lines += ["", "Failing on stock too:", ""]
    lines += [f"- `{test_id}`: {why}" for test_id, why in stock_failures]
  return "\n".join(lines) + "\n"


def summary_row(
    rel_path: str, results: dict[str, SideResult], lost: list
) -> str:
  return (
      f"| {rel_path} | {results['stock'].counts()} | "
      f"{results['ours'].counts()} | {len(lost)} |"
  )


def write_summary(out: Path, rows: dict[str, str]) -> None:
  header = [
      "| file | stock pass / fail / skip | ours pass / fail / skip | "
      "pass on stock, not on ours |",
      "|---|---|---|---|",
  ]
  (out / "summary.md").write_text(
      "\n".join(header + list(rows.values())) + "\n"
  )


def read_summary(out: Path) -> dict[str, str]:
  """Rows of an earlier summary.md, so that runs of single files add up."""
  path = out / "summary.md"
  if not path.exists():
    return {}
  rows = {}
  for line in path.read_text().splitlines()[2:]:
    # A label may hold spaces (Optax's "optax-0.2.8/--pyargs optax").
    match = re.match(r"\| (.+?) \|", line)
    if match:
      rows[match.group(1)] = line
  return rows


def resolve_files(checkout: Path, names: list[str]) -> list[tuple[str, str]]:
  """(stem, path relative to the checkout) for each --files entry."""
  files = []
  for name in names:
    rel_path = DEFAULT_FILES.get(name, name)
    if not (checkout / rel_path).is_file():
      raise RunnerError(f"{name}: no {checkout / rel_path}")
    files.append((Path(rel_path).stem, rel_path))
  return files


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "checkout", type=Path, help="jax source tree at tag jax-v0.10.2"
  )
  parser.add_argument(
      "--files",
      default=",".join(DEFAULT_FILES),
      help="comma-separated names (api_test, pytree_test, "
      "...) or paths relative to the checkout "
      "(default: the seventeen files of DEFAULT_FILES)",
  )
  parser.add_argument(
      "--stock-venv", type=Path, default=REPO / ".venv-upstream-stock"
  )
  parser.add_argument(
      "--ours-venv", type=Path, default=REPO / ".venv-upstream-ours"
  )
  parser.add_argument(
      "--dist",
      type=Path,
      default=REPO / "dist",
      help="where build/build.py wrote the custom wheels",
  )
  parser.add_argument(
      "--out",
      type=Path,
      default=REPO / "build" / "upstream",
      help="folder for the reports, junit xml and logs",
  )
  add_run_options(parser, jobs="auto")
  parser.add_argument(
      "--cpu-devices",
      type=int,
      default=8,
      help="virtual CPU devices (default 8; the Pallas interpreters' "
      "tests need 1)",
  )
  args = parser.parse_args(argv)
  args.checkout = args.checkout.resolve()
  args.out = args.out.resolve()
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    files = resolve_files(
        args.checkout, [n for n in args.files.split(",") if n]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    venvs = prepare_venvs(args)
  except RunnerError as e:
    print(f"run.py: {e}", file=sys.stderr)
    return 2
  rows = read_summary(args.out)
  total_lost = 0
  for stem, rel_path in files:
    print(f"{rel_path}", flush=True)
    results = {
        side: (
            earlier_side(args, side, stem)
            if side == "stock" and args.only_ours
            else run_side(
                args, side, venvs[side], args.checkout / rel_path, stem
            )
        )
        for side in SIDES
    }
    lost = regressions(results["stock"], results["ours"])
    total_lost += len(lost)
    report = file_report(stem, rel_path, results, lost)
    (args.out / f"{stem}.md").write_text(report)
    print(report, flush=True)
    rows[rel_path] = summary_row(rel_path, results, lost)
    write_summary(args.out, rows)
  print((args.out / "summary.md").read_text())
  return 1 if total_lost else 0


if __name__ == "__main__":
  sys.exit(main())
