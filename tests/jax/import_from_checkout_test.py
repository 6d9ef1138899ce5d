"""`import jax` works in the checkout's root, where a new user starts.

A program started there has the checkout's root first on its path, so the
source folder `jaxlib_patch/` (which holds no built module) shadows the
installed package of that name; the package's `__init__.py` makes every
folder of its name on the path part of it, so `pytree` is found in the
installed one.
"""

import os
import pathlib
import subprocess
import sys

import stock_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Run by this environment's interpreter, which has the custom wheels.
PROGRAM = (
    "import jax, jaxlib_patch, jaxlib_patch.pytree as p;"
    "print(jaxlib_patch.__file__);"
    "print(p.__file__);"
    "print(jax.jit(lambda x: x + 1)(1))"
)


def run_in(folder):
  env = stock_reference.child_environment()
  env.pop("PYTHONPATH", None)  # As a user's shell has it.
  return subprocess.run(
      [sys.executable, "-c", PROGRAM],
      cwd=folder,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )


def test_import_jax_in_the_checkouts_root():
  done = run_in(ROOT)
  assert done.returncode == 0, done.stderr
  package, module, result = done.stdout.split()
  # The source folder is the package the program found first ...
  assert pathlib.Path(package).parent == ROOT / "jaxlib_patch"
  # ... and the module came from the installed package.
  assert not pathlib.Path(module).is_relative_to(ROOT / "jaxlib_patch")
  assert result == "2"


def test_import_jax_elsewhere(tmp_path):
  done = run_in(tmp_path)
  assert done.returncode == 0, done.stderr
  package, module, _ = done.stdout.split()
  assert pathlib.Path(package).parent == pathlib.Path(module).parent
