"""Test-suite setup: which build of the module is under test."""

import os

import jaxlib_patch.pytree


def pytest_report_header(config):
  return f"jaxlib_patch.pytree from {jaxlib_patch.pytree.__file__}"


def pytest_configure(config):
  # tests/run.sh runs the suite once per build and names the folder the module
  # must come from, so a stale install can never stand in for the build.
  expected = os.environ.get("JAXLIB_PATCH_EXPECT")
  if expected and expected not in jaxlib_patch.pytree.__file__:
    raise RuntimeError(
        f"testing {jaxlib_patch.pytree.__file__}, expected a module from "
        f"{expected}"
    )
