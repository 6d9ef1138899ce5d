"""Canonical, module-independent descriptions of what an operation gave."""

import re

from test_stock_compat import strategies as S
from test_stock_compat.strategies import (
    DataNode,
    DataOnly,
    Empty,
    KeyedNode,
    MetaOnly,
    Pair,
    PlainNode,
    RegA,
    RegB,
    Single,
    ours,
    stock,
)

_MODULE_NAMES = sorted(
    {
        stock.PyTreeDef.__module__,
        ours.PyTreeDef.__module__,
        "jaxlib._jax.pytree",
        "jaxlib_patch.pytree",
    },
    key=len,
    reverse=True,
)

TREEDEF_TYPES = (stock.PyTreeDef, ours.PyTreeDef)
REGISTRY_TYPES = (stock.PyTreeRegistry, ours.PyTreeRegistry)
KEY_CLASSES = ["SequenceKey", "DictKey", "GetAttrKey", "FlattenedIndexKey"]
KEY_TYPES = tuple(getattr(m, n) for m in (stock, ours) for n in KEY_CLASSES)
ATOMS = (bool, int, float, complex, str, bytes, type(None))
NAMEDTUPLES = (Pair, Single, Empty)
DATACLASSES = (DataNode, DataOnly, MetaOnly)
# Other classes whose instances the modules build (through from_iterable or
# dataclass constructors); described by their attributes, not identity.
STRUCTURAL = (S.RaisingIterable, RegA, RegB)


def norm_msg(msg: str) -> str:
  """Removes what may legitimately differ from an error message.

  * memory addresses (``0x7f...``);
  * the module path of the pytree classes (nanobind argument-mismatch
    messages name ``jaxlib._jax.pytree.PyTreeDef`` etc.);
  * the candidate's documented extra keyword-only parameters, which show up
    in the signatures nanobind prints for register_node,
    register_dataclass_node and PyTreeRegistry's constructor.
  """
  msg = re.sub(r"0x[0-9a-fA-F]+", "0x?", msg)
  for name in _MODULE_NAMES:
    msg = msg.replace(name + ".", "<pytree>.")
  msg = re.sub(
      r",\s*\*,\s*preserve_relative_identities:\s*bool(\s*\|\s*None)?\s*=\s*\w+",
      "",
      msg,
  )
  msg = re.sub(
      r",\s*\*,\s*keeps_relative_identities:\s*bool\s*=\s*\w+", "", msg
  )
  return msg


def describe_exc(ex: BaseException):
  return ("raise", type(ex), norm_msg(str(ex)))


def safe(fn):
  """fn() or a description of the exception it raises."""
  try:
    return fn()
  except Exception as ex:  # noqa: BLE001
    return describe_exc(ex)


def treedef_summary(t):
  return (
      safe(lambda: repr(t)),
      safe(lambda: t.num_leaves),
      safe(lambda: t.num_nodes),
  )


def canon(x):
  """A module-independent, comparable description of ``x``.

  Containers built by the modules (tuples, lists, dicts, namedtuples, custom
  nodes) are described by type and content; treedefs by repr and sizes;
  keys by type name, repr and str; registries by flavour name; plain values
  by type and repr; any other object by identity (both modules receive the
  very same leaf objects, so the same id means the same leaf).
  """
  t = type(x)
  if t in ATOMS:
    return (t.__name__, repr(x))
  if t in TREEDEF_TYPES:
    return ("PyTreeDef",) + treedef_summary(x)
  if t in KEY_TYPES:
    return ("key", t.__name__, repr(x), str(x))
  if t in REGISTRY_TYPES:
    return ("registry", S.REGISTRY_NAMES.get(id(x), "<unnamed registry>"))
  if t is tuple or t is list:
    return (t.__name__,) + tuple(canon(i) for i in x)
  if t is dict:
    return ("dict",) + tuple((canon(k), canon(v)) for k, v in x.items())
  if t in NAMEDTUPLES:
    return (t.__name__,) + tuple(canon(i) for i in x)
  if t in (KeyedNode, PlainNode):
    return (t.__name__, canon(x.children), canon(x.meta))
  if t in DATACLASSES or t in STRUCTURAL:
    return (t.__name__, canon(vars(x)))
  if isinstance(x, type):
    return ("type", x)
  if isinstance(x, BaseException):
    return describe_exc(x)
  if hasattr(x, "__next__"):
    return ("iterator", t.__name__)
  return ("object", id(x), t.__name__)
