"""The custom wheels on a GPU or TPU: relative identities, buffers and timings.

    bash build/check_device.sh WHEELS [options]     # fresh venv, offline install
    python build/check_device.py --no-install [options]   # this interpreter

WHEELS is a folder with the custom jax and jaxlib wheels (jaxlib for the
venv's Python, or its overlay where the machine has stock jaxlib: see
check_device_install.py and --overlay) and, for a GPU, the stock jax-cuda13-plugin and
jax-cuda13-pjrt wheels of the same version (or the CUDA 12 ones). A wheel
split into NAME.part-000, NAME.part-001, ... is put back together first
(under build/_work/check-device/wheels/). The wheels that fit the venv's Python
are installed with ``pip install --no-index --no-deps --force-reinstall``
into a fresh venv made with ``--system-site-packages`` (so that the NVIDIA
runtime wheels, numpy and the rest come from the machine's Python, and from
its venv through a .pth file where that Python runs in one, while the given
wheels override any jax already there); then the checks run in that venv.
Extra wheels in WHEELS (equinox, optax and what they need, for the timing)
are installed the same way; one wheel per distribution.

Checks, each passed, failed or skipped:

- install: jax and jaxlib are the custom distributions, imported from where
  those distributions are (or, for a jaxlib overlay, the machine's files
  equal to those its RECORD lists), and with --expect-dist (the install
  step passes one per wheel) every given wheel is what is installed;
- jit dispatch: bench/bench_jit.py's patched child on this platform, its
  sanity checks held; its cases timed, beside stock's child where
  --stock-python names one;
- table and tied step: check_device_side.py on each side, device memory of
  one table that 8 references share and a tied-LM step;
- device: jax's backend and devices are the expected platform (what
  --platform names: by default any accelerator) and no jax module comes
  from outside the venv (but an overlaid jaxlib's);
- jit, grad, vmap, scan: a Parent whose left and right are one opted-in
  Child keeps ``left is right`` inside the traced function and on the
  outputs, outputs are new objects, one leaf, one gradient (the sum over
  both uses);
- buffers: ``jax.device_put`` of 100 references to one opted-in Param over a
  large host array makes exactly one new device buffer;
- donation: a jitted call that donates a tree holding one Param twice
  deletes the input buffer and works;
- tied LM: one step of the Equinox model of tests/jax/equinox_tied_lm.py,
  tied by identity (``eqx.Module`` opted in), against the same model tied
  with ``eqx.nn.Shared``: same loss, one table gradient equal to Shared's,
  the tie kept through the step; both timed with bench/bench_peers.py's
  code, in this process (Shared first, before the opt-in, which cannot be
  undone); skipped, saying so, where Equinox or optax is missing.

The checks that start children come first: a TPU admits one process at a
time, and this one opens the device at the device check.

The last line is ``check_device: N passed, M failed, K skipped (device: ...)``;
the exit status is 1 if a check failed. Timings are printed, and written with
the checks to --json, never checked.
"""

import argparse
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The venv's run is `python -I check_device.py`, which leaves this script's
# folder off sys.path: its two halves are imported from there.
sys.path.insert(0, str(ROOT / "build"))

# pylint: disable=wrong-import-position
from check_device_checks import (
    LM_PRESETS,
    Skip,
    check_buffers,
    check_device,
    check_donation,
    check_grad,
    check_install,
    check_jit,
    check_scan,
    check_tied_lm,
    check_vmap,
    register_nodes,
)
from check_device_against_stock import check_jit_dispatch, check_sides
from check_device_install import WORK, CheckError, install, make_overlay


def run_checks(args):
  sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "jax")]
  results, timings = [], {}

  def run(name, check, *check_args):
    start = time.perf_counter()
    try:
      status, detail = "passed", check(*check_args)
    except Skip as e:
      status, detail = "skipped", str(e)
    except Exception as e:  # any failure is the check's, reported, not fatal
      status, detail = "failed", f"{type(e).__name__}: {e}"
      if not isinstance(e, AssertionError):
        traceback.print_exc()
    seconds = time.perf_counter() - start
    results.append(
        {"check": name, "status": status, "detail": detail, "s": seconds}
    )
    print(f"[{status}] {name} ({seconds:.1f} s): {detail}", flush=True)
    return status == "passed"

  if not run("install", check_install, args.expect_dist):
    return finish(args, results, timings, "jax not usable")
  import jax

  # The children first: a TPU admits one process at a time, and this one
  # opens the device at its first jax.devices() (the device check).
  run(
      "jit dispatch (bench_jit)",
      check_jit_dispatch,
      args,
      args.platform,
      timings,
  )
  run("table and tied step against stock", check_sides, args, timings)
  register_nodes(jax)
  run("device", check_device, jax, args.platform, bool(args.expect_dist))
  run("jit", check_jit, jax)
  run("grad", check_grad, jax)
  run("vmap", check_vmap, jax)
  run("scan", check_scan, jax)
  run("buffers: device_put", check_buffers, jax, args.big_mib)
  run("buffers: donation", check_donation, jax, args.big_mib)
  # Last: it opts eqx.Module in, for the rest of the process.
  run("tied LM (equinox)", check_tied_lm, jax, args, timings)
  device = jax.devices()[0]
  return finish(
      args,
      results,
      timings,
      f"{device.device_kind}, {jax.default_backend()}; jax "
      f"{importlib.metadata.version('jax')}",
  )


def finish(args, results, timings, about):
  for name, rows in timings.items():
    print(f"timing: {name}")
    for label, values in rows.items():
      shown = ", ".join(
          f"{key} {value:.3f}" if key == "ratio" else f"{key} {value:.1f}"
          for key, value in values.items()
      )
      print(f"  {label}: {shown}")
  counts = {
      status: sum(r["status"] == status for r in results)
      for status in ("passed", "failed", "skipped")
  }
  summary = (
      f"check_device: {counts['passed']} passed, {counts['failed']} failed, "
      f"{counts['skipped']} skipped (device: {about})"
  )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
          {
              "summary": summary,
              "checks": results,
              "timings": timings,
              "python": sys.version.split()[0],
              "argv": sys.argv,
          },
          f,
          indent=1,
      )
  print(summary)
  return 1 if counts["failed"] else 0


def default_platform():
  """The platform JAX_PLATFORMS names first, else "accelerator": whatever
  jax picks, but not the CPU."""
  named = os.environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
  return {"": "accelerator", "cuda": "gpu", "rocm": "gpu"}.get(named, named)


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
      "wheels", nargs="?", help="folder of wheels (not with --no-install)"
  )
  parser.add_argument(
      "--no-install",
      action="store_true",
      help="no venv and no install: check this interpreter's jax",
  )
  parser.add_argument(
      "--python",
      default=sys.executable,
      help="the interpreter the venv is made from (default: this one)",
  )
  parser.add_argument(
      "--venv",
      default=str(WORK / "venv"),
      help="the venv to make, emptied first (default %(default)s)",
  )
  parser.add_argument(
      "--no-system-site-packages",
      dest="system_site_packages",
      action="store_false",
      help="a venv without the interpreter's packages (then WHEELS must hold "
      "every dependency)",
  )
  parser.add_argument(
      "--platform",
      default=default_platform(),
      help="the platform jax must use (gpu, tpu, cpu), or accelerator: any "
      "but the CPU; the first JAX_PLATFORMS names, else accelerator "
      "(default here: %(default)s)",
  )
  parser.add_argument(
      "--lm",
      action="append",
      metavar="SIZE",
      help="tied-LM size to time, repeatable: tiny (the test's), gpu "
      f"{LM_PRESETS['gpu']}, or V,D,S,B (vocabulary, width, sequence, batch; "
      "default tiny)",
  )
  parser.add_argument(
      "--calls", type=int, default=50, help="calls per timed batch"
  )
  parser.add_argument(
      "--batches", type=int, default=20, help="timed batches per model"
  )
  parser.add_argument(
      "--jit-rounds", type=int, default=20, help="bench_jit.py --rounds"
  )
  parser.add_argument(
      "--big-mib",
      type=float,
      default=256,
      help="MiB of the shared array of the buffer checks (default %(default)s)",
  )
  parser.add_argument(
      "--stock-python",
      help="an interpreter with stock jax, timed beside (the install step "
      "names its own where the machine's jax is stock)",
  )
  parser.add_argument("--json", help="write the checks and timings here")
  parser.add_argument(
      "--expect-dist",
      action="append",
      default=[],
      metavar="NAME==VERSION",
      help="a distribution that must be installed at that version "
      "(the install step passes one per wheel)",
  )
  parser.add_argument(
      "--overlay",
      nargs=2,
      metavar=("JAXLIB_WHEEL", "DEST"),
      help="write the custom jaxlib's overlay (its own files, a few MB) into "
      "DEST, to bring to a machine with stock jaxlib in place of the wheel",
  )
  args = parser.parse_args(argv)
  if args.overlay:
    print(make_overlay(*args.overlay))
    return 0
  args.lm = args.lm or ["tiny"]
  for size in args.lm:
    if size not in LM_PRESETS and not re.fullmatch(r"\d+(,\d+){3}", size):
      parser.error(f"--lm {size}: expected tiny, gpu or V,D,S,B")
  if args.no_install:
    if args.wheels:
      parser.error("--no-install takes no wheel folder")
    return run_checks(args)
  if not args.wheels:
    parser.error("a wheel folder, or --no-install")
  try:
    return install(args)
  except (CheckError, subprocess.CalledProcessError) as e:
    print(f"check_device: install failed: {e}")
    return 1


if __name__ == "__main__":
  sys.exit(main())
