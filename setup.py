"""Builds the C++ pytree module `jaxlib_patch.pytree` with setuptools.

The same sources build with bazel (see WORKSPACE); both builds pass the same
tests. Set JAXLIB_PATCH_SANITIZE=1 to build with AddressSanitizer and
UndefinedBehaviorSanitizer (see docs/hardening.md).
"""

import glob
import os

import sysconfig

import nanobind
from setuptools import Extension, setup

NANOBIND = os.path.dirname(nanobind.__file__)

compile_args = ["-std=c++17", "-fvisibility=hidden", "-DNB_DOMAIN=jaxlib_patch"]
link_args = []
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    compile_args.append("-DNB_FREE_THREADED")
if os.environ.get("JAXLIB_PATCH_SANITIZE"):
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                "-fno-sanitize-recover=undefined"]
    compile_args += ["-O1", "-g"] + sanitize
    link_args += sanitize
else:
    # -g0 overrides the -g in Python's own CFLAGS: a 6 MB module shrinks to
    # the size of the bazel build's.
    compile_args += ["-O2", "-DNDEBUG", "-g0"]

pytree = Extension(
    "jaxlib_patch.pytree",
    sources=sorted(glob.glob("jaxlib_patch/*.cc"))
    + [os.path.join(NANOBIND, "src", "nb_combined.cpp")],
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
