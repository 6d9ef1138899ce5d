"""The supervisor of a campaign: runs the programs in worker processes
(`--jobs`, interleaved), restarts a worker after the program that crashed or
hung it, gathers what the workers report (see runner.py) and prints, and
writes as JSON, the campaign's summary."""

import collections
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

from jaxlib_patch import pytree as pt


class Worker:
  """A worker subprocess and what it has reported."""

  def __init__(self, supervisor, slot, start):
    self.supervisor = supervisor
    self.slot = slot
    self.start = start
    self.spawn()

  def spawn(self):
    d = self.supervisor
    remaining_e = None
    if d.args.executions is not None:
      remaining_e = max(
          1, (d.args.executions - d.executions_done) // d.args.jobs + 1
      )
    remaining_s = None
    if d.deadline is not None:
      remaining_s = max(0.0, d.deadline - time.monotonic())
    cmd = [
        sys.executable,
        d.script,
        "--worker",
        "--seed",
        str(d.args.seed),
        "--start",
        str(self.start),
        "--stride",
        str(d.args.jobs),
        "--expect-module",
        os.path.realpath(pt.__file__),
    ]
    if d.args.programs is not None:
      cmd += ["--end", str(d.args.start + d.args.programs)]
    if remaining_e is not None:
      cmd += ["--executions", str(remaining_e)]
    if remaining_s is not None:
      cmd += ["--seconds", f"{remaining_s:.3f}"]
    if d.args.skip_known:
      cmd.append("--skip-known")
    self.stderr_path = os.path.join(d.tmpdir, f"worker{self.slot}.err")
    self.stderr = open(self.stderr_path, "wb")
    self.proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=self.stderr, env=os.environ.copy()
    )
    self.buffer = b""
    self.current = None  # Program index being run.
    self.base = None  # Counts at the last checkpoint of this process.
    self.last_counts = None
    self.exec_at_current = 0
    self.last_seen = time.monotonic()
    self.done = False
    self.hung = False

  def feed(self, data):
    self.buffer += data
    *lines, self.buffer = self.buffer.split(b"\n")
    for line in lines:
      self.handle(line.decode("utf-8", "replace"))

  def handle(self, line):
    self.last_seen = time.monotonic()
    tag, _, rest = line.partition(" ")
    if tag == "P":
      index, execs = rest.split()
      self.current = int(index)
      self.exec_at_current = int(execs)
    elif tag == "C":
      self.last_counts = json.loads(rest)
    elif tag == "F":
      self.supervisor.add_finding(json.loads(rest))
    elif tag == "D":
      self.last_counts = json.loads(rest)
      self.done = True


def crash_site(err):
  """Where a worker crashed: the sanitizer's first frame in the module and
  the fuzzer's operation, from the worker's stderr."""
  parts = []
  m = re.search(r"(ERROR: AddressSanitizer: [\w-]+|runtime error: [^\n]*)", err)
  if m:
    parts.append(m.group(1)[:80])
    frame = re.search(
        r"#\d+ 0x[0-9a-f]+ in (jaxlib_patch::[^\n]*?) "
        r"(\S*jaxlib_patch/\S+)",
        err,
    )
    if frame:
      parts.append(f"{frame.group(1)[:60]} {frame.group(2).split('/')[-1]}")
  ops = re.findall(r"line \d+ in (op_\w+)", err)
  if ops:
    parts.append(ops[0])
  elif "Fatal Python error" not in err and not parts:
    parts.append("no stack")
  return " | ".join(parts) or "unknown"


class Supervisor:
  """A campaign: its workers, and what they found."""

  def __init__(self, args, script):
    self.args = args
    self.script = script  # The fuzzer's command line, run with --worker.
    self.deadline = (
        None if args.seconds is None else time.monotonic() + args.seconds
    )
    self.executions_done = 0
    self.programs_done = 0
    self.outcomes = collections.Counter()
    self.warnings = collections.Counter()
    self.by_op = collections.Counter()
    self.nested = 0
    self.misbehaved = 0
    self.findings = []
    self.finding_keys = collections.Counter()
    self.crashes = []
    self.tmpdir = tempfile.mkdtemp(prefix="pytree_fuzz_")

  def add_finding(self, record):
    key = (record["kind"], record["op"], record["exception"][:80])
    self.finding_keys[key] += 1
    if self.finding_keys[key] <= 3:
      self.findings.append(record)
      print(
          f"FINDING ({record['kind']}) seed {record['seed']} program "
          f"{record['program']} op {record['op']}: {record['exception']}",
          flush=True,
      )

  def absorb(self, worker):
    counts = worker.last_counts
    if counts:
      self.executions_done += counts["e"]
      self.programs_done += counts["p"]
      self.outcomes.update(counts["o"])
      self.warnings.update(counts["w"])
      self.by_op.update(counts["b"])
      self.nested += counts["n"]
      self.misbehaved += counts["f"]
    worker.last_counts = None

  def run(self):
    start_time = time.monotonic()
    live = [Worker(self, k, self.args.start + k) for k in range(self.args.jobs)]
    last_print = time.monotonic()
    while live:
      fds = {w.proc.stdout.fileno(): w for w in live}
      ready, _, _ = select.select(list(fds), [], [], 1.0)
      for fd in ready:
        w = fds[fd]
        data = os.read(fd, 1 << 16)
        if data:
          w.feed(data)
          continue
        # End of output: the worker exited.
        rc = w.proc.wait()
        w.stderr.close()
        with open(w.stderr_path, "rb") as f:
          err = f.read().decode("utf-8", "replace")
        if w.done and rc == 0:
          self.absorb(w)
          live.remove(w)
          continue
        sanitizer = "runtime error:" in err or "Sanitizer" in err
        if (
            rc > 0
            and "Fatal Python error" not in err
            and not sanitizer
            and not w.hung
        ):
          # The fuzzer itself failed (not the module): stop.
          sys.stderr.write(err)
          raise SystemExit(f"a worker failed (exit status {rc})")
        # A crash or a hang: record it, count the programs completed before
        # it (the last checkpoint), and restart after the program.
        crash = {
            "seed": self.args.seed,
            "program": w.current,
            "returncode": "hang" if w.hung else rc,
            "site": crash_site(err),
            "stderr": err[-20000:],
        }
        self.crashes.append(crash)
        what = "HANG" if w.hung else "CRASH"
        print(
            f"{what} seed {self.args.seed} program {w.current} (rc {rc}); "
            f"replay: python {sys.argv[0]} --seed {self.args.seed} "
            f"--program {w.current} --verbose",
            flush=True,
        )
        self.absorb(w)
        if w.current is None:
          live.remove(w)
          continue
        w.start = w.current + self.args.jobs
        if (
            self.deadline is not None and time.monotonic() >= self.deadline
        ) or (
            self.args.executions is not None
            and self.executions_done >= self.args.executions
        ):
          live.remove(w)
          continue
        w.spawn()
      for w in live:
        idle = time.monotonic() - w.last_seen
        if not w.hung and idle > self.args.hang_seconds:
          w.hung = True
          w.proc.kill()
      if time.monotonic() - last_print > 10:
        last_print = time.monotonic()
        done = self.executions_done + sum(w.exec_at_current for w in live)
        print(
            f"  ... ~{done} executions, "
            f"{time.monotonic() - start_time:.0f} s",
            flush=True,
        )
    self.elapsed = time.monotonic() - start_time
    shutil.rmtree(self.tmpdir, ignore_errors=True)  # Kept in crash records.
    return self.report()

  def report(self):
    n_findings = sum(self.finding_keys.values())
    summary = {
        "seed": self.args.seed,
        "jobs": self.args.jobs,
        "executions": self.executions_done,
        "programs": self.programs_done,
        "nested_executions": self.nested,
        "callback_misbehaviours": self.misbehaved,
        "seconds": round(self.elapsed, 1),
        "exec_per_s": round(self.executions_done / max(self.elapsed, 1e-9)),
        "outcomes": dict(self.outcomes.most_common()),
        "executions_by_operation": dict(self.by_op.most_common()),
        "findings": n_findings,
        "distinct_findings": [
            {"kind": k[0], "op": k[1], "exception": k[2], "count": c}
            for k, c in self.finding_keys.most_common()
        ],
        "crashes": len(self.crashes),
        "crash_programs": [c["program"] for c in self.crashes],
        "crash_sites": dict(
            collections.Counter(c["site"] for c in self.crashes).most_common()
        ),
        "warnings": dict(self.warnings.most_common(10)),
        "skip_known": self.args.skip_known,
        "module": os.path.realpath(pt.__file__),
        "python": sys.version.split()[0],
    }
    print_summary(summary)
    if self.args.json:
      with open(self.args.json, "w") as f:
        json.dump(
            {
                "summary": summary,
                "findings": self.findings,
                "crashes": self.crashes,
            },
            f,
            indent=1,
        )
    return 1 if (n_findings or self.crashes) else 0


def print_summary(s):
  print(
      f"executions: {s['executions']}  programs: {s['programs']}  "
      f"time: {s['seconds']} s  exec/s: {s['exec_per_s']}  "
      f"seed: {s['seed']}  jobs: {s.get('jobs', 1)}"
  )
  print(
      f"executions from inside callbacks: {s['nested_executions']}  "
      f"callback misbehaviours: {s['callback_misbehaviours']}"
  )
  print("outcomes: " + ", ".join(f"{k}={v}" for k, v in s["outcomes"].items()))
  print(f"findings: {s['findings']}  crashes: {s['crashes']}")
  for f in s["distinct_findings"]:
    print(f"  {f['count']}x {f['kind']} in {f['op']}: {f['exception']}")
  if s["crashes"]:
    print(f"  crashed programs: {s['crash_programs'][:20]}")
    for site, count in s["crash_sites"].items():
      print(f"  {count}x crashed at {site}")
  if s["warnings"]:
    print(
        "warnings: " + "; ".join(f"{v}x {k}" for k, v in s["warnings"].items())
    )
