"""check_gpu.py's install step: the wheels of a folder (split files put
back together), the ones the venv's interpreter installs by their tags, and
a fresh venv with exactly those, where check_gpu.py then runs its checks."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import zipfile
import zlib

CHECK_GPU = pathlib.Path(__file__).resolve().with_name("check_gpu.py")
WORK = CHECK_GPU.parents[1] / "build" / "_work" / "check-gpu"

PART_RE = re.compile(r"(?P<name>.+)\.part-(?P<index>\d+)")
WHEEL_RE = re.compile(
    r"(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?"
    r"-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl"
)


class CheckError(Exception):
  """The install step cannot go on; the message says why."""


def gather_wheels(source, dest):
  """The wheels of folder `source`, whole, in a fresh folder `dest`; returns
  their paths. NAME.part-000, NAME.part-001, ... are concatenated into NAME
  (numbered from 0 without a gap) and NAME must then read as a whole zip;
  a whole NAME beside its parts is used as it is."""
  if dest.resolve() == source.resolve():
    raise CheckError(f"{source} is the folder the wheels are gathered in")
  if dest.exists():
    shutil.rmtree(dest)
  dest.mkdir(parents=True)
  parts, whole = {}, []
  for path in sorted(source.iterdir()):
    match = PART_RE.fullmatch(path.name)
    if match:
      parts.setdefault(match["name"], []).append((int(match["index"]), path))
    elif path.name.endswith(".whl"):
      whole.append(path)
  wheels = []
  for path in whole:
    target = dest / path.name
    try:
      os.link(path, target)
    except OSError:  # another file system, or no hard links
      shutil.copy2(path, target)
    wheels.append(target)
  for name, pieces in sorted(parts.items()):
    if name in {path.name for path in whole}:
      print(f"  {name}: whole file found, its parts are not used")
      continue
    pieces.sort()
    numbers = [index for index, _ in pieces]
    if numbers != list(range(len(pieces))):
      raise CheckError(
          f"{name}: parts {numbers} in {source}, expected 0 to "
          f"{len(pieces) - 1} without a gap"
      )
    target = dest / name
    with open(target, "wb") as out:
      for _, path in pieces:
        with open(path, "rb") as piece:
          shutil.copyfileobj(piece, out, 1 << 22)
    if name.endswith(".whl"):
      try:
        with zipfile.ZipFile(target) as wheel:
          bad = wheel.testzip()
      except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
        bad = str(e)
      if bad:
        raise CheckError(f"{name}, from {len(pieces)} parts, is corrupt: {bad}")
      wheels.append(target)
    print(f"  {name}: put together from {len(pieces)} parts")
  return wheels


def wheel_tags(path):
  """(distribution name normalized, version, {"py-abi-platform", ...})."""
  match = WHEEL_RE.fullmatch(path.name)
  if not match:
    raise CheckError(f"{path.name} is not a wheel's file name")
  name = re.sub(r"[-_.]+", "_", match["name"]).lower()
  tags = {
      f"{python}-{abi}-{platform}"
      for python in match["python"].split(".")
      for abi in match["abi"].split(".")
      for platform in match["platform"].split(".")
  }
  return name, match["version"], tags


def select_wheels(wheels, supported):
  """The wheels whose tags an interpreter with tags `supported` installs: one
  per distribution, a custom (local-labelled) jax and jaxlib among them."""
  chosen = {}
  for path in wheels:
    name, version, tags = wheel_tags(path)
    if tags & set(supported):
      chosen.setdefault(name, []).append((version, path))
  twice = {name: found for name, found in chosen.items() if len(found) > 1}
  if twice:
    raise CheckError(
        "more than one wheel per distribution for this Python: "
        + "; ".join(
            f"{name}: " + ", ".join(path.name for _, path in found)
            for name, found in sorted(twice.items())
        )
    )
  for name in ("jax", "jaxlib"):
    if name not in chosen:
      raise CheckError(f"no {name} wheel for this Python among the wheels")
    version = chosen[name][0][0]
    if "+" not in version:
      raise CheckError(f"{name} {version}: not a custom build (no +label)")
  return {name: found[0] for name, found in sorted(chosen.items())}


TAGS_PROBE = """
import json
try:
  from packaging import tags
except ImportError:
  from pip._vendor.packaging import tags
print(json.dumps([str(tag) for tag in tags.sys_tags()]))
"""
# An interpreter's own site-packages when it runs in a venv, else none.
VENV_SITE_PROBE = """
import json, site, sys
print(json.dumps(site.getsitepackages() if sys.prefix != sys.base_prefix else []))
"""
PURELIB_PROBE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _probe(python, code):
  return subprocess.run(
      [python, "-I", "-c", code], check=True, capture_output=True, text=True
  ).stdout


def see_the_makers_venv(maker, python):
  """Let the venv of `python`, made with --system-site-packages by `maker`,
  see `maker`'s packages where `maker` runs in a venv itself: the option
  shows only the base interpreter's (a GPU machine's Python, CUDA wheels and
  all, is often a venv). A .pth file adds them after the venv's own, so the
  given wheels still win. Returns the folders added."""
  folders = json.loads(_probe(maker, VENV_SITE_PROBE))
  if folders:
    purelib = pathlib.Path(_probe(python, PURELIB_PROBE).strip())
    (purelib / "makers_venv.pth").write_text("".join(f"{f}\n" for f in folders))
  return folders


def install(args):
  """Install the wheels into a fresh venv, run the checks there; the checks'
  exit status."""
  source = pathlib.Path(args.wheels).resolve()
  print(f"check_gpu: wheels from {source}")
  wheels = gather_wheels(source, WORK / "wheels")
  venv = pathlib.Path(args.venv).resolve()
  command = [args.python, "-m", "venv", "--clear"]
  if args.system_site_packages:
    command.append("--system-site-packages")
  subprocess.run(command + [str(venv)], check=True)
  python = str(venv / "bin" / "python")
  if args.system_site_packages:
    for folder in see_the_makers_venv(args.python, python):
      print(f"  also sees {folder}")
  supported = json.loads(_probe(python, TAGS_PROBE))
  chosen = select_wheels(wheels, supported)
  for _, path in chosen.values():
    print(f"  installing {path.name}")
  # --isolated: no pip configuration or PIP_* variable can bring in an index
  # or another wheel folder. --force-reinstall --no-deps: exactly these
  # wheels, in the venv, whatever the machine's Python already has.
  pip = [python, "-I", "-m", "pip", "--isolated", "--disable-pip-version-check"]
  links = ["--no-index", "--find-links", str(WORK / "wheels")]
  subprocess.run(
      pip
      + ["install", "--quiet", *links, "--no-deps", "--force-reinstall"]
      + [str(path) for _, path in chosen.values()],
      check=True,
  )
  command = [
      python,
      "-I",
      str(CHECK_GPU),
      "--no-install",
  ]
  for name, (version, _) in chosen.items():
    command += ["--expect-dist", f"{name}=={version}"]
  command += forwarded(args)
  return subprocess.run(command).returncode


def forwarded(args):
  """The options of the checks, for the run in the venv."""
  options = [
      "--calls",
      str(args.calls),
      "--batches",
      str(args.batches),
      "--jit-rounds",
      str(args.jit_rounds),
      "--big-mib",
      str(args.big_mib),
      "--platform",
      args.platform,
  ]
  for size in args.lm:
    options += ["--lm", size]
  if args.json:
    options += ["--json", str(pathlib.Path(args.json).resolve())]
  return options
