"""Sharing across processes: two JAX processes on 127.0.0.1 (CPU, gloo).

Each runs tests/jax/multiprocess_worker.py: a model with one Param tied in two
places, arrays on a global mesh, a jitted gradient step, then
multihost_utils.process_allgather and broadcast_one_to_all of a shared tree.
The coordinator listens on loopback only, on a port that was free; each
process must exit by itself within the timeout.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

import stock_reference

WORKER = pathlib.Path(__file__).with_name("multiprocess_worker.py")
NUM_PROCESSES = 2
TIMEOUT_S = 240


def free_port():
  try:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind(("127.0.0.1", 0))
      return s.getsockname()[1]
  except OSError as e:
    pytest.skip(f"this machine refuses a socket on the loopback: {e}")


@pytest.fixture(scope="module")
def findings():
  """Each process's findings, in process order."""
  port = free_port()
  env = {
      k: v
      for k, v in stock_reference.child_environment().items()
      if k != "XLA_FLAGS"
  }
  procs = [
      subprocess.Popen(
          [sys.executable, str(WORKER), str(i), str(NUM_PROCESSES), str(port)],
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env=env,
      )
      for i in range(NUM_PROCESSES)
  ]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=TIMEOUT_S))
  except subprocess.TimeoutExpired:
    pytest.fail(f"a process did not exit within {TIMEOUT_S} s", pytrace=False)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs)):
    assert (
        proc.returncode == 0
    ), f"process {i} exited with {proc.returncode}:\n{out}\n{err[-6000:]}"
  return [json.loads(out.splitlines()[-1]) for out, _ in outputs]


def test_both_processes_see_the_global_mesh(findings):
  for found in findings:
    assert found["process_count"] == NUM_PROCESSES
    assert found["global_devices"] == 2 * NUM_PROCESSES


@pytest.mark.parametrize(
    "what",
    [
        "shared_inside_jit",
        "shared_after_jit",
        "grads_shared",
        "grad_sharding_global",
        "grad_is_sum_of_uses",
        "allgather_shared",
        "broadcast_shared",
    ],
)
def test_sharing_holds_in_every_process(findings, what):
  assert [found[what] for found in findings] == [True] * NUM_PROCESSES


def test_allgather_and_broadcast_values(findings):
  for found in findings:
    # One row per process, each filled with its process id.
    assert found["allgather_values"] == [[0.0, 0.0], [1.0, 1.0]]
    # Process 0's value everywhere.
    assert found["broadcast_values"] == [0.0, 0.0]
