# The compile flags of the jaxlib_patch.pytree module: one source for both
# builds.  Bazel loads this file (jaxlib_patch/BUILD); setup.py reads the same
# assignments with ast.literal_eval, so each must stay a plain list literal.

# Every translation unit, the module's and nanobind's (nb_combined.cpp), in
# both builds.  -O2 is explicit so that Bazel's fastbuild mode optimises too.
# nanobind's own build compiles its core (raw CPython API code) with
# -fno-strict-aliasing; the module's files get it as well, so that one list
# serves both.
COPTS = [
    "-std=c++17",
    "-O2",
    "-fvisibility=hidden",
    "-fno-strict-aliasing",
    "-Wall",
    "-Wextra",
]

# Added when JAXLIB_PATCH_WERROR=1 (tests/run.sh, so CI): a new warning fails
# the build there without failing a user's build with a newer compiler.
WERROR_COPTS = ["-Werror"]

# The module's nanobind internals stay apart from those of stock jaxlib (and
# of any other nanobind extension).
DEFINES = ["NB_DOMAIN=jaxlib_patch"]

# Added for a free-threaded CPython (sysconfig's Py_GIL_DISABLED).
FREE_THREADED_DEFINES = ["NB_FREE_THREADED"]
