#!/usr/bin/env bash
# Formats the project's own code: the C++ with clang-format (.clang-format),
# the Python with pyink, JAX's formatter (pyproject.toml's [tool.pyink]).
# jax_patch/'s diffs against jax's sources are left as they are; the modules
# the series adds, kept whole in jax_patch/<V>/modules/, are checked as the
# project's Python, and are the series' to change: format them in a checkout
# of the series (build/patch_series.py) and export it, or
# tests/test_series_modules.py finds the copies apart from the series.
# Usage: bash tests/format.sh [--check]   (--check: change nothing, fail if a
# file is not formatted). $PYTHON (default python3) gets the pinned formatters.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
"$python" -m pip install -q -r tests/format-requirements.txt
bin=$(dirname "$("$python" -c 'import sys; print(sys.executable)')")
mapfile -t cpp < <(git ls-files '*.cc' '*.h')
mapfile -t py < <(git ls-files '*.py')
if [ "${1:-}" = --check ]; then
  "$bin/clang-format" --dry-run -Werror "${cpp[@]}"
  "$bin/pyink" --check --quiet "${py[@]}"
  echo "formatting: ${#cpp[@]} C++ and ${#py[@]} Python files as formatted"
else
  "$bin/clang-format" -i "${cpp[@]}"
  "$bin/pyink" --quiet "${py[@]}"
fi
