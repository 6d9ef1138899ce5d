"""How the module tests run code in threads and in child processes.

The runners live here once, so that every test gets the same interleaving,
the same module in its children and the same report of a crash: `run_child`
runs a program in a fresh interpreter, `isolated` runs a test in a forked
copy of this one, `run_in_threads` runs workers in threads. Also
`clear_as_the_collector_does`, the one way the tests call a type's tp_clear.
"""

import ctypes
import functools
import os
import signal
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


_progress_fd = None


def progress(message):
  """In an isolated child: records what is being tried (shown on a crash)."""
  if _progress_fd is not None:
    os.write(
        _progress_fd, b"P" + message.encode("utf-8", "replace")[:500] + b"\n"
    )


def isolated(fn):
  """Runs the test in a forked child; a crash fails it with the signal."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    global _progress_fd
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # Child.
      os.close(read_end)
      _progress_fd = write_end
      try:
        fn(*args, **kwargs)
        result = b"ok"
      except BaseException:  # noqa: BLE001 -- reported to the parent.
        result = traceback.format_exc().encode()
      os.write(write_end, b"R" + result.replace(b"\n", b"\x00") + b"\n")
      os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as inp:
      lines = inp.read().split(b"\n")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
      tried = [line[1:].decode() for line in lines if line.startswith(b"P")]
      pytest.fail(
          f"{fn.__name__} crashed the interpreter: "
          f"{signal.Signals(os.WTERMSIG(status)).name}"
          + (f" while trying: {tried[-1]}" if tried else ""),
          pytrace=False,
      )
    results = [line[1:] for line in lines if line.startswith(b"R")]
    assert results, "the isolated child exited without a result"
    if results[-1] != b"ok":
      pytest.fail(
          "in the isolated child:\n"
          + results[-1].replace(b"\x00", b"\n").decode(),
          pytrace=False,
      )

  return wrapper


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


def clear_as_the_collector_does(obj):
  """Calls `obj`'s tp_clear directly, as the collector does on a cycle it
  frees, with `obj` still alive after it: for the tests of calls on an object
  while it is cleared (from code that dropping its references runs) and
  after. Through the collector, the moment is the collector's to choose."""
  get_slot = ctypes.pythonapi.PyType_GetSlot
  get_slot.restype = ctypes.c_void_p
  get_slot.argtypes = [ctypes.py_object, ctypes.c_int]
  py_tp_clear = 51  # CPython's typeslots.h
  # PYFUNCTYPE: tp_clear runs with the GIL held, as under the collector.
  clear = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)(
      get_slot(type(obj), py_tp_clear)
  )
  assert clear(obj) == 0


def by_address(address):
  """The live object at `address` (its id), as a new strong reference: how a
  callback reaches an object it must not keep alive."""
  return ctypes.cast(address, ctypes.py_object).value
