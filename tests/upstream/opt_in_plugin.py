"""pytest plugin: opt a library's base classes in before its tests import.

``JAXLIB_PATCH_OPT_IN`` names the library whose suite runs: ``equinox`` opts
in ``eqx.Module``, ``nnx`` opts in Flax's ``nnx.Pytree`` and ``nnx.Variable``
(every module, optimizer, ``Rngs`` and variable), with
``jax.tree_util.preserve_relative_identities``, and acknowledges the ties
that makes (``TiedByOptInWarning`` is ignored, as by a user who means them).
Unset or empty, the plugin does nothing, so one command line serves stock
jax and the custom wheels.

Load it with ``-p opt_in_plugin`` and this folder on ``PYTHONPATH``. The
opt-in happens in ``pytest_configure``, before collection imports the test
modules, so the classes they define are registered after it and are opted in
through their base class; once collection is over, the plugin checks that
every opted-in subclass defined at the top level of a test module
preserves relative identities, and stops the run if one does not (the
suite would then measure stock behaviour under the opt-in's name); at the
end it checks the classes the tests defined as they ran, and the terminal
summary says how many of each it found.
"""

import importlib
import inspect
import os

import pytest

ENV_VAR = "JAXLIB_PATCH_OPT_IN"

# Library name -> the (module, class) pairs of its base classes.
BASE_CLASSES = {
    "equinox": (("equinox", "Module"),),
    "nnx": (("flax.nnx", "Pytree"), ("flax.nnx", "Variable")),
}

_bases = ()
_MODULES = pytest.StashKey[set]()  # the names of the collected test modules
# The test-module classes found opted in: at collection (those a module
# defines at its top level) and at the end (every live subclass whose module
# is a test module, those defined inside tests included; under pytest-xdist
# the largest count of one worker).
_counts = {"collection": 0, "end": 0}


def _library():
  name = os.environ.get(ENV_VAR, "")
  if name and name not in BASE_CLASSES:
    raise pytest.UsageError(
        f"{ENV_VAR}={name!r}: expected one of {', '.join(BASE_CLASSES)}"
    )
  return name


# trylast: jaxtyping's plugin (Equinox's suite runs with
# --jaxtyping-packages=equinox,...) installs its import hook in its own
# pytest_configure; equinox must be imported after that hook, as on stock,
# or the suite would run on an uninstrumented equinox.
@pytest.hookimpl(trylast=True)
def pytest_configure(config):
  global _bases
  name = _library()
  if not name:
    return
  from jax import tree_util

  if not hasattr(tree_util, "preserve_relative_identities"):
    raise pytest.UsageError(
        f"{ENV_VAR}={name} needs the custom jax wheels: this jax has no "
        "jax.tree_util.preserve_relative_identities"
    )
  bases = []
  for module_name, class_name in BASE_CLASSES[name]:
    cls = getattr(importlib.import_module(module_name), class_name)
    tree_util.preserve_relative_identities(cls)
    bases.append(cls)
  _bases = tuple(bases)
  # The suite opts in knowingly, as a user who means the ties its tests
  # make: the warning that tells the first one (under the suites'
  # warnings-as-errors) is acknowledged.
  config.addinivalue_line(
      "filterwarnings", "ignore::jax.tree_util.TiedByOptInWarning"
  )


def pytest_report_header(config):
  if not _bases:
    return "opt-in: none"
  names = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in _bases)
  return f"opt-in: preserve_relative_identities({names})"


def _test_module_classes(module_names, candidates):
  """Opted-in and not opted-in subclasses of the bases from test modules."""
  from jax import tree_util

  found, missed = set(), set()
  for cls in candidates:
    if cls.__module__ not in module_names or not issubclass(cls, _bases):
      continue
    if tree_util.has_relative_identities(cls):
      found.add(cls)
    else:
      missed.add(f"{cls.__module__}.{cls.__qualname__}")
  return found, missed


def _all_subclasses():
  seen, stack = set(), list(_bases)
  while stack:
    for sub in type.__subclasses__(stack.pop()):
      if sub not in seen:
        seen.add(sub)
        stack.append(sub)
  return seen


def pytest_collection_finish(session):
  if not _bases:
    return
  modules = {
      item.module
      for item in session.items
      if getattr(item, "module", None) is not None
  }
  session.config.stash[_MODULES] = {m.__name__ for m in modules}
  top_level = {
      cls
      for module in modules
      for _, cls in inspect.getmembers(module, inspect.isclass)
  }
  found, missed = _test_module_classes(
      session.config.stash[_MODULES], top_level
  )
  if missed:
    raise pytest.UsageError(
        "opted-in base classes, yet these test-module classes do not "
        f"preserve relative identities: {', '.join(sorted(missed))}"
    )
  _counts["collection"] = len(found)


def pytest_sessionfinish(session):
  if not _bases or _MODULES not in session.config.stash:
    return
  found, missed = _test_module_classes(
      session.config.stash[_MODULES], _all_subclasses()
  )
  _counts["end"] = len(found)
  if missed:
    _counts["missed"] = sorted(missed)
  # Under pytest-xdist the workers collect and run: hand the counts to the
  # controller, which prints them.
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None:
    workeroutput["opt_in_counts"] = dict(_counts)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  counts = getattr(node, "workeroutput", {}).get("opt_in_counts")
  if counts:
    for key in ("collection", "end"):
      _counts[key] = max(_counts[key], counts[key])
    _counts.setdefault("missed", []).extend(counts.get("missed", []))


def pytest_terminal_summary(terminalreporter):
  if not _bases:
    return
  terminalreporter.write_line(
      f"opt-in: {_counts['collection']} classes defined at the top level of "
      f"test modules and {_counts['end']} live at the end (those defined in "
      "tests too) preserve relative identities"
  )
  if _counts.get("missed"):
    terminalreporter.write_line(
        "opt-in: NOT opted in: " + ", ".join(sorted(set(_counts["missed"])))
    )
