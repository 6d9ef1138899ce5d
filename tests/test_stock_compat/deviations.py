"""The deliberate differences from stock, and what the candidate must do at
each place they affect instead of matching stock."""

import dataclasses
import re

from test_stock_compat.describe import canon, norm_msg
from test_stock_compat.strategies import OURS

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
