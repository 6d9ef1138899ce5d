"""Differential tests: ``jaxlib_patch.pytree`` must behave exactly like stock.

Every test runs the same operation against the stock module
(``jaxlib._jax.pytree``) and against the candidate (``jaxlib_patch.pytree``)
and compares the *outcomes*: the returned values (canonicalized, see
``canon``), or the exception type and message when the operation raises.  It
also compares the log of Python callbacks each module made (custom
``to_iterable``/``from_iterable`` functions, leaf predicates, walk
callbacks), since those calls are observable behaviour too.

Only trees in which no class opts into the candidate's extra
``preserve_relative_identities`` flag are used: there the candidate must be a
drop-in replacement.

Error messages are compared after removing memory addresses, the module path
of the pytree classes, and the candidate's extra keyword-only parameter from
nanobind signatures (``norm_msg``).  Two stock defects are tolerated rather
than required: hash consistency (a == b implies equal hashes) is only checked
for treedefs of one registry, and the recursion depth stock leaks on nested
errors is compensated by a fixture (the candidate may leak less, not more).

The deliberate differences documented in docs/semantics.md ("Deliberate
differences from stock jaxlib 0.10.2") are listed in ``DEVIATIONS``: for each
item, the hand-written cases and property sub-checks it affects and what the
candidate must do there instead of matching stock (raise a given exception
type, order dict keys with ``sorted()``, ...).  Those places are still
checked, just against the documented behaviour; ``test_deviations_table``
keeps the table in step with the document.

Environment variables:

* ``PYTREE_CANDIDATE=stock`` compares stock with itself (for working on this
  suite while the candidate is not built; see ``strategies.py``).
* ``PYTREE_EXAMPLES=N`` overrides the number of hypothesis examples per
  property (default 300).
* ``PYTREE_COMPARE_CALLS=0`` stops comparing callback logs (to see other
  differences when a callback-order difference masks them).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
import re
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import strategies as S  # noqa: E402
from strategies import (  # noqa: E402
    CALLS,
    OURS,
    SIDES,
    STOCK,
    DataNode,
    DataOnly,
    Empty,
    Junk,
    JunkNoKeys,
    KeyedNode,
    Leaf,
    MetaOnly,
    Opaque,
    Pair,
    PlainNode,
    Single,
    TupleSub,
    log_call,
    ours,
    stock,
)

EXAMPLES = int(os.environ.get("PYTREE_EXAMPLES", "300"))
COMPARE_CALLS = os.environ.get("PYTREE_COMPARE_CALLS", "1") != "0"

PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    report_multiple_bugs=False,  # shrink one difference per property
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

# ---------------------------------------------------------------------------
# Canonical, module-independent descriptions of results.
# ---------------------------------------------------------------------------

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
KEY_TYPES = tuple(
    getattr(m, n)
    for m in (stock, ours)
    for n in ("SequenceKey", "DictKey", "GetAttrKey", "FlattenedIndexKey")
)
ATOMS = (bool, int, float, complex, str, bytes, type(None))
NAMEDTUPLES = (Pair, Single, Empty)
DATACLASSES = (DataNode, DataOnly, MetaOnly)
# Other classes whose instances the modules build (through from_iterable or
# dataclass constructors); described by their attributes, not identity.
STRUCTURAL = [S.RaisingIterable]  # + the registration-test classes below


def norm_msg(msg: str) -> str:
  """Removes what may legitimately differ from an error message.

  * memory addresses (``0x7f...``);
  * the module path of the pytree classes (nanobind argument-mismatch
    messages name ``jaxlib._jax.pytree.PyTreeDef`` etc.);
  * the candidate's documented extra keyword-only parameter, which shows up
    in the signature nanobind prints for register_node and
    register_dataclass_node.
  """
  msg = re.sub(r"0x[0-9a-fA-F]+", "0x?", msg)
  for name in _MODULE_NAMES:
    msg = msg.replace(name + ".", "<pytree>.")
  msg = re.sub(
      r",\s*\*,\s*preserve_relative_identities:\s*bool\s*=\s*\w+", "", msg
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


# ---------------------------------------------------------------------------
# Running one operation on both sides.
# ---------------------------------------------------------------------------


class Ran:
  """What running an operation on one side produced."""

  def __init__(self, value, error, calls):
    self.value, self.error, self.calls = value, error, calls

  @property
  def ok(self):
    return self.error is None

  def describe(self):
    if self.error is not None:
      return describe_exc(self.error)
    return ("ok", canon(self.value))


def run_on(side, fn):
  CALLS.clear()
  try:
    value, error = fn(side), None
  except Exception as ex:  # noqa: BLE001
    value, error = None, ex
  calls = tuple(CALLS)
  CALLS.clear()
  return Ran(value, error, calls)


def both(
    op: str,
    fn,
    *,
    calls: bool = True,
    place: str | None = None,
    ctx: dict | None = None,
):
  """Runs ``fn(side)`` for stock and candidate; asserts identical outcomes.

  ``place`` names the spot in ``DEVIATIONS`` where a documented deliberate
  difference applies (callers pass it only when its condition holds); there
  the candidate must either match stock or do what the table says instead
  (checked with ``ctx``, the inputs the check needs).

  Returns the two ``Ran`` records (stock first) so callers can continue
  with the values each module produced.
  """
  s, o = run_on(STOCK, fn), run_on(OURS, fn)
  sd, od = s.describe(), o.describe()
  if place is None:
    assert sd == od, f"{op}: results differ\n  stock: {sd!r}\n  ours:  {od!r}"
    if calls and COMPARE_CALLS:
      assert s.calls == o.calls, (
          f"{op}: Python callbacks differ\n  stock: {s.calls!r}\n"
          f"  ours:  {o.calls!r}"
      )
    return s, o
  item, instead = DEVIATION_AT[place]
  where = (
      f"{op}: differs from stock beyond deliberate difference {item} "
      f"of docs/semantics.md ({place}: the candidate must "
      f"{instead.text})"
  )
  if sd != od:
    try:
      instead.check(s, o, ctx or {})
    except AssertionError as ex:
      raise AssertionError(
          f"{where}: {ex}\n  stock: {sd!r}\n  ours:  {od!r}"
      ) from None
  if calls and COMPARE_CALLS:
    try:
      (instead.calls or _same_calls)(s, o)
    except AssertionError as ex:
      raise AssertionError(
          f"{where}: Python callbacks: {ex}\n  stock: {s.calls!r}\n"
          f"  ours:  {o.calls!r}"
      ) from None
  return s, o


def _same_calls(s, o):
  assert s.calls == o.calls, "they differ"


def expect_same_error(op: str, fn):
  """Like ``both`` but additionally requires that the operation raises."""
  s, o = both(op, fn)
  assert not s.ok, f"{op}: expected an error, stock returned {s.value!r}"
  return s, o


def check_hash_consistency(a, b):
  """Within one module: a == b must imply hash(a) == hash(b)."""
  try:
    equal = a == b
  except Exception:  # noqa: BLE001  (equality may raise on bad metadata)
    return
  if equal:
    assert hash(a) == hash(b), f"equal treedefs, different hashes: {a!r}"


# ---------------------------------------------------------------------------
# Deliberate differences from stock.
#
# docs/semantics.md, "Deliberate differences from stock jaxlib 0.10.2", lists
# the cases where the candidate gives a clear behaviour instead of a stock
# bug or accident.  DEVIATIONS names each one by its item number there and,
# for every hand-written case ("case:<name>") or property sub-check
# ("<test>/<operation>") it affects, what the candidate must do instead.
# A deviation only narrows what is compared: the candidate may match stock,
# or do exactly what the table says; anything else (another exception type,
# returning instead of raising, a crash, other callbacks) still fails.
# Property tests pass ``place`` only when the condition the item describes
# holds (e.g. dict keys without a total order), so all other examples stay
# fully strict.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instead:
  """What the candidate must do at one place, instead of matching stock.

  ``check(stock, ours, ctx)`` asserts it on the two ``Ran`` records (it is
  called only when the outcomes differ); ``calls(stock, ours)`` compares the
  callback logs (default: identical, as everywhere else).
  """

  text: str
  check: object
  calls: object = None


@dataclasses.dataclass(frozen=True)
class Deviation:
  summary: str
  places: dict  # place -> Instead


def raises(exc_type, *, prefix=None, same_message=False):
  """Instead: raise exactly ``exc_type`` (optionally: message starting with
  ``prefix``, or the same message as stock)."""
  text = f"raise {exc_type.__name__}"
  if prefix is not None:
    text += f" with a message starting {prefix!r}"
  elif same_message:
    text += " with stock's message"
  else:
    text += " (any message)"

  def check(s, o, ctx):
    assert o.error is not None, "it returned instead of raising"
    assert (
        type(o.error) is exc_type
    ), f"it raised {type(o.error).__name__}, not {exc_type.__name__}"
    msg = norm_msg(str(o.error))
    if prefix is not None:
      assert msg.startswith(prefix), f"unexpected message {msg!r}"
    if same_message:
      assert s.error is not None and msg == norm_msg(
          str(s.error)
      ), f"message {msg!r} is not stock's"

  return Instead(text, check)


def _outcome_is(expected_fn):
  """Instead: the outcome described by ``expected_fn(ctx)`` (a description
  in the form of ``Ran.describe``)."""

  def check(s, o, ctx):
    expected = expected_fn(ctx)
    assert o.describe() == expected, f"expected {expected!r}"

  return check


# Item 2: flatten_one_level_with_keys of a namedtuple.
def _check_namedtuple_own_fields(s, o, ctx):
  assert s.ok and o.ok, "both must return"
  pairs, node_type = s.value
  fields = getattr(node_type, "_fields", None)
  assert fields is not None and len(fields) == len(
      pairs
  ), "stock's result is not that of a namedtuple"
  expected = (
      type(pairs)(
          (OURS.mod.GetAttrKey(f), child)
          for f, (_, child) in zip(fields, pairs)
      ),
      node_type,
  )
  assert canon(o.value) == canon(expected), f"expected {canon(expected)!r}"


# Item 6: dict keys without a total order.  The candidate must behave as
# stock would if dict keys were ordered by Python's sorted(): these oracles
# describe that outcome for the flat dicts {key: leaf} of test_dict_keys.
def sort_order_is_an_artifact(keys):
  """True when comparing the keys never raises but ``<`` is not a strict
  total order on them (e.g. NaN among numbers, incomparable frozensets).
  Keys whose comparison raises are not a deviation: both modules raise."""
  keys = list(keys)
  try:
    lt = {
        (i, j): keys[i] < keys[j]
        for i in range(len(keys))
        for j in range(len(keys))
        if i != j
    }
  except Exception:  # noqa: BLE001
    return False
  n = len(keys)
  for i in range(n):
    for j in range(n):
      if i != j and lt[i, j] == lt[j, i]:
        return True
      for k in range(n):
        if len({i, j, k}) == 3 and lt[i, j] and lt[j, k] and not lt[i, k]:
          return True
  return False


def _sorted_keys(d):
  """sorted(d), or the description of the error sorting raises."""
  try:
    return sorted(d), None
  except Exception:  # noqa: BLE001
    return None, (
        "raise",
        ValueError,
        "Comparator raised exception while sorting pytree " "dictionary keys.",
    )


def _dict_treedef_desc(keys):
  items = ", ".join(f"{k!r}: *" for k in keys)
  return ("PyTreeDef", f"PyTreeDef({{{items}}})", len(keys), len(keys) + 1)


def _sorted_flatten(which, with_path=False):
  def expected(ctx):
    d = ctx[which]
    keys, err = _sorted_keys(d)
    if err:
      return err
    if with_path:
      leaves = canon([((OURS.mod.DictKey(k),), d[k]) for k in keys])
    else:
      leaves = canon([d[k] for k in keys])
    return ("ok", ("tuple", leaves, _dict_treedef_desc(keys)))

  return expected


def _sorted_flatten_one_level(ctx):
  d = ctx["tree"]
  keys, err = _sorted_keys(d)
  return err or ("ok", canon((tuple(d[k] for k in keys), tuple(keys))))


def _sorted_unflatten(ctx):
  keys, err = _sorted_keys(ctx["tree"])
  return err or ("ok", canon(dict(zip(keys, ctx["pool"]))))


def _sorted_flatten_up_to(ctx):
  expected_keys, err = _sorted_keys(ctx["tree"])
  present_keys, err2 = _sorted_keys(ctx["other"])
  if err or err2:
    return err or err2
  if expected_keys != present_keys:
    return (
        "raise",
        ValueError,
        f"Dict key mismatch; expected keys: {expected_keys!r}; "
        f"present keys: {present_keys!r}.",
    )
  return ("ok", canon([ctx["other"][k] for k in present_keys]))


def _sorted_equality(ctx):
  a, err = _sorted_keys(ctx["tree"])
  b, err2 = _sorted_keys(ctx["other"])
  return err or err2 or ("ok", canon(a == b))


# Item 7: from_iterable calls in another order.
FROM_ITERABLE_CALLBACKS = {
    "keyed_unflatten",
    "plain_unflatten",
    "junk_unflatten",
    "tuple_unflatten",
    "rega_unflatten",
    "DataNode.__init__",
}


def _same_outcome(s, o, ctx):
  raise AssertionError("the outcome must be stock's")


def _from_iterable_calls_as_multiset(s, o):
  def split(calls):
    others = [c for c in calls if c[0] not in FROM_ITERABLE_CALLBACKS]
    built = sorted(repr(c) for c in calls if c[0] in FROM_ITERABLE_CALLBACKS)
    return others, built

  s_others, s_built = split(s.calls)
  o_others, o_built = split(o.calls)
  assert s_others == o_others, "the other callbacks differ"
  if s.ok:
    assert s_built == o_built, "the from_iterable calls differ as a multiset"


# Item 9: stock truncates some messages about junk returned by flatten
# functions right after "... where 'child" (followed by the offending
# object); the candidate completes them.
def _check_completed_message(s, o, ctx):
  assert s.error is not None and o.error is not None, "both must raise"
  assert type(o.error) is type(s.error), "the exception types differ"
  stock_msg, ours_msg = norm_msg(str(s.error)), norm_msg(str(o.error))
  m = re.fullmatch(r"(.* where )'child(.*)", stock_msg, re.S)
  assert m, "stock's message is not a truncated one; messages must match"
  assert ours_msg.startswith(m[1]) and ours_msg.endswith(
      m[2]
  ), "the candidate's message does not complete stock's"


_NDC_SIGNATURE = (
    "from_node_data_and_children(): incompatible function " "arguments"
)
_KEY_SIGNATURE = "__init__(): incompatible function arguments"
_SORTED = "behave as stock would with the keys in Python's sorted() order: "
_COMPLETED = Instead(
    "raise the same exception type as stock; where stock's message is "
    'truncated after "where \'child", a message with the same beginning '
    "and the same offending object at the end",
    _check_completed_message,
)

DEVIATIONS = {
    1: Deviation(
        "A tree deeper than the recursion limit raises RecursionError "
        "(stock: SystemError wrapping it).",
        {
            "case:flatten_deeper_than_recursion_limit": raises(RecursionError),
            "case:flatten_with_path_deeper_than_recursion_limit": raises(
                RecursionError
            ),
        },
    ),
    2: Deviation(
        "flatten_one_level_with_keys keys a namedtuple's children by their "
        "own fields (stock repeats the first field name).",
        {
            place: Instead(
                "return stock's result with the keys "
                "GetAttrKey(<the namedtuple's own fields>)",
                _check_namedtuple_own_fields,
            )
            for place in (
                "case:flatten_one_level_namedtuple_keys",
                "test_flatten_one_level/flatten_one_level_with_keys",
            )
        },
    ),
    3: Deviation(
        "deserialize_using_proto of non-proto bytes raises ValueError "
        "(stock: its JaxRuntimeError).",
        {"case:proto_garbage": raises(ValueError, same_message=True)},
    ),
    4: Deviation(
        "from_node_data_and_children and treedef_tuple check their input.",
        {
            "case:ndc_tuple_bad_children": raises(TypeError),
            "case:treedef_tuple_non_treedef": raises(TypeError),
            "case:ndc_dict_bad_data": raises(TypeError),
            "case:ndc_dict_mapping_data": raises(TypeError),
            "case:ndc_leaf_with_children": raises(ValueError),
            "case:ndc_non_type": raises(TypeError, prefix=_NDC_SIGNATURE),
        },
    ),
    5: Deviation(
        "PyTreeDef.__setstate__ validates the whole state: ValueError.",
        {
            "case:setstate_int": raises(ValueError),
            "case:setstate_wrong_tuple": raises(ValueError),
            "case:setstate_unknown_kind": raises(ValueError),
            **{
                f"case:setstate_{name}": raises(
                    ValueError, prefix="Malformed pickled PyTreeDef: "
                )
                for name in (
                    "arity_too_big",
                    "negative_arity",
                    "two_roots",
                    "no_nodes",
                    "dict_keys_short",
                    "dict_keys_not_a_list",
                )
            },
        },
    ),
    6: Deviation(
        "Dict keys with no total order are sorted with Python's sorted(); "
        "stock's order for them is an artifact of its C++ sort.",
        {
            "test_dict_keys/flatten": Instead(
                _SORTED + "leaves and treedef keys in that order",
                _outcome_is(_sorted_flatten("tree")),
            ),
            "test_dict_keys/flatten other": Instead(
                _SORTED + "leaves and treedef keys in that order",
                _outcome_is(_sorted_flatten("other")),
            ),
            "test_dict_keys/flatten_with_path": Instead(
                _SORTED + "paths, leaves and treedef keys in that order",
                _outcome_is(_sorted_flatten("tree", with_path=True)),
            ),
            "test_dict_keys/flatten_one_level": Instead(
                _SORTED + "children and keys in that order",
                _outcome_is(_sorted_flatten_one_level),
            ),
            "test_dict_keys/unflatten": Instead(
                _SORTED + "the leaves assigned to the keys in that order",
                _outcome_is(_sorted_unflatten),
            ),
            "test_dict_keys/flatten_up_to(other dict)": Instead(
                _SORTED + "the subtrees of the other dict in that order, or "
                "stock's key-mismatch ValueError listing both sorted key lists "
                "when they differ",
                _outcome_is(_sorted_flatten_up_to),
            ),
            "test_dict_keys/== other dict": Instead(
                _SORTED + "equal exactly when both sorted key lists are equal",
                _outcome_is(_sorted_equality),
            ),
        },
    ),
    7: Deviation(
        "from_iterable_tree builds nodes bottom-up, left to right (stock: "
        "right to left); only the order of from_iterable calls differs.",
        {
            place: Instead(
                "give stock's outcome, make the same other callbacks in the same "
                "order and, when it returns, the same from_iterable calls as a "
                "multiset (when it raises, which nodes were built before the "
                "error depends on the order, so those are not compared)",
                _same_outcome,
                _from_iterable_calls_as_multiset,
            )
            for place in (
                "case:fit_custom",
                "test_from_iterable_tree/from_iterable_tree",
            )
        },
    ),
    8: Deviation(
        "SequenceKey and FlattenedIndexKey take an int (stock also converts "
        "a numeric string).",
        {
            place: raises(TypeError, prefix=_KEY_SIGNATURE)
            for place in ("test_keys/construct", "test_keys/construct other")
        },
    ),
    9: Deviation(
        "Flatten functions returning junk: the same exception type as stock, "
        "with a complete message.",
        {
            "test_misbehaving_custom_nodes/flatten_with_path": _COMPLETED,
            "test_misbehaving_custom_nodes/flatten_one_level_with_keys": _COMPLETED,
        },
    ),
    10: Deviation(
        "Bad input that stock answers with RuntimeError raises ValueError.",
        {
            **{
                place: raises(ValueError, same_message=True)
                for place in (
                    "case:ndc_unregistered_type",
                    "case:ndc_custom_in_bare",
                    "case:ndc_disabled_none",
                    "case:ndc_disabled_tuple",
                    "test_children_node_data_rebuild/"
                    "from_node_data_and_children(other registry)",
                )
            },
            **{
                place: raises(ValueError, prefix="Malformed PyTreeDef: ")
                for place in (
                    "case:ndc_dict_too_few_keys",
                    "case:proto_empty",
                    "case:proto_two_roots",
                )
            },
        },
    ),
}

# place -> (item number, Instead)
DEVIATION_AT = {
    place: (item, instead)
    for item, deviation in DEVIATIONS.items()
    for place, instead in deviation.places.items()
}


# ---------------------------------------------------------------------------
# Stock leaks Python recursion depth.
#
# Stock flatten / flatten_with_path leave the interpreter's recursion counter
# raised by one for every nesting level an exception propagates through (a
# raising to_iterable or leaf predicate, unsortable dict keys, ... below the
# root).  This suite provokes many such errors (about a thousand leaked levels
# per run), which would end in spurious RecursionErrors.  The fixture below
# gives the interpreter head-room while this module runs and, at the end,
# leaves the limit raised by exactly the amount leaked, so later test modules
# see the same effective limit as before.
# ---------------------------------------------------------------------------

_HEADROOM = 50_000


def available_depth():
  """How many more Python frames can be entered before RecursionError."""
  n = 0

  def dive():
    nonlocal n
    n += 1
    dive()

  try:
    dive()
  except RecursionError:
    pass
  return n


@pytest.fixture(autouse=True, scope="module")
def _compensate_recursion_leaks():
  old_limit = sys.getrecursionlimit()
  before = available_depth()
  sys.setrecursionlimit(old_limit + _HEADROOM)
  yield
  leaked = before + _HEADROOM - available_depth()
  sys.setrecursionlimit(old_limit + max(leaked, 0))


# ---------------------------------------------------------------------------
# Leaf predicates (all log their calls).
# ---------------------------------------------------------------------------


def _pred(name, fn):
  def predicate(x):
    log_call("pred", name, id(x))
    return fn(x)

  return predicate


def _raise_on_tuple(x):
  if type(x) is tuple:
    raise ArithmeticError("predicate failed")
  return False


LEAF_PREDICATES = {
    "absent": None,
    "explicit_none": None,
    "tuples": lambda x: type(x) is tuple,
    "lists_dicts": lambda x: isinstance(x, (list, dict)),
    "custom": lambda x: isinstance(x, (KeyedNode, DataNode, Pair)),
    "never": lambda x: False,
    "returns_None": lambda x: None,
    "short_seq": lambda x: isinstance(x, (tuple, list)) and len(x) < 2,
    "is_None": lambda x: x is None,
    "returns_int": lambda x: 1 if isinstance(x, list) else False,
    "returns_array": lambda x: np.array([True]) if type(x) is dict else False,
    "raises": _raise_on_tuple,
}

leaf_predicate_names = st.sampled_from(sorted(LEAF_PREDICATES))


def make_leaf_predicate(name):
  fn = LEAF_PREDICATES[name]
  return None if fn is None else _pred(name, fn)


def _path_pred(name, fn):
  def predicate(path, x):
    log_call("path_pred", name, canon(path), id(x))
    return fn(path, x)

  return predicate


PATH_PREDICATES = {
    "absent": None,
    "explicit_none": None,
    "depth1": lambda p, x: len(p) >= 1,
    "depth2": lambda p, x: len(p) >= 2,
    "first_index_0": lambda p, x: bool(p)
    and repr(p[0]).startswith("SequenceKey(idx=0"),
    "tuples": lambda p, x: type(x) is tuple,
    "returns_str": lambda p, x: "yes" if len(p) == 1 else False,
    "raises": lambda p, x: _raise_on_tuple(x),
}

path_predicate_names = st.sampled_from(sorted(PATH_PREDICATES))


def make_path_predicate(name):
  fn = PATH_PREDICATES[name]
  return None if fn is None else _path_pred(name, fn)


def flatten_with(side, flavour, tree, pred_name):
  """Calls flatten in the way named by pred_name (absent/None/predicate)."""
  reg = side.regs[flavour]
  if pred_name == "absent":
    return reg.flatten(tree)
  if pred_name == "explicit_none":
    return reg.flatten(tree, None)
  return reg.flatten(tree, leaf_predicate=make_leaf_predicate(pred_name))


def flatten_with_path_with(side, flavour, tree, pred_name):
  reg = side.regs[flavour]
  if pred_name == "absent":
    return reg.flatten_with_path(tree)
  if pred_name == "explicit_none":
    return reg.flatten_with_path(tree, leaf_predicate=None)
  return reg.flatten_with_path(tree, make_path_predicate(pred_name))


def treedef_of(side, flavour, tree):
  return side.regs[flavour].flatten(tree)[1]


# ---------------------------------------------------------------------------
# Python-level navigation of generated trees (to build related inputs).
# ---------------------------------------------------------------------------


def py_children(x):
  """(step, child) pairs for the container kinds the strategies build."""
  t = type(x)
  if t in (tuple, list) or t in NAMEDTUPLES:
    return list(enumerate(x))
  if t is dict:
    return list(x.items())
  if t in (KeyedNode, PlainNode):
    return list(enumerate(x.children))
  if t is DataNode:
    return [("x", x.x), ("y", x.y)]
  if t is DataOnly:
    return [("a", x.a)]
  return []


def subtree_paths(x, prefix=()):
  """All paths (tuples of steps) to subtrees of x, the root included."""
  yield prefix
  for step, child in py_children(x):
    yield from subtree_paths(child, prefix + (step,))


def subtrees(x):
  yield x
  for _, child in py_children(x):
    yield from subtrees(child)


def get_at(x, path):
  for step in path:
    x = dict(py_children(x))[step]
  return x


def replace_child(x, step, new):
  """A copy of container x with child ``step`` replaced by ``new``."""
  t = type(x)
  if t in (tuple, list):
    items = list(x)
    items[step] = new
    return t(items)
  if t in NAMEDTUPLES:
    items = list(x)
    items[step] = new
    return t(*items)
  if t is dict:
    d = dict(x)
    d[step] = new
    return d
  if t in (KeyedNode, PlainNode):
    items = list(x.children)
    items[step] = new
    return t(tuple(items) if t is KeyedNode else items, x.meta)
  if t in (DataNode, DataOnly):
    return dataclasses.replace(x, **{step: new})
  raise AssertionError(t)


def replace_at(x, path, new):
  if not path:
    return new
  step = path[0]
  child = dict(py_children(x))[step]
  return replace_child(x, step, replace_at(child, path[1:], new))


def mutations(node):
  """Names of the structural mutations applicable to ``node``."""
  t = type(node)
  names = ["replace_leaf", "replace_none", "replace_tree"]
  if t in (tuple, list):
    names += ["append", "swap_seq_type"] + (["drop"] if node else [])
  if t is dict:
    names += ["add_key"] + (["drop_key"] if node else [])
  if t in (KeyedNode, PlainNode):
    names += ["change_meta", "swap_custom", "append_child"]
  if t in NAMEDTUPLES:
    names += ["namedtuple_to_tuple"]
  if t is DataNode:
    names += ["change_tag"]
  return names


def mutate(node, name, data):
  """Applies mutation ``name`` to node, drawing what is needed from data."""
  t = type(node)
  if name == "replace_leaf":
    return Opaque("mutant")
  if name == "replace_none":
    return None
  if name == "replace_tree":
    return data.draw(S.trees(max_leaves=4), label="replacement")
  if name == "append":
    return t(list(node) + [Leaf(99)])
  if name == "drop":
    return t(list(node)[:-1])
  if name == "swap_seq_type":
    return list(node) if t is tuple else tuple(node)
  if name == "add_key":
    key = data.draw(st.one_of(S.str_keys, S.int_keys), label="new key")
    return {**node, key: Leaf(98)}
  if name == "drop_key":
    d = dict(node)
    d.pop(next(iter(d)))
    return d
  if name == "change_meta":
    return t(node.children, ("changed", node.meta))
  if name == "swap_custom":
    other = PlainNode if t is KeyedNode else KeyedNode
    return other(tuple(node.children), node.meta)
  if name == "append_child":
    return t(tuple(node.children) + (Leaf(97),), node.meta)
  if name == "namedtuple_to_tuple":
    return tuple(node)
  if name == "change_tag":
    return DataNode(node.x, node.y, ("changed", node.tag))
  raise AssertionError(name)


def draw_mutant(data, tree):
  """tree with one randomly chosen subtree structurally changed."""
  paths = list(subtree_paths(tree))
  path = data.draw(st.sampled_from(paths), label="mutation path")
  node = get_at(tree, path)
  name = data.draw(st.sampled_from(mutations(node)), label="mutation")
  return replace_at(tree, path, mutate(node, name, data))


def draw_leafwise_extension(data, tree, flavour):
  """A tree that has ``tree`` as a prefix: each leaf replaced by a subtree.

  Built with the stock module (input construction only).
  """
  leaves, treedef = STOCK.regs[flavour].flatten(tree)
  replacements = data.draw(
      st.lists(
          S.trees(max_leaves=3), min_size=len(leaves), max_size=len(leaves)
      ),
      label="leaf replacements",
  )
  return treedef.unflatten(replacements)


def draw_same_structure(data, tree, flavour):
  """A tree with the structure of ``tree`` (for flavour) but other leaves."""
  leaves, treedef = STOCK.regs[flavour].flatten(tree)
  new_leaves = data.draw(
      st.lists(
          S.leaves.filter(lambda v: v is not None),
          min_size=len(leaves),
          max_size=len(leaves),
      ),
      label="other leaves",
  )
  return treedef.unflatten(new_leaves)


def leaf_pool(n):
  return [Leaf(i) for i in range(max(n, 0))]


LEAF_ITERABLES = {
    "list": list,
    "tuple": tuple,
    "generator": lambda leaves: (x for x in leaves),
    "iterator": iter,
    "raising": lambda leaves: _raising_after(leaves),
}


def _raising_after(leaves):
  yield from leaves
  raise KeyError("leaf iterator failed")


# ---------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------


@PROPERTY
@given(
    tree=S.trees(mixed_keys=True), flavour=S.flavours, pred=leaf_predicate_names
)
def test_flatten(tree, flavour, pred):
  """flatten: same leaves (by identity, in order), same treedef repr and
  sizes, same predicate/to_iterable calls, same errors."""

  def op(side):
    leaves, treedef = flatten_with(side, flavour, tree, pred)
    assert treedef.num_leaves == len(leaves)
    return [id(x) for x in leaves], leaves, treedef

  s, o = both("flatten", op)
  if s.ok:
    # Consistency of the returned treedef with itself, in both modules.
    both("treedef == itself", lambda side: op(side)[2] == op(side)[2])
    for r in (s, o):
      check_hash_consistency(r.value[2], r.value[2])


@PROPERTY
@given(
    tree=S.trees(mixed_keys=True), flavour=S.flavours, pred=path_predicate_names
)
def test_flatten_with_path(tree, flavour, pred):
  """flatten_with_path: same (key path, leaf) pairs (keys compared by type,
  repr and str; leaves by identity), same treedef, and the treedef equals the
  one from flatten when no predicate is given."""

  def op(side):
    pairs, treedef = flatten_with_path_with(side, flavour, tree, pred)
    return [id(leaf) for _, leaf in pairs], pairs, treedef

  s, _ = both("flatten_with_path", op)
  if s.ok and pred in ("absent", "explicit_none"):
    both(
        "flatten_with_path treedef == flatten treedef",
        lambda side: op(side)[2] == treedef_of(side, flavour, tree),
    )


@PROPERTY
@given(tree=S.trees(mixed_keys=True), flavour=S.flavours)
def test_flatten_one_level(tree, flavour):
  """flatten_one_level and flatten_one_level_with_keys on every subtree:
  same children (and whether the input container itself is returned), same
  aux data, same keys, None for leaves, same errors."""
  for sub in subtrees(tree):

    def plain(side, sub=sub):
      res = side.regs[flavour].flatten_one_level(sub)
      return res, res is not None and res[0] is sub

    def keyed(side, sub=sub):
      return side.regs[flavour].flatten_one_level_with_keys(sub)

    both("flatten_one_level", plain)
    both(
        "flatten_one_level_with_keys",
        keyed,
        place=(
            "test_flatten_one_level/flatten_one_level_with_keys"
            if type(sub) in NAMEDTUPLES
            else None
        ),
    )


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    pred=leaf_predicate_names,
    delta=st.sampled_from([0, 0, 0, -1, 1, 5]),
    kind=st.sampled_from(sorted(LEAF_ITERABLES)),
)
def test_unflatten(tree, flavour, pred, delta, kind):
  """unflatten with fresh sentinel leaves (right and wrong counts, several
  iterable kinds): same rebuilt tree (types, dict order, custom nodes built
  via the same from_iterable calls), or same error; also unflatten(flatten(t))
  round trip."""
  s, _ = both("flatten", lambda side: flatten_with(side, flavour, tree, pred))
  if not s.ok:
    return
  n = s.value[1].num_leaves
  pool = leaf_pool(n + delta)

  def op(side):
    treedef = flatten_with(side, flavour, tree, pred)[1]
    return treedef.unflatten(LEAF_ITERABLES[kind](pool))

  both("unflatten", op)

  def roundtrip(side):
    leaves, treedef = flatten_with(side, flavour, tree, pred)
    return treedef.unflatten(leaves)

  both("unflatten(flatten(tree))", roundtrip)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour_a=S.flavours,
    flavour_b=S.flavours,
    how=st.sampled_from(
        [
            "same_structure",
            "same_structure",
            "mutant",
            "independent",
            "same_tree",
        ]
    ),
)
def test_treedef_equality_and_hash(data, tree, flavour_a, flavour_b, how):
  """== and != between treedefs (same or different registries, equal or
  different structure, against non-treedefs) agree with stock, and within
  each module a == b implies hash(a) == hash(b)."""
  if how == "same_structure":
    other = draw_same_structure(data, tree, flavour_a)
  elif how == "mutant":
    other = draw_mutant(data, tree)
  elif how == "independent":
    other = data.draw(S.trees(), label="independent tree")
  else:
    other = tree
  if data.draw(st.booleans(), label="same registry"):
    flavour_b = flavour_a

  def pair(side):
    return (
        treedef_of(side, flavour_a, tree),
        treedef_of(side, flavour_b, other),
    )

  s, o = both("flatten pair", pair)
  if not s.ok:
    return
  both("a == b", lambda side: pair(side)[0] == pair(side)[1])
  both("a != b", lambda side: pair(side)[0] != pair(side)[1])
  both("b == a", lambda side: pair(side)[1] == pair(side)[0])
  both("a == a", lambda side: (lambda a: a == a)(pair(side)[0]))
  both(
      "a == 5, a != 5, a == None",
      lambda side: (lambda a: (a == 5, a != 5, a == None))(  # noqa: E711
          pair(side)[0]
      ),
  )
  both(
      "hash succeeds",
      lambda side: [type(safe(lambda t=t: hash(t))) is int for t in pair(side)],
  )
  for r, side in ((s, STOCK), (o, OURS)):
    a, b = r.value
    check_hash_consistency(a, a)
    check_hash_consistency(a, pair(side)[0])
    # Only for treedefs of the same registry: stock itself breaks the rule
    # across registries (a dataclass node flattened by two registries that
    # both registered the class compares equal but hashes differently).
    if flavour_a == flavour_b:
      check_hash_consistency(a, b)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    how=st.sampled_from(
        ["extension", "extension", "mutant", "mutant", "independent", "same"]
    ),
)
def test_flatten_up_to(data, tree, flavour, how):
  """treedef.flatten_up_to on trees that do and do not have the treedef as a
  prefix: same returned subtrees (by identity where objects), same error
  type and message for every kind of mismatch."""
  if how == "extension":
    full = draw_leafwise_extension(data, tree, flavour)
  elif how == "mutant":
    full = draw_mutant(data, draw_leafwise_extension(data, tree, flavour))
  elif how == "independent":
    full = data.draw(S.trees(), label="independent tree")
  else:
    full = tree

  def op(side):
    out = treedef_of(side, flavour, tree).flatten_up_to(full)
    return [id(x) for x in out], out

  both("flatten_up_to", op)


@PROPERTY
@given(
    inner=S.trees(max_leaves=5),
    outer=S.trees(max_leaves=6),
    flavour=S.flavours,
    other_flavour=S.flavours,
    same_registry=st.booleans(),
)
def test_compose(inner, outer, flavour, other_flavour, same_registry):
  """outer.compose(inner): same treedef (repr, sizes, equality with the
  treedef of the composed tree), same unflatten result; composing treedefs
  of different registries fails the same way."""
  inner_flavour = flavour if same_registry else other_flavour

  def composed(side):
    return treedef_of(side, flavour, outer).compose(
        treedef_of(side, inner_flavour, inner)
    )

  s, _ = both("compose", composed)
  if not s.ok:
    return
  pool = leaf_pool(s.value.num_leaves)
  both("compose().unflatten", lambda side: composed(side).unflatten(pool))

  # The composed tree itself, built once (with stock) and shared by both.
  outer_leaves, outer_def = STOCK.regs[flavour].flatten(outer)
  whole = outer_def.unflatten([inner] * len(outer_leaves))

  def expected(side):
    return composed(side) == treedef_of(side, flavour, whole)

  both("compose() == treedef of composed tree", expected)


def _decompose(treedef):
  """Recursively (node_data, [children...]) of a treedef."""
  return (
      treedef.node_data(),
      [_decompose(child) for child in treedef.children()],
  )


def _registry_knows_root(side, flavour, treedef):
  """Whether the registry ``flavour`` of ``side`` flattens the root of
  ``treedef`` as a node, as it must to rebuild it (a leaf root needs no
  registration)."""
  if treedef.num_nodes == 1 and treedef.num_leaves == 1:
    return True
  root = treedef.unflatten(leaf_pool(treedef.num_leaves))
  return side.regs[flavour].flatten_one_level(root) is not None


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    rebuild_flavour=S.flavours,
)
def test_children_node_data_rebuild(data, tree, flavour, rebuild_flavour):
  """children(), node_data() (recursively), and
  PyTreeDef.from_node_data_and_children round trip (also with another
  registry and with permuted children): same results as stock."""
  both("children", lambda side: treedef_of(side, flavour, tree).children())
  both("node_data", lambda side: treedef_of(side, flavour, tree).node_data())
  both(
      "recursive decomposition",
      lambda side: _decompose(treedef_of(side, flavour, tree)),
  )

  def rebuild(side, registry_flavour=flavour, permute=None):
    treedef = treedef_of(side, flavour, tree)
    children = treedef.children()
    if permute is not None:
      children = [children[i] for i in permute]
    return side.mod.PyTreeDef.from_node_data_and_children(
        side.regs[registry_flavour], treedef.node_data(), children
    )

  s, _ = both("from_node_data_and_children", rebuild)
  both(
      "rebuilt == original",
      lambda side: rebuild(side) == treedef_of(side, flavour, tree),
  )
  pool = leaf_pool(s.value.num_leaves)
  both("rebuilt.unflatten", lambda side: rebuild(side).unflatten(pool))
  both(
      "from_node_data_and_children(other registry)",
      lambda side: rebuild(side, rebuild_flavour),
      place=(
          None
          if _registry_knows_root(STOCK, rebuild_flavour, s.value)
          else "test_children_node_data_rebuild/"
          "from_node_data_and_children(other registry)"
      ),
  )
  n = len(s.value.children())
  if n > 1:
    perm = data.draw(st.permutations(range(n)), label="children order")
    both(
        "from_node_data_and_children(permuted)",
        lambda side: rebuild(side, permute=perm),
    )
    both(
        "permuted.unflatten",
        lambda side: rebuild(side, permute=perm).unflatten(pool),
    )


def _f_node(node, data):
  log_call("f_node", canon(node), canon(data))
  return ("N", node, data)


def _f_leaf(x):
  log_call("f_leaf", id(x))
  return ("L", x)


def _f_node_raising(node, data):
  raise OverflowError("f_node failed")


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    delta=st.sampled_from([0, 0, 0, -1, 1]),
    f_node=st.sampled_from(["normal", "normal", "raising"]),
)
def test_walk(tree, flavour, delta, f_node):
  """treedef.walk(f_node, f_leaf, leaves): same result, same sequence of
  callback calls (arguments included), same errors for wrong leaf counts
  and raising callbacks."""
  node_fn = _f_node if f_node == "normal" else _f_node_raising
  s, _ = both("flatten", lambda side: treedef_of(side, flavour, tree))
  pool = leaf_pool(s.value.num_leaves + delta)
  both(
      "walk",
      lambda side: treedef_of(side, flavour, tree).walk(node_fn, _f_leaf, pool),
  )
  both(
      "walk(generator leaves)",
      lambda side: treedef_of(side, flavour, tree).walk(
          node_fn, _f_leaf, (x for x in pool)
      ),
  )


class GenMarker:
  """Stands for 'a fresh generator over these items' in an iterable tree."""

  def __init__(self, items):
    self.items = items


def materialize(x):
  """Turns GenMarkers into fresh generators (one per side)."""
  if isinstance(x, GenMarker):
    return (materialize(i) for i in x.items)
  if type(x) in (list, tuple):
    return type(x)(materialize(i) for i in x)
  return x


def draw_iterable_tree(data, tree, flavour):
  """The 'iterable tree' for from_iterable_tree: every node (as the stock
  registry of ``flavour`` sees it) replaced by an iterable of its children."""
  reg = STOCK.regs[flavour]

  def convert(x):
    res = reg.flatten_one_level(x)
    if res is None:
      return x
    items = [convert(c) for c in res[0]]
    kind = data.draw(
        st.sampled_from(["list", "list", "tuple", "gen"]), label="iterable kind"
    )
    return {"list": items, "tuple": tuple(items), "gen": GenMarker(items)}[kind]

  return convert(tree)


def _iterable_paths(x, prefix=()):
  yield prefix
  if type(x) in (list, tuple):
    for i, item in enumerate(x):
      yield from _iterable_paths(item, prefix + (i,))


def _replace_in_iterable(x, path, new):
  if not path:
    return new
  items = list(x)
  items[path[0]] = _replace_in_iterable(items[path[0]], path[1:], new)
  return type(x)(items)


@PROPERTY
@given(
    data=st.data(),
    tree=S.trees(),
    flavour=S.flavours,
    corrupt=st.sampled_from([None, None, 5, None, "ab", "drop", "extend"]),
)
def test_from_iterable_tree(data, tree, flavour, corrupt):
  """treedef.from_iterable_tree on iterable trees (lists, tuples,
  generators), optionally corrupted (non-iterables, wrong arity): same
  rebuilt tree or same error."""
  s, _ = both("flatten", lambda side: treedef_of(side, flavour, tree))
  if not s.ok:
    return
  itree = draw_iterable_tree(data, tree, flavour)
  if corrupt is not None:
    path = data.draw(
        st.sampled_from(list(_iterable_paths(itree))), label="corruption path"
    )
    target = itree
    for step in path:
      target = target[step]
    if corrupt == "drop" and type(target) in (list, tuple) and target:
      new = type(target)(list(target)[:-1])
    elif corrupt == "extend" and type(target) in (list, tuple):
      new = type(target)(list(target) + [Leaf(50)])
    else:
      new = corrupt
    itree = _replace_in_iterable(itree, path, new)
  both(
      "from_iterable_tree",
      lambda side: treedef_of(side, flavour, tree).from_iterable_tree(
          materialize(itree)
      ),
      place="test_from_iterable_tree/from_iterable_tree",
  )


def _state(side, flavour, tree):
  return treedef_of(side, flavour, tree).__getstate__()


@PROPERTY
@given(
    tree=S.trees(),
    flavour=S.flavours,
    protocol=st.sampled_from([2, pickle.HIGHEST_PROTOCOL]),
)
def test_pickle(tree, flavour, protocol):
  """__getstate__ content, pickle round trip (registries pickled by
  reference), equality of the loaded treedef with the original, unflatten
  with the loaded treedef, and __setstate__ of a fresh instance."""
  s, _ = both("__getstate__", lambda side: _state(side, flavour, tree))

  def roundtrip(side):
    treedef = treedef_of(side, flavour, tree)
    loaded = pickle.loads(pickle.dumps(treedef, protocol=protocol))
    return loaded, loaded == treedef, type(loaded) is type(treedef)

  r, _ = both("pickle round trip", roundtrip)
  if r.ok:
    pool = leaf_pool(r.value[0].num_leaves)
    both("loaded.unflatten", lambda side: roundtrip(side)[0].unflatten(pool))
  if s.ok:

    def setstate(side):
      fresh = side.mod.PyTreeDef.__new__(side.mod.PyTreeDef)
      fresh.__setstate__(_state(side, flavour, tree))
      return fresh, fresh == treedef_of(side, flavour, tree)

    both("__setstate__", setstate)


@PROPERTY
@given(
    tree=st.one_of(S.builtin_trees(), S.builtin_trees(), S.trees()),
    flavour=S.flavours,
    load_flavour=S.flavours,
)
def test_proto(tree, flavour, load_flavour):
  """serialize_using_proto gives byte-identical output (or the same error
  for custom nodes / non-string dict keys); deserialize_using_proto round
  trip (into any registry flavour) gives the same treedef."""
  s, _ = both(
      "serialize_using_proto",
      lambda side: treedef_of(side, flavour, tree).serialize_using_proto(),
  )
  if not s.ok:
    return
  proto = s.value

  def load(side):
    return side.mod.PyTreeDef.deserialize_using_proto(
        side.regs[load_flavour], proto
    )

  both("deserialize_using_proto", load)
  both(
      "deserialized == original",
      lambda side: load(side) == treedef_of(side, flavour, tree),
  )
  both(
      "deserialized.serialize_using_proto",
      lambda side: load(side).serialize_using_proto(),
  )


@PROPERTY
@given(
    items=st.lists(st.tuples(S.trees(max_leaves=5), S.flavours), max_size=4),
    flavour=S.flavours,
    same_registry=st.booleans(),
)
def test_treedef_tuple(items, flavour, same_registry):
  """treedef_tuple(registry, treedefs): same result (repr, sizes, unflatten)
  and same error when registries do not match."""

  def op(side):
    defs = [
        treedef_of(side, flavour if same_registry else f, tree)
        for tree, f in items
    ]
    return side.mod.treedef_tuple(side.regs[flavour], defs)

  s, _ = both("treedef_tuple", op)
  if s.ok:
    pool = leaf_pool(s.value.num_leaves)
    both("treedef_tuple().unflatten", lambda side: op(side).unflatten(pool))
    as_tuple = tuple(tree for tree, _ in items)
    both(
        "treedef_tuple() == treedef of tuple",
        lambda side: op(side) == treedef_of(side, flavour, as_tuple),
    )


CANDIDATE_TYPES = [
    int,
    float,
    str,
    bytes,
    bool,
    type(None),
    tuple,
    list,
    dict,
    Pair,
    Single,
    Empty,
    KeyedNode,
    PlainNode,
    DataNode,
    DataOnly,
    MetaOnly,
    Junk,
    JunkNoKeys,
    TupleSub,
    Opaque,
    np.ndarray,
    object,
    type,
]


@PROPERTY
@given(
    objs=st.lists(st.one_of(S.leaves, S.trees(max_leaves=3)), max_size=5),
    flavour=S.flavours,
    kind=st.sampled_from(["list", "tuple", "gen"]),
)
def test_all_leaves_and_is_node(objs, flavour, kind):
  """all_leaves(registry, iterable) and registry.is_node(type) agree with
  stock for every registry flavour."""

  def all_leaves(side):
    it = {"list": list, "tuple": tuple, "gen": lambda o: (x for x in o)}[kind](
        objs
    )
    return side.mod.all_leaves(side.regs[flavour], it)

  both("all_leaves", all_leaves)
  both(
      "is_node",
      lambda side: [
          side.regs[flavour].is_node(t)
          for t in CANDIDATE_TYPES + [type(o) for o in objs]
      ],
  )


KEY_CLASSES = ["SequenceKey", "DictKey", "GetAttrKey", "FlattenedIndexKey"]

key_args = st.one_of(
    st.integers(-(2**65), 2**65),
    st.integers(-3, 3),
    st.text(max_size=3),
    st.none(),
    st.tuples(st.integers(0, 2), st.text(max_size=1)),
    st.lists(st.integers(0, 2), max_size=2),
    st.booleans(),
    st.floats(allow_nan=False),
)


@PROPERTY
@given(
    cls=st.sampled_from(KEY_CLASSES),
    arg=key_args,
    other_cls=st.sampled_from(KEY_CLASSES),
    other_arg=key_args,
    use_kw=st.booleans(),
)
def test_keys(cls, arg, other_cls, other_arg, use_kw):
  """Key classes: construction (positional and keyword, incl. bad argument
  types), repr, str, attribute, __match_args__, hash value, ==/!= with
  keys of the same/other class and with non-keys, __getstate__, pickling,
  and structural pattern matching."""
  field = {
      "SequenceKey": "idx",
      "DictKey": "key",
      "GetAttrKey": "name",
      "FlattenedIndexKey": "key",
  }

  def make(side, c, a, kw=False):
    ctor = getattr(side.mod, c)
    return ctor(**{field[c]: a}) if kw else ctor(a)

  def int_only(c, a):  # item 8 of the deliberate differences
    return c in ("SequenceKey", "FlattenedIndexKey") and type(a) is str

  s, o = both(
      "construct",
      lambda side: make(side, cls, arg, use_kw),
      place="test_keys/construct" if int_only(cls, arg) else None,
  )
  so, oo = both(
      "construct other",
      lambda side: make(side, other_cls, other_arg),
      place=(
          "test_keys/construct other"
          if int_only(other_cls, other_arg)
          else None
      ),
  )
  if not (s.ok and o.ok):
    return

  def k(side):
    return make(side, cls, arg, use_kw)

  both("repr/str", lambda side: (repr(k(side)), str(k(side))))
  both("attribute", lambda side: getattr(k(side), field[cls]))
  both("__match_args__", lambda side: type(k(side)).__match_args__)
  both("hash", lambda side: hash(k(side)))
  both("== same args", lambda side: (k(side) == k(side), k(side) != k(side)))
  if so.ok and oo.ok:
    both(
        "== other key",
        lambda side: (
            k(side) == make(side, other_cls, other_arg),
            k(side) != make(side, other_cls, other_arg),
        ),
    )
  both(
      "== non-key",
      lambda side: (k(side) == arg, k(side) == None, k(side) != arg),  # noqa
  )
  both("__getstate__", lambda side: k(side).__getstate__())

  def pickled(side):
    loaded = pickle.loads(pickle.dumps(k(side)))
    return loaded, loaded == k(side), type(loaded) is type(k(side))

  both("pickle", pickled)

  def match(side):
    key = k(side)
    m = side.mod
    match key:
      case m.SequenceKey(i):
        return ("seq", i)
      case m.DictKey(i):
        return ("dict", i)
      case m.GetAttrKey(i):
        return ("attr", i)
      case m.FlattenedIndexKey(i):
        return ("flat", i)
    return "no match"

  both("match", match)
  if type(safe(lambda: hash(s.value))) is int:
    for side in SIDES:
      a, b = k(side), k(side)
      if a == b:
        assert hash(a) == hash(b)


@PROPERTY
@given(
    junk=S.junk_nodes,
    flavour=st.sampled_from(
        [f for f in S.ALL_FLAVOURS if f not in ("bare", "default")]
    ),
    wrap=st.sampled_from(["bare", "list", "dict", "keyed"]),
    pred=path_predicate_names,
)
def test_misbehaving_custom_nodes(junk, flavour, wrap, pred):
  """Custom nodes whose to_iterable / to_iterable_with_keys raise, return
  non-tuples, wrong-sized tuples, non-iterable children, generators,
  iterables that raise, junk key/leaf pairs, or whose from_iterable raises
  or returns None: every operation gives the same result or error."""
  tree = {
      "bare": junk,
      "list": [1, junk],
      "dict": {"b": junk, "a": (junk,)},
      "keyed": KeyedNode((junk, 2), "m"),
  }[wrap]
  s, _ = both("flatten", lambda side: side.regs[flavour].flatten(tree))
  both(
      "flatten_with_path",
      lambda side: flatten_with_path_with(side, flavour, tree, pred),
      place="test_misbehaving_custom_nodes/flatten_with_path",
  )
  both(
      "flatten_one_level",
      lambda side: side.regs[flavour].flatten_one_level(junk),
  )
  both(
      "flatten_one_level_with_keys",
      lambda side: side.regs[flavour].flatten_one_level_with_keys(junk),
      place="test_misbehaving_custom_nodes/flatten_one_level_with_keys",
  )
  if s.ok:
    pool = leaf_pool(s.value[1].num_leaves)
    both(
        "unflatten",
        lambda side: treedef_of(side, flavour, tree).unflatten(pool),
    )
    both(
        "repr/==/num_nodes",
        lambda side: (lambda t: (repr(t), t == t, t.num_nodes, t.node_data()))(
            treedef_of(side, flavour, tree)
        ),
    )
    both(
        "walk",
        lambda side: treedef_of(side, flavour, tree).walk(
            _f_node, _f_leaf, pool
        ),
    )
    both(
        "flatten_up_to(tree)",
        lambda side: treedef_of(side, flavour, tree).flatten_up_to(tree),
    )


_numeric_keys = st.one_of(
    st.integers(-3, 3),
    st.just(float("nan")),
    st.sampled_from([1.0, 0.5, -0.0, True, False, float("inf")]),
)
_frozenset_keys = st.sampled_from(
    [frozenset(), frozenset({1}), frozenset({2}), frozenset({1, 2})]
)
_other_keys = st.sampled_from([None, (1,), ("a",), b"a"])
_any_key = st.one_of(
    _numeric_keys,
    st.text(alphabet="ab", max_size=2),
    _frozenset_keys,
    _other_keys,
)

# Key lists drawn from one family of mutually comparable keys (numbers with
# NaN, strings, frozensets: not totally ordered), or from all of them mixed.
dict_key_lists = st.one_of(
    st.lists(_numeric_keys, max_size=6),
    st.lists(st.text(alphabet="ab", max_size=2), max_size=4),
    st.lists(_frozenset_keys, max_size=4),
    st.lists(_any_key, max_size=4),
)


@PROPERTY
@given(
    keys=dict_key_lists,
    flavour=st.sampled_from(["full", "no_none", "no_dict", "default"]),
    other_keys=dict_key_lists,
)
def test_dict_keys(keys, flavour, other_keys):
  """Dicts with heterogeneous keys (sortable or not, equal-but-different
  types like 1/1.0/True, keys without a total order: NaN, frozensets):
  flatten, flatten_with_path, flatten_up_to
  against a dict with other keys, unflatten, repr, and proto serialization
  all agree with stock."""
  tree = {k: Leaf(i) for i, k in enumerate(keys)}
  other = {k: Leaf(10 + i) for i, k in enumerate(other_keys)}
  # Item 6 of the deliberate differences: where the keys have no total
  # order, the candidate orders them with sorted() (checked by oracles).
  sorts = flavour != "no_dict"
  in_tree = sorts and sort_order_is_an_artifact(tree)
  in_other = sorts and sort_order_is_an_artifact(other)

  def at(op, applies):
    return f"test_dict_keys/{op}" if applies else None

  s, _ = both(
      "flatten",
      lambda side: side.regs[flavour].flatten(tree),
      place=at("flatten", in_tree),
      ctx={"tree": tree},
  )
  both(
      "flatten other",
      lambda side: side.regs[flavour].flatten(other),
      place=at("flatten other", in_other),
      ctx={"other": other},
  )
  both(
      "flatten_with_path",
      lambda side: side.regs[flavour].flatten_with_path(tree),
      place=at("flatten_with_path", in_tree),
      ctx={"tree": tree},
  )
  both(
      "flatten_one_level",
      lambda side: side.regs[flavour].flatten_one_level(tree),
      place=at("flatten_one_level", in_tree),
      ctx={"tree": tree},
  )
  if s.ok:
    pool = leaf_pool(s.value[1].num_leaves)
    ctx = {"tree": tree, "other": other, "pool": pool}
    both(
        "unflatten",
        lambda side: treedef_of(side, flavour, tree).unflatten(pool),
        place=at("unflatten", in_tree),
        ctx=ctx,
    )
    both(
        "flatten_up_to(other dict)",
        lambda side: treedef_of(side, flavour, tree).flatten_up_to(other),
        place=at("flatten_up_to(other dict)", in_tree or in_other),
        ctx=ctx,
    )
    both(
        "== other dict",
        lambda side: treedef_of(side, flavour, tree)
        == treedef_of(side, flavour, other),
        place=at("== other dict", in_tree or in_other),
        ctx=ctx,
    )
    both(
        "serialize_using_proto",
        lambda side: treedef_of(side, flavour, tree).serialize_using_proto(),
    )


class RegA:
  """Plain classes used as registration targets in test_registrations."""

  def __init__(self, p=1, q=2):
    self.p, self.q = p, q


class RegB(RegA):
  pass


STRUCTURAL.extend([RegA, RegB])


def _rega_flatten(x):
  log_call("rega_flatten", id(x))
  return (x.p, x.q), "rega"


def _rega_flatten_keys(x):
  log_call("rega_flatten_keys", id(x))
  return [("p", x.p), ("q", x.q)], "rega"


def _rega_unflatten(aux, children):
  log_call("rega_unflatten", aux, type(children).__name__)
  return RegA(*children)


REGISTRATION_TARGETS = [
    RegA,
    RegB,
    tuple,
    list,
    dict,
    type(None),
    int,
    Pair,
    DataNode,
]
registration_ops = st.tuples(
    st.sampled_from(["node", "node_keys", "dataclass"]),
    st.sampled_from(range(len(REGISTRATION_TARGETS))),
    st.sampled_from([["p"], ["p", "q"], [], ["x"], ["first"]]),
    st.sampled_from([[], ["q"], ["second"], ["p"]]),
)


@PROPERTY
@given(
    ops=st.lists(registration_ops, min_size=1, max_size=4),
    flags=st.fixed_dictionaries(
        {},
        optional={
            f: st.booleans()
            for f in [
                "enable_none",
                "enable_tuple",
                "enable_namedtuple",
                "enable_list",
                "enable_dict",
            ]
        },
    ),
)
def test_registrations(ops, flags):
  """Sequences of register_node / register_dataclass_node calls on fresh
  registries (duplicates, builtin types, overlapping fields) give the same
  results/errors, and the registries then behave the same on sample trees
  (flatten, flatten_with_path, unflatten, is_node)."""
  samples = [
      RegA(1, (2, 3)),
      RegB([4], None),
      (RegA(), [1]),
      {"k": RegB()},
      Pair(RegA(5, 6), 7),
      DataNode(1, 2, "t"),
      None,
  ]

  def build(side):
    reg = side.mod.PyTreeRegistry(**flags)
    outcomes = []
    for kind, target_index, data_fields, meta_fields in ops:
      target = REGISTRATION_TARGETS[target_index]
      try:
        if kind == "node":
          res = reg.register_node(target, _rega_flatten, _rega_unflatten)
        elif kind == "node_keys":
          res = reg.register_node(
              target, _rega_flatten, _rega_unflatten, _rega_flatten_keys
          )
        else:
          res = reg.register_dataclass_node(target, data_fields, meta_fields)
        outcomes.append(("ok", canon(res)))
      except Exception as ex:  # noqa: BLE001
        outcomes.append(describe_exc(ex))
    return reg, outcomes

  both("registrations", lambda side: build(side)[1])
  for sample in samples:
    s, _ = both("flatten", lambda side: build(side)[0].flatten(sample))
    both(
        "flatten_with_path",
        lambda side: build(side)[0].flatten_with_path(sample),
    )
    if s.ok:

      def unflatten(side):
        leaves, treedef = build(side)[0].flatten(sample)
        return treedef.unflatten(leaves)

      both("unflatten", unflatten)
  both(
      "is_node",
      lambda side: [build(side)[0].is_node(t) for t in REGISTRATION_TARGETS],
  )


# ---------------------------------------------------------------------------
# Hand-written cases: error paths and quirks that random trees rarely hit.
# Each case is fn(side) -> value; both modules must give the same outcome.
# ---------------------------------------------------------------------------


def _td(side, tree, flavour="full"):
  return side.regs[flavour].flatten(tree)[1]


def _ndc(side, node_data, children, flavour="full"):
  return side.mod.PyTreeDef.from_node_data_and_children(
      side.regs[flavour], node_data, children
  )


def _children(side, tree=(1, [2, 3])):
  return _td(side, tree).children()


class _BadAux:
  """Metadata whose ==, hash and str all raise."""

  def __eq__(self, other):
    raise KeyError("eq failed")

  def __hash__(self):
    raise KeyError("hash failed")

  def __str__(self):
    raise IndexError("str failed")


class _NotImplementedAux:

  def __eq__(self, other):
    return NotImplemented

  __hash__ = object.__hash__


class _WeirdEqAux:

  def __eq__(self, other):
    return 5

  __hash__ = object.__hash__


class _RaisingKey:
  """A dict key whose comparison raises a custom error."""

  def __init__(self, v):
    self.v = v

  def __lt__(self, other):
    raise FloatingPointError("no ordering")

  def __hash__(self):
    return hash(self.v)

  def __eq__(self, other):
    return self is other


def _fresh(side, **flags):
  return side.mod.PyTreeRegistry(**flags)


def _register_twice(side, first, second):
  reg = _fresh(side)
  calls = {
      "node": lambda: reg.register_node(RegA, _rega_flatten, _rega_unflatten),
      "dataclass": lambda: reg.register_dataclass_node(RegA, ["p"], ["q"]),
  }
  calls[first]()
  return calls[second]()


def _uninitialized_treedef(side):
  return side.mod.PyTreeDef.__new__(side.mod.PyTreeDef)


_LEAF_ENTRY = (0, 0, None, None, 1, 1)


def _setstate_then_repr(side, entries):
  """__setstate__ of (registry, entries), then the treedef's repr."""
  treedef = _uninitialized_treedef(side)
  treedef.__setstate__((side.regs["full"], entries))
  return repr(treedef)


def _setstate_initialized(side):
  """__setstate__ on a treedef that already holds a tree (nanobind warns)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    return _td(side, 1).__setstate__(_td(side, (1,)).__getstate__())


def _walk(side, tree, f_node, f_leaf, leaves):
  return _td(side, tree).walk(f_node, f_leaf, leaves)


def _deeper_than_recursion_limit(side, method):
  """``method`` on nested lists deeper than the recursion limit.

  The limit is lowered to leave only a few hundred frames (this module runs
  with a raised limit), so that stock, which recurses on the C stack, stays
  far from the end of it.
  """
  tree = 1
  for _ in range(3000):
    tree = [tree]
  old = sys.getrecursionlimit()
  sys.setrecursionlimit(old - available_depth() + 500)
  try:
    return getattr(side.regs["full"], method)(tree)
  finally:
    sys.setrecursionlimit(old)


class I:  # noqa: E742
  """Inputs of the hand-written cases, shared by both sides (so that
  objects and callback logs can be compared by identity)."""

  rega = RegA()
  raising_keys = {_RaisingKey(1): 1, _RaisingKey(2): 2}
  leaf0 = Leaf(0)
  pool2 = leaf_pool(2)
  k1a = KeyedNode((1,), "a")
  k1b = KeyedNode((1,), "b")
  k12a = KeyedNode((1, 2), "a")
  k10 = KeyedNode((1,), 0)
  p1a = PlainNode([1], "a")
  d12t = DataNode(1, 2, "t")
  d12u = DataNode(1, 2, "u")
  bad1 = KeyedNode((), _BadAux())
  bad2 = KeyedNode((), _BadAux())
  bad_child1 = KeyedNode((1,), _BadAux())
  bad_child2 = KeyedNode((1,), _BadAux())
  arr1 = KeyedNode((), np.arange(3))
  arr2 = KeyedNode((), np.arange(3))
  ni1 = KeyedNode((), _NotImplementedAux())
  ni2 = KeyedNode((), _NotImplementedAux())
  weird1 = KeyedNode((), _WeirdEqAux())
  weird2 = KeyedNode((), _WeirdEqAux())
  unhashable = KeyedNode((), [1])
  nested = [Pair(None, ()), {}, Empty(), MetaOnly("m", 2), DataOnly(())]
  walk_tree = {"b": KeyedNode((1,), "m"), "a": DataNode(None, 2, 3)}
  fit_tree = [KeyedNode((1, 2), "m"), DataNode(1, 2, "t")]
  raising_junk = Junk(("raise", "x"), ("raise", "y"))


ERROR_CASES = {
    # Registry construction and registration.
    "registry_kwargs_defaults": lambda s: _fresh(s).flatten(
        (None, [1], {"a": 2}, Pair(3, 4))
    ),
    "registry_positional_flags": lambda s: s.mod.PyTreeRegistry(
        True, True, True, True, False
    ).flatten({"a": 1}),
    "registry_too_many_flags": lambda s: s.mod.PyTreeRegistry(
        True, True, True, True, True, True
    ),
    "registry_unknown_kwarg": lambda s: s.mod.PyTreeRegistry(bogus=True),
    "registry_int_flag": lambda s: s.mod.PyTreeRegistry(enable_none=1),
    "registry_numpy_bool_flag": lambda s: s.mod.PyTreeRegistry(
        enable_list=np.False_
    ),
    "registry_reduce_unnamed": lambda s: _fresh(s).__reduce__(),
    "registry_reduce_named": lambda s: s.regs["full"].__reduce__()
    == s.regs["full"].__name__,
    "registry_pickle_named": lambda s: pickle.loads(
        pickle.dumps(s.regs["full"])
    )
    is s.regs["full"],
    "registry_pickle_unnamed": lambda s: pickle.dumps(_fresh(s)),
    "registry_dict_attr": lambda s: sorted(vars(_fresh(s))),
    "duplicate_node": lambda s: _register_twice(s, "node", "node"),
    "duplicate_dataclass": lambda s: _register_twice(
        s, "dataclass", "dataclass"
    ),
    "node_then_dataclass": lambda s: _register_twice(s, "node", "dataclass"),
    "dataclass_then_node": lambda s: _register_twice(s, "dataclass", "node"),
    "register_builtin_tuple": lambda s: _fresh(s).register_node(
        tuple, _rega_flatten, _rega_unflatten
    ),
    "register_builtin_none": lambda s: _fresh(s).register_dataclass_node(
        type(None), [], []
    ),
    "register_tuple_when_disabled": lambda s: _fresh(
        s, enable_tuple=False
    ).register_node(tuple, S.tuple_flatten, S.tuple_unflatten),
    "register_non_type": lambda s: _fresh(s).register_node(
        5, _rega_flatten, _rega_unflatten
    ),
    "register_non_callable": lambda s: _fresh(s).register_node(RegA, 5, 6),
    "register_bad_keys_fn": lambda s: _fresh(s).register_node(
        RegA, _rega_flatten, _rega_unflatten, 7
    ),
    "register_keys_fn_none": lambda s: _fresh(s).register_node(
        RegA, _rega_flatten, _rega_unflatten, None
    ),
    "register_keys_fn_kw": lambda s: _fresh(s).register_node(
        RegA,
        _rega_flatten,
        _rega_unflatten,
        to_iterable_with_keys=_rega_flatten_keys,
    ),
    "register_all_kw": lambda s: _fresh(s).register_node(
        type=RegA, to_iterable=_rega_flatten, from_iterable=_rega_unflatten
    ),
    "dataclass_fields_str": lambda s: _fresh(s).register_dataclass_node(
        RegA, "pq", "r"
    ),
    "dataclass_fields_ints": lambda s: _fresh(s).register_dataclass_node(
        RegA, [1], []
    ),
    "dataclass_fields_tuple": lambda s: _fresh(s).register_dataclass_node(
        RegA, ("p",), ("q",)
    ),
    "dataclass_kwargs": lambda s: _fresh(s).register_dataclass_node(
        type=RegA, data_fields=["p"], meta_fields=[]
    ),
    "dataclass_missing_attr": lambda s: (
        lambda r: (
            r.register_dataclass_node(RegA, ["p", "zz"], []),
            r.flatten(I.rega),
        )
    )(_fresh(s)),
    "dataclass_unflatten_bad_ctor": lambda s: (
        lambda r: (
            r.register_dataclass_node(RegA, ["p"], ["zz"]),
            s.mod.PyTreeDef.from_node_data_and_children(
                r, (RegA, (1,)), [_td(s, 0)]
            ).unflatten([1]),
        )
    )(_fresh(s)),
    # flatten & friends: bad arguments.
    "flatten_no_args": lambda s: s.regs["full"].flatten(),
    "flatten_kw_tree": lambda s: s.regs["full"].flatten(tree=[1, (2,)]),
    "flatten_bad_predicate": lambda s: s.regs["full"].flatten([1], 5),
    "flatten_predicate_raises_on_root": lambda s: s.regs["full"].flatten(
        (1,), lambda x: 1 / 0
    ),
    "flatten_predicate_numpy_bool": lambda s: s.regs["full"].flatten(
        [1], lambda x: np.True_
    ),
    "flatten_predicate_wrong_arity": lambda s: s.regs["full"].flatten_with_path(
        [1], lambda x: False
    ),
    "flatten_with_path_kw": lambda s: s.regs["full"].flatten_with_path(
        tree={"a": (1,)}, leaf_predicate=None
    ),
    "flatten_with_path_none_tree": lambda s: s.regs["full"].flatten_with_path(
        None
    ),
    "flatten_raising_dict_key": lambda s: s.regs["full"].flatten(
        I.raising_keys
    ),
    "flatten_one_level_leaf": lambda s: s.regs["full"].flatten_one_level(5),
    "flatten_one_level_keys_leaf": lambda s: s.regs[
        "full"
    ].flatten_one_level_with_keys(5),
    "flatten_one_level_namedtuple_keys": lambda s: s.regs[
        "full"
    ].flatten_one_level_with_keys(Pair(1, 2)),
    "flatten_one_level_list_identity": lambda s: (
        lambda x: s.regs["full"].flatten_one_level(x)[0] is x
    )([1, 2]),
    "flatten_one_level_tuple_identity": lambda s: (
        lambda x: s.regs["full"].flatten_one_level(x)[0] is x
    )((1, 2)),
    "flatten_one_level_dict_unsortable": lambda s: s.regs[
        "full"
    ].flatten_one_level({1: 1, "a": 2}),
    "flatten_huge_int_leaf": lambda s: s.regs["full"].flatten([2**200]),
    "flatten_deeper_than_recursion_limit": lambda s: _deeper_than_recursion_limit(
        s, "flatten"
    ),
    "flatten_with_path_deeper_than_recursion_limit": lambda s: _deeper_than_recursion_limit(
        s, "flatten_with_path"
    ),
    # unflatten.
    "unflatten_too_few": lambda s: _td(s, (1, [2, 3])).unflatten([1]),
    "unflatten_too_many": lambda s: _td(s, (1, [2, 3])).unflatten(range(9)),
    "unflatten_non_iterable": lambda s: _td(s, (1, 2)).unflatten(5),
    "unflatten_string": lambda s: _td(s, (1, 2)).unflatten("ab"),
    "unflatten_dict": lambda s: _td(s, (1, 2)).unflatten({"a": 1, "b": 2}),
    "unflatten_no_args": lambda s: _td(s, (1, 2)).unflatten(),
    "unflatten_leaf_treedef": lambda s: _td(s, 1).unflatten([I.leaf0]),
    "unflatten_namedtuple_ctor": lambda s: _td(s, Pair(1, 2)).unflatten([1, 2]),
    # flatten_up_to.
    "up_to_none_prefix": lambda s: _td(s, (None, 1)).flatten_up_to((5, 1)),
    "up_to_expected_none": lambda s: _td(s, [None]).flatten_up_to([3]),
    "up_to_tuple_vs_list": lambda s: _td(s, (1, 2)).flatten_up_to([1, 2]),
    "up_to_tuple_arity": lambda s: _td(s, (1, 2)).flatten_up_to((1, 2, 3)),
    "up_to_list_arity": lambda s: _td(s, [1, 2]).flatten_up_to([1]),
    "up_to_dict_keys": lambda s: _td(s, {"a": 1, "b": 2}).flatten_up_to(
        {"a": 1, "c": 2}
    ),
    "up_to_dict_vs_list": lambda s: _td(s, {"a": 1}).flatten_up_to([1]),
    "up_to_dict_int_keys": lambda s: _td(s, {1: 1, 2: 2}).flatten_up_to(
        {1: 1, 3: 2}
    ),
    "up_to_dict_unsortable": lambda s: _td(s, {"a": 1}).flatten_up_to(
        {"a": 1, 1: 2}
    ),
    "up_to_namedtuple_vs_tuple": lambda s: _td(s, Pair(1, 2)).flatten_up_to(
        (1, 2)
    ),
    "up_to_namedtuple_other": lambda s: _td(s, Pair(1, 2)).flatten_up_to(
        Single(1)
    ),
    "up_to_custom_meta": lambda s: _td(s, I.k1a).flatten_up_to(I.k1b),
    "up_to_custom_type": lambda s: _td(s, I.k1a).flatten_up_to(I.p1a),
    "up_to_custom_arity": lambda s: _td(s, I.k1a).flatten_up_to(I.k12a),
    "up_to_dataclass_meta": lambda s: _td(s, I.d12t).flatten_up_to(I.d12u),
    "up_to_dataclass_vs_leaf": lambda s: _td(s, I.d12t).flatten_up_to(5),
    "up_to_bad_meta_eq": lambda s: _td(s, I.bad_child1).flatten_up_to(
        I.bad_child2
    ),
    "up_to_no_args": lambda s: _td(s, (1,)).flatten_up_to(),
    # Equality / hash / repr of treedefs with odd metadata.
    "eq_bad_meta": lambda s: _td(s, I.bad1) == _td(s, I.bad2),
    "ne_bad_meta": lambda s: _td(s, I.bad1) != _td(s, I.bad2),
    "eq_array_meta": lambda s: _td(s, I.arr1) == _td(s, I.arr2),
    "eq_notimplemented_meta": lambda s: _td(s, I.ni1) == _td(s, I.ni2),
    "eq_weird_meta": lambda s: _td(s, I.weird1) == _td(s, I.weird2),
    "hash_bad_meta": lambda s: type(hash(_td(s, I.bad1))),
    "hash_unhashable_meta": lambda s: type(hash(_td(s, I.unhashable))),
    "repr_bad_meta": lambda s: repr(_td(s, I.bad1)),
    "repr_str_dict_keys": lambda s: repr(_td(s, {"a'b": 1, 'c"': 2})),
    "repr_nested": lambda s: repr(_td(s, I.nested)),
    "eq_across_registries_builtin": lambda s: _td(s, (1, [2]))
    == _td(s, (1, [2]), "bare"),
    "eq_across_registries_custom": lambda s: _td(s, I.k10)
    == _td(s, I.k10, "no_none"),
    "eq_int_float_keys": lambda s: _td(s, {1: 0}) == _td(s, {1.0: 0}),
    "eq_wrong_type_arg": lambda s: _td(s, (1,)).__eq__(5),
    "ne_wrong_type_arg": lambda s: _td(s, (1,)).__ne__(5),
    # compose / treedef_tuple.
    "compose_across_registries": lambda s: _td(s, (1, 2)).compose(
        _td(s, [1], "bare")
    ),
    "compose_non_treedef": lambda s: _td(s, (1, 2)).compose(5),
    "compose_leaf_outer": lambda s: _td(s, 1).compose(_td(s, (1, 2))),
    "compose_leaf_inner": lambda s: _td(s, (1, 2)).compose(_td(s, 1)),
    "compose_empty_outer": lambda s: _td(s, ()).compose(_td(s, (1, 2))),
    "treedef_tuple_across_registries": lambda s: s.mod.treedef_tuple(
        s.regs["full"], [_td(s, 1), _td(s, 1, "bare")]
    ),
    "treedef_tuple_empty": lambda s: s.mod.treedef_tuple(s.regs["full"], []),
    "treedef_tuple_non_treedef": lambda s: s.mod.treedef_tuple(
        s.regs["full"], [5]
    ),
    "treedef_tuple_tuple_arg": lambda s: s.mod.treedef_tuple(
        s.regs["full"], (_td(s, 1),)
    ),
    "treedef_tuple_iterator_arg": lambda s: s.mod.treedef_tuple(
        s.regs["full"], iter([_td(s, 1)])
    ),
    "treedef_tuple_no_tuple_registry": lambda s: s.mod.treedef_tuple(
        s.regs["no_tuple"], [_td(s, 1, "no_tuple")]
    ),
    "treedef_tuple_bad_registry": lambda s: s.mod.treedef_tuple(5, []),
    # children / node_data / from_node_data_and_children.
    "node_data_leaf": lambda s: _td(s, 1).node_data(),
    "node_data_none": lambda s: _td(s, None).node_data(),
    "node_data_dict": lambda s: _td(s, {"b": 1, "a": 2}).node_data(),
    "node_data_namedtuple": lambda s: _td(s, Pair(1, 2)).node_data(),
    "node_data_dataclass": lambda s: _td(s, I.d12t).node_data(),
    "node_data_tuple_custom": lambda s: _td(
        s, (1,), "tuple_custom"
    ).node_data(),
    "children_leaf": lambda s: _td(s, 1).children(),
    "ndc_leaf": lambda s: _ndc(s, None, []),
    "ndc_leaf_with_children": lambda s: _ndc(s, None, _children(s)),
    "ndc_unregistered_type": lambda s: _ndc(s, (int, None), []),
    "ndc_tuple_bad_children": lambda s: _ndc(s, (tuple, None), [1]),
    "ndc_tuple_generator_children": lambda s: _ndc(
        s, (tuple, None), iter(_children(s))
    ),
    "ndc_tuple_ignored_data": lambda s: _ndc(s, (tuple, "x"), []),
    "ndc_list": lambda s: _ndc(s, (list, None), _children(s)),
    "ndc_dict": lambda s: _ndc(s, (dict, ["a", "b"]), _children(s)),
    "ndc_dict_unsorted_keys": lambda s: _ndc(
        s, (dict, ["b", "a"]), _children(s)
    ),
    "ndc_dict_key_tuple": lambda s: _ndc(s, (dict, ("a", "b")), _children(s)),
    "ndc_dict_bad_data": lambda s: _ndc(s, (dict, 5), _children(s)),
    "ndc_dict_mapping_data": lambda s: _ndc(
        s, (dict, {"a": 1, "b": 2}), _children(s)
    ),
    "ndc_dict_too_few_keys": lambda s: repr(
        _ndc(s, (dict, ["a"]), _children(s))
    ),
    "ndc_none": lambda s: _ndc(s, (type(None), None), []),
    "ndc_namedtuple": lambda s: _ndc(s, (Pair, None), _children(s)),
    "ndc_namedtuple_wrong_count": lambda s: _ndc(
        s, (Pair, None), _children(s)[:1]
    ),
    "ndc_custom": lambda s: _ndc(s, (KeyedNode, "m"), _children(s)),
    "ndc_dataclass": lambda s: _ndc(s, (DataNode, ("t",)), _children(s)),
    "ndc_non_type": lambda s: _ndc(s, (5, None), _children(s)),
    "ndc_not_a_pair": lambda s: _ndc(s, 5, _children(s)),
    "ndc_triple": lambda s: _ndc(s, (tuple, None, 1), _children(s)),
    "ndc_children_int": lambda s: _ndc(s, (tuple, None), 5),
    "ndc_disabled_tuple": lambda s: _ndc(
        s, (tuple, None), _children(s), "no_tuple"
    ),
    "ndc_disabled_none": lambda s: _ndc(s, (type(None), None), [], "no_none"),
    "ndc_disabled_namedtuple": lambda s: _ndc(
        s, (Pair, None), _children(s), "no_namedtuple"
    ),
    "ndc_custom_in_bare": lambda s: _ndc(s, (KeyedNode, "m"), [], "bare"),
    "ndc_mixed_registry_children": lambda s: _ndc(
        s, (tuple, None), _children(s) + [_td(s, 1, "bare")]
    ),
    "ndc_kwargs": lambda s: s.mod.PyTreeDef.from_node_data_and_children(
        registry=s.regs["full"], node_data=None, children=[]
    ),
    # walk.
    "walk_f_leaf_none": lambda s: _walk(s, (1, 2), _f_node, None, [1, 2]),
    "walk_too_few": lambda s: _walk(s, (1, [2]), _f_node, _f_leaf, [1]),
    "walk_too_many": lambda s: _walk(s, (1, [2]), _f_node, _f_leaf, [1, 2, 3]),
    "walk_f_leaf_raises": lambda s: _walk(
        s, (1,), _f_node, lambda x: 1 / 0, [1]
    ),
    "walk_f_node_raises": lambda s: _walk(
        s, [1], _f_node_raising, _f_leaf, [1]
    ),
    "walk_non_iterable": lambda s: _walk(s, (1,), _f_node, _f_leaf, 5),
    "walk_non_callable": lambda s: _walk(s, (1,), 5, _f_leaf, [1]),
    "walk_custom_and_dict": lambda s: _walk(
        s, I.walk_tree, _f_node, _f_leaf, I.pool2
    ),
    # from_iterable_tree.
    "fit_non_iterable": lambda s: _td(s, (1, 2)).from_iterable_tree(5),
    "fit_none_node": lambda s: _td(s, (None, 1)).from_iterable_tree([None, 1]),
    "fit_dict_iterates_keys": lambda s: _td(
        s, {"a": 1, "b": 2}
    ).from_iterable_tree({"b": 3, "a": 4}),
    "fit_arity": lambda s: _td(s, (1, 2)).from_iterable_tree([1]),
    "fit_string": lambda s: _td(s, (1, 2)).from_iterable_tree("ab"),
    "fit_custom": lambda s: _td(s, I.fit_tree).from_iterable_tree(
        [[3, 4], [5, 6]]
    ),
    "fit_leaf": lambda s: _td(s, 1).from_iterable_tree([1, 2]),
    # proto.
    "proto_custom_node": lambda s: _td(s, I.k10).serialize_using_proto(),
    "proto_namedtuple": lambda s: _td(s, Pair(1, 2)).serialize_using_proto(),
    "proto_int_keys": lambda s: _td(s, {1: 2}).serialize_using_proto(),
    "proto_leaf": lambda s: _td(s, 1).serialize_using_proto(),
    "proto_none": lambda s: _td(s, None).serialize_using_proto(),
    "proto_tuple_custom": lambda s: _td(
        s, (1,), "tuple_custom"
    ).serialize_using_proto(),
    "proto_garbage": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], b"garbage"
    ),
    "proto_empty": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(s.regs["full"], b"")
    ),
    "proto_bad_node_type": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], b"\n\x02\x10\x07"
    ),
    "proto_two_roots": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(
            s.regs["full"], b"\n\x02\x10\x01\n\x02\x10\x01"
        )
    ),
    "proto_str_arg": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], "abc"
    ),
    "proto_bytearray_arg": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        s.regs["full"], bytearray(b"")
    ),
    "proto_kwargs": lambda s: s.mod.PyTreeDef.deserialize_using_proto(
        registry=s.regs["full"], data=_td(s, [1]).serialize_using_proto()
    ),
    "proto_into_disabled_dict": lambda s: repr(
        s.mod.PyTreeDef.deserialize_using_proto(
            s.regs["no_dict"], _td(s, {"a": 1}).serialize_using_proto()
        )
    ),
    # pickle / state.
    "getstate_default_registry": lambda s: _td(
        s, (1,), "default"
    ).__getstate__(),
    "pickle_default_registry": lambda s: pickle.dumps(_td(s, (1,), "default")),
    "pickle_unnamed_registry": lambda s: pickle.dumps(
        _fresh(s).flatten((1,))[1]
    ),
    "setstate_int": lambda s: _uninitialized_treedef(s).__setstate__(5),
    "setstate_wrong_tuple": lambda s: _uninitialized_treedef(s).__setstate__(
        (s.regs["full"], [(0, 0, None, None, 1, 1)], 3)
    ),
    "setstate_unknown_kind": lambda s: _uninitialized_treedef(s).__setstate__(
        (s.regs["full"], [(9, 0, None, None, 1, 1)])
    ),
    # States whose arities do not make one tree: stock accepts them and fails
    # at the first use.
    "setstate_arity_too_big": lambda s: _setstate_then_repr(
        s, [_LEAF_ENTRY, (2, 2, None, None, 1, 2)]
    ),
    "setstate_negative_arity": lambda s: _setstate_then_repr(
        s, [_LEAF_ENTRY, (2, -1, None, None, 1, 2)]
    ),
    "setstate_two_roots": lambda s: _setstate_then_repr(
        s, [_LEAF_ENTRY, _LEAF_ENTRY]
    ),
    "setstate_no_nodes": lambda s: _setstate_then_repr(s, []),
    "setstate_dict_keys_short": lambda s: _setstate_then_repr(
        s, [_LEAF_ENTRY, _LEAF_ENTRY, (5, 2, ["a"], None, 2, 3)]
    ),
    "setstate_dict_keys_not_a_list": lambda s: _setstate_then_repr(
        s, [_LEAF_ENTRY, (5, 1, "a", None, 1, 2)]
    ),
    "setstate_valid": lambda s: (
        lambda t: (t.__setstate__(_td(s, (1, [2])).__getstate__()), t)[1]
    )(_uninitialized_treedef(s)),
    "setstate_initialized": lambda s: _setstate_initialized(s),
    "treedef_no_constructor": lambda s: s.mod.PyTreeDef(),
    # all_leaves / is_node.
    "all_leaves_non_iterable": lambda s: s.mod.all_leaves(s.regs["full"], 5),
    "all_leaves_none": lambda s: s.mod.all_leaves(s.regs["full"], [None]),
    "all_leaves_none_disabled": lambda s: s.mod.all_leaves(
        s.regs["no_none"], [None, 1]
    ),
    "all_leaves_empty": lambda s: s.mod.all_leaves(s.regs["full"], []),
    "all_leaves_bad_registry": lambda s: s.mod.all_leaves(5, []),
    "is_node_non_type": lambda s: s.regs["full"].is_node(5),
    "is_node_subclass": lambda s: [
        s.regs["full"].is_node(t) for t in (TupleSub, bool, RegB)
    ],
    # Keys.
    "key_bad_types": lambda s: [
        safe(lambda c=c, a=a: getattr(s.mod, c)(a))
        for c in KEY_CLASSES
        for a in (1.5, "x", None, -1, 2**64)
    ],
    "key_no_args": lambda s: s.mod.SequenceKey(),
    "key_setstate": lambda s: (lambda k: (k.__setstate__((7,)), k)[1])(
        s.mod.SequenceKey.__new__(s.mod.SequenceKey)
    ),
    "key_setstate_bad": lambda s: s.mod.SequenceKey.__new__(
        s.mod.SequenceKey
    ).__setstate__(("a",)),
    "key_eq_across_classes": lambda s: s.mod.SequenceKey(1)
    == s.mod.FlattenedIndexKey(1),
    "key_unhashable": lambda s: hash(s.mod.DictKey([1])),
    "key_match_args_class": lambda s: [
        getattr(s.mod, c).__match_args__ for c in KEY_CLASSES
    ],
    "module_version": lambda s: s.mod.version,
    "default_registry_singleton": lambda s: s.mod.default_registry()
    is s.mod.default_registry(),
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_hand_written_case(name):
  """Each hand-written case (mostly error paths) has the same outcome, or
  the one DEVIATIONS documents for it."""
  place = f"case:{name}"
  both(name, ERROR_CASES[name], place=place if place in DEVIATION_AT else None)


def _documented_items():
  """Item numbers of docs/semantics.md's list of deliberate differences."""
  path = os.path.join(
      os.path.dirname(os.path.abspath(__file__)),
      os.pardir,
      "docs",
      "semantics.md",
  )
  with open(path, encoding="utf-8") as f:
    text = f.read()
  title = "## Deliberate differences from stock jaxlib"
  assert title in text, f"{title!r} not found in {path}"
  section = text.split(title, 1)[1].split("\n## ", 1)[0]
  return {int(n) for n in re.findall(r"^(\d+)\. ", section, re.M)}


def test_deviations_table():
  """DEVIATIONS covers exactly the documented items, each with at least one
  place, and every place exists: a hand-written case, or an operation named
  (as a string literal) in the body of the property test."""
  assert set(DEVIATIONS) == _documented_items()
  for item, deviation in DEVIATIONS.items():
    assert deviation.places, item
    for place, instead in deviation.places.items():
      assert isinstance(instead, Instead), place
      if place.startswith("case:"):
        assert place[len("case:") :] in ERROR_CASES, place
        continue
      test_name, op = place.split("/", 1)
      test = globals().get(test_name)
      assert test_name.startswith("test_") and callable(test), place
      body = inspect.getsource(getattr(test, "hypothesis").inner_test)
      assert f'"{op}"' in body, place


def _leak_of(fn, repeat=20):
  """Recursion levels leaked by calling fn (expected to raise) repeat times."""
  before = available_depth()
  for _ in range(repeat):
    try:
      fn()
    except Exception:  # noqa: BLE001
      pass
  return before - available_depth()


NESTED_ERRORS = {
    "flatten_nested_unsortable": lambda s: s.regs["full"].flatten(
        [[{1: 1, "a": 2}]]
    ),
    "flatten_nested_raising_to_iterable": lambda s: s.regs["full"].flatten(
        [[I.raising_junk]]
    ),
    "flatten_nested_raising_predicate": lambda s: s.regs["full"].flatten(
        [(1, (2,))], make_leaf_predicate("raises")
    ),
    "flatten_with_path_nested_unsortable": lambda s: s.regs[
        "full"
    ].flatten_with_path([[{1: 1, "a": 2}]]),
}


@pytest.mark.parametrize("name", sorted(NESTED_ERRORS))
def test_recursion_depth_leak_not_worse_than_stock(name):
  """Errors raised below the root must not leak more interpreter recursion
  depth in the candidate than in stock (stock leaks one level per nesting
  level; the candidate may leak less, never more).  Both must raise."""
  expect_same_error(name, NESTED_ERRORS[name])
  stock_leak = _leak_of(lambda: NESTED_ERRORS[name](STOCK))
  ours_leak = _leak_of(lambda: NESTED_ERRORS[name](OURS))
  assert ours_leak <= stock_leak, (name, ours_leak, stock_leak)


# ---------------------------------------------------------------------------
# API surface.
# ---------------------------------------------------------------------------


def _public(obj):
  return sorted(
      n
      for n in dir(obj)
      if not n.startswith("_")
      or n
      in (
          "__getstate__",
          "__setstate__",
          "__reduce__",
          "__match_args__",
          "__eq__",
          "__ne__",
          "__hash__",
          "__repr__",
          "__str__",
          "__init__",
      )
  )


def _doc(obj):
  return norm_msg(getattr(obj, "__doc__", None) or "")


def test_api_surface():
  """Every public name of stock (module and classes) exists in the candidate
  (which may add names for its new feature) with the same documented
  signature (nanobind docstrings), modulo the module path and the documented
  extra keyword-only parameter."""
  missing = set(_public(stock)) - set(_public(ours))
  assert not missing, missing
  for cls_name in ["PyTreeRegistry", "PyTreeDef"] + KEY_CLASSES:
    s_cls, o_cls = getattr(stock, cls_name), getattr(ours, cls_name)
    missing = set(_public(s_cls)) - set(_public(o_cls))
    assert not missing, (cls_name, missing)
    for attr in _public(s_cls):
      assert _doc(getattr(s_cls, attr)) == _doc(
          getattr(o_cls, attr)
      ), f"{cls_name}.{attr}"
  for fn in ["default_registry", "treedef_tuple", "all_leaves"]:
    assert _doc(getattr(stock, fn)) == _doc(getattr(ours, fn)), fn
  assert ours.version == stock.version
