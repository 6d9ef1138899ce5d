"""How the module tests run code in threads and in child processes.

Both runners live here once, so that every test gets the same interleaving,
the same module in its children and the same report of a crash.
"""

import os
import subprocess
import sys
import textwrap
import threading
import traceback

import pytest

from jaxlib_patch import pytree as pt

# The folder the module under test was imported from: children import it from
# there, whichever build (site-packages, a build folder) this run tests.
MODULE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(pt.__file__)))


def child_env():
  """This process's environment, with the module under test first on the
  path."""
  env = dict(os.environ)
  env["PYTHONPATH"] = MODULE_DIR + os.pathsep + env.get("PYTHONPATH", "")
  return env


def run_child(code, timeout=600):
  """Runs `code` in a fresh interpreter that imports this same module and
  returns what it printed; a crash or a non-zero exit fails the test, not
  the run."""
  proc = subprocess.run(
      [sys.executable, "-P", "-c", textwrap.dedent(code)],
      capture_output=True,
      text=True,
      timeout=timeout,
      env=child_env(),
  )
  if proc.returncode != 0:
    how = (
        f"signal {-proc.returncode}"
        if proc.returncode < 0
        else f"exit status {proc.returncode}"
    )
    pytest.fail(
        f"child process failed ({how}):\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-6000:]}",
        pytrace=False,
    )
  return proc.stdout


def run_in_threads(worker, count, timeout):
  """Runs `worker(k)` for k in range(count), each in a thread of its own, all
  released at once and switching every few microseconds so that they
  interleave as finely as they can. Returns (k, traceback) for each worker
  that raised; a thread still running after `timeout` seconds fails the
  test."""
  start = threading.Barrier(count)
  errors = []

  def run(k):
    try:
      start.wait()
      worker(k)
    except BaseException:  # noqa: BLE001 -- returned to the test.
      errors.append((k, traceback.format_exc()))

  old = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)
  try:
    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads)
  finally:
    sys.setswitchinterval(old)
  return errors
