"""Bar charts of the benchmark ratios, for docs/.

Usage::

    python bench/plots.py [--pytree bench/results/pytree.json]
                          [--jit bench/results/jit.json] [--out docs]

Reads the JSON written by ``bench/bench_pytree.py --json`` and by
``bench/bench_jit.py --json`` and writes three PNG charts:

- ``pytree_ratios.png``: per case and operation, the time of
  ``jaxlib_patch.pytree`` (without and with the class opted in) and of optree
  divided by stock ``jaxlib._jax.pytree``'s, with each target as a short red
  line over the bar it applies to;
- ``jit_ratios.png``: per case and function, patched ``jax.jit``'s time per
  cached call divided by stock's (median over run pairs, with the range over
  the pairs as an error bar), and the targets;
- ``jit_peers.png``: microseconds per cached call on the shared model (v):
  stock ``jax.jit`` (which expands it), patched ``jax.jit``, ``nnx.jit``, the
  equinox share-through wrapper and plain ``eqx.filter_jit``.

A file that is missing is skipped with a message (so the pytree chart can be
made on a machine that has no patched venv for the jit benchmark). Needs
matplotlib (``pip install matplotlib``); uses the Agg backend.
"""

import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

OPS = ("flatten", "unflatten", "flatten_up_to")
PYTREE_SERIES = (  # library, legend, colour
    ("ours", "ours, not opted in", "#4C72B0"),
    ("opt-in", "ours, Layer opted in", "#55A868"),
    ("optree", "optree (information only)", "#BBBBBB"),
)
JIT_CASES = ("i", "ii", "iii", "iv", "v")
JIT_LABELS = {
    "i": "(i) one small\narray",
    "ii": "(ii) dict of\n100 arrays",
    "iii": "(iii) 100 layers,\nno opt-in",
    "iv": "(iv) 100 layers,\nopted in, unshared",
    "v": "(v) 1 opted-in layer\nshared x100",
}
JIT_KINDS = (("tree", "#4C72B0"), ("scalar", "#DD8452"))
PEERS = (  # result key prefix, label, colour
    ("stock", "stock jax.jit\n(300 leaves)", "#999999"),
    ("patched", "patched jax.jit\n(3 leaves)", "#55A868"),
    ("nnx", "nnx.jit", "#8172B3"),
    ("eqx_share", "eqx share-through\nwrapper", "#C44E52"),
    ("eqx_plain", "plain\neqx.filter_jit", "#CCB974"),
)
TARGET_COLOUR = "#D62728"


def _load(path):
  if not os.path.exists(path):
    print(f"skipped: {path} does not exist", file=sys.stderr)
    return None
  with open(path) as f:
    return json.load(f)


def _ratio_label(value):
  return f"{value:.2f}" if value < 10 else f"{value:.0f}"


def _machine_note(data):
  machine = dict(data.get("machine") or {})
  if not machine:
    return ""
  python = machine.get("python") or data.get("info", {}).get("stock", {}).get(
      "python"
  )
  note = f"{machine.get('cpu', '?')}, {machine.get('nproc', '?')} CPUs"
  if python:
    note += f", Python {python}"
  date = (machine.get("date") or data.get("date") or "")[:10]
  if date:
    note += f", {date}"
  return note


def _label_bar(ax, x, top, text, limit=None):
  """Writes ``text`` above a bar whose top is at ``top``, and above the
  bar's target line if that is just above the bar (log scale)."""
  y = top
  if limit is not None and top <= limit < top * 1.7:
    y = limit
  ax.annotate(
      text,
      (x, y),
      xytext=(0, 3),
      textcoords="offset points",
      ha="center",
      va="bottom",
      fontsize=7,
      bbox=dict(
          boxstyle="square,pad=0.05",
          facecolor="white",
          edgecolor="none",
          alpha=0.8,
      ),
      zorder=6,
  )


def _log_ticks(ax, ticks):
  ax.set_yticks(ticks)
  ax.set_yticklabels([f"{t:g}" for t in ticks])
  ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _target_segment(ax, x, half_width, limit):
  ax.plot(
      [x - half_width, x + half_width],
      [limit, limit],
      color=TARGET_COLOUR,
      linewidth=2.2,
      solid_capstyle="butt",
      zorder=4,
  )


def plot_pytree(data, out_path):
  """One panel per tree; bars per operation and library; log scale."""
  cells = {
      (c["case"], c["op"], c["library"]): c["median_us"] for c in data["cells"]
  }
  cases = list(dict.fromkeys(c["case"] for c in data["cells"]))
  targets = {
      (t["case"], t["op"], t["library"]): t["limit"]
      for t in data.get("targets", [])
  }

  ncols = 2
  nrows = (len(cases) + ncols - 1) // ncols
  fig, axes = plt.subplots(
      nrows, ncols, figsize=(10, 3.6 * nrows + 1.0), sharey=True, squeeze=False
  )
  axes = axes.ravel()
  for ax in axes[len(cases) :]:
    ax.set_visible(False)
  width = 0.26
  for ax, case in zip(axes, cases):
    for k, (lib, _, colour) in enumerate(PYTREE_SERIES):
      for j, op in enumerate(OPS):
        stock = cells.get((case, op, "stock"))
        mine = cells.get((case, op, lib))
        if not stock or mine is None:
          continue
        value = mine / stock
        x = j + (k - 1) * width
        ax.bar(x, value, width, color=colour, zorder=3)
        limit = targets.get((case, op, lib))
        if limit is not None:
          _target_segment(ax, x, width * 0.6, limit)
        _label_bar(ax, x, value, _ratio_label(value), limit)
    ax.axhline(1.0, color="black", linewidth=0.8, zorder=2)
    ax.set_yscale("log")
    ax.set_xticks(range(len(OPS)))
    ax.set_xticklabels(["flatten", "unflatten", "flatten\n_up_to"], fontsize=8)
    ax.set_title(case, fontsize=9)
    ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
  for ax in axes[::ncols]:
    ax.set_ylabel("time / stock time\n(log scale; < 1 is faster)")
  axes[0].set_ylim(0.03, 8)
  _log_ticks(axes[0], [0.05, 0.1, 0.2, 0.5, 1, 2, 5])
  handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in PYTREE_SERIES]
  labels = [label for _, label, _ in PYTREE_SERIES]
  handles += [
      Line2D([], [], color="black", linewidth=0.8),
      Line2D([], [], color=TARGET_COLOUR, linewidth=2.2),
  ]
  labels += ["stock jaxlib = 1", "target (at most)"]
  fig.legend(
      handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False
  )
  fig.suptitle(
      "jaxlib_patch.pytree vs stock jaxlib._jax.pytree "
      f"{data['machine'].get('jaxlib', '?')}: "
      "median time per call, ratio to stock\n" + _machine_note(data),
      fontsize=10,
  )
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fig.savefig(out_path, dpi=120)
  plt.close(fig)
  print(f"wrote {out_path}")


_JIT_TARGET = re.compile(r"^\((\w+)\) (\w+) <= ([0-9.]+)x stock")


def _jit_targets(data):
  """{(case, kind): limit} from the targets' text, e.g. '(i) tree <= 1.10x stock'."""
  found = {}
  for t in data.get("targets", []):
    m = _JIT_TARGET.match(t.get("target", ""))
    if m:
      found[m.group(1), m.group(2)] = float(m.group(3))
  return found


def plot_jit(data, out_path):
  """Patched / stock time per cached jax.jit call, per case and function."""
  res = data["results"]
  targets = _jit_targets(data)
  fig, ax = plt.subplots(figsize=(9, 5.4))
  width = 0.36
  for k, (kind, colour) in enumerate(JIT_KINDS):
    for j, case in enumerate(JIT_CASES):
      r = res.get(f"{case}/{kind}")
      if not r:
        continue
      x = j + (k - 0.5) * width
      value = r["ratio"]
      runs = r.get("run_ratios") or [value]
      err = [[value - min(runs)], [max(runs) - value]]
      ax.bar(
          x,
          value,
          width,
          color=colour,
          zorder=3,
          label=kind if j == 0 else None,
      )
      ax.errorbar(
          x, value, yerr=err, color="black", capsize=3, linewidth=0.8, zorder=5
      )
      limit = targets.get((case, kind))
      if limit is not None:
        _target_segment(ax, x, width * 0.6, limit)
      _label_bar(ax, x, max(runs), _ratio_label(value) + "x", limit)
  ax.axhline(1.0, color="black", linewidth=0.8, zorder=2)
  ax.set_yscale("log")
  ax.set_ylim(0.02, 3)
  _log_ticks(ax, [0.02, 0.05, 0.1, 0.2, 0.5, 1, 2])
  ax.set_xticks(range(len(JIT_CASES)))
  ax.set_xticklabels([JIT_LABELS[c] for c in JIT_CASES], fontsize=8)
  ax.set_ylabel("patched / stock time per call\n(log scale; < 1 is faster)")
  ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
  handles, labels = ax.get_legend_handles_labels()
  handles += [
      Line2D([], [], color="black", linewidth=0.8),
      Line2D([], [], color=TARGET_COLOUR, linewidth=2.2),
  ]
  labels = [
      f"fn returns the {'updated tree' if l == 'tree' else 'sum'} ({l})"
      for l in labels
  ]
  labels += ["stock jax.jit = 1", "target (at most)"]
  ax.legend(
      handles,
      labels,
      fontsize=8,
      loc="upper center",
      bbox_to_anchor=(0.5, -0.16),
      ncol=2,
      frameon=False,
  )
  runs = data.get("runs", "?")
  versions = {side: data["info"][side]["jax"] for side in ("patched", "stock")}
  ax.set_title(
      "jax.jit, cache hit: patched jax %s vs stock %s\nmedian over %s run "
      "pairs; error bars: range over the pairs. %s"
      % (versions["patched"], versions["stock"], runs, _machine_note(data)),
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(out_path, dpi=120)
  plt.close(fig)
  print(f"wrote {out_path}")


def plot_jit_peers(data, out_path):
  """Microseconds per cached call on the shared model (v), with peers."""
  res = data["results"]
  fig, ax = plt.subplots(figsize=(9, 4.6))
  width = 0.36
  xs = []
  for j, (key, label, colour) in enumerate(PEERS):
    xs.append(label)
    for k, (kind, _) in enumerate(JIT_KINDS):
      if key in ("stock", "patched"):
        r = res.get(f"v/{kind}", {})
        value = r.get(f"{key}_us")
      else:
        value = res.get(f"{key}/{kind}", {}).get("patched_us")
      if value is None or value != value:
        continue
      x = j + (k - 0.5) * width
      ax.bar(
          x,
          value,
          width,
          color=colour,
          zorder=3,
          hatch="//" if kind == "scalar" else None,
          edgecolor="white" if kind == "scalar" else colour,
      )
      _label_bar(ax, x, value, f"{value:.0f}")
  ax.set_yscale("log")
  ax.set_ylim(5, 5000)
  _log_ticks(ax, [5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000])
  ax.set_xticks(range(len(xs)))
  ax.set_xticklabels(xs, fontsize=8)
  ax.set_ylabel("µs per cached call (log scale)")
  ax.grid(axis="y", which="both", alpha=0.3, zorder=0)
  ax.legend(
      [
          plt.Rectangle((0, 0), 1, 1, color="#777777"),
          plt.Rectangle(
              (0, 0), 1, 1, facecolor="#777777", edgecolor="white", hatch="//"
          ),
      ],
      [
          "fn returns the updated tree (left bar)",
          "fn returns the sum (right bar, hatched)",
      ],
      fontsize=8,
      loc="upper left",
  )
  ax.set_title(
      "One layer (3 arrays) shared 100 times, jitted call on a "
      "cache hit\n" + _machine_note(data),
      fontsize=9,
  )
  fig.tight_layout()
  fig.savefig(out_path, dpi=120)
  plt.close(fig)
  print(f"wrote {out_path}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--pytree",
      default=os.path.join(HERE, "results", "pytree.json"),
      help="bench_pytree.py --json output",
  )
  parser.add_argument(
      "--jit",
      default=os.path.join(HERE, "results", "jit.json"),
      help="bench_jit.py --json output",
  )
  parser.add_argument(
      "--out",
      default=os.path.join(ROOT, "docs"),
      help="folder for the PNG files",
  )
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  wrote = 0
  pytree = _load(args.pytree)
  if pytree is not None:
    plot_pytree(pytree, os.path.join(args.out, "pytree_ratios.png"))
    wrote += 1
  jit = _load(args.jit)
  if jit is not None:
    plot_jit(jit, os.path.join(args.out, "jit_ratios.png"))
    plot_jit_peers(jit, os.path.join(args.out, "jit_peers.png"))
    wrote += 2
  return 0 if wrote else 1


if __name__ == "__main__":
  sys.exit(main())
