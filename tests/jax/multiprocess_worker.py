"""One process of tests/jax/multiprocess_test.py: a model with a tied Param on
a global mesh of two processes (two CPU devices each).

    python multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT

Prints one JSON object of findings as its last line; the test asserts them.
"""

import dataclasses
import json
import os
import sys

process_id, num_processes, port = map(int, sys.argv[1:])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from shared_nodes import Param  # this script's folder is first on the path

jax.config.update("jax_cpu_collectives_implementation", "gloo")
address = f"127.0.0.1:{port}"
# coordinator_bind_address: the coordinator listens on loopback only, not on
# every interface.
jax.distributed.initialize(
    coordinator_address=address,
    num_processes=num_processes,
    process_id=process_id,
    coordinator_bind_address=address,
    initialization_timeout=60,
    heartbeat_timeout_seconds=30,
    shutdown_timeout_seconds=30,
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Model:
  enc: Param
  dec: Param


def loss(model, x):
  return jnp.sum((jnp.tanh(x @ model.enc.value) @ model.dec.value.T) ** 2)


mesh = Mesh(np.array(jax.devices()), ("x",))
rows = 2 * len(jax.devices())
w_host = np.linspace(-1.0, 1.0, rows * 3, dtype=np.float32).reshape(rows, 3)
x_host = np.linspace(-2.0, 2.0, 2 * rows, dtype=np.float32).reshape(2, rows)
row_sharding = NamedSharding(mesh, P("x"))
replicated = NamedSharding(mesh, P())
w = jax.make_array_from_callback(
    w_host.shape, row_sharding, lambda i: w_host[i]
)
# Every process holds the whole (replicated) input.
x = jax.make_array_from_process_local_data(replicated, x_host, x_host.shape)

tied = Param(w)
model = Model(tied, tied)
findings = {
    "process_count": jax.process_count(),
    "global_devices": len(jax.devices()),
}

traced = []


@jax.jit
def step(model, x):
  traced.append(model.enc is model.dec)
  grads = jax.grad(loss)(model, x)
  new = jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)
  return new, grads


new_model, grads = step(model, x)
findings["shared_inside_jit"] = traced == [True]
findings["shared_after_jit"] = new_model.enc is new_model.dec
findings["grads_shared"] = grads.enc is grads.dec
findings["grad_sharding_global"] = grads.enc.value.sharding.is_equivalent_to(
    row_sharding, 2
)

# The gradient of a tied Param is the sum over its uses: the untied model's
# two gradients added.
untied = Model(Param(w), Param(w))
untied_grads = jax.jit(jax.grad(loss))(untied, x)
gathered_grads = multihost_utils.process_allgather(
    (grads.enc.value, untied_grads.enc.value, untied_grads.dec.value),
    tiled=True,
)
findings["grad_is_sum_of_uses"] = bool(
    np.allclose(
        gathered_grads[0], gathered_grads[1] + gathered_grads[2], rtol=1e-5
    )
)

# A shared tree through the multihost helpers.
local_param = Param(np.full((2,), process_id, np.float32))
local_tree = Model(local_param, local_param)
gathered = multihost_utils.process_allgather(local_tree)
findings["allgather_shared"] = gathered.enc is gathered.dec
findings["allgather_values"] = np.asarray(gathered.enc.value).tolist()
broadcast = multihost_utils.broadcast_one_to_all(local_tree)
findings["broadcast_shared"] = broadcast.enc is broadcast.dec
findings["broadcast_values"] = np.asarray(broadcast.enc.value).tolist()

multihost_utils.sync_global_devices("multiprocess_worker done")
jax.distributed.shutdown()
print(json.dumps(findings), flush=True)
