"""The tree the jax patch series applies to, compared with the one recorded.

    python build/series_tree.py [--version V] [--checkout DIR] [--write]

Checks the series out as ``patch_series.py checkout`` does, into a
temporary folder (or takes DIR, a checkout made so, at its last commit),
and compares git's hash of the applied tree (every file
of jax after the last patch: content and mode, not history) with the hash
in ``jax_patch/V/applied-tree``. A reorder or re-split of the series must
leave it as it is, so that it changes no behaviour; a patch that changes
what jax does records the new hash with ``--write``, in the same commit.
Exits 1 if the two differ.
"""

import argparse
import sys
from pathlib import Path

from build_common import DEFAULT_VERSION, REPO
from patch_series import checked_out, git


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--version", default=DEFAULT_VERSION)
  parser.add_argument(
      "--checkout",
      type=Path,
      help="an existing checkout (patch_series.py checkout) to check as it is",
  )
  parser.add_argument("--write", action="store_true", help="record the hash")
  args = parser.parse_args()
  record = REPO / "jax_patch" / args.version / "applied-tree"
  with checked_out(args.version, args.checkout) as folder:
    tree = git(folder, "rev-parse", "HEAD^{tree}").strip()
  if args.write:
    record.write_text(tree + "\n")
  recorded = record.read_text().strip()
  print(f"series_tree: applied tree {tree}, recorded {recorded}")
  sys.exit(0 if tree == recorded else 1)


if __name__ == "__main__":
  main()
