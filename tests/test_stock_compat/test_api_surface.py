"""The public names and signatures: those of stock."""

from test_stock_compat.describe import KEY_CLASSES, norm_msg
from test_stock_compat.strategies import ours, stock


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
