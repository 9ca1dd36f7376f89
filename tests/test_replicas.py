"""Data parallelism is real: each replica trains on its B/N share, and N replicas take the same step as one.

Adam's first update is nearly sign(gradient), so a gradient N times too large would hardly show; these
checks use plain SGD, where the update is proportional to the gradient. Four replicas on the CPU:
logical devices for TensorFlow, `--xla_force_host_platform_device_count=4` for JAX.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.workloads import WORKLOADS, workload_probe

pytestmark = [pytest.mark.slow, pytest.mark.workloads]  # all run the workloads' own Python

BATCH, REPLICAS = 64, 4

TF_PROBE = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * {replicas})
sys.path.insert(0, {workloads!r} + "/tf_mnist")  # the example's source folder
import tf_mnist

rng = np.random.default_rng(0)
x = rng.integers(0, 256, (1, {batch}, 28, 28)).astype("uint8")  # one chunk of one global batch
y = rng.integers(0, 10, (1, {batch})).astype("int64")
initial = tf_mnist.build_model().get_weights()

def one_step(strategy):
    trainer = tf_mnist.Trainer(strategy, {batch})
    with strategy.scope():
        trainer.optimizer = tf.keras.optimizers.SGD(0.5)
        trainer.optimizer.build(trainer.model.trainable_variables)
    trainer.model.set_weights(initial)
    batch = trainer.distribute(x, y)
    seen = strategy.run(lambda x, y: tf.shape(x)[1], args=batch)
    loss = float(trainer.train(x, y, 1))  # the chunk's one step
    return {{
        "seen": [int(s) for s in strategy.experimental_local_results(seen)],
        "loss": loss,
        "weights": [w.tolist() for w in trainer.model.get_weights()],
    }}

one = one_step(tf.distribute.get_strategy())
many = one_step(tf.distribute.MirroredStrategy([f"/cpu:{{i}}" for i in range({replicas})]))
print(json.dumps({{"initial": [w.tolist() for w in initial], "one": one, "many": many}}))
"""

JAX_PROBE = """
import json, sys
import numpy as np
import jax, optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, {workloads!r} + "/jax_mnist")  # the example's source folder
import jax_mnist

assert len(jax.devices()) == {replicas}, jax.devices()
rng = np.random.default_rng(0)
x = rng.integers(0, 256, (1, {batch}, 28, 28)).astype("uint8")  # one chunk of one global batch
y = rng.integers(0, 10, (1, {batch})).astype("int32")
initial = jax_mnist.init_params(0)  # on the host: the step donates
optimizer = optax.sgd(0.5)
step = jax_mnist.make_train_step(optimizer)

def one_step(devices):
    mesh = Mesh(np.array(devices), ("data",))
    params = jax.device_put(initial, NamedSharding(mesh, P()))
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "data")))
    ys = jax.device_put(y, NamedSharding(mesh, P(None, "data")))
    params, _, loss = step(params, optimizer.init(params), xs, ys, 0)
    return {{
        "seen": [s.data.shape[1] for s in xs.addressable_shards],
        "loss": float(loss),
        "weights": [np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(params)],
    }}

one = one_step(jax.devices()[:1])
many = one_step(jax.devices())
print(json.dumps({{"initial": [np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(initial)],
                  "one": one, "many": many}}))
"""


def probe(source: str, **env: str) -> dict:
    return workload_probe(source.format(workloads=str(WORKLOADS), batch=BATCH, replicas=REPLICAS), env=env)


def check_same_step(result: dict) -> None:
    one, many = result["one"], result["many"]
    assert one["seen"] == [BATCH]
    assert many["seen"] == [BATCH // REPLICAS] * REPLICAS  # each replica its share, not the whole batch
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-4)  # the mean over the global batch, once
    for before, w1, wn in zip(result["initial"], one["weights"], many["weights"], strict=True):
        before, w1, wn = np.array(before), np.array(w1), np.array(wn)
        update = np.abs(w1 - before).max()
        assert update > 1e-4  # the step moved this tensor, so a wrong gradient scale would show
        assert np.abs(wn - w1).max() <= 1e-3 * update + 1e-6


def test_tensorflow_replicas_split_the_batch_and_agree_with_one():
    check_same_step(probe(TF_PROBE))


def test_jax_devices_split_the_batch_and_agree_with_one():
    check_same_step(probe(JAX_PROBE, XLA_FLAGS=f"--xla_force_host_platform_device_count={REPLICAS}"))
