"""The hint a Flax NNX user gets who opts in `nnx.Pytree` but not
`nnx.Variable` and ties a kernel: optax's `jax.tree.map` fails with
"pytree structure error: different numbers of pytree children" (JAX's
words, from its tree_map, the same on stock JAX), and docs/guide.md's
Troubleshooting has a section under that error that says to opt in
`nnx.Variable`. This test checks that the error is the one the guide's
heading quotes, that the section says the remedy, and that the remedy works.

The opt-ins are for the whole process, so nnx_pytree_only.py runs in a child
process with this interpreter.
"""

import functools
import json
import pathlib
import re
import subprocess
import sys

import docs_test
import stock_reference

HERE = pathlib.Path(__file__).resolve().parent
# The guide's files (docs/guide.md and its parts), in reading order.
GUIDE = [HERE.parents[1] / f for f in docs_test.files("docs/guide.md")]


@functools.cache
def _child_report():
  done = subprocess.run(
      [sys.executable, str(HERE / "nnx_pytree_only.py")],
      env=stock_reference.child_environment(),
      capture_output=True,
      text=True,
      check=True,
  )
  return json.loads(done.stdout.splitlines()[-1])


def _guide_section(heading_start):
  """The heading that starts with `heading_start` and its section's text."""
  text = "\n".join(path.read_text() for path in GUIDE)
  match = re.search(
      rf"^### ({re.escape(heading_start)}[^\n]*)\n(.*?)(?=^##)",
      text,
      re.M | re.S,
  )
  assert match, f"the guide has no section '### {heading_start}...'"
  return match.group(1), match.group(2)


def test_pytree_alone_fails_as_the_guide_says_and_variable_fixes_it():
  report = _child_report()
  leaves, error = report["pytree only"]
  assert leaves == 4  # the shared kernel twice
  heading, section = _guide_section("`ValueError: pytree structure error")
  quoted = re.match(r"`ValueError: (.*?)`", heading).group(1)
  assert error.startswith(quoted), (quoted, error)
  assert "symmetric difference on key sets is\n    kernel" in error
  assert "tree_util.preserve_relative_identities(nnx.Variable)" in section
  assert report["pytree and variable"] == [3, "ok"]


def test_the_sections_error_text_block_is_the_error():
  # The guide shows the error's text in a ```text block: it must be the
  # error itself, line for line.
  _, section = _guide_section("`ValueError: pytree structure error")
  shown = [
      b.source for b in docs_test.fenced_blocks(section) if b.language == "text"
  ]
  assert len(shown) == 1
  _, error = _child_report()["pytree only"]
  assert shown[0].strip() == f"ValueError: {error}".strip()
