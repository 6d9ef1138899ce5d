"""A Markdown table, as the benchmarks print it and the documents hold it
(bench/doc_tables.py)."""


def row(cells):
  """One line of a Markdown table."""
  return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def table(header, rows):
  """The table's lines, joined: the header, its rule, then the rows."""
  return "\n".join(
      [row(header), "|" + "---|" * len(header)] + [row(r) for r in rows]
  )
