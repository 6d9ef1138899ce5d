"""How the side-by-side benchmarks run their children.

Patched and stock jax cannot be imported in one process, so bench_jit.py,
bench_peers.py and count_jit_instructions.py (and count_instructions.py,
for callgrind's sake) each run their own script again as a child: under the
interpreter of stock jax and jaxlib, and under the interpreter of the
custom wheels. This module names the two interpreters (the command-line
options every such benchmark takes), the order the children take turns in,
and one child's run: its command line, its failure, and the JSON result
that it prints as its last line of output.
"""

import json
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIDES = ("stock", "patched")


def interpreter_path(path):
  """An interpreter given on the command line, made absolute where it is a
  relative path: children run from another folder (`/`), so that the
  checkout cannot shadow the installed packages. A bare name is looked up on
  PATH as it is."""
  return os.path.abspath(path) if os.sep in path else path


def add_interpreter_arguments(parser):
  """--stock-python (default $JAXLIB_PATCH_STOCK_PYTHON, else the test venv)
  and --patched-python (default the venv of the custom wheels)."""
  parser.add_argument(
      "--stock-python",
      type=interpreter_path,
      default=os.environ.get(
          "JAXLIB_PATCH_STOCK_PYTHON", str(ROOT / ".venv-test/bin/python")
      ),
      help="interpreter with stock jax and jaxlib (default: "
      "$JAXLIB_PATCH_STOCK_PYTHON, else the checkout's .venv-test)",
  )
  parser.add_argument(
      "--patched-python",
      type=interpreter_path,
      default=str(ROOT / ".venv-jax/bin/python"),
      help="interpreter with the custom wheels (default: the checkout's "
      ".venv-jax)",
  )


def interpreter(args, side):
  """The interpreter of `side` ("stock" or "patched") that `args` names."""
  return args.stock_python if side == "stock" else args.patched_python


def alternating(runs):
  """(k, side) for `runs` runs of each side, in the order stock, patched,
  patched, stock, stock, ...: run k of one side is next in time to run k of
  the other, so that load drifting over the runs weighs on both alike."""
  for k in range(runs):
    for side in SIDES if k % 2 == 0 else SIDES[::-1]:
      yield k, side


def child_command(python, script, *options, python_flags=()):
  """The command line that runs `script` as a child under `python`."""
  return [
      str(python),
      *python_flags,
      os.path.abspath(script),
      *(str(option) for option in options),
  ]


class ChildFailed(SystemExit):
  """A child exited with an error. A SystemExit, so that a benchmark ends
  with its message; a caller that goes on after a failed child catches it."""

  def __init__(self, what, command, returncode, output):
    super().__init__(
        f"{what} exited {returncode}: {' '.join(command)}\n{output}"
    )
    self.returncode = returncode
    self.output = output


def run_child(command, what, **options):
  """Runs `command` to its end and returns its standard output; raises
  ChildFailed, with the child's output, if it fails."""
  done = subprocess.run(command, capture_output=True, text=True, **options)
  if done.returncode:
    output = (done.stdout + done.stderr).strip()
    raise ChildFailed(what, command, done.returncode, output)
  return done.stdout


def print_result(result):
  """A child's result, printed as the last line of its output."""
  print(json.dumps(result), flush=True)


def last_result(stdout):
  """The result that a child printed with `print_result`."""
  return json.loads(stdout.splitlines()[-1])


def run_json_child(command, what, **options):
  """`run_child`, then the result the child printed."""
  return last_result(run_child(command, what, **options))
