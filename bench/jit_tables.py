"""bench_jit.py's two tables, made from its results as its --json output
holds them (under "results" and "compile"): bench_jit.py prints them, and
bench/doc_tables.py puts them in the documents."""

from jit_cases import CASE_LABELS
from md_table import table

COMPILE_CASES = {
    "iv": "(iv) 100 distinct layers",
    "v": "(v) 1 layer shared x100",
}


def us(x):
  """A time in µs, one decimal; '-' where the cell was not timed (NaN)."""
  return f"{x:.1f}" if x == x else "-"


def dispatch_table(results):
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


def compile_table(compile_results):
  """Per interpreter and cell ("interpreter:case/kind"): the lowered
  function's HLO parameters, and the milliseconds of its first call."""
  rows = []
  for name, c in compile_results.items():
    interpreter, cell = name.split(":")
    case, kind = cell.split("/")
    rows.append(
        (
            interpreter,
            COMPILE_CASES[case],
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
