"""Draws docs/architecture.svg, the project's rooms, from the code itself:
the C++ module's files by concern (each with its line count), the patch
series by patch, the modules it adds, and the tie policy's switches (read
from jax/_src/tie_policy.py's docstring, as the series' copy holds it).

    python build/architecture.py           # writes docs/architecture.svg
    python build/architecture.py --check   # fails if the file is not current

A C++ file that no concern below names, or that two name, is an error: the
picture must place every file.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VERSION = (REPO / "VERSION").read_text(encoding="utf-8").strip()
SERIES = REPO / "jax_patch" / VERSION
OUT = REPO / "docs" / "architecture.svg"

# The C++ module's concerns, each by the file names it holds.
CONCERNS = (
    ("the tree model and registry", ("pytree.h", "registry.cc", "keys.*")),
    (
        "walks: flatten and unflatten",
        ("flatten*", "unflatten.cc", "leaf_collector.h", "identity_scope.h"),
    ),
    (
        "treedef queries and sharing",
        ("treedef_*", "sharing.cc", "prefix.cc", "serialization.cc"),
    ),
    (
        "jit's front door",
        ("jit_function*", "dispatch_args.cc"),
    ),
    (
        "bindings and support",
        (
            "module.cc",
            "gc.cc",
            "exceptions.*",
            "text.*",
            "recursion_guard.*",
            "recycling_allocator.h",
            "spare_lease.h",
        ),
    ),
)

# One call of jax.jit on a tied argument, by the arrows' numbers.
STEPS = (
    "1. jax.jit's object (C++) takes the call: nothing opted in yet, or "
    "nothing that could be shared, and it goes to stock's dispatch as it is.",
    "2. Else one flatten of all the dynamic arguments, in the identity layout:"
    " a shared node once, its leaves one buffer on the device.",
    "3. The series: JAX traces and transforms in stock's layout (the twins), "
    "results following their arguments; a tie written out is remembered.",
    "4. The result is unflattened: the tie kept, one object again; or split,"
    " and the tie policy decides whether and where the user is told.",
)
WIDTH, LINE, PAD, GAP = 1400, 15, 10, 50
COLUMN = (WIDTH - 2 * PAD - 3 * GAP) // 4
# Characters a row of a box holds (monospace at 12 px).
FITS = COLUMN // 7 - 3


def lines_of(path: Path) -> int:
  return len(path.read_text(encoding="utf-8").splitlines())


def cxx_rooms() -> list:
  """[(concern, [(file, lines)])], every C++ file in one concern."""
  files = sorted(
      p for p in (REPO / "jaxlib_patch").iterdir() if p.suffix in (".cc", ".h")
  )
  placed: dict = {}
  rooms = []
  for concern, patterns in CONCERNS:
    members = [
        p for p in files if any(p.match(pattern) for pattern in patterns)
    ]
    for p in members:
      if p.name in placed:
        sys.exit(f"{p.name}: in '{placed[p.name]}' and in '{concern}'")
      placed[p.name] = concern
    rooms.append((concern, [(p.name, lines_of(p)) for p in members]))
  unplaced = [p.name for p in files if p.name not in placed]
  if unplaced:
    sys.exit(f"build/architecture.py: no concern holds {unplaced}")
  return rooms


def series_rooms() -> tuple:
  """The patches of the series, and the modules it adds with their lines."""
  patches = [
      line.strip()
      for line in (SERIES / "series").read_text().splitlines()
      if line.strip() and not line.startswith("#")
  ]
  modules = sorted((SERIES / "modules").rglob("*.py"))
  return patches, [
      (p.relative_to(SERIES / "modules").as_posix(), lines_of(p))
      for p in modules
  ]


def policy_switches() -> list:
  """The headings of the tie policy's switches, from its docstring."""
  text = (SERIES / "modules" / "jax" / "_src" / "tie_policy.py").read_text()
  doc = text.split('"""')[1]
  return [
      re.split(r"[:,]", paragraph.split("\n")[0])[0]
      for paragraph in doc.split("\n\n")
      if re.search(r"^  - `", paragraph, re.M)
  ]


class Canvas:

  def __init__(self):
    self.parts: list = []

  def box(self, x, y, w, title, rows, fill):
    """A box with a bold title and one text row a line; returns its bottom."""
    h = PAD + LINE * (len(rows) + 1) + PAD
    self.parts.append(
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" '
        f'fill="{fill}" stroke="#444"/>'
    )
    self.text(x + PAD, y + PAD + LINE - 3, title, bold=True)
    for i, row in enumerate(rows, start=2):
      self.text(x + PAD, y + PAD + LINE * i - 3, row)
    return y + h

  def text(self, x, y, content, bold=False):
    weight = ' font-weight="bold"' if bold else ""
    self.parts.append(
        f'<text x="{x}" y="{y}"{weight}>{html.escape(content)}</text>'
    )

  def arrow(self, x1, y1, x2, y2, number):
    self.parts.append(
        f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#a33" '
        'stroke-width="2" marker-end="url(#head)"/>'
    )
    self.text((x1 + x2) // 2 + 6, (y1 + y2) // 2 - 4, number, bold=True)

  def svg(self, height):
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" font-family="monospace" font-size="12">\n'
        '<defs><marker id="head" markerWidth="8" markerHeight="8" refX="8" '
        'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#a33"/>'
        "</marker></defs>\n"
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>\n'
        + "\n".join(self.parts)
        + "\n</svg>\n"
    )


def draw() -> str:
  canvas = Canvas()
  top = 40
  canvas.text(
      PAD,
      24,
      "The rooms, and one call of jax.jit on a tied "
      "argument: the red arrows, told below",
      bold=True,
  )
  x = [PAD + i * (COLUMN + GAP) for i in range(4)]
  fit = lambda rows: [row[:FITS] for row in rows]
  bottoms = []
  # Column 1: the user's call and the front door.
  user = canvas.box(
      x[0],
      top,
      COLUMN,
      "the user",
      ["f = jax.jit(loss)", "f(model)  # model.a is model.b"],
      "#eef",
  )
  door = user + 40
  canvas.arrow(x[0] + 60, user, x[0] + 60, door, "1")
  rooms = cxx_rooms()
  front = dict(rooms)["jit's front door"]
  bottoms.append(
      canvas.box(
          x[0],
          door,
          COLUMN,
          "jit's front door",
          fit(
              [f"{name} ({n})" for name, n in front]
              + ["jax/_src/jit_front_door.py (series)"]
          ),
          "#efe",
      )
  )
  # Column 2: the rest of the C++ module, by concern.
  y = top
  for concern, members in rooms:
    if concern != "jit's front door":
      y = (
          canvas.box(
              x[1],
              y,
              COLUMN,
              f"C++: {concern}",
              fit([f"{name} ({n})" for name, n in members]),
              "#efe",
          )
          + PAD
      )
  bottoms.append(y)
  canvas.arrow(x[0] + COLUMN, door + 30, x[1], top + 140, "2")
  # Column 3: the series and the modules it adds.
  patches, modules = series_rooms()
  y = canvas.box(
      x[2],
      top,
      COLUMN,
      f"the jax series: {len(patches)} patches",
      fit([p.removesuffix(".patch") for p in patches]),
      "#ffe",
  )
  bottoms.append(
      canvas.box(
          x[2],
          y + PAD,
          COLUMN,
          "the modules it adds",
          fit([f"{name} ({n})" for name, n in modules]),
          "#ffe",
      )
  )
  canvas.arrow(x[1] + COLUMN, top + 150, x[2], top + 120, "3")
  # Column 4: the tie policy.
  policy = canvas.box(
      x[3],
      top,
      COLUMN,
      "the tie policy: its switches",
      fit([f"{i}. {s}" for i, s in enumerate(policy_switches(), start=1)]),
      "#fee",
  )
  bottoms.append(policy)
  canvas.arrow(x[2] + COLUMN, top + 160, x[3], policy - 20, "4")
  y = max(bottoms) + 2 * PAD
  for step in STEPS:
    y += LINE
    canvas.text(PAD, y, step)
  return canvas.svg(y + 2 * PAD)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true")
  args = parser.parse_args()
  drawn = draw()
  if args.check:
    if not OUT.exists() or OUT.read_text(encoding="utf-8") != drawn:
      print(
          f"{OUT.relative_to(REPO)} is not current: run "
          "python build/architecture.py",
          file=sys.stderr,
      )
      return 1
    return 0
  OUT.write_text(drawn, encoding="utf-8")
  print(f"wrote {OUT.relative_to(REPO)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
