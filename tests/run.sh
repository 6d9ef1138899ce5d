#!/usr/bin/env bash
# Runs the whole test suite, from a bare machine (Python 3.11, pip, gcc) up,
# on every CPython that stock jaxlib ships wheels for and this machine has
# (3.11, 3.12, 3.13: on PATH or under pyenv; it says which it skipped):
#   0. the formatting of the C++ and the Python (tests/format.sh --check);
#   1. per Python, a virtual environment with what the tests need (stock
#      jaxlib 0.10.2 for the differential tests, hypothesis, pytest, optree);
#   2. per Python, the module built with setuptools (`pip install .`, warnings
#      as errors), then the module's tests (the fuzz campaign and the
#      hypothesis search of test_sharing_invariants.py and
#      test_sharing_query_invariants.py on the first only);
#   3. on the first Python only (the heavy jobs): the module built with bazel
#      (Debian's bazel-bootstrap, warnings as errors) and the same tests
#      against that build, then the module built with AddressSanitizer and
#      UndefinedBehaviorSanitizer (tests/sanitize.sh) and its tests under them;
#   4. the custom jaxlib wheel for each Python and the jax wheel, from one
#      build/build.py run (which fails unless `auditwheel show` accepts each
#      jaxlib wheel's manylinux tag), then the module's tests against the
#      module of the first Python's wheel (zig's build);
#   5. per Python, the wheels installed in a second virtual environment, then
#      the JAX-level tests (tests/jax) and the demo against them; on the
#      first, the jax series checked out commit by commit (each runs JAX on
#      a tied pair; none takes back a line an earlier one added).
# The first Python's venvs are $JAXLIB_PATCH_VENV and $JAXLIB_PATCH_JAX_VENV
# if set (default .venv-test, .venv-jax); the others' get a -3.X suffix.
#
# --quick, the inner loop (README.md gives a dated measurement of its time):
# the first Python only, its venvs as they are (made as above only where
# missing); the module built with setuptools (`setup.py build_ext --force`,
# warnings as errors) into
# build/quick_module; the module's tests against it but the fuzz campaign
# and the sharing invariants' hypothesis search; then the JAX-level tests but
# check_device_test.py against the custom wheels of dist/ (built by
# build/build.py first if there are none for that Python; the jax wheel
# built again, --jax-only, where it records another series than
# jax_patch/'s), with the module just built in front of the wheel's, and the
# series commit by commit. No
# formatting check, bazel, sanitizers, other Pythons or demo.
# Usage: bash tests/run.sh [--quick] [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
pythons=(3.11 3.12 3.13)
quick=0
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
dist=$root/dist

step() { printf '\n=== %s\n' "$*"; }

# The jax series commit by commit: each runs JAX on a tied pair (with the
# module of the given venv's custom jaxlib), none takes back a line an
# earlier one added, and the last leaves the tree recorded in
# jax_patch/<version>/applied-tree.
check_series() {
  step "the jax series, commit by commit (build/series_smoke.py, series_undos.py, series_tree.py)"
  # One checkout for the three.
  local series
  series=$(mktemp -d)/jax
  (cd build && "$1/bin/python" patch_series.py checkout "$series" &&
     "$1/bin/python" series_smoke.py --python "$1/bin/python" \
       --checkout "$series" &&
     "$1/bin/python" series_undos.py --checkout "$series" | tail -n 1 &&
     "$1/bin/python" series_tree.py --checkout "$series" | tail -n 1)
  rm -rf "$(dirname "$series")"
}

# Warnings fail the setuptools builds (setup.py) and the bazel build (below).
export JAXLIB_PATCH_WERROR=1

step "Pythons"
found=()
declare -A interpreter
while read -r version path; do
  if [ "$path" = missing ]; then
    echo "skipped: Python $version (not on PATH, not under pyenv)"
  else
    echo "Python $version: $path"
    found+=("$version")
    interpreter[$version]=$path
  fi
done < <("$python" build/build.py --find-pythons --python "$(IFS=,; echo "${pythons[*]}")")
[ ${#found[@]} -gt 0 ] || { echo "no Python of ${pythons[*]} found" >&2; exit 1; }
first=${found[0]}

venv_of() {  # venv_of VERSION DEFAULT_VAR_VALUE: the venv folder of Python VERSION
  if [ "$1" = "$first" ]; then echo "$2"; else echo "$2-$1"; fi
}

make_venv() {  # make_venv VERSION FOLDER REQUIREMENTS
  [ -x "$2/bin/python" ] || "${interpreter[$1]}" -m venv "$2"
  "$2/bin/python" -m pip install -q --upgrade pip
  # Plus pyproject.toml's build requirements (nanobind, setuptools), pinned
  # there only: the bazel and sanitizer builds compile with the venv's.
  "$2/bin/python" -m pip install -q -r "$3" $("$2/bin/python" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
  print(" ".join(tomllib.load(f)["build-system"]["requires"]))')
}

# Run from outside the checkout, so that the source folder jaxlib_patch/ (which
# holds no built module) cannot shadow the build under test.
run_suite() {
  local label=$1 venv=$2; shift 2
  step "module tests against the $label build"
  (cd "$root/tests" && "$venv/bin/python" -P -m pytest -p no:cacheprovider \
      --rootdir="$root" -c "$root/pyproject.toml" "$root/tests" \
      --ignore="$root/tests/jax" "$@")
}

# The two longest jobs, the fuzz campaign and the hypothesis search for
# broken sharing invariants (together half the suite's time).
heavy=(--ignore="$root/tests/test_fuzz_short.py"
       --ignore="$root/tests/test_sharing_invariants.py"
       --ignore="$root/tests/test_sharing_query_invariants.py")

# newest_wheels VERSION: the newest custom jax and jaxlib wheels of dist/
# for Python VERSION, one a line.
newest_wheels() {
  ls -t "$dist"/jax-*+*-py3-none-any.whl | head -n 1
  ls -t "$dist"/jaxlib-*+*-cp${1/./}-*.whl | head -n 1
}

# install_wheels VERSION JAX_VENV: newest_wheels into JAX_VENV, with the
# JAX-level tests' requirements; JAX_VENV/custom-wheels then names them (with
# their sizes and times), so that --quick can tell whether they are current.
install_wheels() {
  local jax_venv=$2 wheels
  mapfile -t wheels < <(newest_wheels "$1")
  [ -x "$jax_venv/bin/python" ] || "${interpreter[$1]}" -m venv "$jax_venv"
  "$jax_venv/bin/python" -m pip install -q --upgrade pip
  "$jax_venv/bin/python" -m pip install -q --force-reinstall --no-deps "${wheels[@]}"
  # The wheels again beside the requirements: pip must choose equinox and
  # flax versions that keep them (the newest flax would pull a newer jax).
  "$jax_venv/bin/python" -m pip install -q "${wheels[@]}" -r tests/jax/requirements.txt
  ls -l "${wheels[@]}" > "$jax_venv/custom-wheels"
}

# run_jax_suite VERSION JAX_VENV [pytest args...]: the JAX-level tests.
# Stock jax's reference numbers (peer libraries) and the install-time pin
# checks use the module tests' venv of the same Python, which holds stock
# jax and jaxlib.
run_jax_suite() {
  local version=$1 jax_venv=$2; shift 2
  (cd "$root/tests" && JAXLIB_PATCH_DIST="$dist" \
      JAXLIB_PATCH_STOCK_PYTHON="$(venv_of "$version" "$module_venv")/bin/python" \
      "$jax_venv/bin/python" -P -m pytest -p no:cacheprovider \
      --rootdir="$root" -c "$root/pyproject.toml" "$root/tests/jax" "$@")
}

module_venv=${JAXLIB_PATCH_VENV:-$root/.venv-test}
jax_venv_default=${JAXLIB_PATCH_JAX_VENV:-$root/.venv-jax}

if [ "$quick" = 1 ]; then
  started=$SECONDS
  step "quick: Python $first, virtual environments $module_venv and $jax_venv_default"
  [ -x "$module_venv/bin/python" ] ||
    make_venv "$first" "$module_venv" tests/requirements.txt
  step "quick: setuptools build into build/quick_module"
  quick_module=$root/build/quick_module
  rm -rf "$quick_module"
  # --force: setuptools does not track headers, so an old build must not
  # stand for the sources.
  "$module_venv/bin/python" setup.py -q build_ext --force -j "$(nproc)" \
    --build-lib "$quick_module" --build-temp "$root/build/quick_temp"
  cp jaxlib_patch/__init__.py "$quick_module/jaxlib_patch/"
  PYTHONPATH="$quick_module" JAXLIB_PATCH_EXPECT="$quick_module" \
    run_suite "setuptools (quick, Python $first)" "$module_venv" \
    "${heavy[@]}" "$@"
  if ! ls "$dist"/jaxlib-*+*-cp${first/./}-*.whl >/dev/null 2>&1; then
    step "quick: no custom wheels for Python $first in dist/: build/build.py"
    "$module_venv/bin/python" -m pip install -q -r build/requirements.txt
    "$module_venv/bin/python" build/build.py --no-selfcheck --dist "$dist" \
      --python "$first"
  fi
  mapfile -t wheels < <(newest_wheels "$first")
  # A jax wheel of another series than jax_patch/'s (its dist-info records
  # the digest) is built again from the series as it is: the JAX-level tests
  # never run on a stale one.
  if [ "$("$module_venv/bin/python" build/build.py --recorded-series "${wheels[0]}")" != \
       "$("$module_venv/bin/python" build/build.py --series-digest)" ]; then
    step "quick: jax_patch/ is not the series of $(basename "${wheels[0]}"): build/build.py --jax-only"
    "$module_venv/bin/python" build/build.py --jax-only --dist "$dist" \
      --python "$first"
    mapfile -t wheels < <(newest_wheels "$first")
  fi
  if [ "$(ls -l "${wheels[@]}")" != \
       "$(cat "$jax_venv_default/custom-wheels" 2>/dev/null)" ]; then
    step "quick: the wheels of dist/ into $jax_venv_default"
    install_wheels "$first" "$jax_venv_default"
  fi
  step "quick: JAX-level tests, the wheels of dist/ with build/quick_module"
  # But the rehearsal of the accelerator check (build/check_device.py on CPU), a
  # quarter of the JAX-level tests' time, which the whole suite runs.
  PYTHONPATH="$quick_module" run_jax_suite "$first" "$jax_venv_default" \
    --ignore="$root/tests/jax/check_device_test.py" "$@"
  check_series "$jax_venv_default"
  step "quick: done in $((SECONDS - started)) s"
  exit 0
fi

step "formatting (tests/format.sh --check)"
format_venv=$root/build/format_venv
[ -x "$format_venv/bin/python" ] || "${interpreter[$first]}" -m venv "$format_venv"
PYTHON="$format_venv/bin/python" bash tests/format.sh --check

for version in "${found[@]}"; do
  venv=$(venv_of "$version" "$module_venv")
  step "Python $version: virtual environment in $venv"
  make_venv "$version" "$venv" tests/requirements.txt
  step "Python $version: setuptools build (pip install .)"
  "$venv/bin/python" -m pip install -q --force-reinstall --no-deps .
  # The heavy jobs run on the first Python only; the differential tests
  # against stock run on all.
  skipped=()
  if [ "$version" != "$first" ]; then
    skipped=("${heavy[@]}")
    echo "Python $version: test_fuzz_short.py and the sharing invariants' hypothesis search run on Python $first only"
  fi
  JAXLIB_PATCH_EXPECT=site-packages \
    run_suite "setuptools (Python $version)" "$venv" "${skipped[@]}" "$@"
done

first_venv=$(venv_of "$first" "$module_venv")
step "bazel build (Python $first)"
if ! command -v bazel >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq bazel-bootstrap >/dev/null
  else
    echo "bazel is missing: apt-get install -y bazel-bootstrap" >&2; exit 1
  fi
fi
bazel_out=$root/build/bazel_out
PYTHON="$first_venv/bin/python" build/bazel_module.sh "$bazel_out" >/dev/null
PYTHONPATH="$bazel_out" JAXLIB_PATCH_EXPECT="$bazel_out" \
  run_suite "bazel (Python $first)" "$first_venv" "$@"

step "sanitizer build (ASan + UBSan, Python $first)"
PYTHON="$first_venv/bin/python" bash tests/sanitize.sh "$@"

step "custom wheels for Python ${found[*]} (build/build.py)"
# zig and auditwheel build and check the release module (build/README.md).
"$first_venv/bin/python" -m pip install -q -r build/requirements.txt
"$first_venv/bin/python" build/build.py --no-selfcheck --dist "$dist" \
  --python "$(IFS=,; echo "${found[*]}")"

# The module as the wheel ships it (zig's build, not gcc's): the module's
# tests against it, on the first Python.
wheel_module=$root/build/wheel_module
rm -rf "$wheel_module"
"$first_venv/bin/python" - "$(ls -t "$dist"/jaxlib-*+*-cp${first/./}-*.whl | head -n 1)" \
    "$wheel_module" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [name for name in wheel.namelist()
                                   if name.startswith("jaxlib_patch/")])
PY
PYTHONPATH="$wheel_module" JAXLIB_PATCH_EXPECT="$wheel_module" \
  run_suite "wheel's (zig, Python $first)" "$first_venv" "$@"

for version in "${found[@]}"; do
  jax_venv=$(venv_of "$version" "$jax_venv_default")
  step "Python $version: the custom wheels in $jax_venv, then the JAX-level tests"
  install_wheels "$version" "$jax_venv"
  # The generated public-surface test (1,400 cases) runs on the first
  # Python only: the patched jax is the same source on every Python.
  if [ "$version" = "$first" ]; then
    run_jax_suite "$version" "$jax_venv" "$@"
    check_series "$jax_venv"
  else
    run_jax_suite "$version" "$jax_venv" \
      --ignore="$root/tests/jax/public_surface_test.py" "$@"
  fi
  "$jax_venv/bin/python" -I examples/demo.py
done
