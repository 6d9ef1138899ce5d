#!/usr/bin/env bash
# The custom wheels on a GPU or TPU (build/check_device.py has the details):
#
#     bash build/check_device.sh WHEELS [options]     # fresh venv, offline install
#     JAX_PLATFORMS=cpu bash build/check_device.sh --no-install [options]
#
# $PYTHON (default python3) makes the venv; the last line says how many
# checks passed and failed, and the exit status is 1 if one failed.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/check_device.py" "$@"
