"""jax_mnist run for real on the CPU: it trains, and its export loads and predicts without the program."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time

import pytest

from tests.sandbox import free_port, wait_for
from tests.workloads import (
    ENGINES,
    WORKLOADS,
    checkpoint_names,
    committed_steps,
    run_workload,
    slice_environment,
    tensorboard_scalars,
    train_briefly,
    workload_probe,
    workloads_python,
)

# Two hosts' mean gradient equals one host's over the same global batch up to float summation order.
LOSS_TOLERANCE = 1e-3  # measured: equal to the 5 decimals the log keeps


pytestmark = [pytest.mark.slow, pytest.mark.workloads]  # all run the workloads' own Python

LOAD_AND_PREDICT = """
import json, sys
import numpy as np
from jax import export
sys.path.insert(0, {workloads!r})
import runlib
data = runlib.unpack(open({sample!r}, "rb").read())
predictor = export.deserialize(bytearray(open({blob!r}, "rb").read()))
logits = np.asarray(predictor.call(data["x_test"]))
print(json.dumps({{"shape": list(logits.shape), "accuracy": float(np.mean(logits.argmax(1) == data["y_test"]))}}))
"""


# conv_pool against XLA's convolution then 2x2 max pooling (`lax.reduce_window`): the values without a gradient
# ("plain", XLA's own operations) and under one (the four matrix products), the kernel's gradient and the images'
# gradient for a random upstream gradient. On random images; on images with a blank margin, where the four places of
# the margin's windows tie at zero over blank patches; and on ties of different patches: a kernel that reads one
# pixel, and in every window places (0, 1) and (1, 0) at the same brightest value, so that the kernel's gradient
# depends on which place a tie goes to.
GRADIENTS = """
import json, sys
import jax, jax.numpy as jnp
sys.path.insert(0, {folder!r})
import jax_mnist
kx, kk, kd = jax.random.split(jax.random.PRNGKey(7), 3)
kernel = jax.random.normal(kk, (3, 3, 1, 32))
dpooled = jax.random.normal(kd, (8, 13, 13, 32))
def xlas(x, kernel):
    y = jax_mnist._convolve(x, kernel)
    return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
most = lambda a: float(jnp.max(jnp.abs(a)))
found = {{}}
random = jax.random.uniform(kx, (8, 28, 28, 1))
one_pixel = jnp.zeros_like(kernel).at[0, 0].set(jax.random.uniform(kk, (1, 32), minval=0.5, maxval=1.5))
tied = random.at[:, 0:26:2, 1:26:2].set(2.0).at[:, 1:26:2, 0:26:2].set(2.0)
for name, x, kernel in (
    ("random", random, kernel),
    ("margin", random.at[:, :8].set(0.0).at[:, :, 20:].set(0.0), kernel),
    ("tied", tied, one_pixel),
):
    ours, theirs = jax.vjp(jax_mnist.conv_pool, x, kernel), jax.vjp(xlas, x, kernel)
    (dx, dk), (dx0, dk0) = ours[1](dpooled), theirs[1](dpooled)
    found[name] = {{
        "plain": most(jax_mnist.conv_pool(x, kernel) - theirs[0]),
        "forward": most(ours[0] - theirs[0]) / most(theirs[0]),
        "kernel": most(dk - dk0) / most(dk0),
        "images": most(dx - dx0) / most(dx0),
    }}
refused = []
for images, depth in (((2, 3, 3, 1), 1), ((2, 28, 28, 3), 3)):  # too small for the kernel; three channels
    try:
        jax.vjp(jax_mnist.conv_pool, jnp.ones(images), jnp.ones((3, 3, depth, 4)))
    except ValueError as error:
        refused.append(str(error))
print(json.dumps({{"cases": found, "refused": refused}}))
"""


def probe(script: str) -> dict:
    """Run `script` in the workloads' Python on the CPU; what it printed last, as JSON."""
    return workload_probe(script, env={"JAX_PLATFORMS": "cpu"})


# float summation order only: the products are the same, summed in another order (measured: under 4e-7)
SUMMATION = 1e-5


def test_the_convolution_and_pooling_as_four_matrix_products_are_xlas():
    """jax_mnist's conv_pool (faster on XLA:CPU) must give XLA's values and gradients, ties included: XLA's
    pooling gradient (select_and_scatter) gives a tie to the window's first place, and so does conv_pool. It
    failed with the ties given to the last place, and with PHASES in another order."""
    result = probe(GRADIENTS.format(folder=str(WORKLOADS / "jax_mnist")))
    found = result["cases"]
    assert set(found) == {"random", "margin", "tied"}
    assert all(differences["plain"] == 0.0 for differences in found.values()), found
    for name, differences in found.items():
        for what in ("forward", "kernel", "images"):
            assert differences[what] < SUMMATION, (name, what, differences)
    assert result["refused"] == [  # shapes it was not written for: a sentence, not a failed reshape
        "images of 3x3 are too small for a 3x3 kernel and 2x2 pooling",
        "conv_pool takes images of one channel, not 3 (a kernel of 3)",
    ]


# The model's two paths (convolve_and_pool): the CPU's conv_pool, and every other platform's XLA convolution and
# pooling with XLA's gradients, here taken on the CPU by answering "tpu" for the platform at trace time. One batch
# of images of random brightness, without ties: the loss and every parameter's gradient; and which path each traced
# (whether its jaxpr holds XLA's convolution). Ties part the paths, each a subgradient of the maximum: JAX's
# gradient of the maximum over a reshape splits a tie, conv_pool gives it to the window's first place; one tied
# window of 86,528 put them 3.5e-3 apart in the kernel's gradient, on images of whole uint8 levels.
PATHS = """
import json, sys
import jax, numpy as np, optax
sys.path.insert(0, {folder!r})
import jax_mnist
params = jax.device_put(jax_mnist.init_params(0))
rng = np.random.default_rng(5)
x = rng.uniform(0, 1, (16, 28, 28, 1)).astype("float32")
y = rng.integers(0, 10, 16)
loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(jax_mnist.forward(p, x), y).mean()
def traced(platform):
    jax_mnist.jax.default_backend = lambda: platform
    grad = jax.value_and_grad(loss)
    primitives = {{str(e.primitive) for e in jax.make_jaxpr(grad)(params).eqns}}
    value, grads = jax.jit(grad)(params)
    return float(value), grads, "conv_general_dilated" in primitives
cpu, other = traced("cpu"), traced("tpu")
most = lambda a: float(np.max(np.abs(a)))
print(json.dumps({{
    "xlas_convolution": [cpu[2], other[2]],
    "loss": abs(cpu[0] - other[0]),
    "gradients": max(most(cpu[1][k] - other[1][k]) / most(other[1][k]) for k in params),
}}))
"""


def test_the_models_other_platforms_path_trains_the_same_model():
    """A TPU takes XLA's convolution, pooling and gradients (conv_pool was measured on XLA:CPU only): that path is
    traced and trained here on the CPU, and gives conv_pool's loss and gradients to float summation order."""
    result = probe(PATHS.format(folder=str(WORKLOADS / "jax_mnist")))
    assert result["xlas_convolution"] == [False, True]  # the CPU's path is conv_pool's products; the other, XLA's
    assert result["loss"] < 1e-6, result
    assert result["gradients"] < SUMMATION, result


# runlib's chunks of 3 steps per call (3 steps, then 1 to the checkpoint step 4, then 2 to the run's end) through
# the program's step function, against the same 6 steps one per call. Compilations are counted by JAX's own
# monitoring event for each XLA compilation (jax/_src/dispatch.py BACKEND_COMPILE_EVENT, recorded by
# pxla._cached_compilation with the function's name; jax.monitoring's public listener).
CHUNKS = """
import json, sys
import jax, numpy as np
sys.path.insert(0, {folder!r})
import jax_mnist, runlib
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

compiled = []
def listen(event, seconds, **labels):
    if event == "/jax/core/compile/backend_compile_duration" and "train_step" in str(labels.get("fun_name")):
        compiled.append(labels["fun_name"])
jax.monitoring.register_event_duration_secs_listener(listen)

rng = np.random.default_rng(0)
data = runlib.Dataset(rng.integers(0, 256, (128, 28, 28)).astype("uint8"), rng.integers(0, 10, 128), None, None)
mesh = Mesh(np.array(jax.devices()), ("data",))
initial = jax_mnist.init_params(0)  # on the host: steps donate

def trained(per_call):
    state = jax.device_put((initial, jax_mnist.OPTIMIZER.init(initial)), NamedSharding(mesh, P()))
    training = jax_mnist.Training(*state, "", 4)
    step_fn = jax_mnist.chunk_trainer(training, NamedSharding(mesh, P(None, "data")), slice(0, 32))
    for _, count, x, y in runlib.batches(data, 32, 0, 6, per_call, boundary=4):
        step_fn(x, y, count)
    return training

chunked = trained(3)
compiles = len(compiled)
alone = trained(1)
most = lambda tree: max(float(np.abs(leaf).max()) for leaf in jax.tree_util.tree_leaves(tree))
difference = lambda a, b: jax.tree_util.tree_map(lambda u, v: np.asarray(u) - np.asarray(v), a, b)
print(json.dumps({{
    "compiles": compiles,
    "steps": int(chunked.opt_state[0].count),
    "moved": most(difference(chunked.params, initial)),
    "apart": most(difference(chunked.params, alone.params)),
}}))
"""


def test_a_short_chunk_trains_only_its_own_steps_through_the_one_compiled_step():
    result = probe(CHUNKS.format(folder=str(WORKLOADS / "jax_mnist")))
    assert result["compiles"] == 1  # chunks of 3, 1 and 2 steps: one shape, one compilation
    assert result["steps"] == 6  # Adam's step count: the padding batches are not trained on
    assert result["moved"] > 1e-4
    assert result["apart"] <= 1e-6  # the same steps as one call each


# The program's checkpointer in a fresh folder, every 8 steps: which steps it saves unforced, and which it commits.
FIRST_SAVE = """
import json, sys
import jax
sys.path.insert(0, {folder!r})
import jax_mnist
params = jax.device_put(jax_mnist.init_params(0))
training = jax_mnist.Training(params, jax_mnist.OPTIMIZER.init(params), {directory!r}, 8)
saved = [step for step in (4, 8, 12, 16) if training.save(step, {{"step": step}}, force=False)]
training.wait()
print(json.dumps({{"saved": saved, "committed": training.steps()}}))
"""


def test_a_fresh_run_saves_at_its_step_interval_only(tmp_path):
    """Orbax's default policy also saves the first step of a run with no checkpoint (InitialSavePolicy): in the
    seed's job, step 32, a checkpoint no one asked for whose save waited inside the loop for the first compile."""
    script = FIRST_SAVE.format(folder=str(WORKLOADS / "jax_mnist"), directory=str(tmp_path / "ckpt"))
    assert probe(script) == {"saved": [8, 16], "committed": [8, 16]}


def test_trains_and_exports_a_model_that_predicts_on_the_cpu(tmp_path):
    sample = tmp_path / "mnist.npz"
    made = run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "256", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    done = train_briefly("jax_mnist/jax_mnist.py", sample, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["val_accuracy"] > 0.8  # the data is learnable; chance is 10%
    # TensorBoard scalars by tensorboardX: the logged losses and the accuracy.
    scalars = tensorboard_scalars(tmp_path / "models" / "tensorboard" / "train")
    logged = [json.loads(line) for line in done.stdout.splitlines() if '"training"' in line]
    assert [[line["step"], line["loss"]] for line in logged] == [[s, pytest.approx(v)] for s, v, _ in scalars["loss"]]
    assert scalars["val_accuracy"] == [
        [summary["steps"], pytest.approx(summary["val_accuracy"], abs=1e-4), "simple_value"]
    ]
    # A fresh process with no jax_mnist code: only the exported file and the raw uint8 test images.
    script = LOAD_AND_PREDICT.format(
        workloads=str(WORKLOADS), sample=str(sample), blob=str(tmp_path / "models" / "mnist.jax_export")
    )
    loaded = subprocess.run([workloads_python(), "-c", script], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    predicted = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert predicted["shape"] == [256, 10]
    assert predicted["accuracy"] == pytest.approx(summary["val_accuracy"], abs=1e-3)  # the model it reported on


def final_loss(log: str, step: int) -> float:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"training"' in line]
    return next(line["loss"] for line in lines if line["step"] == step)


def start_slice(
    tmp_path, args: list[str], engine: str, count: int = 2, cannot_write: int | None = None
) -> list[subprocess.Popen]:
    """`count` jax_mnist processes joined as one slice, with the environment `engine` gives its workers.

    Worker `cannot_write` may not grow a file past FILE_LIMIT (RLIMIT_FSIZE, setrlimit(2)): the kernel
    refuses its larger writes with EFBIG, as a full or failing disk would, so its checkpoint's array data
    fails in TensorStore's asynchronous write. Its output goes to a pipe, which the limit spares: read it
    with `communicate`."""
    port = free_port()
    processes = []
    for worker in range(count):
        slice_env = slice_environment(engine, worker, count, port)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", **slice_env}
        limited = worker == cannot_write
        with open(tmp_path / f"worker-{worker}.log", "a") as out:  # the child keeps its own copy open
            processes.append(
                subprocess.Popen(
                    [workloads_python(), str(WORKLOADS / "jax_mnist/jax_mnist.py"), *args],
                    stdout=subprocess.PIPE if limited else out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=tmp_path,
                    preexec_fn=limit_file_size if limited else None,
                )
            )
    return processes


FILE_LIMIT = 64 * 1024  # above the run identity and Orbax's metadata files; below the model's arrays (1.3 MB)


def limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


@pytest.mark.parametrize("engine", ENGINES)
def test_two_processes_train_as_one_slice_stop_together_on_one_sigterm_and_resume(tmp_path, engine):
    """Two processes joined by jax.distributed on loopback (Gloo collectives), without the sandbox, each
    told its place in the slice as a VM's start-up script or GKE tells it."""
    sample = tmp_path / "mnist.npz"
    assert (
        run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "256", cwd=tmp_path).returncode == 0
    )
    steps = 64  # 2 epochs of 1024 at batch 32
    args = [
        "--data",
        str(sample),
        "--steps",
        str(steps),
        "--batch-size",
        "32",
        "--checkpoint-every-steps",
        "8",
        "--steps-per-call",
        "4",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--model-dir",
        str(tmp_path / "m"),
    ]
    one = run_workload("jax_mnist/jax_mnist.py", *args[:-4], cwd=tmp_path)  # one process, the same global batch
    assert one.returncode == 0, one.stderr[-3000:]

    def committed() -> list[int]:
        return committed_steps(checkpoint_names(tmp_path / "ckpt"))

    first = start_slice(tmp_path, args, engine)
    wait_for(committed, 120, "a first committed checkpoint", interval=0.1)
    first[1].send_signal(signal.SIGTERM)  # one host of the slice is told it is preempted
    wait_for(lambda: "SIGTERM: checkpoint" in (tmp_path / "worker-0.log").read_text(), 60, "worker 0 to stop")
    # The rest of the slice is told as it leaves, its stop committed: notices until it is gone.
    while first[0].poll() is None:
        first[0].send_signal(signal.SIGTERM)
        time.sleep(0.01)
    codes = [p.wait(60) for p in first]
    logs = [(tmp_path / f"worker-{w}.log").read_text() for w in range(2)]
    assert codes == [75, 75], logs[0][-2000:] + logs[1][-2000:]  # checkpointed, resume later (the run contract)
    stopped = [json.loads(line) for log in logs for line in log.splitlines() if '"SIGTERM: checkpoint' in line]
    assert [s["signalled_here"] for s in stopped] == [False, True]  # worker 0 stopped for worker 1's signal
    assert stopped[0]["step"] == stopped[1]["step"] == committed()[-1] < steps

    second = start_slice(tmp_path, args, engine)
    assert [p.wait(180) for p in second] == [0, 0]
    logs = [(tmp_path / f"worker-{w}.log").read_text() for w in range(2)]
    resumed = [json.loads(line)["step"] for log in logs for line in log.splitlines() if '"resumed from' in line]
    assert resumed == [stopped[0]["step"]] * 2
    assert "in 2 process(es)" in logs[0]
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert (metrics["steps"], metrics["resumes"]) == (steps, 1)
    # The same global batches, split over two hosts and resumed: the loss of one uninterrupted process.
    assert final_loss(logs[0], steps) == pytest.approx(final_loss(one.stdout, steps), abs=LOSS_TOLERANCE)


# SlicePeers against a stand-in for jax.distributed's client (its key-value store), in one process told it is
# process {process} of two: what it asks and sets when it fails or sees another's failure, and whether it stays.
LEAVING = """
import json, sys, time
sys.path.insert(0, {folder!r})
import jax, jax_mnist
from jax._src import distributed

events = []

class Client:
    def __init__(self, store):
        self.store = store
    def key_value_set(self, key, value):
        self.store[key] = value
        events.append(["set", key])
    def key_value_try_get(self, key):
        if key not in self.store:
            raise jax.errors.JaxRuntimeError("NOT_FOUND: " + key)
        return self.store[key]
    def blocking_key_value_get(self, key, timeout_ms):
        events.append(["waited for", key])  # the other process set it: it answers at once
        return "1"

peers = jax_mnist.SlicePeers()  # its backend started first: one process, on the CPU
peers.count = 2
distributed.global_state.client = Client({store!r})
jax.process_index = lambda: {process}
time.sleep = lambda seconds: events.append(["stayed", seconds])
peers.report_failure("OSError: disk") if {failing} else peers.failure()
print(json.dumps(events))
"""


@pytest.mark.parametrize(("process", "failing"), [(0, True), (0, False), (1, True), (1, False)])
def test_process_0_which_hosts_the_coordination_service_leaves_last(process, failing):
    """Once process 0 (the coordination service's host) is gone, JAX aborts every process still connected
    (SIGABRT: a clean-clone run ended the fail-fast slice [74, -6]). So a process that failed, or saw the
    failure, exits at once, but process 0 stays a while after, whichever of the two failed."""
    store = {} if failing else {"runlib/failed": "process 1: OSError: disk"}
    script = LEAVING.format(folder=str(WORKLOADS / "jax_mnist"), store=store, process=process, failing=failing)
    done = subprocess.run([workloads_python(), "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = json.loads(done.stdout.strip().splitlines()[-1])
    other = 1 - process
    told = [["set", "runlib/failed"], ["waited for", f"runlib/failure-seen/{other}"]]
    seen = [["set", f"runlib/failure-seen/{process}"]]
    stays = [["stayed", 3.0]] if process == 0 else []
    assert events == (told if failing else seen) + stays


# Far below Orbax's own bound on a save's barriers (AsyncOptions.timeout_secs, 1200 s), which is how long
# every host waited before; far above a start, a first save and a failure, even on a loaded machine.
ENDS_WITHIN = 420


@pytest.mark.workloads
@pytest.mark.parametrize("failing", [0, 1])  # 0 also hosts jax.distributed's coordination service
def test_a_checkpoint_one_host_cannot_write_ends_every_host_with_the_failure_code(tmp_path, failing):
    """One host's async save fails on its storage: it exits 74 (EX_IOERR: failed, retried from the last
    committed checkpoint), and so does the other, which was waiting for it at Orbax's commit barrier."""
    sample = tmp_path / "mnist.npz"
    assert (
        run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "256", cwd=tmp_path).returncode == 0
    )
    args = ["--data", str(sample), "--steps", "64", "--batch-size", "32", "--checkpoint-every-steps", "8"]
    workers = start_slice(tmp_path, [*args, "--checkpoint-dir", str(tmp_path / "ckpt")], "vm", cannot_write=failing)
    try:
        outputs = {w: workers[w].communicate(timeout=ENDS_WITHIN)[0] for w in (failing, 1 - failing)}
    finally:
        for p in workers:
            p.kill()
    codes = [p.returncode for p in workers]
    logs = [outputs[w].decode() if outputs[w] else (tmp_path / f"worker-{w}.log").read_text() for w in range(2)]
    assert codes == [74, 74], logs[0][-3000:] + logs[1][-3000:]
    ended = [json.loads(line) for log in logs for line in log.splitlines() if '"severity": "ERROR"' in line]
    assert [(e["process"], e["message"]) for e in ended] == [
        (
            w,
            "checkpoint save failed; ending the run"
            if w == failing
            else "another process's checkpoint save failed; ending the run",
        )
        for w in range(2)
    ]
    assert all("File too large" in e["error"] for e in ended)  # the storage's own error, on both hosts
    assert ended[1 - failing]["error"].startswith(f"process {failing}: ")
    assert committed_steps(checkpoint_names(tmp_path / "ckpt")) == []  # the failed save was never committed
