"""pip refuses the custom jax beside a stock jaxlib, at install time.

The custom jax imports ``jaxlib_patch``, which only the custom jaxlib has, so
its wheel requires ``jaxlib==<version>+<label>`` exactly. These tests ask
pip's resolver (``--dry-run``, offline: ``--no-index --find-links``) in the
environment named by JAXLIB_PATCH_STOCK_PYTHON, where stock jaxlib is
installed (tests/run.sh points it at the module tests' venv). The wheels are
those installed here, found in JAXLIB_PATCH_DIST (default: the repository's
dist/).
"""

import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys

import stock_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]


def stock_python():
  return stock_reference.stock_python("stock jaxlib")


def custom_wheel(name):
  """The dist/ wheel of the custom `name` installed in this environment."""
  dist = pathlib.Path(os.environ.get("JAXLIB_PATCH_DIST", ROOT / "dist"))
  version = importlib.metadata.version(name)
  assert "+" in version, f"{name} {version} here is not the custom build"
  python_tag = "py3" if name == "jax" else "cp%d%d" % sys.version_info[:2]
  found = sorted(dist.glob(f"{name}-{version}-{python_tag}-*.whl"))
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
