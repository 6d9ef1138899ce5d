#!/usr/bin/env bash
# The README's first command: builds the custom jaxlib and jax wheels into
# dist/, installs them into the virtual environment .venv, and runs the demo
# (examples/demo.py). Extra arguments go to build/build.py (e.g. --cuda 12).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r build/requirements.txt   # zig, auditwheel
.venv/bin/python build/build.py --no-selfcheck "$@"
# The wheels just built: the newest jax and jaxlib (for this Python) with a
# local version label.
tag=$(.venv/bin/python -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
jax_wheel=$(ls -t dist/jax-*+*-py3-none-any.whl | head -n 1)
jaxlib_wheel=$(ls -t dist/jaxlib-*+*-"$tag"-*.whl | head -n 1)
.venv/bin/python -m pip install -q --force-reinstall "$jax_wheel" "$jaxlib_wheel"
.venv/bin/python -I examples/demo.py
