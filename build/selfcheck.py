"""Self-check of the installed custom jax/jaxlib wheels (run by build/build.py).

    python -I build/selfcheck.py --version V --label LABEL

Run it in an environment where the two wheels from dist/ are installed.  It
never calls jax.jit.  Importing this module does nothing.
"""

import argparse
import importlib.metadata
import inspect
import pathlib
import sys


def check(ok: bool, what: str) -> None:
  """Print one check's result; raise AssertionError if it failed."""
  print(f"  [{'ok' if ok else 'FAIL'}] {what}", flush=True)
  if not ok:
    raise AssertionError(what)


def check_install(version: str, label: str) -> None:
  """The wheels are ours: versions, pytree module, jaxlib's version.py."""
  import jax
  import jaxlib.version
  from jax._src.lib import pytree

  for dist in ("jax", "jaxlib"):
    found = importlib.metadata.version(dist)
    check(found == f"{version}+{label}", f"distribution {dist} is {found}")
  check(
      jaxlib.version.__version__ == version,
      f"jaxlib.version.__version__ is {jaxlib.version.__version__} (as published)",
  )
  check(
      pytree.__name__ == "jaxlib_patch.pytree",
      f"jax._src.lib.pytree is {pytree.__name__} from {pytree.__file__}",
  )
  check(
      "site-packages" in pytree.__file__,
      "jaxlib_patch comes from the installed wheel",
  )
  print(f"  jax {jax.__version__} from {jax.__file__}")


def check_relative_identities() -> bool:
  """The README's Parent/Child example through jax.tree.map; False if not available."""
  import jax
  import numpy as np

  params = inspect.signature(jax.tree_util.register_pytree_node).parameters
  if "preserve_relative_identities" not in params:
    return False

  # examples/, beside build/ in the checkout: `python -I` leaves it off
  # sys.path, and nothing in it shadows the installed jax.
  sys.path.insert(
      0, str(pathlib.Path(__file__).resolve().parents[1] / "examples")
  )
  from parent_child import Child, Parent, register

  register(jax.tree_util.register_pytree_node)

  child = Child(x=np.array(1.0))
  parent = Parent(left=child, right=child)
  out = jax.tree.map(lambda x: x, parent)
  check(
      out.left is out.right,
      "jax.tree.map(lambda x: x, parent): out.left is out.right",
  )
  check(
      out is not parent and out.left is not child,
      "out and out.left are new objects",
  )
  check(
      len(jax.tree.leaves(parent)) == 1,
      "the shared child's leaf is counted once",
  )
  return True


def main(argv=None) -> int:
  """Run the checks; the exit status is 0 only if all that ran passed."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      "--version", required=True, help="the published jax/jaxlib version"
  )
  parser.add_argument("--label", required=True, help="the local label")
  args = parser.parse_args(argv)
  print(f"selfcheck: Python {sys.version.split()[0]} at {sys.executable}")
  print("selfcheck: installation")
  check_install(args.version, args.label)
  print("selfcheck: relative identities")
  if check_relative_identities():
    print("selfcheck: all checks ran and passed")
  else:
    print(
        "  [skip] register_pytree_node has no preserve_relative_identities keyword yet"
    )
    print(
        "selfcheck: installation checks passed; relative-identity check skipped"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
