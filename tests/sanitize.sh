#!/usr/bin/env bash
# Builds the module with AddressSanitizer and UndefinedBehaviorSanitizer and
# runs the module's tests under them; any sanitizer report fails the run.
# Usage: PYTHON=<venv python with the test requirements> bash tests/sanitize.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
out=$root/build/asan_out

rm -rf "$out" "$root/build/asan_tmp"
JAXLIB_PATCH_SANITIZE=1 "$python" setup.py -q build_ext -j 2 \
  -b "$out" -t "$root/build/asan_tmp" >/dev/null
cp jaxlib_patch/__init__.py "$out/jaxlib_patch/"

# The sanitizer runtimes must be loaded before the interpreter. Leak checking
# is off: CPython keeps interned objects alive at exit by design; the tests
# check reference counts instead.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$root/tests"
PYTHONPATH="$out" JAXLIB_PATCH_EXPECT="$out" "$python" -P -m pytest \
  -p no:cacheprovider --rootdir="$root" -c "$root/pyproject.toml" \
  "$root/tests" --ignore="$root/tests/jax" "$@"
