"""The tie policy's list of switches (jax._src.tie_policy's docstring) is
true of the code: each part it names exists where it says, there are at
most seven switches, and each piece of state that the jax series or the
C++ module adds, module-level or thread-local, is named in the list or said
here to decide nothing about ties."""

import pathlib
import re

import jax
from jax._src import tie_policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
JAX = pathlib.Path(jax.__file__).resolve().parent
ENTRY = re.compile(r"^  - `([\w.]+)` in `([\w./]+)`")

# State the series or the module adds that decides nothing about ties: with
# the reason.
DECIDES_NOTHING = {
    "registration_epoch_": "a count that invalidates the jit front door's "
    "memo of how types flatten when a registration changes",
    "spare": "spare_lease.h: a spare buffer per thread, reused to spare "
    "allocations",
    "limit": "recursion_guard.cc: the stack depth a thread may recurse to",
    "_unjitted_calls": "pjit.py: the front door's memo of the calls it "
    "routes to the Python path",
    "_PUBLIC_NAMES": "written_out_ties.py: the names a message gives JAX's "
    "own public functions (jax.jit for its call)",
}


def switches():
  """{switch heading: [(name, path), ...]} from the policy's docstring."""
  found = {}
  for paragraph in tie_policy.__doc__.split("\n\n"):
    lines = paragraph.split("\n")
    entries = [
        ENTRY.match(line).groups() for line in lines[1:] if ENTRY.match(line)
    ]
    if entries:
      found[lines[0]] = entries
  return found


def source_of(path):
  if path.startswith("jax/"):
    return (JAX / path[len("jax/") :]).read_text()
  return (ROOT / path).read_text()


def test_at_most_seven_switches_each_with_parts():
  found = switches()
  assert 1 <= len(found) <= 7, list(found)


def test_each_part_exists_where_the_list_says():
  missing = [
      f"{name} in {path}"
      for entries in switches().values()
      for name, path in entries
      if not re.search(rf"\b{re.escape(name)}\b", source_of(path))
  ]
  assert missing == []


def state_added_by_the_series():
  """Names of module-level or class-level mutable state, thread-locals and
  config options in the lines the jax series adds."""
  names = set()
  patterns = (
      # A module's table or set, a thread-local, a weak map.
      re.compile(
          r"^\+(\w+)(?:: [^=]+)? = (?:set\(|\{|dict\(|\[\]|"
          r"weakref\.|threading\.local\(|collections\.)"
      ),
      re.compile(r"^\+\s+(\w+)(?:: [^=]+)? = threading\.local\("),
      re.compile(r"^\+class (\w+)\(threading\.local\)"),
      re.compile(r"^\+(\w+) = \w*_?state\("),
      # An attribute another module sets on a module or registry.
      re.compile(r"^\+\s*\w+\.(\w+_(?:observer|hook)) = "),
      re.compile(r"^\+(\w+_(?:observer|hook))(?:: [^=]+)? = "),
  )
  for patch in sorted((ROOT / "jax_patch" / "0.10.2").glob("*.patch")):
    for line in patch.read_text().splitlines():
      for pattern in patterns:
        match = pattern.match(line)
        if match:
          names.add(match.group(1))
  return names


def state_of_the_module():
  """Names of the C++ module's thread-locals and atomics."""
  names = set()
  pattern = re.compile(
      r"(?:thread_local|std::atomic<[^>]+>)\s+[\w:<>*\s]*?(\w+)\s*(?:=|\{|;)"
  )
  for path in sorted((ROOT / "jaxlib_patch").glob("*.[ch]*")):
    for line in path.read_text().splitlines():
      if line.lstrip().startswith("//"):
        continue
      match = pattern.search(line)
      if match:
        names.add(match.group(1))
  return names


def test_the_scans_find_the_state_they_are_for():
  # Made-up lines of each kind: a scan that finds nothing proves nothing.
  series, module = state_added_by_the_series(), state_of_the_module()
  assert {
      "split_ties",
      "_bases_told",
      "_rules_running",
      "_PublicCalls",
      "split_results_hook",
  } <= series, series
  assert {
      "stock_layout_depth",
      "tied_treedefs_met",
      "has_opt_ins_",
      "registration_epoch_",
  } <= module, module


def test_every_piece_of_added_state_is_a_named_part_or_decides_nothing():
  named = {name for entries in switches().values() for name, _ in entries}
  unnamed = sorted(
      (state_added_by_the_series() | state_of_the_module())
      - named
      - set(DECIDES_NOTHING)
  )
  assert unnamed == [], (
      "state that may decide a tie, not in jax._src.tie_policy's list of "
      "switches: name it there, or say here why it decides nothing"
  )


def test_decides_nothing_names_only_state_that_exists():
  found = state_added_by_the_series() | state_of_the_module()
  assert sorted(set(DECIDES_NOTHING) - found) == []
