# Copyright 2026 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Files of a tree's arrays, loaded checked against the model's layout.

``equinox.tree_serialise_leaves`` writes the arrays of a tree one after
another in NumPy's ``.npy`` format, with no paths, and
``equinox.tree_deserialise_leaves`` reads them back in the order of the
leaves of the model it loads into, checking each array's shape and dtype but
not how many the file holds. A model whose classes keep relative identities
holds a shared table once (its *tied* layout); stock JAX, and
``jax.tree_util.tree_unshare(model)``, hold it at each place it is used (the
*untied* layout). A file of the one layout read into a model of the other
loads without an error when the tables have one shape, and puts tables in the
wrong fields. :func:`load_leaves` refuses it, and says which layout the file
has and how to load it.

This module uses NumPy, Equinox and jax's public API only (``tree_unshare``
where the installed jax has it), so the same file runs on stock JAX.
"""

import io
import os
from typing import Any, BinaryIO

import jax
import numpy as np

__all__ = ["load_leaves", "saved_shapes"]


def saved_shapes(file: BinaryIO) -> list[tuple[int, ...]]:
  """The shapes of the arrays of a file that ``tree_serialise_leaves``
  wrote, in order, read from their headers; the file is left where it was."""
  start, shapes = file.tell(), []
  end = file.seek(0, io.SEEK_END)
  file.seek(start)
  try:
    while file.tell() < end:
      version = np.lib.format.read_magic(file)
      read_header = (
          np.lib.format.read_array_header_1_0
          if version == (1, 0)
          else np.lib.format.read_array_header_2_0
      )
      shape, _, dtype = read_header(file)
      shapes.append(shape)
      file.seek(int(np.prod(shape)) * dtype.itemsize, io.SEEK_CUR)
  finally:
    file.seek(start)
  return shapes


def _read_shapes(tree: Any) -> list[tuple[int, ...]]:
  """The shapes of the arrays ``tree_deserialise_leaves`` reads into
  `tree`, in order: its array-like leaves (Python scalars too)."""
  import equinox as eqx  # Only this module's callers need Equinox.

  return [
      tuple(getattr(leaf, "shape", ()))
      for leaf in jax.tree.leaves(tree)
      if eqx.is_array_like(leaf) or isinstance(leaf, jax.ShapeDtypeStruct)
  ]


def _untied_layout(like: Any) -> Any | None:
  """`like` with each shared node at each of its places, where the installed
  jax keeps relative identities and `like` shares; else None."""
  unshare = getattr(jax.tree_util, "tree_unshare", None)
  if unshare is None or not getattr(
      jax.tree.structure(like), "has_shared_nodes", False
  ):
    return None
  return unshare(like)


def _refusal(found: list[tuple[int, ...]], like: Any) -> str:
  """Why a file whose arrays have the shapes `found` does not load into
  `like`, naming the file's layout where it is one of `like`'s."""
  expected = _read_shapes(like)
  said = (
      f"the file holds {len(found)} arrays of shapes {found}; the model "
      f"reads {len(expected)}, of shapes {expected}"
  )
  untied = _untied_layout(like)
  if untied is not None and _read_shapes(untied) == found:
    return (
        f"{said}. The file has this model's untied layout (a shared table at "
        "each place it is used: what stock JAX writes for this model, and "
        "what tree_unshare(model) writes); the model reads its tied layout "
        "(each shared table once). Load it into the untied layout and tie it "
        "again: jax.tree_util.tree_retie(load_leaves(file, "
        "jax.tree_util.tree_unshare(model)), model), which refuses tables "
        "that were trained apart."
    )
  if len(found) < len(expected):
    return (
        f"{said}. The file has fewer arrays than the model: it was written "
        "from a model that holds a table once where this one holds it at "
        "several places (a model with relative identities, or one tied with "
        "eqx.nn.Shared): load it into a model of that kind."
    )
  if len(found) > len(expected):
    return (
        f"{said}. The file has more arrays than the model: it was written "
        "from a model that holds a table at several places where this one "
        "holds it once (stock JAX's untied model, or tree_unshare(model)): "
        "load it into a model of that layout."
    )
  return f"{said}: the file was written from another model."


def load_leaves(path_or_file: str | os.PathLike | BinaryIO, like: Any) -> Any:
  """``equinox.tree_deserialise_leaves(path_or_file, like)``, refusing a
  file whose arrays are not the ones `like` reads.

  Args:
    path_or_file: a file that ``equinox.tree_serialise_leaves`` wrote: its
      path, or a binary file open at its start.
    like: the model to load into, in the layout the file was written in:
      the tied model for a file written from it (or from a model tied with
      ``eqx.nn.Shared``), ``jax.tree_util.tree_unshare(model)`` for a file
      of the untied layout (stock JAX's).

  Returns:
    `like` with the file's arrays, in `like`'s layout: a tied model comes
    back tied.

  Raises:
    ValueError: the file's arrays differ in number or shape from those
      `like` reads; the message names the file's layout where it is `like`'s
      other one, and how to load it.
  """
  import equinox as eqx  # Only this module's callers need Equinox.

  if isinstance(path_or_file, (str, os.PathLike)):
    with open(path_or_file, "rb") as file:
      return load_leaves(file, like)
  found = saved_shapes(path_or_file)
  if found != _read_shapes(like):
    raise ValueError(_refusal(found, like))
  return eqx.tree_deserialise_leaves(path_or_file, like)
