"""build/check_device.py on CPU, so that the accelerator check cannot rot
between runs on a GPU or TPU: its checks in this interpreter
(``--no-install``, tiny sizes, few timing repetitions, stock's side from
JAXLIB_PATCH_STOCK_PYTHON; timings are never asserted on), and its wheel
handling (split files, tags, the jaxlib overlay) without installing anything.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "build" / "check_device.py"

CHECKS = [
    "install",
    "device",
    "jit",
    "grad",
    "vmap",
    "scan",
    "buffers: device_put",
    "buffers: donation",
    "jit dispatch (bench_jit)",
    "table and tied step against stock",
    "tied LM (equinox)",
]
STOCK_PYTHON = os.environ.get("JAXLIB_PATCH_STOCK_PYTHON")


def _module(name):
  """build/NAME.py, loaded without putting build/ on sys.path."""
  spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("check_device") / "result.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one CPU device, as a plain run has
  done = subprocess.run(
      [sys.executable, "-s", str(SCRIPT), "--no-install", "--json", str(out)]
      + ["--calls", "2", "--batches", "2", "--jit-rounds", "1"]
      + ["--big-mib", "1"]
      + (["--stock-python", STOCK_PYTHON] if STOCK_PYTHON else []),
      capture_output=True,
      text=True,
      env=env,
      cwd="/",
      timeout=600,
  )
  return done, json.loads(out.read_text()) if out.exists() else None


def test_every_check_passes_on_cpu(cpu_run):
  done, result = cpu_run
  assert done.returncode == 0, done.stdout + done.stderr
  assert result is not None, done.stdout + done.stderr
  statuses = {r["check"]: r["status"] for r in result["checks"]}
  # equinox and optax are installed here: the tied LM must run, not skip.
  assert statuses == {name: "passed" for name in CHECKS}, done.stdout
  summary = done.stdout.strip().splitlines()[-1]
  assert summary.startswith(f"check_device: {len(CHECKS)} passed, 0 failed, 0 ")
  assert "(device: cpu" in summary


def test_timings_are_reported(cpu_run):
  done, result = cpu_run
  assert set(result["timings"]) == {
      "jit dispatch on cpu",
      "1 MiB table, 8 references: device_put",
      "tied LM step (tiny)",
      "tied LM step: opt-in against eqx.nn.Shared",
  }, done.stdout
  table = result["timings"]["1 MiB table, 8 references: device_put"]
  assert table["ours"]["buffers"] == 1, table
  if STOCK_PYTHON:
    assert table["stock"]["buffers"] == 8, table


def test_the_overlay_holds_the_custom_jaxlibs_own_files(tmp_path):
  module = _module("check_device_install.py")
  wheel = tmp_path / "jaxlib-1.0+a-cp311-cp311-linux_x86_64.whl"
  with zipfile.ZipFile(wheel, "w") as archive:
    for name in (
        "jaxlib/__init__.py",
        "jaxlib_patch/__init__.py",
        "jaxlib-1.0+a.dist-info/RECORD",
    ):
      archive.writestr(name, "")
  overlay = module.make_overlay(wheel, tmp_path / "out")
  assert overlay.name == "jaxlib-1.0+a.overlay"
  assert sorted(p.name for p in overlay.iterdir()) == [
      "jaxlib-1.0+a.dist-info",
      "jaxlib_patch",
  ]
  stock = tmp_path / "jaxlib-1.0-cp311-cp311-linux_x86_64.whl"
  stock.write_bytes(wheel.read_bytes())
  with pytest.raises(module.CheckError, match="not a custom jaxlib"):
    module.make_overlay(stock, tmp_path / "out")


def test_jaxlib_files_are_compared_with_its_record(tmp_path):
  import types

  import jaxlib

  module = _module("check_device_checks.py")
  checked, differ = module.files_as_recorded("jaxlib", jaxlib)
  assert checked > 100 and not differ
  # Where the files are not jaxlib's, every one differs.
  elsewhere = types.SimpleNamespace(__file__=str(tmp_path / "jaxlib/x.py"))
  checked, differ = module.files_as_recorded("jaxlib", elsewhere)
  assert len(differ) == checked > 100


def test_a_missing_equinox_skips_the_tied_lm_saying_so(monkeypatch):
  module = _module("check_device_checks.py")
  monkeypatch.setitem(sys.modules, "equinox", None)  # import raises
  with pytest.raises(module.Skip, match="Equinox or optax is not importable"):
    module.check_tied_lm(None, None, {})


def _wheel(path):
  with zipfile.ZipFile(path, "w") as wheel:
    wheel.writestr("x/__init__.py", "x = 1\n" * 5000)
  return path


def test_split_wheels_are_put_back_together(tmp_path):
  module = _module("check_device_install.py")
  source, dest = tmp_path / "source", tmp_path / "dest"
  source.mkdir()
  whole = _wheel(tmp_path / "jaxlib-1+a-cp311-cp311-linux_x86_64.whl")
  data = whole.read_bytes()
  third = len(data) // 3 + 1
  for index in range(3):
    piece = data[index * third : (index + 1) * third]
    (source / f"{whole.name}.part-{index:03d}").write_bytes(piece)
  _wheel(source / "jax-1+a-py3-none-any.whl")
  wheels = module.gather_wheels(source, dest)
  assert sorted(w.name for w in wheels) == sorted(
      [whole.name, "jax-1+a-py3-none-any.whl"]
  )
  assert (dest / whole.name).read_bytes() == data

  (source / f"{whole.name}.part-001").unlink()
  with pytest.raises(module.CheckError, match="without a gap"):
    module.gather_wheels(source, dest)
  (source / f"{whole.name}.part-001").write_bytes(b"not the piece")
  with pytest.raises(module.CheckError, match="corrupt"):
    module.gather_wheels(source, dest)


def test_wheels_are_chosen_by_the_interpreter_s_tags(tmp_path):
  module = _module("check_device_install.py")
  names = [
      "jax-0.10.2+relid-py3-none-any.whl",
      "jaxlib-0.10.2+relid-cp311-cp311-manylinux_2_27_x86_64.whl",
      "jaxlib-0.10.2+relid-cp312-cp312-manylinux_2_27_x86_64.whl",
      "jax_cuda13_plugin-0.10.2-cp312-cp312-manylinux_2_27_x86_64.whl",
      "jax_cuda13_pjrt-0.10.2-py3-none-manylinux_2_27_x86_64.whl",
      "ml_dtypes-0.7.0-cp312-cp312-"
      "manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
  ]
  wheels = [tmp_path / name for name in names]
  cp312 = [
      "cp312-cp312-manylinux_2_28_x86_64",
      "cp312-cp312-manylinux_2_27_x86_64",
      "py3-none-manylinux_2_27_x86_64",
      "py3-none-any",
  ]
  chosen = module.select_wheels(wheels, cp312)
  assert {name: path.name for name, (_, path) in chosen.items()} == {
      "jax": names[0],
      "jaxlib": names[2],
      "jax_cuda13_plugin": names[3],
      "jax_cuda13_pjrt": names[4],
      "ml_dtypes": names[5],
  }
  assert chosen["jaxlib"][0] == "0.10.2+relid"

  with pytest.raises(module.CheckError, match="no jaxlib wheel"):
    module.select_wheels(wheels[:2], cp312)
  stock = tmp_path / "jax-0.11.2-py3-none-any.whl"
  with pytest.raises(module.CheckError, match="more than one wheel"):
    module.select_wheels(wheels + [stock], cp312)
  stock_jaxlib = (
      tmp_path / "jaxlib-0.10.2-cp312-cp312-manylinux_2_27_x86_64.whl"
  )
  with pytest.raises(module.CheckError, match="not a custom build"):
    module.select_wheels([wheels[0], stock_jaxlib], cp312)


def test_a_venv_made_by_a_venv_sees_the_makers_packages(tmp_path):
  # The tests run in a venv, as a GPU machine's Python often is: a venv it
  # makes with --system-site-packages would see only the base interpreter's
  # packages, without the link the install step writes.
  module = _module("check_device_install.py")
  venv = tmp_path / "venv"
  subprocess.run(
      [sys.executable, "-m", "venv", "--without-pip"]
      + ["--system-site-packages", str(venv)],
      check=True,
  )
  python = str(venv / "bin" / "python")
  # jax: in the tests' venv (the wheels under test), never in a bare Python.
  where = [python, "-I", "-c", "import jax; print(jax.__file__)"]
  assert subprocess.run(where, capture_output=True).returncode != 0
  folders = module.see_the_makers_packages(sys.executable, python)
  assert folders
  found = subprocess.run(where, capture_output=True, text=True, check=True)
  assert any(found.stdout.startswith(folder) for folder in folders)
