"""check_device.py's checks against stock JAX: children under each side's
interpreter (this one, and --stock-python's where given), started before
check_device.py's own process opens the device, since a TPU admits one
process at a time."""

import os
import pathlib
import statistics
import sys

from check_device_checks import Conditions, on_platform


def side_child(python, script, what, *options):
  """The JSON result of `script` run as a child under `python`, isolated
  (-E -s) as a venv runs; AssertionError with the tail of its output if it
  fails."""
  import children

  command = children.child_command(
      python, script, *options, python_flags=("-E", "-s")
  )
  try:
    # A GPU check's process may hold jax's preallocated share of memory.
    return children.run_json_child(
        command,
        what,
        timeout=900,
        env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
    )
  except children.ChildFailed as e:
    tail = e.output.splitlines()[-5:]
    raise AssertionError(f"{what} exited {e.returncode}: " + " | ".join(tail))


def sides(args):
  """("ours", this interpreter) and, where --stock-python names one,
  ("stock", it)."""
  yield "ours", sys.executable
  if args.stock_python:
    yield "stock", args.stock_python


def check_jit_dispatch(args, platform, timings):
  """bench_jit.py's child on each side, on this run's platform (--platforms
  '': JAX_PLATFORMS, if set, is inherited), before this process opens the
  device."""
  import children
  import jit_cases

  script = pathlib.Path(children.__file__).with_name("bench_jit.py")
  results = {}
  for side, python in sides(args):
    results[side] = side_child(
        python,
        script,
        f"bench_jit.py's {side} child",
        *("--child", "patched" if side == "ours" else "stock"),
        *("--platforms", "", "--rounds", args.jit_rounds, "--compile-reps", 1),
    )
  result = results["ours"]
  c = Conditions()
  backend = result["info"]["backend"]
  c(
      on_platform(backend, platform),
      f"bench_jit ran on {backend}, not {platform}",
  )
  # Only the unshared case (iv) has its layers apart in the output.
  wrong = [
      name
      for name, ok in result["checks"].items()
      if ok != (name != "iv out shares layers")
  ]
  c(not wrong, f"bench_jit's checks failed: {wrong}")
  cells = {}
  for case in jit_cases.COMMON_CASES + jit_cases.EXTRA_CASES:
    for kind in jit_cases.KINDS:
      row = {}
      for side, found in results.items():
        times = found["times_us"].get(f"{case}/{kind}")
        if times:
          row[f"{side} us"] = statistics.median(times)
      if len(row) == 2:
        row["ratio"] = row["ours us"] / row["stock us"]
      if row:
        cells[f"{jit_cases.CASE_LABELS[case]} ({kind})"] = row
  timings[f"jit dispatch on {backend}"] = cells
  params = {
      name: stats["hlo_params"] for name, stats in result["compile"].items()
  }
  return c.done(
      f"{len(result['checks'])} sanity checks held on {backend}; HLO "
      f"parameters {params}"
      + ("; stock timed beside" if "stock" in results else "")
  )


def check_sides(args, timings):
  """check_device_side.py on each side: device memory of one table that 8
  references share, and a tied-LM training step."""
  script = pathlib.Path(__file__).with_name("check_device_side.py")
  results = {
      side: side_child(
          python,
          script,
          f"check_device_side.py ({side})",
          *("--table-mib", args.big_mib),
          *("--calls", args.calls, "--batches", args.batches),
      )
      for side, python in sides(args)
  }
  c = Conditions()
  ours = results["ours"]["table"]
  c(ours["buffers"] == 1, f"{ours['buffers']} device buffers, not 1")
  c(
      ours["bytes"] < 2 * ours["table_bytes"],
      f"device memory grew by {ours['bytes']} bytes for a table of "
      f"{ours['table_bytes']}",
  )
  memory = timings.setdefault(
      f"{args.big_mib:g} MiB table, 8 references: device_put", {}
  )
  steps = timings.setdefault("tied LM step (tiny)", {})
  for side, found in results.items():
    memory[side] = {
        "MiB": found["table"]["bytes"] / 2**20,
        "buffers": found["table"]["buffers"],
    }
    if found["step_s"] is not None:
      steps[f"{side}, {found['step_how']}"] = {"us": found["step_s"] * 1e6}
  return c.done(
      f"ours: {ours['buffers']} buffer, {ours['bytes'] / 2**20:.0f} MiB"
      + "".join(
          f"; {side} (jax {found['jax']}): {found['table']['buffers']} "
          f"buffers, {found['table']['bytes'] / 2**20:.0f} MiB"
          for side, found in results.items()
          if side != "ours"
      )
  )
