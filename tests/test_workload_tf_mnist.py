"""The seed's MNIST program, run for real on the CPU with generated MNIST-shaped data."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.workloads import (
    WORKLOADS,
    run_workload,
    tensorboard_scalars,
    train_briefly,
    workload_probe,
    workloads_python,
)

pytestmark = [pytest.mark.slow, pytest.mark.workloads]

LOAD_AND_PREDICT = """
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, {workloads!r})
import runlib
data = runlib.unpack(open({sample!r}, "rb").read())
serve = tf.saved_model.load({export!r}).signatures["serving_default"]
(logits,) = serve(images=tf.constant(data["x_test"])).values()
print(json.dumps({{"shape": logits.shape.as_list(),
                  "accuracy": float(np.mean(logits.numpy().argmax(1) == data["y_test"]))}}))
"""


# The program's TensorFlow, imported as the program imports it, with the kernels it runs on the CPU.
KERNELS = """
import gc, json, sys
sys.path.insert(0, {workloads!r} + "/tf_mnist")  # the example's source folder
import tf_mnist
from tensorflow.python.util import _pywrap_util_port
print(json.dumps({{"onednn": _pywrap_util_port.IsMklEnabled(), "collecting": gc.isenabled()}}))
"""

# runlib's chunks of 3 steps per call (3 steps, then 1 to the checkpoint step 4, then 2 to the run's end), against
# the same 6 steps one per call.
CHUNKS = """
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, {workloads!r} + "/tf_mnist")
import runlib, tf_mnist

rng = np.random.default_rng(0)
data = runlib.Dataset(rng.integers(0, 256, (128, 28, 28)).astype("uint8"), rng.integers(0, 10, 128), None, None)

def train(trainer, per_call):
    for _, count, x, y in runlib.batches(data, 32, 0, 6, per_call, boundary=4):
        trainer.train(x, y.astype("int64"), count)

chunked = tf_mnist.Trainer(tf.distribute.get_strategy(), 32)
initial = chunked.model.get_weights()
train(chunked, 3)
alone = tf_mnist.Trainer(tf.distribute.get_strategy(), 32)
alone.model.set_weights(initial)
train(alone, 1)
print(json.dumps({{
    "traces": chunked.train_steps.experimental_get_tracing_count(),
    "iterations": int(chunked.optimizer.iterations.numpy()),
    "moved": min(float(np.abs(w - w0).max()) for w, w0 in zip(chunked.model.get_weights(), initial)),
    "apart": max(float(np.abs(w - v).max()) for w, v in zip(chunked.model.get_weights(), alone.model.get_weights())),
}}))
"""


# The program's model against the guide's layer order (ReLU in the convolution, before the pooling), with the same
# weights, on images with a blank margin (where whole windows are negative or tie): the logits and every gradient.
GUIDES_ORDER = """
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, {workloads!r} + "/tf_mnist")
import tf_mnist

ours = tf_mnist.build_model()
guides = tf.keras.Sequential([
    tf.keras.layers.Input(shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(32, 3, activation="relu"),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(64, activation="relu"),
    tf.keras.layers.Dense(10),
])
guides.set_weights(ours.get_weights())
rng = np.random.default_rng(3)
images = rng.uniform(0, 1, (16, 28, 28, 1)).astype("float32")
images[:, :8] = 0.0
labels = rng.integers(0, 10, 16)
loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

def run(model):
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        value = loss(labels, logits)
    return logits.numpy(), [g.numpy() for g in tape.gradient(value, model.trainable_variables)]

(a, ga), (b, gb) = run(ours), run(guides)
print(json.dumps({{
    "layers": [type(layer).__name__ for layer in ours.layers],
    "weights": [w.shape for w in ours.get_weights()] == [w.shape for w in guides.get_weights()],
    "logits": float(np.abs(a - b).max()),
    "gradients": max(float(np.abs(u - v).max()) for u, v in zip(ga, gb)),
}}))
"""


def probe(source: str, **env: str) -> dict:
    """Run `source` in the workloads' Python, TensorFlow's oneDNN choice left to the program unless `env` sets it."""
    return workload_probe(source.format(workloads=str(WORKLOADS)), env=env, without=("TF_ENABLE_ONEDNN_OPTS",))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    done = run_workload("sample_mnist.py", str(folder / "mnist.npz"), "--train", "1024", "--test", "256", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / "mnist.npz"


def test_trains_reports_and_saves(sample, tmp_path):
    done = train_briefly("tf_mnist/tf_mnist.py", sample, tmp_path, "--checkpoint-dir", str(tmp_path / "checkpoints"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Running on CPU with 1 replica(s)" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["device"] == "CPU"
    assert summary["wall_seconds"] > 0
    # The data is learnable: a model that trains gets far above chance (10%).
    assert summary["val_accuracy"] > 0.8
    assert (tmp_path / "models" / "mnist.keras").stat().st_size > 10_000
    # TensorBoard scalars by tf.summary, as the scalars plug-in reads them: the logged losses and the accuracy.
    scalars = tensorboard_scalars(tmp_path / "models" / "tensorboard" / "train")
    logged = [json.loads(line) for line in done.stdout.splitlines() if '"training"' in line]
    assert [[line["step"], line["loss"]] for line in logged] == [[s, pytest.approx(v)] for s, v, _ in scalars["loss"]]
    assert scalars["val_accuracy"] == [[summary["steps"], pytest.approx(summary["val_accuracy"], abs=1e-4), "scalars"]]
    assert {kind for _, _, kind in scalars["loss"]} == {"scalars"}
    # The SavedModel, loaded by plain TensorFlow in a fresh process (as TF Serving would), predicts
    # from raw uint8 images with the accuracy the run reported.
    script = LOAD_AND_PREDICT.format(
        workloads=str(WORKLOADS), sample=str(sample), export=str(tmp_path / "models" / "saved_model")
    )
    env = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    loaded = subprocess.run([workloads_python(), "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    predicted = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert predicted["shape"] == [256, 10]
    assert predicted["accuracy"] == pytest.approx(summary["val_accuracy"], abs=1e-3)


def test_bad_data_location_fails_clearly(tmp_path):
    done = run_workload("tf_mnist/tf_mnist.py", "--data", str(tmp_path / "missing.npz"), "--epochs", "1", cwd=tmp_path)
    assert done.returncode != 0
    assert "missing.npz" in done.stderr


def test_the_program_runs_tensorflows_onednn_kernels_unless_told_not_to():
    # TensorFlow turns them on by itself only on CPUs with AVX-512 VNNI/BF16, AVX-VNNI or AMX; an AVX2
    # machine such as CI's shows the program's own choice.
    assert probe(KERNELS) == {"onednn": True, "collecting": True}  # collecting again after the import
    assert probe(KERNELS, TF_ENABLE_ONEDNN_OPTS="0") == {"onednn": False, "collecting": True}


def test_a_short_chunk_trains_only_its_own_steps_through_the_one_traced_step():
    result = probe(CHUNKS)
    assert result["traces"] == 1  # chunks of 3, 1 and 2 steps: one shape, one trace
    assert result["iterations"] == 6  # the padding batches are not trained on
    assert result["moved"] > 1e-4
    assert result["apart"] <= 1e-6  # the same steps as one call each


def test_the_model_is_the_guides_with_its_relu_after_the_pooling():
    """The same weights give the same logits and gradients as the guide's order (ReLU, then pooling)."""
    result = probe(GUIDES_ORDER)
    assert result["layers"] == ["Conv2D", "MaxPooling2D", "ReLU", "Flatten", "Dense", "Dense"]
    assert result["weights"] is True
    assert result["logits"] == 0.0  # the same operations on the same values: a maximum commutes with ReLU
    assert result["gradients"] <= 1e-6, result  # float summation order only
