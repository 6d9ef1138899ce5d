"""The proposal's sizes of the C++, counted from jaxlib_patch/ itself.

doc_tables.py calls these for the generated parts of the documents whose
source is ``jaxlib_patch``: the total that ``wc -l jaxlib_patch/*.cc
jaxlib_patch/*.h`` prints, and the "lines" column of the proposal's table
of the C++ by concern. The table's other columns (the concern, what of it
upstream needs) are prose and stay as written; each row names its files in
backticks in the second column, and every ``.cc`` and ``.h`` file must be in
exactly one row, so that a new file fails the check until a row names it.
"""

import pathlib
import re

SUFFIXES = (".cc", ".h")


class SizesError(Exception):
  """The table does not name the C++ files as they are."""


def cxx_files(folder):
  return sorted(
      p.name for p in pathlib.Path(folder).iterdir() if p.suffix in SUFFIXES
  )


def lines_of(folder, names):
  folder = pathlib.Path(folder)
  return sum(len((folder / n).read_text().splitlines()) for n in names)


def total_phrase(folder, _body=None):
  """What ``wc -l`` says of all the C++, as the proposal quotes it."""
  total = lines_of(folder, cxx_files(folder))
  return f"`wc -l jaxlib_patch/*.cc jaxlib_patch/*.h`, {total} lines"


def sizes_table(folder, body):
  """`body` (a Markdown table) with each row's lines counted again."""
  every = set(cxx_files(folder))
  named = []
  out = []
  for line in body.split("\n"):
    cells = line.split("|")
    if not line.startswith("|") or len(cells) < 5:
      out.append(line)
      continue
    names = re.findall(r"`([\w.]+\.(?:cc|h))`", cells[2])
    if not names:
      out.append(line)  # the header or the rule under it
      continue
    missing = [n for n in names if n not in every]
    if missing:
      raise SizesError(f"the table names files that do not exist: {missing}")
    named += names
    cells[3] = f" {lines_of(folder, names)} "
    out.append("|".join(cells))
  twice = sorted({n for n in named if named.count(n) > 1})
  unnamed = sorted(every - set(named))
  if twice or unnamed:
    raise SizesError(
        f"every C++ file must be in one row: in two rows {twice}, in none "
        f"{unnamed} (add it to the row of its concern)"
    )
  return "\n".join(out)
