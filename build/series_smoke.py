"""Each commit of the jax patch series, checked out alone, runs JAX.

    python build/series_smoke.py [--version V] [--python PY] [--checkout DIR]

Checks the series out as ``patch_series.py checkout`` does, into a temporary
folder (or takes DIR, a checkout made so), and at each commit from the first
patch on runs SMOKE with ``PY`` (default: this interpreter), the checkout
first on its path: ``jax.jit``, ``jax.grad``, ``jax.vmap``, ``lax.scan`` and
``jax.tree.map`` on a pair that holds one object twice (opted in from the
patch that brings the flag on), warnings as errors, and from the flag on a
``jax.tree.map`` that splits the tie, which must warn. A commit passes when
every call runs and computes stock's values; whether it keeps the tie is
printed beside, since the patches that keep it come after those that make
room for it. The checkout is left at its last commit. ``PY`` must import this
repository's module (``jaxlib_patch``) and jaxlib: the venv of
``tests/run.sh``'s JAX-level tests, say. Exits 1 if a commit fails.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from build_common import DEFAULT_VERSION
from patch_series import STOCK_SUBJECT, checked_out, git

# Run at each commit. Opts in through jax's registration where the commit
# has the flag; before it, registers the class plainly (stock's values, no
# tie to keep).
SMOKE = r"""
import dataclasses, inspect, warnings
warnings.simplefilter("error")
import jax, jax.numpy as jnp

@dataclasses.dataclass
class Param:
  value: object

flag = {}
if "preserve_relative_identities" in inspect.signature(
    jax.tree_util.register_dataclass).parameters:
  flag = dict(preserve_relative_identities=True)
jax.tree_util.register_dataclass(Param, ["value"], [], **flag)

p = Param(jnp.arange(3.0))
pair = (p, p)
kept = {}

out = jax.jit(lambda t: (t[0], Param(t[1].value * 2)))(pair)
assert (out[0].value == p.value).all() and (out[1].value == 2 * p.value).all()
kept["jit"] = jax.jit(lambda t: t)(pair)
grad = jax.grad(lambda t: jnp.sum(t[0].value * 2 + t[1].value * 3))(pair)
assert sum(float(g.value[0]) for g in {id(g): g for g in grad}.values()) == 5
kept["grad"] = grad
mapped = jax.vmap(lambda t: t)((Param(jnp.ones((2, 3))),) * 2)
kept["vmap"] = mapped
carry, _ = jax.lax.scan(lambda c, _: (c, None), pair, None, length=2)
assert (carry[0].value == p.value).all()
kept["scan"] = carry
plus = jax.tree.map(lambda x: x + 1, pair)
assert (plus[1].value == p.value + 1).all()
kept["tree.map"] = plus
if flag:  # From the flag on, a map that splits the tie tells it.
  with warnings.catch_warnings(record=True) as told:
    warnings.simplefilter("always")
    split = jax.tree.map(lambda x, s: x * s, pair, (Param(1.0), Param(2.0)))
  assert (split[1].value == 2 * p.value).all() and split[0] is not split[1]
  assert [w for w in told if "split a tie" in str(w.message)], told
print(" ".join(k for k, t in kept.items() if t[0] is t[1]) or "-")
"""


def smoke(folder: Path, version: str, python: str) -> int:
  log = git(folder, "log", "--reverse", "--format=%H %s").splitlines()
  subjects = [line.split(" ", 1) for line in log]
  stock = STOCK_SUBJECT.format(version=version)
  failed = 0
  for number, (commit, subject) in enumerate(subjects):
    if subject == stock:
      continue
    git(folder, "checkout", "-q", commit)
    done = subprocess.run(
        [python, "-c", SMOKE],
        cwd=tempfile.gettempdir(),
        env=dict(os.environ, PYTHONPATH=str(folder), JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode == 0:
      print(f"{number:04d} {subject}: ran; ties kept by: {done.stdout.strip()}")
    else:
      failed += 1
      # The exception's own line: the last that names an error, not the
      # note jax's traceback filtering appends.
      lines = done.stderr.strip().splitlines() or ["no output"]
      named = [
          l for l in lines if re.match(r"\w+(\.\w+)*(Error|Exception)\b", l)
      ]
      error = (named or lines)[-1][:200]
      print(f"{number:04d} {subject}: FAILED: {error}")
  git(folder, "checkout", "-q", subjects[-1][0])
  print(
      f"series_smoke: {len(subjects) - 1 - failed} of {len(subjects) - 1} "
      "commits run JAX on a tied pair"
  )
  return 1 if failed else 0


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--version", default=DEFAULT_VERSION)
  parser.add_argument("--python", default=sys.executable)
  parser.add_argument(
      "--checkout",
      type=Path,
      help="an existing checkout (patch_series.py checkout) to check as it is",
  )
  args = parser.parse_args()
  with checked_out(args.version, args.checkout) as folder:
    sys.exit(smoke(folder, args.version, args.python))


if __name__ == "__main__":
  main()
