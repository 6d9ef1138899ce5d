"""The patch series' sizes, counted from jax_patch/ itself.

doc_tables.py calls these for the generated parts whose source is a folder
of the series (``jax_patch/0.10.2``): the size columns of
jax-integration.md's table of patches, and the proposal's phrase for the
whole series. A patch's size is what its diff adds and deletes (lines that
start with ``+`` or ``-``, its file headers aside) and the files it
touches; its description is not counted. The table's other columns (the
patch, what it does) are prose and stay as written; each row names its
patch in backticks in the first column, and every patch of the folder
must be in exactly one row, so that a new patch fails the check until a
row names it.
"""

import pathlib
import re


class SeriesError(Exception):
  """The table does not name the patches as they are."""


def patches(folder):
  """The series' patch names (without ``.patch``), in order."""
  return sorted(p.stem for p in pathlib.Path(folder).glob("*.patch"))


def counts(folder, name):
  """(the files it touches, lines added, lines deleted) of one patch."""
  text = (pathlib.Path(folder) / f"{name}.patch").read_text(encoding="utf-8")
  # The description (whose lists start lines with "-") ends at the first
  # file header.
  diff = text[text.index("\n--- ") + 1 :]
  files, added, deleted = set(), 0, 0
  for line in diff.splitlines():
    if line.startswith("+++ "):
      files.add(line[4:].split("\t")[0])
    elif line.startswith("--- "):
      continue
    elif line.startswith("+"):
      added += 1
    elif line.startswith("-"):
      deleted += 1
  return files, added, deleted


def total_phrase(folder, _body=None):
  """The whole series, as the proposal quotes it."""
  names = patches(folder)
  files, added, deleted = set(), 0, 0
  for name in names:
    touched, a, d = counts(folder, name)
    files |= touched
    added += a
    deleted += d
  return (
      f"{len(names)} patches that add {added} lines and delete {deleted} "
      f"(summed over the patches) in {len(files)} files of jax"
  )


def sizes_table(folder, body):
  """`body` (a Markdown table whose first column names a patch and whose
  last three are files, added, deleted) with each row's sizes counted
  again."""
  every = patches(folder)
  named = []
  out = []
  for line in body.split("\n"):
    cells = line.split("|")
    names = (
        re.findall(r"^ `(\d{4}-[\w-]+)` $", cells[1]) if len(cells) > 5 else []
    )
    if not names:
      out.append(line)  # the header or the rule under it
      continue
    (name,) = names
    if name not in every:
      raise SeriesError(f"the table names a patch that does not exist: {name}")
    named.append(name)
    files, added, deleted = counts(folder, name)
    cells[-4:-1] = [f" {len(files)} ", f" {added} ", f" {deleted} "]
    out.append("|".join(cells))
  if named != every:
    raise SeriesError(
        "every patch must be in one row, in the series' order: missing "
        f"{sorted(set(every) - set(named))}, in two rows "
        f"{sorted({n for n in named if named.count(n) > 1})}"
    )
  return "\n".join(out)
