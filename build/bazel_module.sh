#!/usr/bin/env bash
# Build the jaxlib_patch.pytree C++ extension with Bazel, offline, and lay it
# out as an importable package:
#
#     build/bazel_module.sh [OUT_DIR]      (default: build/bazel_out)
#
# produces OUT_DIR/jaxlib_patch/{*.py, pytree<EXT_SUFFIX>}, so that
# `PYTHONPATH=OUT_DIR python -c "import jaxlib_patch.pytree"` works, and
# prints OUT_DIR (absolute) as its only line on stdout.
#
# It is an alternative to the setuptools build (`pip install .`), from the
# same sources.  It installs nothing: it needs Bazel 4 (Debian's
# bazel-bootstrap), a C++17 compiler, and a Python with its headers and the
# `nanobind` that pyproject.toml's build requirements pin.  The interpreter is $PYTHON if set, else
# python3; the module is built for that interpreter.  Bazel keeps its output
# base in ~/.cache/bazel and writes nothing into the source tree (.bazelrc).
set -euo pipefail

log() { echo "bazel_module.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v bazel >/dev/null 2>&1; then
    die "bazel not found.  Install Debian's offline-capable Bazel 4 with:
    apt-get install -y bazel-bootstrap"
fi

# The output directory is relative to where the caller stands; the default is
# relative to the repository.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ $# -ge 1 && -n $1 ]]; then
    mkdir -p "$1"
    out_dir=$(cd "$1" && pwd)
else
    mkdir -p "$repo_root/build/bazel_out"
    out_dir="$repo_root/build/bazel_out"
fi

python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || die "no '$python' on PATH (set PYTHON=/path/to/python)"
# Resolve a shim (pyenv) to the interpreter it runs (a venv stays a venv), so
# that Bazel's @local_python repository and EXT_SUFFIX below agree with it.
python=$("$python" -c 'import sys; print(sys.executable)')
ext_suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')

cd "$repo_root"

# Passed to every command so that `bazel info` sees the same configuration as
# `bazel build` (otherwise it would re-run the Python discovery for nothing).
# PYTHON_BIN_PATH picks the interpreter in third_party/bazel/python/
# python_configure.bzl; changing it makes Bazel re-run that discovery.
bazel_flags=(--repo_env="PYTHON_BIN_PATH=$python")
# Warnings as errors, like setup.py, when asked (tests/run.sh, so CI): the
# flags are WERROR_COPTS of jaxlib_patch/compile_flags.bzl (jaxlib_patch/BUILD).
build_flags=()
if [[ ${JAXLIB_PATCH_WERROR:-} == 1 ]]; then
    build_flags=(--define=jaxlib_patch_werror=1)
fi

log "building //jaxlib_patch:pytree for $python (this takes a while the first time)"
start=$SECONDS
bazel build "${bazel_flags[@]}" "${build_flags[@]}" //jaxlib_patch:pytree >&2
log "bazel build finished in $((SECONDS - start)) s"

built="$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)/jaxlib_patch/pytree$ext_suffix"
[[ -f $built ]] || die "bazel reported success but $built does not exist"

# A fresh package directory: no stale module from another Python version.
pkg="$out_dir/jaxlib_patch"
rm -rf "$pkg"
mkdir -p "$pkg"
# The package's Python files (at least __init__.py) make it importable.
[[ -f jaxlib_patch/__init__.py ]] || die "jaxlib_patch/__init__.py is missing"
cp jaxlib_patch/*.py "$pkg/"
cp "$built" "$pkg/"
# Bazel's outputs are read-only; let the next run (or the user) replace them.
chmod u+w "$pkg"/*

# CI ends whatever a run leaves behind; stop the Bazel server cleanly instead
# of leaving it to idle out (.bazelrc: --max_idle_secs).
if [[ ${CI:-} == true ]]; then
    bazel shutdown >&2 || true
fi

log "module: $pkg/pytree$ext_suffix"
echo "$out_dir"
