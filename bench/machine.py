"""What the benchmarks record of the machine they ran on."""

import platform


def cpu_model():
  """The processor's model name from /proc/cpuinfo, else platform's."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"
