#!/usr/bin/env python3
"""Run Equinox's, Flax NNX's and Optax's test suites on stock jax and on ours.

Usage:
  python3 tests/upstream/run_libraries.py [--equinox EQX_CHECKOUT]
      [--flax FLAX_CHECKOUT] [--optax] [--wheels DIR] [--stock-venv DIR]
      [--ours-venv DIR] [--out DIR] [--jobs N] [--only-ours]

EQX_CHECKOUT is an Equinox source tree at tag v0.13.8 (its tests/ and
pyproject.toml are read), FLAX_CHECKOUT a Flax tree at v0.12.8 (tests/nnx and
pyproject.toml); a suite whose checkout is not given is not run. Neither
checkout may hold the library's own package folder: pytest puts a checkout's
root on sys.path, and the suite must test the release installed from PyPI.
Optax ships its tests inside its wheel, so ``--optax`` needs no checkout: its
suite runs as Optax's own CI runs it, ``pytest --pyargs optax``, from a folder
with no pytest configuration.

Each suite runs once in the stock virtual environment (jax and jaxlib
0.10.2 from PyPI) and once in the custom one (the wheels of WHEELS over
stock's, --no-deps), there with the library's base classes opted in by the
pytest plugin opt_in_plugin.py (``JAXLIB_PATCH_OPT_IN``). Optax has no base
class to opt in (its states are named tuples), so its suite checks that a
user of the custom wheels who opts nothing in sees stock behaviour. Both
environments get the library at its exact version and its test requirements when
missing. For each suite the script prints both sides' pass/fail/skip counts
and every test that passes on stock and not on ours with the first line of
its error, and writes the same into OUT/<suite>.md beside the junit xml and
pytest log of each side; OUT/summary.md gathers the table. The helpers for
junit, venvs and reports are run.py's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import run
from run import RunnerError, SideResult, venv_python

OPT_IN_VAR = "JAXLIB_PATCH_OPT_IN"


@dataclass(frozen=True)
class Suite:
  """One library's test suite."""

  distribution: str  # the package on PyPI
  version: str
  package: str  # its import name, which the checkout must not hold
  # Relative to the checkout; None: the tests ship in the installed package.
  test_path: str | None
  opt_in: str  # the value of JAXLIB_PATCH_OPT_IN on our side
  requirements: tuple[str, ...]


SUITES = {
    # Equinox's `tests` dependency group (jaxlib is pinned already) and
    # pytest-xdist for -n.
    "equinox": Suite(
        "equinox",
        "0.13.8",
        "equinox",
        "tests",
        "equinox",
        ("beartype", "optax", "pytest", "pytest-xdist"),
    ),
    # Of Flax's `testing` extra, what tests/nnx imports; the rest of it
    # (tensorflow, torch, gymnasium, ...) serves linen and the examples.
    "nnx": Suite(
        "flax",
        "0.12.8",
        "flax",
        "tests/nnx",
        "nnx",
        ("cloudpickle", "pytest", "pytest-xdist"),
    ),
    # Optax's `test` extra, with Flax at the version the nnx suite pins.
    "optax": Suite(
        "optax",
        "0.2.8",
        "optax",
        None,
        "",
        ("flax==0.12.8", "scipy", "scikit-learn", "pytest", "pytest-xdist"),
    ),
}


def installed_version(venv_dir: Path, distribution: str) -> str:
  """The version of a distribution in a venv, "" when it is missing."""
  code = (
      "import importlib.metadata as m, sys\n"
      "try: print(m.version(sys.argv[1]))\n"
      "except m.PackageNotFoundError: print('')"
  )
  return subprocess.run(
      [str(venv_python(venv_dir)), "-c", code, distribution],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()


def prepare_venvs(args, suites: list[Suite]) -> dict[str, Path]:
  """Create the two environments when missing; the custom wheels every run."""
  venvs = {"stock": args.stock_venv, "ours": args.ours_venv}
  for side, venv_dir in venvs.items():
    if side == "stock" and args.only_ours:
      continue
    if not venv_python(venv_dir).exists():
      print(f"creating the {side} virtual environment {venv_dir}", flush=True)
      venv.create(venv_dir, with_pip=True)
    # Stock jax first on both sides: the libraries' dependencies resolve
    # against it, so the two sides get the same versions of everything else.
    wanted = [f"jax=={run.JAX_VERSION}", f"jaxlib=={run.JAX_VERSION}"]
    for suite in suites:
      if installed_version(venv_dir, suite.distribution) != suite.version:
        wanted += [f"{suite.distribution}=={suite.version}"]
      # One suite's library can be another's requirement (Equinox's tests
      # install Optax), so each requirement is looked up on its own.
      wanted += [
          r
          for r in suite.requirements
          if installed_version(venv_dir, r.partition("==")[0]) == ""
      ]
    if installed_version(venv_dir, "jaxlib") == "":
      run.pip_install(venv_dir, *wanted)
    elif len(wanted) > 2:
      # Keep what is installed of jax (the custom wheels, on our side).
      run.pip_install(venv_dir, *wanted[2:])
  run.install_custom_wheels(venvs["ours"], args.wheels)
  return venvs


def run_side(
    args, name: str, suite: Suite, side: str, venv_dir: Path
) -> SideResult:
  """Run one suite on one side; its junit xml and log land in OUT."""
  checkout = args.checkouts.get(name)
  junit, log = run.report_paths(args.out, name, side)
  config = [] if checkout is None else ["-c", str(checkout / "pyproject.toml")]
  cmd = run.pytest_command(
      venv_dir,
      "opt_in_plugin",
      junit,
      args.jobs,
      # A suite without a checkout runs from OUT, which holds no configuration.
      f"--rootdir={checkout or args.out}",
      *config,
  )
  if suite.test_path is None:
    cmd += ["--pyargs", suite.package]
  else:
    cmd.append(str(checkout / suite.test_path))
  env = dict(
      os.environ,
      PYTHONPATH=str(run.HERE),
      JAX_PLATFORMS="cpu",
      **{OPT_IN_VAR: suite.opt_in if side == "ours" else ""},
  )
  env.pop("XLA_FLAGS", None)
  return run.run_pytest(cmd, env, args.out, args.timeout, log, junit, side)


def check_checkout(name: str, suite: Suite, checkout: Path) -> None:
  if not (checkout / suite.test_path).is_dir():
    raise RunnerError(f"{name}: no {checkout / suite.test_path}")
  if not (checkout / "pyproject.toml").is_file():
    raise RunnerError(f"{name}: no {checkout / 'pyproject.toml'}")
  if (checkout / suite.package).exists():
    raise RunnerError(
        f"{name}: {checkout / suite.package} would shadow the installed "
        f"{suite.distribution} {suite.version}; use a checkout with only "
        f"{suite.test_path} and pyproject.toml"
    )


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--equinox", type=Path, help="Equinox source tree at tag v0.13.8"
  )
  parser.add_argument(
      "--flax", type=Path, help="Flax source tree at tag v0.12.8"
  )
  parser.add_argument(
      "--optax",
      action="store_true",
      help="run Optax 0.2.8's suite, which its wheel carries",
  )
  parser.add_argument(
      "--wheels",
      type=Path,
      default=run.REPO / "dist",
      help="folder holding the custom jax and jaxlib wheels",
  )
  # Outside the repository, beside the checkout (docs/compatibility.md).
  for side, holding in (
      ("stock", "stock jax and jaxlib"),
      ("ours", "the custom wheels"),
  ):
    parser.add_argument(
        f"--{side}-venv",
        type=Path,
        default=run.REPO.parent / f"venv-lib-{side}",
        help=f"venv of {holding} (default: venv-lib-{side} beside the "
        "checkout)",
    )
  parser.add_argument(
      "--out",
      type=Path,
      default=run.REPO / "build" / "upstream-libraries",
      help="folder for the reports, junit xml and logs",
  )
  run.add_run_options(parser, jobs="2")
  args = parser.parse_args(argv)
  given = {"equinox": args.equinox, "nnx": args.flax}
  args.checkouts = {n: p.resolve() for n, p in given.items() if p is not None}
  args.suites = list(args.checkouts) + (["optax"] if args.optax else [])
  args.out = args.out.resolve()
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  names = args.suites
  try:
    if not names:
      raise RunnerError("give --equinox, --flax and/or --optax")
    for name, checkout in args.checkouts.items():
      check_checkout(name, SUITES[name], checkout)
    args.out.mkdir(parents=True, exist_ok=True)
    venvs = prepare_venvs(args, [SUITES[n] for n in names])
  except RunnerError as e:
    print(f"run_libraries.py: {e}", file=sys.stderr)
    return 2
  rows = run.read_summary(args.out)
  total_lost = 0
  for name in names:
    suite = SUITES[name]
    where = suite.test_path or f"--pyargs {suite.package}"
    label = f"{suite.distribution}-{suite.version}/{where}"
    print(label, flush=True)
    results = {
        side: (
            run.earlier_side(args, side, name)
            if side == "stock" and args.only_ours
            else run_side(args, name, suite, side, venvs[side])
        )
        for side in run.SIDES
    }
    lost = run.regressions(results["stock"], results["ours"])
    total_lost += len(lost)
    report = run.file_report(name, label, results, lost)
    (args.out / f"{name}.md").write_text(report)
    print(report, flush=True)
    rows[label] = run.summary_row(label, results, lost)
    run.write_summary(args.out, rows)
  print((args.out / "summary.md").read_text())
  return 1 if total_lost else 0


if __name__ == "__main__":
  sys.exit(main())
