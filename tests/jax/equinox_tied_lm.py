"""A tiny Equinox transformer language model with tied input and output
embeddings, trained with optax.adamw.

Two ways to tie: `TiedLM` holds the same `eqx.nn.Embedding` object twice
(shared through the relative-identity opt-in); `SharedLM` ties the same
parameters with `eqx.nn.Shared`, which works on stock JAX. Both are built from
the same keys, so they hold the same numbers and their array leaves come in
the same order.

Run as a script it trains `SharedLM` under `eqx.filter_jit` and prints the
losses and final weights as JSON: equinox_sharing_test.py runs it under stock
JAX and compares.
"""

import json
import math

import jax
import jax.numpy as jnp

import equinox as eqx
import optax

import training

VOCAB, DIM, SEQ, BATCH = 32, 16, 8, 4
STEPS = 20
LEARNING_RATE = 1e-2


class Block(eqx.Module):
  """One pre-norm transformer block: single-head causal attention and an MLP
  (its own layers, so that every non-array field is static and the model
  passes through plain `jax.jit`)."""

  attention_norm: eqx.nn.LayerNorm
  query: eqx.nn.Linear
  key: eqx.nn.Linear
  value: eqx.nn.Linear
  output: eqx.nn.Linear
  mlp_norm: eqx.nn.LayerNorm
  up: eqx.nn.Linear
  down: eqx.nn.Linear

  def __init__(self, key):
    keys = jax.random.split(key, 6)
    self.attention_norm = eqx.nn.LayerNorm(DIM)
    self.query, self.key, self.value, self.output = (
        eqx.nn.Linear(DIM, DIM, key=k) for k in keys[:4]
    )
    self.mlp_norm = eqx.nn.LayerNorm(DIM)
    self.up = eqx.nn.Linear(DIM, 2 * DIM, key=keys[4])
    self.down = eqx.nn.Linear(2 * DIM, DIM, key=keys[5])

  def __call__(self, x):
    h = jax.vmap(self.attention_norm)(x)
    q, k, v = (
        jax.vmap(layer)(h) for layer in (self.query, self.key, self.value)
    )
    scores = q @ k.T / math.sqrt(DIM)
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    x = x + jax.vmap(self.output)(weights @ v)
    h = jax.vmap(self.mlp_norm)(x)
    return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(h)))


def _parts(key):
  embedding_key, position_key, block_key = jax.random.split(key, 3)
  embedding = eqx.nn.Embedding(VOCAB, DIM, key=embedding_key)
  positions = 0.02 * jax.random.normal(position_key, (SEQ, DIM))
  return embedding, positions, Block(block_key), eqx.nn.LayerNorm(DIM)


def _logits(embedding, positions, block, norm, unembedding, tokens):
  x = jax.vmap(embedding)(tokens) + positions
  x = jax.vmap(norm)(block(x))
  return x @ unembedding.weight.T


class TiedLM(eqx.Module):
  """Tied by identity: `embedding` and `unembedding` are one object."""

  embedding: eqx.nn.Embedding
  positions: jax.Array
  block: Block
  norm: eqx.nn.LayerNorm
  unembedding: eqx.nn.Embedding

  def __init__(self, key):
    self.embedding, self.positions, self.block, self.norm = _parts(key)
    self.unembedding = self.embedding

  def __call__(self, tokens):
    return _logits(
        self.embedding,
        self.positions,
        self.block,
        self.norm,
        self.unembedding,
        tokens,
    )


class SharedLM(eqx.Module):
  """Tied with `eqx.nn.Shared`: the output table is rebuilt from the input
  one on every call. Its two tables are two objects: `eqx.nn.Shared` removes
  the copy at `where`, which for one shared object would remove both."""

  embeddings: eqx.nn.Shared
  positions: jax.Array
  block: Block
  norm: eqx.nn.LayerNorm

  def __init__(self, key):
    embedding, self.positions, self.block, self.norm = _parts(key)
    self.embeddings = eqx.nn.Shared(
        (embedding, eqx.nn.Embedding(weight=embedding.weight)),
        where=lambda pair: pair[1].weight,
        get=lambda pair: pair[0].weight,
    )

  def __call__(self, tokens):
    embedding, unembedding = self.embeddings()
    return _logits(
        embedding, self.positions, self.block, self.norm, unembedding, tokens
    )


def batch():
  tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
  return tokens[:, :-1], tokens[:, 1:]


def loss(model, inputs, targets):
  logits = jax.vmap(model)(inputs)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


optimizer = optax.adamw(LEARNING_RATE)


def step(model, opt_state, inputs, targets):
  value, grads = eqx.filter_value_and_grad(loss)(model, inputs, targets)
  updates, opt_state = optimizer.update(
      grads, opt_state, eqx.filter(model, eqx.is_array)
  )
  return value, eqx.apply_updates(model, updates), opt_state


def train(model, jit, after_step=lambda model: None):
  """STEPS optimizer steps with `step` compiled by `jit`; the losses and the
  trained model. `after_step(model)` sees the model after every step."""
  opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
  return training.train(
      jit(step), (model, opt_state), batch(), STEPS, after_step
  )


def weights(model):
  """The model's arrays as lists of floats, in leaf order."""
  return training.as_floats(eqx.filter(model, eqx.is_array))


if __name__ == "__main__":
  losses, model = train(SharedLM(jax.random.key(0)), eqx.filter_jit)
  print(json.dumps({"losses": losses, "weights": weights(model)}))
