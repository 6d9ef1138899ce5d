"""Which patches of the jax series delete lines that an earlier patch added.

    python build/series_undos.py [--version V] [--checkout DIR]

Checks the series out as ``patch_series.py checkout`` does (into a temporary
folder, or takes DIR, a checkout made so) and, for each commit, asks ``git blame`` of its parent
which commit wrote each line the commit deletes or rewrites. A line written
by an earlier patch (not by stock jax) is an undo: a reviewer reads it twice,
once as added and once as taken back. Prints one line per (earlier, later)
pair with the count of such lines, and exits 1 if there is any.
"""

import argparse
import collections
import re
import sys
from pathlib import Path

from build_common import DEFAULT_VERSION
from patch_series import STOCK_SUBJECT, checked_out, git

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? ")


def undone_lines(folder: Path, version: str) -> collections.Counter:
  """{(earlier, later): lines}: patch numbers counted from 1."""
  log = git(folder, "log", "--reverse", "--format=%H %s").splitlines()
  commits = [
      line.split(" ", 1)[0]
      for line in log
      if line.split(" ", 1)[1] != STOCK_SUBJECT.format(version=version)
  ]
  number = {commit: n for n, commit in enumerate(commits, 1)}
  pairs = collections.Counter()
  for later, commit in enumerate(commits, 1):
    path = None
    for line in git(folder, "diff", "-U0", f"{commit}^", commit).splitlines():
      if line.startswith("--- "):
        path = line[6:] if line.startswith("--- a/") else None
        continue
      hunk = HUNK.match(line)
      if not hunk or path is None or hunk.group(2) == "0":
        continue
      first = int(hunk.group(1))
      last = first + int(hunk.group(2) or 1) - 1
      blame = git(
          folder,
          "blame",
          "-l",
          "-s",
          "-L",
          f"{first},{last}",
          f"{commit}^",
          "--",
          path,
      )
      for row in blame.splitlines():
        written_by = number.get(row.split(" ", 1)[0].lstrip("^"))
        if written_by is not None:
          pairs[written_by, later] += 1
  return pairs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--version", default=DEFAULT_VERSION)
  parser.add_argument(
      "--checkout",
      type=Path,
      help="an existing checkout (patch_series.py checkout) to check as it is",
  )
  args = parser.parse_args()
  with checked_out(args.version, args.checkout) as folder:
    pairs = undone_lines(folder, args.version)
  for (earlier, later), lines in sorted(pairs.items()):
    print(f"{earlier:04d} -> {later:04d}: {lines} lines")
  print(f"series_undos: {len(pairs)} pairs, {sum(pairs.values())} lines")
  sys.exit(1 if pairs else 0)


if __name__ == "__main__":
  main()
