"""One tied model in the three layouts its checkpoint can have, for
checkpoint_layouts_test.py.

`CharLM` has an input embedding, an output embedding tied to it, and a third
table of the same shape after them (`char_embedding`), so that a table read
into the wrong field shows. Its checkpoint is written:

- tied: from the opted-in model, the shared table once;
- shared: from `SharedCharLM`, tied with `eqx.nn.Shared` (stock JAX's way),
  the table once as well;
- untied: from a model with one table per position, as stock JAX writes for
  the untied model (three different tables here), and as
  `tree_unshare(tied model)` writes (two equal tables: "unshared").

Every model is built from `tables(seed)`, so the test knows which table
belongs in which field.

Run as a script (under stock JAX: checkpoint_layouts_test.py runs it) with a
folder: writes the stock side's files there, loads the patched side's files
into the stock side's models, and prints what each field received as JSON.
"""

import json
import pathlib
import sys

import equinox as eqx
import jax
import numpy as np

VOCAB, DIM = 6, 3
FIELDS = ("embedding", "unembedding", "char_embedding")
# What the stock side writes, and from which seeds.
STOCK_FILES = {"untied": 1, "shared": 2, "tied": 3}
# What the patched side writes for the stock side to load.
OURS_FILES = ("tied", "unshared")
LOAD_LEAVES_SOURCE = "load_leaves.py"


class CharLM(eqx.Module):
  embedding: eqx.nn.Embedding
  unembedding: eqx.nn.Embedding
  char_embedding: eqx.nn.Embedding


class SharedCharLM(eqx.Module):
  embeddings: eqx.nn.Shared
  char_embedding: eqx.nn.Embedding

  def __init__(self, embedding, char_embedding):
    # Two objects: eqx.nn.Shared replaces the one at `where` by a placeholder.
    self.embeddings = eqx.nn.Shared(
        (embedding, eqx.nn.Embedding(weight=embedding.weight)),
        where=lambda pair: pair[1].weight,
        get=lambda pair: pair[0].weight,
    )
    self.char_embedding = char_embedding


def tables(seed):
  """Three different (VOCAB, DIM) tables."""
  keys = jax.random.split(jax.random.key(seed), len(FIELDS))
  return [jax.random.normal(key, (VOCAB, DIM)) for key in keys]


def _embeddings(seed):
  return [eqx.nn.Embedding(weight=table) for table in tables(seed)]


def tied(seed):
  embedding, _, chars = _embeddings(seed)
  return CharLM(embedding, embedding, chars)


def untied(seed):
  return CharLM(*_embeddings(seed))


def shared(seed):
  embedding, _, chars = _embeddings(seed)
  return SharedCharLM(embedding, chars)


def fields(model):
  """What each field of `FIELDS` holds, for either model class."""
  if isinstance(model, SharedCharLM):
    embedding, unembedding = model.embeddings()
    found = (embedding, unembedding, model.char_embedding)
  else:
    found = tuple(getattr(model, name) for name in FIELDS)
  return {name: np.asarray(e.weight) for name, e in zip(FIELDS, found)}


def stock_side(folder):
  """Writes STOCK_FILES into `folder`, and loads OURS_FILES from it into the
  untied and the eqx.nn.Shared model, with eqx.tree_deserialise_leaves and
  with jax.experimental.leaf_files.load_leaves (its file, copied to
  LOAD_LEAVES_SOURCE as a stock JAX user copies it)."""
  builders = {"untied": untied, "shared": shared, "tied": tied}
  for layout, seed in STOCK_FILES.items():
    eqx.tree_serialise_leaves(
        folder / f"stock-{layout}.eqx", builders[layout](seed)
    )
  leaf_files = {}
  exec((folder / LOAD_LEAVES_SOURCE).read_text(), leaf_files)
  loaders = {
      "eqx.tree_deserialise_leaves": eqx.tree_deserialise_leaves,
      "load_leaves": leaf_files["load_leaves"],
  }
  received = {}
  for layout in OURS_FILES:
    for target in ("untied", "shared"):
      for name, load in loaders.items():
        with open(folder / f"ours-{layout}.eqx", "rb") as file:
          try:
            found = fields(load(file, builders[target](99)))
            outcome = {k: v.tolist() for k, v in found.items()}
          except Exception as error:  # the test compares the type's name
            outcome = type(error).__name__
        received[f"{layout} into {target} by {name}"] = outcome
  return received


if __name__ == "__main__":
  print(json.dumps(stock_side(pathlib.Path(sys.argv[1]))))
