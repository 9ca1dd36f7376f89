#!/usr/bin/env python3
"""MNIST on a Cloud TPU with TensorFlow (a hand-written guide's `tpu_mnist.py`), preemption-safe.

TPUStrategy when the VM has a TPU, the default strategy on CPU/GPU; the guide's model (Conv2D(32,3) →
ReLU → MaxPool → Flatten → Dense(64) → ReLU → Dense(10) logits, computed as pooling then ReLU: the same
values), Adam, sparse categorical cross-entropy from logits, batch 256, 5 epochs. Training state
(weights, optimizer slots, step, data position) is checkpointed every N steps or minutes and on SIGTERM
by `tf.train.CheckpointManager`; a restart resumes from the newest complete checkpoint. Prints the
device, wall time and validation accuracy, writes TensorBoard scalars with `tf.summary`, and exports the
model and metrics.json at the end. The command line is runlib's contract, shared with jax_mnist.py.

TensorFlow's gs:// file system talks to Google's endpoint only (its URL is fixed:
tsl/platform/cloud/gcs_file_system.cc, kGcsUriBase; no variable points it elsewhere), so it cannot
reach the test sandbox's storage emulator. Checkpoints and events are therefore written to a local
staging folder and copied up by `Staged.sync_to_bucket` (google-cloud-storage, which honours
STORAGE_EMULATOR_HOST): the same path on a VM and in the sandbox.
"""

from __future__ import annotations

import concurrent.futures
import gc
import glob
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import runlib

from run_contract.lines import line

# Read once, as TensorFlow loads. Its oneDNN kernels for the CPU are on by default only where the CPU
# has AVX-512 VNNI or BF16, AVX-VNNI or AMX (IsMklEnabled, tensorflow/core/util/port.cc); elsewhere, as
# on this AVX2 machine, TensorFlow runs Eigen's kernels, with which a step of this model took 1.5x the
# CPU time (the max-pooling gradient alone a fifth of it). An explicit setting is kept.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
gc.disable()  # TensorFlow's import would collect ~800 times over objects that live as long as the program
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import summary_pb2  # noqa: E402

gc.freeze()  # and later collections skip them
gc.enable()

PROGRAM = "tf_mnist"
SAVED_MODEL = "saved_model"  # under --model-dir
KEEP = 3  # checkpoints kept (CheckpointManager's max_to_keep)
STATE_FILE = "checkpoint"  # tf.train.CheckpointManager's list of the kept checkpoints


def tpu_present() -> bool:
    """TPU VMs expose their chips as /dev/accel* (v2-v4) or VFIO devices (v5e and later)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")) or "TPU_NAME" in os.environ


def make_strategy(mode: str) -> tuple[tf.distribute.Strategy, str]:
    if mode == "local" or (mode == "auto" and tpu_present()):
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver), "TPU"
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    return tf.distribute.get_strategy(), device


class Staged:
    """A local folder for what TensorFlow writes, mirrored to a gs:// folder by `sync_to_bucket`; a
    local location is written in place (nothing to sync)."""

    def __init__(self, url: str):
        self.store = runlib.Store(url) if url.startswith("gs://") else None
        if self.store is None:
            self.folder = Path(url)
        else:  # fresh each start: the bucket holds the truth
            self.folder = Path(tempfile.gettempdir()) / "tpu-platform-staging" / re.sub(r"[^A-Za-z0-9]+", "_", url)
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._sent: dict[str, tuple[int, int]] = {}  # name -> (size, mtime) as uploaded

    def fetch_from_bucket(self, names: list[str]) -> None:
        for name in names if self.store else ():
            (self.folder / name).write_bytes(self.store.read(name))
            self._sent[name] = self._stamp(name)

    def sync_to_bucket(self, last: tuple[str, ...] = ()) -> None:
        """Upload new and changed files (`last` after all others), then delete what is gone locally."""
        if self.store is None:
            return
        here = {p.name for p in self.folder.iterdir() if p.is_file()}
        changed = sorted((n for n in here if self._sent.get(n) != self._stamp(n)), key=lambda n: (n in last, n))
        for name in changed:
            stamp = self._stamp(name)
            self.store.write(name, (self.folder / name).read_bytes())
            self._sent[name] = stamp
        for name in sorted(set(self._sent) - here):
            self.store.delete(name)
            del self._sent[name]

    def _stamp(self, name: str) -> tuple[int, int]:
        stat = (self.folder / name).stat()
        return stat.st_size, stat.st_mtime_ns


class Checkpoints:
    """runlib's Checkpointer on `tf.train.CheckpointManager` (the step interval, the last KEEP kept, the
    `checkpoint` state file naming them), staged: each save is copied up on a background thread, its
    data before its index and the state file last, so the bucket never names a checkpoint whose files
    are not all there; at start the checkpoints the bucket's state file names are fetched."""

    def __init__(self, trainer: Trainer, url: str, every_steps: int):
        self.where = url
        self.staged = Staged(url)
        if self.staged.store and self.staged.store.exists(STATE_FILE):
            self.staged.fetch_from_bucket([STATE_FILE])
            state = tf.train.get_checkpoint_state(str(self.staged.folder))
            kept = [Path(p).name for p in state.all_model_checkpoint_paths] if state else []
            names = set(self.staged.store.list())
            self.staged.fetch_from_bucket(sorted(n for n in names if n.split(".")[0] in kept))
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.run = tf.Variable("", dtype=tf.string, trainable=False)  # the loop's run state, as JSON
        self.checkpoint = tf.train.Checkpoint(
            model=trainer.model, optimizer=trainer.optimizer, step=self.step, run_state=self.run
        )
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            str(self.staged.folder),
            max_to_keep=KEEP,
            step_counter=self.step,
            checkpoint_interval=every_steps,
        )
        self._upload = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-sync")
        self._pending: concurrent.futures.Future | None = None

    def _prefix(self, step: int) -> str:
        return str(self.staged.folder / f"ckpt-{step}")

    def steps(self) -> list[int]:
        return sorted(int(path.rsplit("-", 1)[1]) for path in self.manager.checkpoints)

    def run_state(self, step: int) -> dict:
        return json.loads(
            tf.train.load_checkpoint(self._prefix(step)).get_tensor("run_state/.ATTRIBUTES/VARIABLE_VALUE")
        )

    def restore(self, step: int) -> None:
        self.checkpoint.restore(self._prefix(step)).assert_existing_objects_matched()

    def save(self, step: int, run_state: dict, force: bool) -> bool:
        self.step.assign(step)
        self.run.assign(json.dumps(run_state))
        if self.manager.save(checkpoint_number=step, check_interval=not force) is None:
            return False
        self.wait()  # one upload in flight
        self._pending = self._upload.submit(self.staged.sync_to_bucket, (STATE_FILE,))
        return True

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending:
            pending.result()

    def failure(self) -> str | None:
        pending = self._pending
        error = pending.exception() if pending and pending.done() else None
        return f"{type(error).__name__}: {error}" if error else None


class Board:
    """TensorBoard scalars through `tf.summary` (staged like the checkpoints). `tf.summary.write` with
    the scalars plug-in's metadata, which is what `tf.summary.scalar` writes: that wrapper lives in the
    `tensorboard` package, which TensorFlow 2.21 no longer installs."""

    METADATA = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))

    def __init__(self, model_dir: str):
        self.staged = Staged(runlib.tensorboard_dir(model_dir))
        self.writer = tf.summary.create_file_writer(str(self.staged.folder))

    def scalar(self, name: str, value: float, step: int) -> None:
        with self.writer.as_default():
            tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=self.METADATA)

    def sync_to_bucket(self) -> None:
        self.writer.flush()
        self.staged.sync_to_bucket()


def load(location: str) -> runlib.Dataset:
    if location:
        return runlib.load_data(location)
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()  # needs internet
    return runlib.Dataset(x_train, y_train, x_test, y_test)


def prepare(images: Any) -> tf.Tensor:
    """uint8 images [n, 28, 28] as the model's input, in [0, 1] with a channel axis: uint8 crosses to the device,
    in training, evaluation and the export alike."""
    return tf.cast(images, tf.float32)[..., tf.newaxis] / 255.0


def build_model() -> tf.keras.Model:
    """The guide's model, its ReLU after the pooling instead of before: the same values (ReLU is monotone, so
    it commutes with a maximum) and gradients, on a quarter of the elements (11% of a step's CPU time)."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.ReLU(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


class Trainer:
    def __init__(self, strategy: tf.distribute.Strategy, batch_size: int):
        replicas = strategy.num_replicas_in_sync
        if batch_size % replicas:
            raise ValueError(f"batch size {batch_size} must divide evenly over {replicas} replicas")
        self.strategy = strategy
        self.batch_size = batch_size
        self.per_replica = batch_size // replicas
        with strategy.scope():
            self.model = build_model()
            self.optimizer = tf.keras.optimizers.Adam()
            self.optimizer.build(self.model.trainable_variables)
            self.loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def distribute(self, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        """Split the stacked global batches x[k, B, ...] over the replicas: replica r gets the rows
        [r*B/N, (r+1)*B/N) of each batch.

        `Strategy.run` splits only distributed values; a plain tensor would reach every replica whole,
        so each would train on the full batch and the summed gradient would be N times too large.
        """

        def part(ctx: tf.distribute.InputReplicaContext) -> tuple[tf.Tensor, tf.Tensor]:
            first = ctx.replica_id_in_sync_group * self.per_replica
            return tf.constant(x[:, first : first + self.per_replica]), tf.constant(
                y[:, first : first + self.per_replica]
            )

        return self.strategy.experimental_distribute_values_from_function(part)

    def train(self, x: np.ndarray, y: np.ndarray, count: int) -> tf.Tensor:
        """runlib's step_fn: train on the first `count` of the stacked global batches x[k, B, ...] in one
        call. runlib's `batches` gives every chunk the same k (a shorter one padded), so `train_steps` is
        traced once (on a TPU, compiled once); `count` is a tensor, so its value traces nothing new."""
        return self.train_steps(*self.distribute(x, y), tf.constant(count))

    @tf.function
    def train_steps(self, x: Any, y: Any, count: Any) -> tf.Tensor:
        """The first `count` of the stacked batches in x, y, a step each, in one call (as Keras'
        steps_per_execution): on a TPU, a host round trip per step is what makes a small model slow.
        Returns the last step's mean loss over the global batch.

        No `jit_compile` here: TPUStrategy compiles with XLA anyway, and on the CPU XLA's convolution is
        slower than TensorFlow's own kernels (measured: a step took 4x the CPU time).
        """

        def step(i: tf.Tensor, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            images = prepare(x[i])
            with tf.GradientTape() as tape:
                logits = self.model(images, training=True)
                loss = tf.nn.compute_average_loss(self.loss(y[i], logits), global_batch_size=self.batch_size)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            return loss

        loss = tf.constant(0.0)
        for i in tf.range(count):
            per_replica = self.strategy.run(step, args=(i, x, y))
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return loss

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        logits = self.model.predict(prepare(x), batch_size=self.batch_size, verbose=0)
        return float(np.mean(np.argmax(logits, axis=1) == y))

    def saved_model(self) -> dict[str, bytes]:
        """The export: a TF SavedModel whose default signature takes uint8 images [n, 28, 28] and
        returns logits [n, 10], for TF Serving or Vertex AI on CPU/GPU; and the Keras file."""
        model = self.model

        def serve(images: tf.Tensor) -> tf.Tensor:
            return model(prepare(images), training=False)

        with tempfile.TemporaryDirectory() as tmp:
            archive = tf.keras.export.ExportArchive()
            archive.track(model)
            archive.add_endpoint("serve", serve, input_signature=[tf.TensorSpec([None, 28, 28], tf.uint8, "images")])
            archive.write_out(str(Path(tmp) / SAVED_MODEL), verbose=False)
            model.save(Path(tmp) / "mnist.keras")
            return {
                str(path.relative_to(tmp)): path.read_bytes() for path in sorted(Path(tmp).rglob("*")) if path.is_file()
            }


def main(argv: list[str] | None = None) -> int:
    args = runlib.parse_args((__doc__ or "").splitlines()[0], argv)
    process = int(os.environ.get("TPU_WORKER_ID", "0"))
    log = runlib.Log(args.run_id, process)
    if process != 0:
        # TensorFlow drives every host of a slice from worker 0; the other workers only host the TPU.
        log("TensorFlow runs from worker 0; nothing to do on this worker")
        return 0
    if runlib.status(args.checkpoint_dir, args.status_dir, args.run_id) == "complete":
        log("run already complete; not training again")
        return 0
    preemption = runlib.Preemption()
    strategy, device = make_strategy(args.tpu)
    log(f"Running on {device} with {strategy.num_replicas_in_sync} replica(s)", device=device)
    data = load(args.data)
    identity = runlib.RunIdentity(PROGRAM, f"tensorflow {tf.__version__}", args.batch_size, data.fingerprint())
    trainer = Trainer(strategy, args.batch_size)
    checkpoints = (
        Checkpoints(trainer, args.checkpoint_dir, args.checkpoint_every_steps) if args.checkpoint_dir else None
    )
    board = Board(args.model_dir) if args.model_dir else None

    def step_fn(x: np.ndarray, y: np.ndarray, count: int) -> tf.Tensor:
        return trainer.train(x, y.astype("int64"), count)

    def logged(step: int, loss: float) -> None:
        if board:
            board.scalar("loss", loss, step)

    try:
        outcome = runlib.train(args, log, data, checkpoints, identity, preemption, step_fn, on_log=logged)
    except runlib.ResumeRefusedError as refused:
        log(str(refused), severity="ERROR")
        return runlib.REFUSED_EXIT
    if outcome.preempted:
        if board:
            board.sync_to_bucket()
        return runlib.EXIT_RETRY  # checkpointed: the platform resumes it
    accuracy = trainer.accuracy(data.x_test, data.y_test)
    metrics = {"framework": "tensorflow", "device": device, **outcome.metrics, "val_accuracy": round(accuracy, 4)}
    wall = metrics["wall_seconds"]
    line(f"Training took {wall:.1f} s on {device}; final validation accuracy {accuracy:.4f}")
    if board:
        board.scalar("val_accuracy", accuracy, outcome.step)
        board.sync_to_bucket()
    runlib.finish(args, PROGRAM, trainer.saved_model(), metrics, process)
    line(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
