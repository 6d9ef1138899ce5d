"""pytest plugin: the ``jax.jaxlib`` package that jax's own pytree test imports.

``jaxlib/pytree_test.py`` of a jax checkout does ``from jax.jaxlib import
_jax``, a path that only exists in jax's Bazel build.  This plugin makes it
resolve in an installed environment.  With ``UPSTREAM_PYTREE_MODULE`` set (to
``jaxlib_patch.pytree`` on the custom side) ``_jax.pytree`` is that module and
every other attribute is stock ``jaxlib._jax``'s; unset, it is stock
``jaxlib._jax`` itself.  Only the test sees the substitute: jax keeps the
pytree module it was built with.

Also, with ``UPSTREAM_CHECKOUT`` set, the test-only modules of ``jax._src``
that the jax wheel does not ship (``hypothesis_test_util``, which
``tests/state_test.py`` imports) are found in the checkout: its
``jax/_src`` comes after the installed one on ``jax._src``'s search path, so
no installed module is shadowed.
"""

import importlib
import os
import sys
import types

from jaxlib import _jax as stock_jax


class _JaxWithPytree(types.ModuleType):
  """``jaxlib._jax`` with its ``pytree`` replaced; the rest is forwarded."""

  def __init__(self, pytree):
    super().__init__(stock_jax.__name__, stock_jax.__doc__)
    self.pytree = pytree

  def __getattr__(self, name):
    return getattr(stock_jax, name)


def _jax_under_test():
  module_name = os.environ.get("UPSTREAM_PYTREE_MODULE")
  if not module_name:
    return stock_jax
  return _JaxWithPytree(importlib.import_module(module_name))


def pytest_configure(config):
  jax_jaxlib = types.ModuleType("jax.jaxlib")
  jax_jaxlib._jax = _jax_under_test()
  sys.modules["jax.jaxlib"] = jax_jaxlib
  sys.modules["jax.jaxlib._jax"] = jax_jaxlib._jax
  checkout = os.environ.get("UPSTREAM_CHECKOUT")
  if checkout:
    import jax._src  # pylint: disable=g-import-not-at-top

    jax._src.__path__.append(os.path.join(checkout, "jax", "_src"))


def pytest_report_header(config):
  return f"jax.jaxlib._jax.pytree is {sys.modules['jax.jaxlib._jax'].pytree}"
