"""What copying and pickling do to the functions JAX hands back, run alike on
stock JAX and on the custom wheels (function_copies_test.py compares the two):
prints one JSON object of

* ``jit``: per kind of jitted function (plain, static-argument, donated,
  method-bound), how the object answers each name of ``dir()`` (its value
  where it is text, else the kind of object) and each
  protocol (copy, deepcopy, pickle through cloudpickle, weak reference,
  method binding, signature, repr, hash and ==, lower/trace/eval_shape, the
  cache queries, ``__new__`` then ``__setstate__``);
* ``transformed``: per public function of jax that takes a function first
  and gives back a new callable (found by a scan of the public namespaces'
  signatures, not by a list), whether the result copies, deep-copies and
  pickles through cloudpickle, and what each copy computes;
* ``modules``: the public modules that import here;
* ``signatures``: ``inspect.signature`` of every public callable of them.

Run as ``function_copies.py [opt-in]``: with ``opt-in``, a class is
registered first (opted in where the registry takes the flag), so that the
jitted functions are made in a process with an opt-in, and ``ties`` says
whether a tie given to each kind of jitted function (and to its pickled
copy) comes back tied.
"""

import copy
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import sys
import weakref

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np

# Where a public function that takes a function first is named so.
FUNCTION_PARAMETERS = ("fun", "f", "func", "fn", "function")
# Public modules that start services, or whose functions act on the process
# when called, are scanned for signatures only.
CALLED_NEVER = (
    "jax.distributed",
    "jax.profiler",
    "jax.config",
    "jax.monitoring",
    "jax.experimental.profiler",
    "jax.experimental.compilation_cache",
    "jax.debug",
)


def public_modules():
  """jax and every module under it whose dotted name has no private part."""
  names = ["jax"]
  for info in pkgutil.walk_packages(jax.__path__, "jax."):
    if any(part.startswith("_") for part in info.name.split(".")):
      continue
    if ".tests" in info.name or "jax2tf" in info.name:
      continue
    names.append(info.name)
  modules = {}
  for name in sorted(names):
    try:
      modules[name] = importlib.import_module(name)
    except Exception:  # pylint: disable=broad-except
      pass  # needs an optional package: the same on both sides
  return modules


def public_callables():
  """{qualified name: callable} over the public modules."""
  out = {}
  for module_name, module in public_modules().items():
    for name in sorted(vars(module)):
      obj = getattr(module, name)
      if name.startswith("_") or inspect.ismodule(obj) or not callable(obj):
        continue
      out[f"{module_name}.{name}"] = obj
  return out


def outcome(thunk):
  """What ``thunk()`` gave, as text: a value's repr, or the error's type."""
  try:
    value = thunk()
  except Exception as e:  # pylint: disable=broad-except
    return f"raises {type(e).__name__}"
  return describe(value)


def describe(value):
  if isinstance(value, (jax.Array, np.ndarray)):
    return f"array {np.round(np.asarray(value, np.float64), 5).tolist()}"
  if isinstance(value, (tuple, list)):
    return f"{type(value).__name__}[{', '.join(map(describe, value))}]"
  if isinstance(value, dict):
    return (
        "{" + ", ".join(f"{k}: {describe(v)}" for k, v in value.items()) + "}"
    )
  text = re.sub(r" at 0x[0-9a-f]+", "", repr(value))
  return re.sub(r"\b(jaxlib_patch\.pytree\.jit|jaxlib\._jax)\.", "", text)


def sine_sum(x):
  return jnp.sum(jnp.sin(x))


def copies(function):
  """{"copy", "deepcopy", "cloudpickle": the copy or the error's text}."""
  out = {}
  for name, make in (
      ("copy", copy.copy),
      ("deepcopy", copy.deepcopy),
      ("cloudpickle", lambda f: cloudpickle.loads(cloudpickle.dumps(f))),
  ):
    try:
      out[name] = make(function)
    except Exception as e:  # pylint: disable=broad-except
      out[name] = f"raises {type(e).__name__}"
  return out


def takes_a_function_first(obj):
  try:
    parameters = list(inspect.signature(obj).parameters.values())
  except (TypeError, ValueError):
    return False
  if not parameters or parameters[0].name not in FUNCTION_PARAMETERS:
    return False
  return all(
      p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
      for p in parameters[1:]
  )


def transformed():
  """Per public function that gives back a callable for a function."""
  out = {}
  x = jnp.arange(3.0)
  for name, obj in public_callables().items():
    if name.startswith(CALLED_NEVER) or not takes_a_function_first(obj):
      continue
    try:
      result = obj(sine_sum)
    except Exception:  # pylint: disable=broad-except
      continue
    if not callable(result) or result is sine_sum:
      continue
    row = {"call": outcome(lambda: result(x))}
    for kind, made in copies(result).items():
      row[kind] = (
          made if isinstance(made, str) else outcome(lambda made=made: made(x))
      )
    out[name] = row
  return out


class Scaler:
  """A class whose method is jitted (method binding)."""

  def __init__(self, factor):
    self.factor = factor

  @jax.jit
  def scale(self, x):
    return self.factor * x


def jitted_kinds():
  return {
      "plain": jax.jit(lambda x: x * 2),
      "static": jax.jit(lambda x, n: x * n, static_argnums=1),
      "static_name": jax.jit(lambda x, *, n: x * n, static_argnames="n"),
      "donated": jax.jit(lambda x: x + 1, donate_argnums=0),
      "method": Scaler(3.0).scale,
  }


def call_of(kind):
  """How each kind of jitted function is called in these checks."""
  x = jnp.arange(3.0)
  return {
      "static": lambda f: f(x, 3),
      "static_name": lambda f: f(x, n=3),
      "donated": lambda f: f(jnp.arange(3.0)),
  }.get(kind, lambda f: f(x))


def protocols(kind, jitted):
  call = call_of(kind)
  x = jnp.arange(3.0)
  row = {
      "call": outcome(lambda: call(jitted)),
      "repr": describe(jitted),
      "signature": outcome(lambda: str(inspect.signature(jitted))),
      "hash_eq": outcome(
          lambda: (
              hash(jitted) == hash(jitted),
              jitted == jitted,
              jitted == copy.copy(jitted),
          )
      ),
      "weakref": outcome(lambda: weakref.ref(jitted)() is jitted),
      "cache_size": outcome(jitted._cache_size),
      "clear_cache": outcome(
          lambda: (jitted._clear_cache(), jitted._cache_size())
      ),
      "cache_miss": outcome(lambda: callable(jitted._cache_miss)),
  }
  if kind == "plain":
    row["lower"] = outcome(lambda: jitted.lower(x).as_text() is not None)
    row["trace"] = outcome(lambda: str(jitted.trace(x).jaxpr))
    row["eval_shape"] = outcome(lambda: jitted.eval_shape(x))
    row["bound"] = outcome(lambda: jitted.__get__(Scaler(1.0))(x))
    fresh = outcome(lambda: (type(jitted).__new__(type(jitted)),))
    row["new"] = fresh
    row["new_setstate"] = outcome(lambda: _from_state(jitted)(x))
  if kind != "method":
    row["dir"] = sorted(dir(jitted))
    row["dict"] = sorted(vars(jitted))
    row["attributes"] = {name: attribute(jitted, name) for name in dir(jitted)}
  for name, made in copies(jitted).items():
    if isinstance(made, str):
      row[name] = made
      continue
    row[name] = {
        "call": outcome(lambda made=made: call(made)),
        "repr": describe(made),
        "dict": sorted(vars(made)),
        "signature": outcome(lambda made=made: str(inspect.signature(made))),
        "cache_size": outcome(made._cache_size),
    }
  return row


def signature(obj):
  """``inspect.signature(obj)`` as [[name, kind, annotation, default], ...,
  return annotation], or the error it raised."""
  try:
    found = inspect.signature(obj)
  except Exception as e:  # pylint: disable=broad-except
    return f"raises {type(e).__name__}"

  def text(value):
    return None if value is inspect.Parameter.empty else describe(value)

  return [
      [p.name, p.kind.name, text(p.annotation), text(p.default)]
      for p in found.parameters.values()
  ] + [text(found.return_annotation)]


def attribute(obj, name):
  """How `obj` answers `name`: its value where it is text or None (names,
  docs), "callable" for what can be called (a method of C++ is a builtin
  method on stock and nanobind's on ours), else the kind of object."""
  try:
    value = getattr(obj, name)
  except Exception as e:  # pylint: disable=broad-except
    return f"raises {type(e).__name__}"
  if value is None or isinstance(value, str):
    return describe(value)
  return "callable" if callable(value) else type(value).__name__


def _from_state(jitted):
  fresh = type(jitted).__new__(type(jitted))
  fresh.__setstate__(jitted.__getstate__())
  return fresh


@dataclasses.dataclass
class Param:
  value: jax.Array


def register_param():
  """Param registered, opted in where the registry takes the flag."""
  flag = {}
  register = jax.tree_util.register_dataclass
  if "preserve_relative_identities" in inspect.signature(register).parameters:
    flag = {"preserve_relative_identities": True}
  register(Param, data_fields=["value"], meta_fields=[], **flag)


def ties():
  """Per kind, whether a tie given to it, and to its copies, comes back."""
  p = Param(jnp.arange(3.0))
  both = jax.jit(lambda a, b: (a, b))
  out = {}
  for name, made in {"original": both, **copies(both)}.items():
    if isinstance(made, str):
      out[name] = made  # how copying failed
      continue
    a, b = made(p, p)
    out[name] = [a is b, a is not p]
  return out


def main():
  opt_in = sys.argv[1:] == ["opt-in"]
  if opt_in:
    register_param()
  result = {
      "jit": {kind: protocols(kind, f) for kind, f in jitted_kinds().items()},
      "transformed": transformed(),
      "modules": sorted(public_modules()),
      "signatures": {
          name: signature(obj) for name, obj in public_callables().items()
      },
  }
  if opt_in:
    result["ties"] = ties()
  json.dump(result, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
  main()
