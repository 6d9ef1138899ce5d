"""The benchmarks' tables, made from their results as their --json output
holds them: the benchmark prints them, and bench/doc_tables.py puts them in
the documents. bench_jit.py's two (from "results" and "compile"),
bench_pytree.py's (from "cells") and bench_shared_dag.py's."""

from jit_cases import CASE_LABELS
from md_table import table

JIT_COMPILE_CASES = {
    "iv": "(iv) 100 distinct layers",
    "v": "(v) 1 layer shared x100",
}


def us(x):
  """A time in µs, one decimal; '-' where the cell was not timed (NaN)."""
  return f"{x:.1f}" if x == x else "-"


def jit_dispatch_table(results):
  """Per cell ("case/kind"): stock's and the patched time and their ratio,
  the median over the run pairs and its range; a cell only the patched
  child times, against the patched (v) of its function."""
  rows = []
  for name, r in results.items():
    case, kind = name.split("/")
    if "stock_us" in r:
      low, high = min(r["run_ratios"]), max(r["run_ratios"])
      rows.append(
          (
              CASE_LABELS[case],
              kind,
              us(r["stock_us"]),
              us(r["patched_us"]),
              f"{r['ratio']:.2f}x",
              f"{low:.2f}-{high:.2f}x",
          )
      )
    else:
      p = r["patched_us"]
      rows.append(
          (
              CASE_LABELS[case],
              kind,
              "-",
              us(p),
              f"{r['vs_patched_v']:.1f}x (v)" if p == p else "-",
              "",
          )
      )
  header = (
      "case",
      "fn",
      "stock µs",
      "patched µs",
      "patched/stock",
      "range over runs",
  )
  return table(header, rows)


def jit_compile_table(compile_results):
  """Per interpreter and cell ("interpreter:case/kind"): the lowered
  function's HLO parameters, and the milliseconds of its first call."""
  rows = []
  for name, c in compile_results.items():
    interpreter, cell = name.split(":")
    case, kind = cell.split("/")
    rows.append(
        (
            interpreter,
            JIT_COMPILE_CASES[case],
            kind,
            str(c["hlo_params"]),
            f"{c['lower_ms']:.1f}",
            f"{c['compile_ms']:.1f}",
            f"{c['first_call_ms']:.1f}",
        )
    )
  header = (
      "interpreter",
      "case",
      "fn",
      "HLO params",
      "trace+lower ms",
      "compile ms",
      "first call ms",
  )
  return table(header, rows)


def pytree_table(cases, ops, libraries, medians_us):
  """Per case and op, each library's µs per call, and each one's ratio to
  the first's (stock's); `medians_us` by (case, op, library)."""
  rows = []
  for case in cases:
    for op in ops:
      times = [f"{medians_us[case, op, lib]:.2f}" for lib in libraries]
      stock = medians_us[case, op, libraries[0]]
      ratios = [
          f"{medians_us[case, op, lib] / stock:.2f}x" for lib in libraries[1:]
      ]
      rows.append((case, op, *times, *ratios))
  header = (
      "case",
      "op",
      *(f"{lib} µs" for lib in libraries),
      *(f"{lib}/{libraries[0]}" for lib in libraries[1:]),
  )
  return table(header, rows)


def shared_dag_table(depths, seconds):
  """Per transformation, its time in ms at each depth of the shared DAG."""
  header = ["transformation", *(f"d={d}" for d in depths)]
  rows = [
      [name, *(f"{1e3 * t:.1f} ms" for t in times)]
      for name, times in seconds.items()
  ]
  return table(header, rows)
