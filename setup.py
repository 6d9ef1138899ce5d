"""Builds the C++ pytree module `jaxlib_patch.pytree` with setuptools.

The same sources build with bazel (see WORKSPACE), with the same flags: every
build takes them from jaxlib_patch/compile_flags.bzl.  Set
JAXLIB_PATCH_WERROR=1 to make warnings errors (CI does),
JAXLIB_PATCH_SANITIZE=1 to build with AddressSanitizer and
UndefinedBehaviorSanitizer (see docs/hardening.md), and JAXLIB_PATCH_ZIG=1
when the compiler is zig's clang (build/build.py sets it for the wheel).
"""

import ast
import glob
import os

import nanobind
from setuptools import Extension, setup

NANOBIND = os.path.dirname(nanobind.__file__)
HERE = os.path.dirname(os.path.abspath(__file__))
NANOBIND_SOURCE = os.path.join(NANOBIND, "src", "nb_combined.cpp")
if os.path.commonpath([os.path.abspath(NANOBIND_SOURCE), HERE]) == HERE:
  # A nanobind inside the checkout (a venv there, and a build without
  # isolation): egg_info lists such a source in its manifest as it is given,
  # and build_py then rejects the absolute path, in this build and in every
  # later one that reads the manifest.
  NANOBIND_SOURCE = os.path.relpath(NANOBIND_SOURCE, HERE)


def compile_flags():
  """The list assignments of jaxlib_patch/compile_flags.bzl, by name."""
  path = os.path.join(HERE, "jaxlib_patch", "compile_flags.bzl")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  return {
      node.targets[0].id: ast.literal_eval(node.value)
      for node in tree.body
      if isinstance(node, ast.Assign)
  }


FLAGS = compile_flags()
compile_args = FLAGS["COPTS"] + ["-D" + d for d in FLAGS["DEFINES"]]
link_args = []
if os.environ.get("JAXLIB_PATCH_WERROR") == "1":
  compile_args += FLAGS["WERROR_COPTS"]
if os.environ.get("JAXLIB_PATCH_ZIG") == "1":
  compile_args += FLAGS["ZIG_COPTS"]
  link_args += FLAGS["ZIG_LINKOPTS"]
if os.environ.get("JAXLIB_PATCH_SANITIZE") == "1":
  compile_args += FLAGS["SANITIZE_COPTS"]
  link_args += FLAGS["SANITIZE_LINKOPTS"]
else:
  compile_args += FLAGS["RELEASE_COPTS"]

pytree = Extension(
    "jaxlib_patch.pytree",
    sources=sorted(glob.glob("jaxlib_patch/*.cc")) + [NANOBIND_SOURCE],
    include_dirs=[
        ".",
        os.path.join(NANOBIND, "include"),
        os.path.join(NANOBIND, "ext", "robin_map", "include"),
    ],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    language="c++",
)

setup(ext_modules=[pytree])
