#!/usr/bin/env python3
"""MNIST in JAX: the same model as tf_mnist.py, data-parallel over every TPU chip of a slice.

Plain JAX and Optax: Conv(32, 3x3) → ReLU → MaxPool 2x2 → Dense(64) → ReLU → Dense(10) logits (computed
as pooling, then bias and ReLU: the same values), Adam, softmax cross-entropy. On a multi-host slice
`jax.distributed` connects the workers (coordinator from the run contract, on either engine); each feeds
its share of every global batch, they agree at each step boundary on checkpoints and on stopping (a
SIGTERM to any host stops the slice), and only process 0 writes checkpoints, the model and metrics.
Parameters, optimizer state, step and data position are checkpointed every N steps or minutes and on
SIGTERM; a restart resumes from the newest complete checkpoint. Same command line as tf_mnist.py.

Checkpoints are Orbax's (`CheckpointManager`: the step interval, the last three kept, async saves,
committed or never listed), written by every process together straight to the checkpoint folder,
gs:// included (`orbax_storage`). TensorBoard scalars go to `<model-dir>/tensorboard/train/` through
tensorboardX, which needs no TensorFlow (a JAX VM has none) and writes gs:// with google-cloud-storage.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import runlib
from jax import export as jax_export
from jax._src import distributed
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboardX import SummaryWriter

from run_contract.lines import line
from run_contract.names import worker_place


def join_slice() -> None:
    """On a multi-host slice, connect this worker to the others through `jax.distributed`.

    The run contract says the worker's id, the worker count and worker 0's address, from what either
    engine gives (a VM's start-up script, GKE's injected variables): passed explicitly, the same path
    serves a TPU slice and processes on CPUs, where JAX detects no Cloud TPU by itself.
    """
    place = worker_place(os.environ)
    if place.worker_count <= 1:
        return
    # Collectives between CPU processes go over Gloo (the default from JAX 0.5; explicit for clarity).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=place.coordinator, num_processes=place.worker_count, process_id=place.worker_id
    )


class SlicePeers(runlib.Peers):
    """runlib's agreements over JAX's collectives: an all-gather across the processes, and a barrier."""

    def __init__(self) -> None:
        self.count = jax.process_count()

    def gather(self, values: list[int]) -> list[list[int]]:
        gathered = multihost_utils.process_allgather(np.asarray(values, dtype=np.int32))
        return np.asarray(gathered).reshape(self.count, len(values)).tolist()

    def barrier(self, name: str) -> None:
        multihost_utils.sync_global_devices(name)

    # A failure is told through the key-value store of jax.distributed's coordination service, which
    # answers while every collective and barrier is stuck; its client is reached the way Orbax reaches it
    # (orbax-checkpoint 0.12.8 _src/multihost/multihost.py get_jax_distributed_client): JAX exports none.
    FAILED = "runlib/failed"
    SEEN = "runlib/failure-seen/"  # + the process index: it has seen the failure and is exiting
    TELL_SECONDS = 30  # the longest a failed process waits for the others to see its failure
    # How long process 0 stays once the others have seen the failure (or it has seen theirs): each of them
    # then only writes a line and exits, far less, even on a loaded machine.
    LEAVE_LAST_SECONDS = 3.0

    def report_failure(self, reason: str) -> None:
        """Record `reason` for the others, then wait (bounded) until each has seen it: process 0 hosts the
        coordination service, whose store goes with it."""
        client = distributed.global_state.client
        if client is None:  # one process: nobody to tell
            return
        with contextlib.suppress(jax.errors.JaxRuntimeError):  # another process failed first: its reason stands
            client.key_value_set(self.FAILED, f"process {jax.process_index()}: {reason}")
        deadline = time.monotonic() + self.TELL_SECONDS
        for other in range(self.count):
            if other == jax.process_index():
                continue
            left = int(1000 * (deadline - time.monotonic()))
            with contextlib.suppress(jax.errors.JaxRuntimeError):  # gone, or the deadline passed
                if left > 0:
                    client.blocking_key_value_get(f"{self.SEEN}{other}", left)
        self.leave_last()

    def failure(self) -> str | None:
        client = distributed.global_state.client
        if client is None:
            return None
        try:
            reason = client.key_value_try_get(self.FAILED)
        except jax.errors.JaxRuntimeError:  # NOT_FOUND: none reported
            return None
        with contextlib.suppress(jax.errors.JaxRuntimeError):
            client.key_value_set(f"{self.SEEN}{jax.process_index()}", "1")
        self.leave_last()
        return reason

    def leave_last(self) -> None:
        """Process 0 hosts the coordination service, and its going ends every process still connected: JAX's
        client aborts it (SIGABRT, "Terminating process because the JAX distributed service detected fatal
        errors", jaxlib's client.h), which then never exits with the run's code. The others exit as soon as
        they have told or seen the failure; process 0 stays LEAVE_LAST_SECONDS longer, so it leaves last."""
        if self.count > 1 and jax.process_index() == 0:
            time.sleep(self.LEAVE_LAST_SECONDS)


def local(tree: Any) -> Any:
    """This process's copy of replicated (global) arrays, as numpy."""
    return jax.tree_util.tree_map(lambda a: np.asarray(a.addressable_data(0)), tree)


def init_params(seed: int) -> dict[str, np.ndarray]:
    """Glorot-uniform weights and zero biases (Keras' defaults), drawn on the host with numpy: the same on
    every process for the same seed. With jax.random each draw of a new shape was a compilation of its
    own, 1.3 s of the start on a CPU."""
    rng = np.random.default_rng(seed)

    def glorot(shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, shape).astype(np.float32)

    return {
        "conv_w": glorot((3, 3, 1, 32), 9, 9 * 32),
        "conv_b": np.zeros(32, np.float32),
        "dense_w": glorot((13 * 13 * 32, 64), 13 * 13 * 32, 64),
        "dense_b": np.zeros(64, np.float32),
        "out_w": glorot((64, 10), 64, 10),
        "out_b": np.zeros(10, np.float32),
    }


def initial_state(sharding: NamedSharding, seed: int = 0) -> tuple[Any, Any]:
    """The parameters (`init_params`) and their optimizer state, placed by `sharding`; the state by one
    compiled call, not an eager operation for each of its arrays."""
    params = jax.device_put(init_params(seed), sharding)
    return params, jax.jit(OPTIMIZER.init, out_shardings=sharding)(params)


def _convolve(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """XLA's VALID convolution of images x[n, h, w, 1] with kernel[kh, kw, 1, c]."""
    return jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def max_pool(y: jax.Array) -> jax.Array:
    """2x2 max pooling of y[n, h, w, c] (VALID, stride 2) as a maximum over a reshape."""
    n, height, width, channels = y.shape
    rows, cols = height // 2, width // 2
    return y[:, : 2 * rows, : 2 * cols].reshape(n, rows, 2, cols, 2, channels).max(axis=(2, 4))


PHASES = ((0, 0), (0, 1), (1, 0), (1, 1))  # the four places of a 2x2 pooling window, in XLA's order


def pooled_size(height: int, width: int, kh: int, kw: int) -> tuple[int, int]:
    """The rows and columns of 2x2 pooling (VALID, stride 2) over the VALID convolution of an image
    height x width with a kh x kw kernel."""
    rows, cols = (height - kh + 1) // 2, (width - kw + 1) // 2
    if rows < 1 or cols < 1:
        raise ValueError(f"images of {height}x{width} are too small for a {kh}x{kw} kernel and 2x2 pooling")
    return rows, cols


def phase_views(images: jax.Array, kh: int, kw: int) -> jax.Array:
    """The patches of images[n, h, w] under a kh x kw kernel at the positions of each pooling window's
    place, as views[place, kh*kw, n*rows*cols]: every convolution output is one row of them against the
    kernel, and the four places of a window are the same (row, col) of the four phases."""
    n, height, width = images.shape
    rows, cols = pooled_size(height, width, kh, kw)
    views = [
        images[:, a + i : a + i + 2 * rows - 1 : 2, b + j : b + j + 2 * cols - 1 : 2]
        for a, b in PHASES
        for i in range(kh)
        for j in range(kw)
    ]
    return jnp.stack(views).reshape(len(PHASES), kh * kw, n * rows * cols)


def _conv_pool(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, tuple[Any, ...]]:
    n, height, width, depth = x.shape
    kh, kw, kernel_depth, channels = kernel.shape
    if depth != 1 or kernel_depth != 1:
        raise ValueError(f"conv_pool takes images of one channel, not {depth} (a kernel of {kernel_depth})")
    rows, cols = pooled_size(height, width, kh, kw)
    views = phase_views(x[..., 0], kh, kw)
    y = jnp.einsum("pkm,kc->pmc", views, kernel.reshape(kh * kw, channels))  # each place's convolution
    pooled = y.max(axis=0).reshape(n, rows, cols, channels)
    return pooled, (x, kernel, views, jnp.argmax(y, axis=0).astype(jnp.int8))


@jax.custom_vjp
def conv_pool(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """The VALID convolution of images x[n, h, w, 1] with kernel[kh, kw, 1, c], then 2x2 max pooling (VALID,
    stride 2). Without a gradient (evaluation, the export) it is XLA's convolution and pooling, fastest
    there. Under a gradient it is four matrix products, one per place of the pooling window on the patches
    there (`phase_views`), and their maximum: the same values, and a cheaper backward pass. XLA's gradients
    took XLA:CPU about half a step: the filter gradient (a convolution over the batch) and the pooling's
    (a tie count and selects over the full convolution output). Here the kernel's gradient is one matrix
    product over the patches already made, and the pooling's is a select by the place that won, a
    byte per output (a tie gives it to the first place, as XLA's pooling gradient does)."""
    return max_pool(_convolve(x, kernel))


def _conv_pool_backward(saved: tuple[Any, ...], dpooled: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, kernel, views, won = saved
    kh, kw, _, channels = kernel.shape
    d = dpooled.reshape(-1, channels)
    dy = jnp.stack([jnp.where(won == place, d, 0.0) for place in range(len(PHASES))])  # [place, m, c]
    dkernel = jnp.einsum("pkm,pmc->kc", views, dy).reshape(kernel.shape)
    # The images' gradient, for completeness: training never asks for it, and jit drops it.
    dviews = jnp.einsum("pmc,kc->pkm", dy, kernel.reshape(kh * kw, channels))
    (dimages,) = jax.vjp(lambda images: phase_views(images, kh, kw), x[..., 0])[1](dviews)
    return dimages[..., None], dkernel


conv_pool.defvjp(_conv_pool, _conv_pool_backward)


def convolve_and_pool(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """The convolution then 2x2 max pooling: `conv_pool` on XLA:CPU, where its gradient was measured faster;
    elsewhere XLA's own convolution, pooling and gradients. A TPU runs convolutions on its matrix units, and
    the four products' [9, 32] kernel would fill little of them; they were not measured there."""
    if jax.default_backend() == "cpu":  # at trace time: the backend is up (after jax.distributed, on a slice)
        return conv_pool(x, kernel)
    return max_pool(_convolve(x, kernel))


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    # Pooling before the bias and ReLU: the same values as ReLU then pooling (adding a constant and ReLU are
    # monotone), on a quarter of the elements.
    y = convolve_and_pool(x, params["conv_w"])
    y = jax.nn.relu(y + params["conv_b"]).reshape(y.shape[0], -1)
    y = jax.nn.relu(y @ params["dense_w"] + params["dense_b"])
    return y @ params["out_w"] + params["out_b"]


PROGRAM = "jax_mnist"
EXPORT = "mnist.jax_export"  # under --model-dir
OPTIMIZER = optax.adam(1e-3)


def make_train_step(optimizer: optax.GradientTransformation) -> Callable[..., tuple[Any, Any, jax.Array]]:
    """One step on batch `i` of k uint8 batches x[k, B, 28, 28] already on the devices (sharded along
    B). Params and optimizer state are donated, so the step updates them in place. Returns the mean
    loss over the whole global batch, as a device value: nothing waits for it unless it is read.

    The host loops over the k steps, dispatching asynchronously. Not `lax.scan`: XLA:CPU runs a
    while-loop body about 5x slower than the same step on its own (measured, 290 vs 60 ms of CPU per
    step), and unrolling 32 steps takes 40 s to compile. On a TPU a scan would save the dispatches.
    """

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(
        params: Any, opt_state: Any, xs: jax.Array, ys: jax.Array, i: jax.Array
    ) -> tuple[Any, Any, jax.Array]:
        x, y = prepare_on_device(xs[i]), ys[i]

        def loss_fn(p: Any) -> jax.Array:
            return optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


train_step = make_train_step(OPTIMIZER)


def prepare_on_device(x: jax.Array) -> jax.Array:
    """uint8 images [n, 28, 28] as the model's input, in [0, 1] with a channel axis: uint8 crosses to the device,
    a quarter of float32, in training, evaluation and the export alike."""
    return (x.astype(jnp.float32) / 255.0)[..., None]


def predict(params: dict[str, Any], images: jax.Array) -> jax.Array:
    """Logits [n, 10] of uint8 images [n, 28, 28]."""
    return forward(params, prepare_on_device(images))


def keep_freed_memory() -> None:
    """On a CPU host, keep freed memory in the process: XLA:CPU allocates each step's temporaries anew,
    and glibc returns large blocks to the kernel on free, so every step faulted ~180 MB back in (~45k
    page faults; 40% of the CPU time was in the kernel). Harmless elsewhere; a no-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_arena_max, m_mmap_threshold, m_trim_threshold, m_top_pad = -8, -3, -1, -2  # <malloc.h>
    for option, value in (
        (m_arena_max, 1),
        (m_mmap_threshold, 1 << 30),
        (m_trim_threshold, 2**31 - 1),
        (m_top_pad, 256 << 20),
    ):
        libc.mallopt(option, value)


def export_model(params: dict[str, jax.Array]) -> bytes:
    """The export: the trained predictor serialised with `jax.export` (StableHLO, weights inside)
    for CPU and TPU. Load it with `jax.export.deserialize(blob).call(images)`: uint8 [n, 28, 28] in,
    logits [n, 10] out, any n. Not jax2tf: that needs TensorFlow, which a JAX TPU VM does not install.
    """
    weights = local(params)
    (n,) = jax_export.symbolic_shape("n")
    spec = jax.ShapeDtypeStruct((n, 28, 28), jnp.uint8)
    exported = jax_export.export(jax.jit(functools.partial(predict, weights)), platforms=("cpu", "tpu"))(spec)
    return bytes(exported.serialize())


KEEP = 3  # checkpoints kept (Orbax's max_to_keep)


def orbax_storage() -> None:
    """Orbax reaches gs:// through TensorStore (the arrays) and etils' epath (its small files), whose
    gs:// backend is TensorFlow's file system wherever TensorFlow is importable, gcsfs elsewhere. TF's
    cannot be pointed at another endpoint (its URL is fixed: tsl/platform/cloud/gcs_file_system.cc,
    kGcsUriBase), so epath uses gcsfs always (EPATH_USE_TF=false; on a JAX VM, which has no TF, it would
    anyway). Where STORAGE_EMULATOR_HOST names another endpoint (google-cloud-storage's and gcsfs'
    variable; the test sandbox's emulator), TensorStore is pointed there too (TENSORSTORE_GCS_HTTP_URL,
    tensorstore docs/environment.rst), with its tokens from the metadata server google-auth uses
    (GCE_METADATA_HOST, TensorStore's GCE_METADATA_ROOT). gcsfs' experimental file system is turned off
    (gcsfs/__init__.py, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT): it first asks the Storage Control API for
    each bucket's layout, which the workload's account may not call (it warns, then falls back to the
    plain JSON API calls this one makes: objects get, insert, list, delete)."""
    os.environ.setdefault("EPATH_USE_TF", "false")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    if emulator := os.environ.get("STORAGE_EMULATOR_HOST"):
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator if "://" in emulator else f"http://{emulator}")
        if metadata := os.environ.get("GCE_METADATA_HOST"):
            os.environ.setdefault("GCE_METADATA_ROOT", metadata)


class SaveFailures(logging.Handler):
    """Orbax's report of a failed async save, when it fails. Its save thread (named `async_save`) logs the
    error with its traceback and keeps it for the next wait, which a failed host reaches only after a
    barrier the others never pass: the checkpoint manager's finalize thread takes it first and holds it
    through that barrier (orbax-checkpoint 0.12.8: `_AsyncManager._thread_func` and `start_async_commit`
    in _src/checkpointers/async_checkpointer.py, `CheckpointManager._finalize` in checkpoint_manager.py).
    So `check_for_errors` cannot see it; the log record can."""

    SAVE_THREAD = "async_save"

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.first is None and record.threadName == self.SAVE_THREAD and record.exc_info:
            error = record.exc_info[1]
            self.first = f"{type(error).__name__}: {error}"


class Training:
    """The replicated training state (parameters, optimizer state) and its Orbax checkpoints: runlib's
    Checkpointer. Each checkpoint holds the state (`StandardSave`) and the loop's run state as JSON."""

    def __init__(self, params: Any, opt_state: Any, directory: str, every_steps: int):
        self.params, self.opt_state = params, opt_state
        self.where = directory
        # The step interval and JAX's preemption notice: Orbax's default with `save_interval_steps`, less its
        # InitialSavePolicy, which saves at the first call of a run with no checkpoint yet (the first chunk's
        # step: a checkpoint no one asked for, the first save's costly set-up inside the loop); orbax-checkpoint
        # 0.12.8, checkpoint_manager.py `_get_default_save_decision_policy`. SIGTERM, the end and the clock are
        # runlib's forced saves, as before. An interval of 0 is none (runlib's "no step interval"): Orbax's
        # FixedIntervalPolicy would divide by it.
        every = [ocp.checkpoint_managers.FixedIntervalPolicy(every_steps)] if every_steps > 0 else []
        policy = ocp.checkpoint_managers.AnySavePolicy(
            [*every, ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]
        )
        options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, save_decision_policy=policy, create=True)
        self.manager = ocp.CheckpointManager(directory, options=options) if directory else None
        self.failures = SaveFailures()
        logging.getLogger("absl").addHandler(self.failures)  # Orbax logs through absl's logger

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps()) if self.manager else []

    def run_state(self, step: int) -> dict[str, Any]:
        assert self.manager
        return dict(self.manager.restore(step, args=ocp.args.Composite(run=ocp.args.JsonRestore()))["run"])

    def restore(self, step: int) -> None:
        assert self.manager
        like = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, (self.params, self.opt_state))
        restored = self.manager.restore(step, args=ocp.args.Composite(train=ocp.args.StandardRestore(like)))
        self.params, self.opt_state = restored["train"]

    def save(self, step: int, run_state: dict[str, Any], force: bool) -> bool:
        assert self.manager
        state = ocp.args.StandardSave((self.params, self.opt_state))
        return self.manager.save(
            step, args=ocp.args.Composite(train=state, run=ocp.args.JsonSave(run_state)), force=force
        )

    def wait(self) -> None:
        if self.manager:
            self.manager.wait_until_finished()

    def failure(self) -> str | None:
        return self.failures.first


def chunk_trainer(
    training: Training, sharding: NamedSharding, rows: slice
) -> Callable[[np.ndarray, np.ndarray, int], jax.Array]:
    """runlib's step_fn: `count` steps on the global batches x[k, B, ...] of a chunk, of which this
    process feeds `rows` of each, placed on its devices by `sharding` (along B). It places its rows of
    all k batches at once, then dispatches the first `count` steps; JAX runs them asynchronously, so
    the next chunk is built while these train. runlib's `batches` gives every chunk the same k (a
    shorter one padded), so `train_step` is compiled once, not once more for each shorter chunk."""

    def step_fn(x: np.ndarray, y: np.ndarray, count: int) -> jax.Array:
        xs = jax.make_array_from_process_local_data(sharding, x[:, rows])
        ys = jax.make_array_from_process_local_data(sharding, y[:, rows].astype("int32"))
        params, opt_state, loss = training.params, training.opt_state, None
        for i in range(count):
            params, opt_state, loss = train_step(params, opt_state, xs, ys, i)
        training.params, training.opt_state = params, opt_state
        return loss

    return step_fn


def main(argv: list[str] | None = None) -> int:
    args = runlib.parse_args((__doc__ or "").splitlines()[0], argv)
    keep_freed_memory()  # before JAX starts its threads and allocates
    orbax_storage()
    join_slice()
    process, processes = jax.process_index(), jax.process_count()
    log = runlib.Log(args.run_id, process)
    if runlib.status(args.checkpoint_dir, args.status_dir, args.run_id) == "complete":
        log("run already complete; not training again")
        return 0
    preemption = runlib.Preemption()
    devices = jax.devices()
    device = devices[0].platform.upper()
    log(f"Running on {device} with {len(devices)} device(s) in {processes} process(es)", device=device)
    if args.batch_size % len(devices):
        raise SystemExit(f"batch size {args.batch_size} must divide over {len(devices)} devices")

    mesh = Mesh(np.array(devices), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P(None, "data")), NamedSharding(mesh, P())
    data = runlib.load_data(args.data) if args.data else None
    if data is None:
        raise SystemExit("--data is required for the JAX workload (prepare it with prepare_data.py)")
    identity = runlib.RunIdentity(PROGRAM, f"jax {jax.__version__}", args.batch_size, data.fingerprint())
    training = Training(*initial_state(replicated), args.checkpoint_dir, args.checkpoint_every_steps)
    share = args.batch_size // processes  # each process feeds its slice of the global batch
    step_fn = chunk_trainer(training, batch_sharding, slice(process * share, (process + 1) * share))
    board = SummaryWriter(runlib.tensorboard_dir(args.model_dir)) if args.model_dir and process == 0 else None

    def logged(step: int, loss: float) -> None:
        if board:
            board.add_scalar("loss", loss, step)

    checkpoints = training if training.manager else None
    try:
        outcome = runlib.train(
            args, log, data, checkpoints, identity, preemption, step_fn, process, SlicePeers(), logged
        )
    except runlib.ResumeRefusedError as refused:
        log(str(refused), severity="ERROR")
        return runlib.REFUSED_EXIT
    finally:
        if board:
            board.flush()
    if outcome.preempted:
        return runlib.EXIT_RETRY  # checkpointed: the platform resumes it
    logits = jax.jit(predict)(local(training.params), data.x_test)  # on this process's devices
    accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=1) == data.y_test))
    metrics = {"framework": "jax", "device": device, **outcome.metrics, "val_accuracy": round(accuracy, 4)}
    wall = metrics["wall_seconds"]
    line(f"Training took {wall:.1f} s on {device}; final validation accuracy {accuracy:.4f}")
    if board:
        board.add_scalar("val_accuracy", accuracy, outcome.step)
        board.close()
    model = {"params.npz": runlib.pack(local(training.params)), EXPORT: export_model(training.params)}
    runlib.finish(args, PROGRAM, model, metrics, process)
    line(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
