# The compile and link flags of the jaxlib_patch.pytree module: the one source
# for every build.  Bazel loads this file (jaxlib_patch/BUILD); setup.py reads
# the same assignments with ast.literal_eval, so each must stay a plain list
# literal.  setup.py serves the gcc build (`pip install .`), the wheel's zig
# build (build/build.py runs `pip wheel .`) and the sanitizer build
# (tests/sanitize.sh); the environment variables named below choose the lists.

# Every translation unit, the module's and nanobind's (nb_combined.cpp), in
# every build.  -O2 is explicit so that Bazel's fastbuild mode optimises too.
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

# Every build but the sanitizer's.  -g0 overrides the -g of Python's own
# CFLAGS, which setuptools passes first: a 6 MB module shrinks to the size of
# the bazel build's.
RELEASE_COPTS = [
    "-DNDEBUG",
    "-g0",
]

# Added when JAXLIB_PATCH_WERROR=1 (tests/run.sh, so CI): a new warning fails
# the build there without failing a user's build with a newer compiler.
WERROR_COPTS = ["-Werror"]

# JAXLIB_PATCH_SANITIZE=1 (tests/sanitize.sh, docs/hardening.md), in place of
# RELEASE_COPTS: AddressSanitizer and UndefinedBehaviorSanitizer, with the
# frames and the debug information their reports need.
SANITIZE_COPTS = [
    "-O1",
    "-g",
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=undefined",
]

SANITIZE_LINKOPTS = ["-fsanitize=address,undefined"]

# The module's nanobind internals stay apart from those of stock jaxlib (and
# of any other nanobind extension).
DEFINES = ["NB_DOMAIN=jaxlib_patch"]

# JAXLIB_PATCH_ZIG=1: the wheel's build, which build/build.py runs with zig's
# clang for the stock jaxlib wheel's manylinux tag, libc++ linked statically
# (build/README.md).  zig's glibc headers define _POSIX_C_SOURCE and
# _XOPEN_SOURCE to newer values than pyconfig.h: not a defect of ours.
# What the other flags do, measured in instructions per call against the gcc
# build (bench/count_instructions.py; docs/benchmarks.md, "The wheel's build
# against the gcc build", 144 cells): without them zig runs up to 1.13x gcc's
# flatten (geometric mean of all cells 1.025x, 52 cells over 1.05x); with all
# of them flatten is at most 1.01x (geometric mean 0.991x) but 17 cells are
# still over 1.05x, every one a flatten_up_to: lists and tuples 1.08-1.27x,
# the opted-in shared layer 1.29x.  Without -flto and the inline threshold
# (keeping the rest) flatten_up_to of lists and tuples is 1.04-1.15x but
# flatten is back to 1.07x, 16 cells over.  Each flag's share was not
# measured apart.  zig's clang keeps frame pointers unless told not to
# (1,489 functions set one up in the module built without these flags, 7 in
# gcc's).
ZIG_COPTS = [
    "-Wno-macro-redefined",
    "-fomit-frame-pointer",
    "-flto",
    "-mllvm",
    "-inline-threshold=600",
]

# With -flto the code is generated at the link, so the optimisation flags
# come again there.  The version script keeps every symbol but PyInit_pytree
# local, so the module's libc++ cannot clash with another extension's C++
# runtime.
ZIG_LINKOPTS = [
    "-O2",
    "-flto",
    "-mllvm",
    "-inline-threshold=600",
    "-Wl,--version-script=jaxlib_patch/exports.map",
]
