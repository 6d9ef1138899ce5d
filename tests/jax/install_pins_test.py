"""pip refuses the custom jax beside a stock jaxlib, at install time.

The custom jax imports ``jaxlib_patch``, which only the custom jaxlib has, so
its wheel requires ``jaxlib==<version>+<label>`` exactly. These tests ask
pip's resolver (``--dry-run``, offline: ``--no-index --find-links``) in the
environment named by JAXLIB_PATCH_STOCK_PYTHON, where stock jaxlib is
installed (tests/run.sh points it at the module tests' venv). The wheels are
those installed here, found in JAXLIB_PATCH_DIST (default: the repository's
dist/).

The way back to stock JAX that docs/guide.md gives is asked of pip here,
where the custom wheels are installed, against wheels of the stock version
that hold metadata only (all a --dry-run reads).
"""

import importlib.metadata
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest

import docs_test
import stock_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]


def stock_python():
  return stock_reference.stock_python("stock jaxlib")


def custom_wheel(name):
  """The dist/ wheel of the custom `name` installed in this environment. A
  folder named by JAXLIB_PATCH_DIST may lack the jaxlib wheel (a TPU machine
  gets the custom jax over its own stock jaxlib files): the test is skipped."""
  named = os.environ.get("JAXLIB_PATCH_DIST")
  dist = pathlib.Path(named or ROOT / "dist")
  version = importlib.metadata.version(name)
  assert "+" in version, f"{name} {version} here is not the custom build"
  python_tag = "py3" if name == "jax" else "cp%d%d" % sys.version_info[:2]
  found = sorted(dist.glob(f"{name}-{version}-{python_tag}-*.whl"))
  if named and not found:
    pytest.skip(f"JAXLIB_PATCH_DIST={named} holds no {name} {version} wheel")
  assert (
      len(found) == 1
  ), f"{dist}: expected one {name} {version} wheel, {found}"
  return found[0]


def resolve(requirement, wheels, tmp_path):
  """pip's dry-run install of `requirement` in the stock environment, offline,
  with only `wheels` to pick from; returns pip's finished process."""
  links = tmp_path / "links"
  links.mkdir()
  for wheel in wheels:
    shutil.copy(wheel, links / wheel.name)
  # -I: the stock environment alone, whatever PYTHON* variables this
  # process has; --isolated: no pip configuration, so no other index or wheel
  # folder.
  return subprocess.run(
      [
          stock_python(),
          "-I",
          "-m",
          "pip",
          "--isolated",
          "install",
          "--dry-run",
          "--no-index",
          "--find-links",
          str(links),
          requirement,
      ],
      capture_output=True,
      text=True,
      timeout=300,
  )


def test_stock_jaxlib_is_installed_in_the_reference_environment():
  out = subprocess.run(
      [
          stock_python(),
          "-I",
          "-c",
          "import importlib.metadata as m; print(m.version('jaxlib'))",
      ],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.strip()
  assert "+" not in out, f"jaxlib {out} there is not stock"


def test_pip_refuses_the_custom_jax_over_a_stock_jaxlib(tmp_path):
  jax_wheel = custom_wheel("jax")
  version = importlib.metadata.version("jax")
  done = resolve(f"jax=={version}", [jax_wheel], tmp_path)
  assert done.returncode != 0, (
      "pip would install the custom jax beside stock jaxlib:\n" + done.stdout
  )
  assert f"jaxlib=={version}" in done.stdout + done.stderr, done.stderr


def test_pip_installs_the_custom_jax_with_the_custom_jaxlib(tmp_path):
  version = importlib.metadata.version("jax")
  done = resolve(
      f"jax=={version}", [custom_wheel("jax"), custom_wheel("jaxlib")], tmp_path
  )
  assert done.returncode == 0, done.stdout + done.stderr
  would_install = done.stdout.rsplit("Would install", 1)[-1].split()
  assert sorted(would_install) == [
      f"jax-{version}",
      f"jaxlib-{version}",
  ], done.stdout


def test_every_jaxlib_requirement_of_the_custom_jax_is_the_exact_pin():
  version = importlib.metadata.version("jax")
  jaxlib_lines = [
      r
      for r in importlib.metadata.requires("jax")
      if r.split(";")[0].strip().startswith("jaxlib")
  ]
  assert jaxlib_lines, importlib.metadata.requires("jax")
  for line in jaxlib_lines:
    assert line.split(";")[0].strip() == f"jaxlib=={version}", line


def _metadata_only_wheel(folder, name, version):
  """A wheel of `name` `version` that holds its metadata only: all that
  pip's resolver reads in a --dry-run."""
  dist_info = f"{name}-{version}.dist-info"
  wheel = folder / f"{name}-{version}-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as archive:
    archive.writestr(
        f"{dist_info}/METADATA",
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    )
    archive.writestr(
        f"{dist_info}/WHEEL",
        "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    )
    archive.writestr(f"{dist_info}/RECORD", "")
  return wheel


def _guide_command(marker, doc="docs/guide.md"):
  """The `pip install` line of `doc`'s ```sh blocks that holds `marker`, as
  arguments after `pip install`."""
  lines = [
      line
      for block in docs_test.fenced_blocks((ROOT / doc).read_text())
      if block.language == "sh"
      for line in block.source.splitlines()
      if marker in line
  ]
  assert len(lines) == 1, lines
  words = shlex.split(lines[0].split("#")[0])
  assert words[:2] == ["pip", "install"], lines[0]
  return words[2:]


def test_the_readme_gives_the_guides_way_back():
  assert _guide_command("--force-reinstall", "README.md") == _guide_command(
      "--force-reinstall"
  )


def test_the_guides_way_back_to_stock_jax(tmp_path):
  # Here, where the custom wheels are installed, against stock-versioned
  # wheels: a plain pin is satisfied by 0.10.2+relid; the guide's command
  # replaces both packages.
  version = importlib.metadata.version("jax").split("+")[0]
  for name in ("jax", "jaxlib"):
    _metadata_only_wheel(tmp_path, name, version)

  def dry_run(*arguments):
    return subprocess.run(
        [sys.executable, "-I", "-m", "pip", "--isolated", "install"]
        + ["--dry-run", "--no-index", "--find-links", str(tmp_path)]
        + list(arguments),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout

  plain = dry_run(f"jax=={version}", f"jaxlib=={version}")
  assert "Would install" not in plain, plain
  assert f"Requirement already satisfied: jax=={version}" in plain, plain
  command = _guide_command("--force-reinstall")
  assert f"jax=={version}" in command and f"jaxlib=={version}" in command
  forced = dry_run(*command)
  would_install = forced.rsplit("Would install", 1)[-1].split()
  assert sorted(would_install) == [f"jax-{version}", f"jaxlib-{version}"]


def test_the_installed_jax_is_built_from_the_series_of_jax_patch():
  # tests/run.sh --quick builds the jax wheel again when jax_patch/ changed:
  # the JAX-level tests must never judge a stale series.
  sys.path.insert(0, str(ROOT / "build"))
  try:
    import jax_series  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  recorded = importlib.metadata.distribution("jax").read_text(
      jax_series.SERIES_DIGEST_FILE
  )
  version = (ROOT / "VERSION").read_text().strip()
  assert recorded is not None, "the installed jax records no series"
  assert recorded.strip() == jax_series.series_digest(version), (
      "the installed jax wheel was built from another jax_patch/ series: "
      "run build/build.py --jax-only and install it"
  )
