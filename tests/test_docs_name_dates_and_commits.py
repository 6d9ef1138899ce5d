"""The docs name when a record was made by its date and commit, never by
the working period it was made in ("session 26", "this session"): a reader
knows dates and commits, nothing else."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
WORKING_PERIOD = re.compile(r"\bsessions?\b", re.IGNORECASE)


def test_the_pages_are_found():
  assert len(PAGES) > 20, PAGES


@pytest.mark.parametrize(
    "page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES]
)
def test_no_working_period_is_named(page):
  lines = page.read_text(encoding="utf-8").splitlines()
  named = [
      f"{page.relative_to(REPO)}:{number}: {line.strip()}"
      for number, line in enumerate(lines, 1)
      if WORKING_PERIOD.search(line)
  ]
  assert named == [], "name the date and commit instead:\n" + "\n".join(named)
