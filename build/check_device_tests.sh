#!/usr/bin/env bash
# tests/jax in the two venvs that build/check_device.sh made (the custom
# wheels, and stock's side), on the device jax finds:
#
#     bash build/check_device_tests.sh WHEELS [K/N] [pytest options]
#
# WHEELS is the folder the check installed from (install_pins_test.py looks
# for the custom wheels there). K/N runs every Nth test file from the Kth, so
# that a run can be split where a command may take only minutes (one TPU v5e
# chip: about 12 minutes in all). The accelerator check's own test and the
# generated public-surface test (CPU references by the thousand) are left out.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venvs="$root/build/_work/check-device"
wheels="$(cd "$1" && pwd)"
shift
part="1/1"
if [[ "${1:-}" =~ ^[0-9]+/[0-9]+$ ]]; then
  part="$1"
  shift
fi
files=$(ls "$root"/tests/jax/*_test.py \
  | grep -v "/public_surface_test.py$\|/check_device_test.py$" \
  | awk -v part="$part" 'BEGIN { split(part, p, "/") } (NR - 1) % p[2] == p[1] - 1')
cd "$root"
# -E -s and no PYTHONPATH: the venvs see the machine's packages through
# their .pth files, as the check ran.
exec env -u PYTHONPATH \
  JAXLIB_PATCH_STOCK_PYTHON="$venvs/venv-stock/bin/python" \
  JAXLIB_PATCH_DIST="$wheels" \
  "$venvs/venv/bin/python" -E -s -m pytest $files -p no:cacheprovider "$@"
