#!/usr/bin/env bash
# Do the stock accelerator plugins install and import beside the custom wheels,
# and does jax fall back to CPU as stock jax does when no accelerator is here?
#
#     python build/build.py && bash build/check_plugins.sh [DIST]   (default dist/)
#
# Two fresh virtual environments under build/_work/: one with the custom jax
# and jaxlib from DIST, one with stock jax and jaxlib; each also gets
# jax-cuda12-plugin and jax-cuda12-pjrt (same version) and the libtpu that
# jax's `tpu` extra pins, with --no-deps, so without NVIDIA's runtime wheels.
# In each, every plugin module must import and jax.devices() must give CPU
# devices; the warnings jax logs on the way must be the same in both.
# Not part of CI: the plugin wheels are about 400 MB (cached in
# build/_work/downloads/plugins/).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}
dist=$(cd "${1:-dist}" && pwd)
work=$root/build/_work
downloads=$work/downloads/plugins
tag=$("$python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')

jax_wheel=$(ls -t "$dist"/jax-*+*-py3-none-any.whl | head -n 1)
jaxlib_wheel=$(ls -t "$dist"/jaxlib-*+*-"$tag"-*.whl | head -n 1)
version=$(basename "$jax_wheel" | cut -d- -f2 | cut -d+ -f1)
# build.py's reading of jax's METADATA, the one that --tpu downloads by.
libtpu=$("$python" -c 'import pathlib, sys; sys.path.insert(0, "build"); import wheel_files
print(wheel_files.libtpu_requirement(pathlib.Path(sys.argv[1])))' "$jax_wheel")
plugins=("jax-cuda12-plugin==$version" "jax-cuda12-pjrt==$version" "$libtpu")

mkdir -p "$downloads"
"$python" -m pip download -q --no-deps --only-binary=:all: --dest "$downloads" \
  "${plugins[@]}"

# The probe: import every plugin module, list the devices, print the log
# lines jax wrote (the venv's path, numbers and addresses blanked) as JSON.
probe='
import importlib, json, logging, re, sys, io
stream = io.StringIO()
logging.basicConfig(stream=stream, level=logging.WARNING)
modules = ["jax_plugins.xla_cuda12", "jax_cuda12_plugin", "libtpu"]
imported = {}
for name in modules:
    try:
        importlib.import_module(name)
        imported[name] = "ok"
    except Exception as e:
        imported[name] = f"{type(e).__name__}: {e}"
import jax
devices = [d.platform for d in jax.devices()]
text = stream.getvalue().replace(sys.prefix, "<venv>")
lines = [re.sub(r"0x[0-9a-f]+|\d+", "N", l) for l in text.splitlines()]
print(json.dumps({"imported": imported, "devices": devices, "log": lines,
                  "jax": jax.__version__, "backend": jax.default_backend()}))
'

check() {  # check NAME PIP_ARGS...: a fresh venv with PIP_ARGS plus the plugins
  local name=$1; shift
  local venv=$work/plugins-venv-$name
  "$python" -m venv --clear "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$@"
  "$venv/bin/python" -m pip install -q --no-deps \
    "$downloads"/jax_cuda12_plugin-*"$tag"*.whl "$downloads"/jax_cuda12_pjrt-*.whl \
    "$downloads"/libtpu-*.whl
  (cd "$work" && "$venv/bin/python" -I -c "$probe")
}

echo "=== plugin wheels ($downloads)"
du -h "$downloads"/*.whl
custom=$(check custom "$jax_wheel" "$jaxlib_wheel")
# Not --find-links "$dist": `jaxlib==V` also matches our V+label.
stock=$(check stock "jax==$version" "jaxlib==$version")
echo "=== custom: $custom"
echo "=== stock:  $stock"
"$python" - "$custom" "$stock" <<'PY'
import json, sys
custom, stock = (json.loads(a) for a in sys.argv[1:])
failures = [f"{name}: {how}" for name, how in custom["imported"].items() if how != "ok"]
if set(custom["devices"]) != {"cpu"}:
    failures.append(f"devices {custom['devices']}, not CPU")
if custom["log"] != stock["log"]:
    failures.append(f"log differs from stock's:\n  {custom['log']}\n  {stock['log']}")
if custom["imported"] != stock["imported"]:
    failures.append(f"imports differ from stock's: {stock['imported']}")
print("check_plugins: " + ("FAILED\n" + "\n".join(failures) if failures else
      "every plugin imports; CPU fallback with stock's messages"))
sys.exit(1 if failures else 0)
PY
