#!/usr/bin/env bash
# Runs the whole test suite, from a bare machine (Python 3.11, pip, gcc) up:
#   1. a virtual environment with what the tests need (stock jaxlib 0.10.2 for
#      the differential tests, hypothesis, pytest, optree);
#   2. the module built with setuptools (`pip install .`), then the tests;
#   3. the module built with bazel (Debian's bazel-bootstrap), then the same
#      tests against that build;
#   4. the module built with AddressSanitizer and UndefinedBehaviorSanitizer
#      (tests/sanitize.sh), then the module's tests under them;
#   5. the custom jaxlib and jax wheels (build/build.py) installed in a second
#      virtual environment, then the JAX-level tests (tests/jax) and the demo
#      against them.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${JAXLIB_PATCH_VENV:-$root/.venv-test}
python=${PYTHON:-python3}

step() { printf '\n=== %s\n' "$*"; }

step "virtual environment in $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r tests/requirements.txt

step "setuptools build (pip install .)"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps .

# Run from outside the checkout, so that the source folder jaxlib_patch/ (which
# holds no built module) cannot shadow the build under test.
run_suite() {
  local label=$1; shift
  step "tests against the $label build"
  (cd "$root/tests" && "$venv/bin/python" -P -m pytest -p no:cacheprovider \
      --rootdir="$root" -c "$root/pyproject.toml" "$root/tests" \
      --ignore="$root/tests/jax" "$@")
}
JAXLIB_PATCH_EXPECT=site-packages run_suite setuptools "$@"

step "bazel build"
if ! command -v bazel >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq bazel-bootstrap >/dev/null
  else
    echo "bazel is missing: apt-get install -y bazel-bootstrap" >&2; exit 1
  fi
fi
bazel_out=$root/build/bazel_out
PYTHON="$venv/bin/python" build/bazel_module.sh "$bazel_out" >/dev/null
PYTHONPATH="$bazel_out" JAXLIB_PATCH_EXPECT="$bazel_out" run_suite bazel "$@"

step "sanitizer build (ASan + UBSan)"
PYTHON="$venv/bin/python" bash tests/sanitize.sh "$@"

step "custom wheels (build/build.py) and the JAX-level tests against them"
jax_venv=${JAXLIB_PATCH_JAX_VENV:-$root/.venv-jax}
"$venv/bin/python" build/build.py --no-selfcheck
[ -x "$jax_venv/bin/python" ] || "$python" -m venv "$jax_venv"
"$jax_venv/bin/python" -m pip install -q --upgrade pip
"$jax_venv/bin/python" -m pip install -q --force-reinstall \
  "$(ls -t dist/jax-*+*-py3-none-any.whl | head -n 1)" \
  "$(ls -t dist/jaxlib-*+*.whl | head -n 1)"
"$jax_venv/bin/python" -m pip install -q -r tests/jax/requirements.txt
# Stock jax's reference numbers for the peer-library test come from the
# module tests' venv, which holds stock jax and jaxlib.
(cd "$root/tests" && JAXLIB_PATCH_STOCK_PYTHON="$venv/bin/python" \
    "$jax_venv/bin/python" -P -m pytest -p no:cacheprovider \
    --rootdir="$root" -c "$root/pyproject.toml" "$root/tests/jax" "$@")
"$jax_venv/bin/python" -I examples/demo.py
