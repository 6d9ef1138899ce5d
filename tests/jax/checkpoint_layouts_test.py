"""Every checkpoint layout of a tied model against every load path that
docs/guide/stock-jax-and-checkpoints.md ("Checkpoints and moving between
stock and patched JAX") documents, in both directions, checking which table
lands in which field.

The layouts (checkpoint_layouts.py): tied (written from the opted-in model),
shared (from a model tied with `eqx.nn.Shared`), untied (from a model with
one table per position, three different tables, as stock JAX writes a model
that was trained untied) and unshared (`tree_unshare` of the tied model,
which is also what stock JAX writes for the tied model: two equal tables).
The models a file is loaded into: the tied one (ours), the `eqx.nn.Shared`
one and the untied one (stock JAX's).

The paths: Equinox's `eqx.tree_deserialise_leaves`, the checked
`jax.experimental.leaf_files.load_leaves` that the guide documents, and it into
`tree_unshare(model)` then `tree_retie`; Orbax's restore with a target, with
the untied layout of the target then `tree_retie`, and without a target.
Outcomes: the file loads (each field gets the table written from it), loads
shifted (no error, and `char_embedding` gets the file's second table: the
trap the guide warns of), or is refused (the guide's recipes), or fails in
the library itself.

StockSideTest runs checkpoint_layouts.py under stock JAX: stock Equinox
writes the same bytes as the untied and `eqx.nn.Shared` models here, and
loads our files as the matrix says.
"""

import io
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

import equinox as eqx
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax import tree_util
from jax._src import test_util as jtu
from jax.experimental import leaf_files
from jax.experimental.leaf_files import load_leaves

import stock_reference

tree_util.preserve_relative_identities(eqx.Module)

import checkpoint_layouts as layouts  # noqa: E402

# The ties these tests make are meant: TiedByOptInWarning, which tells
# the first object a library's opted-in base class ties (tied_by_opt_in_test),
# is acknowledged as a user who means them would.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jax.tree_util.TiedByOptInWarning"
)

LOADS = "loads"  # every field gets the table written from it
SHIFTED = "shifted"  # no error, and a table in the wrong field
REFUSED = "refused"  # load_leaves: the file's arrays are not the model's
RUNS_OUT = "runs out"  # Equinox: fewer arrays in the file than the model reads
COPIES_DIFFER = "copies differ"  # tree_retie: two different tables
MISMATCH = "mismatch"  # Orbax: the target's paths are not the file's
ERRORS = {
    REFUSED: (ValueError, r"^the file holds \d arrays"),
    RUNS_OUT: (Exception, "Error at leaf with path"),
    COPIES_DIFFER: (ValueError, "differs from an earlier copy"),
    MISMATCH: (ValueError, "tree structures do not match"),
}

WRITTEN_SEED, TARGET_SEED = 0, 99
WRITERS = {
    "tied": lambda: layouts.tied(WRITTEN_SEED),
    "shared": lambda: layouts.shared(WRITTEN_SEED),
    "untied": lambda: layouts.untied(WRITTEN_SEED),
    "unshared": lambda: tree_util.tree_unshare(layouts.tied(WRITTEN_SEED)),
}
TARGETS = {
    "tied": layouts.tied,
    "shared": layouts.shared,
    "untied": layouts.untied,
}


def _array_count(model):
  return len(jax.tree.leaves(eqx.filter(model, eqx.is_array)))


class LayoutTestCase(jtu.JaxTestCase):
  """A matrix row's files are written by the subclass's `write(layout,
  model)`, into `self.folder`."""

  def setUp(self):
    super().setUp()
    self.folder = pathlib.Path(tempfile.mkdtemp())

  def assertOutcome(self, outcome, load, written, target_kind):
    """`load()` gives `outcome` for a file written from `written` into a
    model of `target_kind`."""
    if outcome in ERRORS:
      error, pattern = ERRORS[outcome]
      if outcome == REFUSED:
        pattern = rf"^the file holds {_array_count(written)} arrays"
      with self.assertRaisesRegex(error, pattern):
        load()
      return
    loaded = load()
    found, tables = layouts.fields(loaded), layouts.fields(written)
    if outcome == LOADS:
      for name in layouts.FIELDS:
        self.assertArraysEqual(found[name], tables[name])
      if target_kind == "tied":
        self.assertIs(loaded.embedding, loaded.unembedding)
      return
    self.assertEqual(outcome, SHIFTED)
    self.assertArraysEqual(found["char_embedding"], tables["unembedding"])
    self.assertFalse(
        np.array_equal(found["char_embedding"], tables["char_embedding"])
    )

  def run_matrix(self, row, load):
    """Each layout of `row` written and loaded by `load(path, kind)`."""
    target_kind, outcomes = row
    for layout, outcome in outcomes.items():
      with self.subTest(layout=layout, outcome=outcome):
        written = WRITERS[layout]()
        path = self.write(layout, written)
        self.assertOutcome(
            outcome, lambda: load(path, target_kind), written, target_kind
        )


def _deserialise(path, target_kind):
  with open(path, "rb") as file:
    return eqx.tree_deserialise_leaves(file, TARGETS[target_kind](TARGET_SEED))


def _load_leaves(path, target_kind):
  with open(path, "rb") as file:
    return load_leaves(file, TARGETS[target_kind](TARGET_SEED))


def _load_leaves_and_retie(path, target_kind):
  model = TARGETS[target_kind](TARGET_SEED)
  with open(path, "rb") as file:
    loaded = load_leaves(file, tree_util.tree_unshare(model))
  return tree_util.tree_retie(loaded, model)


# (model loaded into, path) -> the outcome for each layout of file.
EQUINOX_MATRIX = {
    ("tied", _deserialise): {
        "tied": LOADS,
        "shared": LOADS,
        "untied": SHIFTED,  # the guide's trap: stock's untied model's file
        "unshared": SHIFTED,
    },
    ("tied", _load_leaves): {
        "tied": LOADS,
        "shared": LOADS,
        "untied": REFUSED,
        "unshared": REFUSED,
    },
    ("tied", _load_leaves_and_retie): {
        "tied": REFUSED,
        "shared": REFUSED,
        "untied": COPIES_DIFFER,
        "unshared": LOADS,
    },
    ("shared", _deserialise): {
        "tied": LOADS,
        "shared": LOADS,
        "untied": SHIFTED,
        "unshared": SHIFTED,
    },
    ("shared", _load_leaves): {
        "tied": LOADS,
        "shared": LOADS,
        "untied": REFUSED,
        "unshared": REFUSED,
    },
    ("untied", _deserialise): {
        "tied": RUNS_OUT,
        "shared": RUNS_OUT,
        "untied": LOADS,
        "unshared": LOADS,
    },
    ("untied", _load_leaves): {
        "tied": REFUSED,
        "shared": REFUSED,
        "untied": LOADS,
        "unshared": LOADS,
    },
}


def _named(matrix):
  return [
      (f"{kind}_by_{load.__name__.strip('_')}", load, (kind, outcomes))
      for (kind, load), outcomes in matrix.items()
  ]


class EquinoxLayoutsTest(LayoutTestCase):

  def write(self, layout, written):
    path = self.folder / f"{layout}.eqx"
    eqx.tree_serialise_leaves(path, written)
    return path

  @parameterized.named_parameters(_named(EQUINOX_MATRIX))
  def test_layouts(self, load, row):
    self.run_matrix(row, load)

  def test_the_documented_loads_never_shift_a_table(self):
    # Every row of load_leaves refuses the file it cannot load right.
    for (_, load), outcomes in EQUINOX_MATRIX.items():
      if load is not _deserialise:
        self.assertNotIn(SHIFTED, outcomes.values(), load.__name__)

  def test_the_refusal_names_the_layout_and_the_conversion(self):
    untied_file = self.write("unshared", WRITERS["unshared"]())
    with self.assertRaisesRegex(ValueError, "") as caught:
      load_leaves(untied_file, layouts.tied(TARGET_SEED))  # a path, too
    message = str(caught.exception)
    self.assertIn("The file has this model's untied layout", message)
    self.assertIn(
        "tree_retie(load_leaves(file, jax.tree_util.tree_unshare(model)), "
        "model)",
        message,
    )
    tied_file = self.write("tied", WRITERS["tied"]())
    with self.assertRaisesRegex(ValueError, "fewer arrays than the model"):
      load_leaves(str(tied_file), layouts.untied(TARGET_SEED))
    with self.assertRaisesRegex(ValueError, "more arrays than the model"):
      load_leaves(untied_file, layouts.shared(TARGET_SEED))

  def test_a_refused_file_is_left_where_it_was(self):
    with open(self.write("untied", WRITERS["untied"]()), "rb") as file:
      file.seek(0)
      with self.assertRaisesRegex(ValueError, "untied layout"):
        load_leaves(file, layouts.tied(TARGET_SEED))
      self.assertEqual(file.tell(), 0)
      loaded = load_leaves(file, layouts.untied(TARGET_SEED))
    tables = layouts.fields(WRITERS["untied"]())
    for name, table in layouts.fields(loaded).items():
      self.assertArraysEqual(table, tables[name])

  def test_the_file_holds_what_each_layout_says(self):
    saved_shapes = leaf_files.saved_shapes
    table = (layouts.VOCAB, layouts.DIM)
    for layout, count in (("tied", 2), ("shared", 2), ("untied", 3)):
      buffer = io.BytesIO()
      eqx.tree_serialise_leaves(buffer, WRITERS[layout]())
      buffer.seek(0)
      self.assertEqual(saved_shapes(buffer), [table] * count)
      self.assertEqual(buffer.tell(), 0)


def _abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _arrays(model):
  # eqx.nn.Shared holds functions and a placeholder, which Orbax cannot
  # write: an Equinox user saves the arrays (eqx.filter) and combines.
  return eqx.filter(model, eqx.is_array)


# (model restored into, path) -> the outcome for each layout of checkpoint.
ORBAX_MATRIX = {
    ("tied", "target"): {
        "tied": LOADS,
        "shared": MISMATCH,
        "untied": MISMATCH,
        "unshared": MISMATCH,
    },
    ("tied", "untied_target_retie"): {
        "tied": MISMATCH,
        "shared": MISMATCH,
        "untied": COPIES_DIFFER,
        "unshared": LOADS,
    },
    ("shared", "target"): {
        "tied": MISMATCH,
        "shared": LOADS,
        "untied": MISMATCH,
        "unshared": MISMATCH,
    },
    ("untied", "target"): {
        "tied": MISMATCH,
        "shared": MISMATCH,
        "untied": LOADS,
        "unshared": LOADS,
    },
}


class OrbaxLayoutsTest(LayoutTestCase):

  def write(self, layout, written):
    path = self.folder / f"{self.checkpointer_name}-{layout}"
    self.checkpointer.save(path, _arrays(written))
    if hasattr(self.checkpointer, "wait_until_finished"):
      self.checkpointer.wait_until_finished()
    return path

  def restore(self, path, target=None):
    if target is None or isinstance(
        self.checkpointer, ocp.StandardCheckpointer
    ):
      return self.checkpointer.restore(path, target)
    return self.checkpointer.restore(
        path,
        args=ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        ),
    )

  def load(self, path, target_kind, how):
    model = TARGETS[target_kind](TARGET_SEED)
    if how == "target":
      restored = self.restore(path, _abstract(_arrays(model)))
      if target_kind == "shared":
        return eqx.combine(restored, model)  # the functions and placeholder
      return restored
    self.assertEqual(how, "untied_target_retie")
    restored = self.restore(path, tree_util.tree_unshare(_abstract(model)))
    return tree_util.tree_retie(restored, model)

  @parameterized.named_parameters(
      (f"{checkpointer}_{kind}_by_{how}", checkpointer, (kind, how))
      for checkpointer in ("standard", "pytree")
      for kind, how in ORBAX_MATRIX
  )
  def test_layouts(self, checkpointer, row):
    make = {
        "standard": ocp.StandardCheckpointer,
        "pytree": ocp.PyTreeCheckpointer,
    }[checkpointer]
    self.checkpointer_name = checkpointer
    with make() as self.checkpointer:
      kind, how = row
      self.run_matrix(
          (kind, ORBAX_MATRIX[row]),
          lambda path, kind: self.load(path, kind, how),
      )

  def test_without_a_target_a_tied_file_lacks_the_later_path(self):
    self.checkpointer_name = "standard"
    keys = {
        "tied": {"embedding", "char_embedding"},  # the guide's warning
        "shared": {"embeddings", "char_embedding"},
        "untied": set(layouts.FIELDS),
        "unshared": set(layouts.FIELDS),
    }
    with ocp.StandardCheckpointer() as self.checkpointer:
      for layout, expected in keys.items():
        written = WRITERS[layout]()
        restored = self.restore(self.write(layout, written))
        self.assertEqual(set(restored), expected)
        if layout in ("untied", "unshared"):
          tables = layouts.fields(written)
          for name in layouts.FIELDS:
            self.assertArraysEqual(restored[name]["weight"], tables[name])


class StockSideTest(jtu.JaxTestCase):
  """Stock Equinox on the other side: the files it writes, and what it
  makes of ours."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.folder = pathlib.Path(tempfile.mkdtemp())
    for layout in layouts.OURS_FILES:
      eqx.tree_serialise_leaves(
          cls.folder / f"ours-{layout}.eqx", WRITERS[layout]()
      )
    # The module's one file, as a stock JAX user copies it.
    (cls.folder / layouts.LOAD_LEAVES_SOURCE).write_text(
        pathlib.Path(leaf_files.__file__).read_text()
    )
    cls.received = stock_reference.run_with_stock_jax(
        layouts.__file__, "equinox", cls.folder
    )

  def test_stock_writes_what_the_same_models_write_here(self):
    # Stock JAX writes a model that holds one object twice as the untied
    # layout: tree_unshare's.
    here = {
        "untied": layouts.untied,
        "shared": layouts.shared,
        "tied": lambda seed: tree_util.tree_unshare(layouts.tied(seed)),
    }
    for layout, seed in layouts.STOCK_FILES.items():
      buffer = io.BytesIO()
      # Made on the CPU, as stock's child makes them: an accelerator's
      # random normals differ in the last bits.
      with jax.default_device(jax.devices("cpu")[0]):
        model = here[layout](seed)
      eqx.tree_serialise_leaves(buffer, model)
      stock_bytes = (self.folder / f"stock-{layout}.eqx").read_bytes()
      self.assertEqual(buffer.getvalue(), stock_bytes, layout)

  def test_stock_loads_our_files(self):
    tied = layouts.fields(WRITERS["tied"]())
    shifted = dict(tied, char_embedding=tied["unembedding"])
    by = {"raw": "eqx.tree_deserialise_leaves", "checked": "load_leaves"}
    expected = {
        ("tied", "untied", "raw"): "TreePathError",
        ("tied", "untied", "checked"): "ValueError",
        ("tied", "shared", "raw"): tied,
        ("tied", "shared", "checked"): tied,
        ("unshared", "untied", "raw"): tied,
        ("unshared", "untied", "checked"): tied,
        ("unshared", "shared", "raw"): shifted,
        ("unshared", "shared", "checked"): "ValueError",
    }
    self.assertLen(self.received, len(expected))
    for (layout, target, how), outcome in expected.items():
      got = self.received[f"{layout} into {target} by {by[how]}"]
      if isinstance(outcome, str):
        self.assertEqual(got, outcome, (layout, target, how))
        continue
      for name in layouts.FIELDS:
        self.assertArraysEqual(np.asarray(got[name], np.float32), outcome[name])


if __name__ == "__main__":
  absltest.main(testLoader=jtu.JaxTestLoader())
