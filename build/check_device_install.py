"""check_device.py's install step: the wheels of a folder (split files put
back together), the ones the venv's interpreter installs by their tags, and
a fresh venv with exactly those, where check_device.py then runs its checks.

In place of the custom jaxlib wheel the folder may hold its overlay,
`jaxlib-VERSION.overlay/` (`check_device.py --overlay`): the wheel's
`jaxlib_patch/` and dist-info alone, a few MB, for a machine whose stock
jaxlib of the same version holds the wheel's other files (a TPU machine's);
the install check then compares those files with the wheel's RECORD. Where
the machine's Python has a stock jax, a second venv with the same extra
wheels and no custom one is the stock side of the timings."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import zipfile
import zlib

CHECK_DEVICE = pathlib.Path(__file__).resolve().with_name("check_device.py")
WORK = CHECK_DEVICE.parents[1] / "build" / "_work" / "check-device"

OVERLAY_GLOB = "jaxlib-*+*.overlay"
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


def select_wheels(wheels, supported, overlay=None):
  """The wheels whose tags an interpreter with tags `supported` installs: one
  per distribution, a custom (local-labelled) jax and jaxlib among them (or
  jaxlib's `overlay` in place of its wheel)."""
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
  for name in ("jax",) if overlay else ("jax", "jaxlib"):
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
# The version of the jax an interpreter imports as its environment has it.
JAX_VERSION_PROBE = """
import importlib.metadata as m
try:
  print(m.version("jax"))
except m.PackageNotFoundError:
  print("")
"""
PURELIB_PROBE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _probe(python, code, isolated=True):
  """What `code` prints under `python`: isolated (-I), or with the
  environment's PYTHONPATH as the machine's Python runs (-s, from the root:
  no checkout on the path)."""
  return subprocess.run(
      [python, "-I" if isolated else "-s", "-c", code],
      check=True,
      capture_output=True,
      text=True,
      cwd=os.sep,
  ).stdout


def see_the_makers_packages(maker, python):
  """Let the venv of `python`, made with --system-site-packages by `maker`,
  see `maker`'s packages where `maker` runs in a venv itself (the option
  shows only the base interpreter's; a GPU machine's Python, CUDA wheels and
  all, is often a venv) or finds them through PYTHONPATH (a TPU machine's
  jax). A .pth file adds them after the venv's own, so the given wheels
  still win. Returns the folders added."""
  folders = json.loads(_probe(maker, VENV_SITE_PROBE)) + [
      folder
      for folder in os.environ.get("PYTHONPATH", "").split(os.pathsep)
      if folder
  ]
  if folders:
    purelib = pathlib.Path(_probe(python, PURELIB_PROBE).strip())
    (purelib / "makers_venv.pth").write_text("".join(f"{f}\n" for f in folders))
  return folders


def make_venv(args, venv):
  """A fresh venv at `venv` that sees the maker's packages (unless
  --no-system-site-packages); its python."""
  command = [args.python, "-m", "venv", "--clear"]
  if args.system_site_packages:
    command.append("--system-site-packages")
  subprocess.run(command + [str(venv)], check=True)
  python = str(venv / "bin" / "python")
  if args.system_site_packages:
    for folder in see_the_makers_packages(args.python, python):
      print(f"  {venv.name} also sees {folder}")
  return python


def install_wheels(python, wheels):
  """Exactly `wheels` into the venv of `python`."""
  # --isolated: no pip configuration or PIP_* variable can bring in an index
  # or another wheel folder. --force-reinstall --no-deps: exactly these
  # wheels, in the venv, whatever the machine's Python already has.
  pip = [python, "-I", "-m", "pip", "--isolated", "--disable-pip-version-check"]
  links = ["--no-index", "--find-links", str(WORK / "wheels")]
  if wheels:
    subprocess.run(
        pip
        + ["install", "--quiet", *links, "--no-deps", "--force-reinstall"]
        + [str(path) for path in wheels],
        check=True,
    )


def make_overlay(wheel, dest):
  """From the custom jaxlib `wheel`, the folder `dest`/jaxlib-VERSION.overlay
  with the wheel's files that stock jaxlib lacks (its module and dist-info);
  returns it."""
  name, version, _ = wheel_tags(pathlib.Path(wheel))
  if name != "jaxlib" or "+" not in version:
    raise CheckError(f"{pathlib.Path(wheel).name}: not a custom jaxlib wheel")
  overlay = pathlib.Path(dest) / f"jaxlib-{version}.overlay"
  if overlay.exists():
    shutil.rmtree(overlay)
  with zipfile.ZipFile(wheel) as archive:
    own = [
        member
        for member in archive.namelist()
        if member.split("/")[0]
        in ("jaxlib_patch", f"jaxlib-{version}.dist-info")
    ]
    archive.extractall(overlay, own)
  return overlay


def lay_overlay(overlay, python):
  """The custom jaxlib's own files (its module and dist-info) into the venv
  of `python`, over the stock jaxlib that the venv sees."""
  purelib = pathlib.Path(_probe(python, PURELIB_PROBE).strip())
  for item in overlay.iterdir():
    shutil.copytree(item, purelib / item.name, dirs_exist_ok=True)
  print(f"  laid {overlay.name} over the machine's jaxlib")


def install(args):
  """Install the wheels into a fresh venv, run the checks there; the checks'
  exit status."""
  source = pathlib.Path(args.wheels).resolve()
  print(f"check_device: wheels from {source}")
  if os.sep in args.python:  # The probes run it from another folder.
    args.python = os.path.abspath(args.python)
  wheels = gather_wheels(source, WORK / "wheels")
  overlays = sorted(source.glob(OVERLAY_GLOB))
  if len(overlays) > 1:
    raise CheckError(f"more than one jaxlib overlay: {overlays}")
  overlay = overlays[0] if overlays else None
  venv = pathlib.Path(args.venv).resolve()
  python = make_venv(args, venv)
  chosen = select_wheels(
      wheels, json.loads(_probe(python, TAGS_PROBE)), overlay
  )
  for _, path in chosen.values():
    print(f"  installing {path.name}")
  install_wheels(python, [path for _, path in chosen.values()])
  command = [python, "-I", str(CHECK_DEVICE), "--no-install"]
  if overlay and "jaxlib" not in chosen:
    lay_overlay(overlay, python)
    version = overlay.name[len("jaxlib-") : -len(".overlay")]
    chosen["jaxlib"] = (version, overlay)
  stock = _probe(args.python, JAX_VERSION_PROBE, isolated=False).strip()
  if stock and "+" not in stock:
    extras = [p for n, (_, p) in chosen.items() if n not in ("jax", "jaxlib")]
    stock_venv = venv.with_name(venv.name + "-stock")
    print(f"  the machine's jax {stock} is the stock side, in {stock_venv}")
    stock_python = make_venv(args, stock_venv)
    install_wheels(stock_python, extras)
    command += ["--stock-python", stock_python]
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
