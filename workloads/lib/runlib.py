#!/usr/bin/env python3
"""The run contract for Python workloads that tpu-platform runs, with no ML framework imported here.

- One command line: data, checkpoint and model locations (defaults from the contract's environment,
  TPU_PLATFORM_*), epochs/steps, batch size, checkpoint intervals (by steps and by minutes), run id.
- Exit codes: 0 finished, 75 (EX_TEMPFAIL) stopped with a checkpoint, 78 (EX_CONFIG) refused, 74 (EX_IOERR)
  a checkpoint could not be written: then every process of the run exits at once (`FailFast`).
- SIGTERM (GCE's notice before it reclaims a spot VM) sets a flag the loop reads at each step
  boundary; on many processes one host's SIGTERM stops them all at one step, behind a barrier that
  holds every process until the checkpoint is committed.
- Checkpoints are the framework's (Orbax for JAX, tf.train.CheckpointManager for TensorFlow): the
  loop says when and with what run state. The run's RunIdentity (program, framework version, batch
  size, data fingerprint) is recorded beside them; a restart with another is refused, not mixed.
  A checkpoint that cannot be loaded is skipped for the one before it.
- Storage for local paths and gs:// URLs (google-cloud-storage, which honours STORAGE_EMULATOR_HOST),
  sharded training data read in parallel, cached and prefetched; JSON log lines for Cloud Logging.
- A completion marker beside the checkpoints (`status` reads it, and `<status-dir>/COMPLETE`). The object
  the platform's guard acts on, `<status-dir>/COMPLETE`, is the VM agent's alone to write (a run's
  credentials cannot reach it): runlib never writes it.

As a program: `python3 runlib.py status --checkpoint-dir URL [--status-dir URL]` prints `complete`
(either marker exists) or `incomplete`.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import queue
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

import numpy as np

from run_contract import completion_marker, names
from run_contract.lines import line
from run_contract.timeline import CHECKPOINT_MESSAGE, RESTORED_MESSAGE

COMPLETE = completion_marker.NAME
# Exit codes of the run contract (docs/run-contract.md; sysexits.h): the platform's agent retries
# a run that exits EXIT_RETRY (stopped mid-run: it resumes from its checkpoint) and never one that
# exits REFUSED_EXIT (a configuration that cannot work: a resume that would mix two runs).
EXIT_RETRY = names.EXIT_RETRY
REFUSED_EXIT = names.EXIT_CONFIG
CHECKPOINT_FAILED_EXIT = names.EXIT_CHECKPOINT_FAILED  # a failure: retried from the last committed checkpoint


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    # Defaults from the run contract's environment, so a command needs no flags for what the platform
    # already says.
    env = os.environ.get
    parser.add_argument(
        "--data", default=env(names.DATA_ENV, ""), help="local path or gs:// URL: an .npz or a folder of shards"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=env(names.CHECKPOINT_DIR_ENV, ""),
        help="where checkpoints go (resumes from the newest)",
    )
    parser.add_argument(
        "--model-dir", default=env(names.MODEL_DIR_ENV, ""), help="where the final model and metrics.json go"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="total training steps (default: from --epochs)")
    parser.add_argument("--batch-size", type=int, default=256)
    # The same defaults as the stack settings (workloads.<name>.*).
    parser.add_argument("--checkpoint-every-steps", type=int, default=200)
    parser.add_argument("--checkpoint-every-minutes", type=float, default=10.0)
    parser.add_argument(
        "--steps-per-call", type=int, default=32, help="training steps per call to the device: fewer host round trips"
    )
    parser.add_argument("--run-id", default=os.environ.get(names.RUN_ID_ENV, "local"))
    parser.add_argument("--tpu", choices=("auto", "local", "none"), default="auto", help="use a TPU: auto-detect")
    # Only the platform's agent writes the run-complete object (when the command exits 0); `status` reads it.
    parser.add_argument("--status-dir", default="", help="where the platform's run-complete object is (read only)")
    return parser.parse_args(argv)


# -------------------------------------------------------------------------------------------- logs
class Log:
    """One JSON object per line, each in one write (run_contract/lines.py): Cloud Logging turns them into
    structured entries with severity."""

    def __init__(self, run_id: str, process: int = 0):
        self.run_id = run_id
        self.process = process

    def __call__(self, message: str, severity: str = "INFO", **fields: Any) -> None:
        entry = {"severity": severity, "message": message, "run_id": self.run_id, "process": self.process, **fields}
        line(json.dumps(entry, default=str))


# ----------------------------------------------------------------------------------------- storage
def _split_gs(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    return bucket, prefix.strip("/")


@dataclass
class Store:
    """A folder, local or gs://; object names are relative to it."""

    root: str
    _client: Any = field(default=None, repr=False)

    @property
    def remote(self) -> bool:
        return self.root.startswith("gs://")

    def _bucket(self) -> tuple[Any, str]:
        if self._client is None:
            from google.cloud import storage  # only when gs:// is used

            self._client = storage.Client()
        bucket, prefix = _split_gs(self.root)
        return self._client.bucket(bucket), prefix

    def _key(self, prefix: str, name: str) -> str:
        return f"{prefix}/{name}" if prefix else name

    def child(self, name: str) -> Store:
        return Store(self.root.rstrip("/") + "/" + name, self._client)

    def list(self, prefix: str = "") -> list[str]:
        """Names (relative to the root) of every object under `prefix`."""
        if self.remote:
            bucket, root = self._bucket()
            start = self._key(root, prefix)
            cut = len(root) + 1 if root else 0
            return sorted(b.name[cut:] for b in bucket.client.list_blobs(bucket, prefix=start))
        base = Path(self.root)
        # os.walk skips folders that vanish while it walks (a writer rotating old checkpoints away).
        return sorted(
            str((Path(folder) / name).relative_to(base))
            for folder, _, names in os.walk(base / prefix)
            for name in names
        )

    def exists(self, name: str) -> bool:
        if self.remote:
            bucket, root = self._bucket()
            return bucket.blob(self._key(root, name)).exists()
        return (Path(self.root) / name).is_file()

    def read(self, name: str) -> bytes:
        if self.remote:
            bucket, root = self._bucket()
            return bucket.blob(self._key(root, name)).download_as_bytes()
        return (Path(self.root) / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        if self.remote:
            bucket, root = self._bucket()
            bucket.blob(self._key(root, name)).upload_from_string(data)
            return
        path = Path(self.root) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(data)
        partial.replace(path)  # atomic on one filesystem

    def delete(self, name: str) -> None:
        if self.remote:
            bucket, root = self._bucket()
            bucket.blob(self._key(root, name)).delete()
        else:
            path = Path(self.root) / name
            path.unlink(missing_ok=True)
            with contextlib.suppress(FileNotFoundError, OSError):  # gone already, or not empty
                if path.parent != Path(self.root):
                    path.parent.rmdir()


# ------------------------------------------------------------------------------------- checkpoints
class ResumeRefusedError(Exception):
    """The checkpoints under this run id were written by another program, batch size, data or framework."""


IDENTITY = "RUN_IDENTITY.json"  # beside the checkpoints


@dataclass(frozen=True)
class RunIdentity:
    """What a run's checkpoints only make sense with, recorded beside them (IDENTITY) when the run
    first starts and checked at every start: a run id restarted with another program, framework,
    batch size or data is refused, whichever framework wrote the checkpoints (or none yet)."""

    program: str
    framework_version: str
    batch_size: int
    data_fingerprint: str

    def mismatches(self, saved: dict[str, Any]) -> list[str]:
        return [f"{key} {saved.get(key)!r} (now {v!r})" for key, v in asdict(self).items() if saved.get(key) != v]


class Checkpointer(Protocol):
    """A workload's checkpoints, written by its framework (Orbax, tf.train.CheckpointManager): the loop
    says when and with what run state (step, resumes, wall seconds: a small JSON object saved inside
    each checkpoint); the framework writes, rotates and commits."""

    where: str  # for messages: the checkpoint folder

    def steps(self) -> list[int]:
        """The committed checkpoints' steps, oldest first (a half-written one is not listed)."""
        ...

    def run_state(self, step: int) -> dict[str, Any]:
        """The run state saved with checkpoint `step`, read without restoring the model."""
        ...

    def restore(self, step: int) -> None:
        """Load checkpoint `step` into the model and optimizer; raises if it cannot be read."""
        ...

    def save(self, step: int, run_state: dict[str, Any], force: bool) -> bool:
        """Save at `step` if the framework's step interval says so, or `force`; True if it saved. May
        return before the files are on storage (an async save); on many processes, every one calls it."""
        ...

    def wait(self) -> None:
        """Return once every save so far is committed."""
        ...

    def failure(self) -> str | None:
        """Why a save of this process failed in the background, without waiting for saves in flight; None
        if none has (yet). The run then ends (FailFast): a failed save is never retried in place."""
        ...


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpack(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data)) as loaded:
        return {k: loaded[k] for k in loaded.files}


# -------------------------------------------------------------------------------------- preemption
class Preemption:
    """GCE sends SIGTERM before reclaiming a spot VM; the loop checks `requested` after each step.

    Take it after the framework has started: jax.distributed.initialize installs a SIGTERM handler of
    its own (XLA's preemption notifier), which would otherwise take the notice.

    Once the program is on its way out (its atexit handlers run), a SIGTERM asks for nothing it is not
    already doing, and is ignored. CPython's finalization would otherwise give SIGTERM back its default
    action (`_PySignal_Fini`, which `Py_FinalizeEx` calls after the atexit handlers) while the modules are
    still torn down (jaxlib's runtime: a tenth of a second or more), and a notice then would end a program
    that leaves with 75, its stop committed, by that signal instead. A slice's other hosts are told just
    then: a peer's notice stopped them, and their own agents' arrives as they leave.
    """

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        atexit.register(signal.signal, signal.SIGTERM, signal.SIG_IGN)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True


class Peers:
    """How the processes of one run agree, at each step boundary, on what only one of them may know:
    a SIGTERM (GCE signals one host of a slice), a checkpoint due by its clock. One process agrees with
    itself; a multi-host workload passes a subclass backed by its framework's collectives."""

    count = 1

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every process's `values`, in process order (an all-gather)."""
        return [values]

    def barrier(self, name: str) -> None:
        """Return once every process has reached the barrier `name`."""

    def any(self, flags: list[bool]) -> list[bool]:
        return [any(column) for column in zip(*self.gather([int(f) for f in flags]), strict=True)]

    def report_failure(self, reason: str) -> None:
        """Tell the other processes that this one ends for `reason` (its checkpoint failed), before it exits.
        Returns once they have seen it, or after a bounded wait."""

    def failure(self) -> str | None:
        """A failure another process reported, without waiting; None if none."""
        return None


def exit_now(code: int) -> NoReturn:
    """End this process with `code` at once. A normal exit would wait for what a failed save leaves
    behind: the framework's background save threads, held at a commit barrier that a failed host never
    reaches, and jax.distributed's shutdown barrier, which the other processes never reach."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class FailFast:
    """A checkpoint that one process cannot write ends every process of the run at once, with
    CHECKPOINT_FAILED_EXIT, instead of leaving them waiting for it.

    An async save fails in a background thread: Orbax's save thread records the error and never reaches
    the `async_write_complete` barrier, where every other process waits for it up to AsyncOptions'
    `timeout_secs` (1200 s), and the failing process's next save or wait blocks at the next barrier
    (orbax-checkpoint 0.12.8: `_background_wait_for_commit_futures` in
    _src/checkpointers/async_checkpointer.py, `CheckpointManager._finalize` in checkpoint_manager.py).
    So a thread asks, every POLL_SECONDS, this process's checkpointer for a failed save (`failure`, which
    does not wait) and the peers for a failure one of them reported; the loop itself ends the same way
    when a save or wait raises. The process that failed tells the others first.
    """

    POLL_SECONDS = 1.0

    def __init__(self, checkpoints: Checkpointer, peers: Peers, log: Log):
        self.checkpoints, self.peers, self.log = checkpoints, peers, log
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="runlib-fail-fast", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.wait(self.POLL_SECONDS):
            if reason := self.checkpoints.failure():
                self.save_failed(reason)
            self.peer_failed()

    def save_failed(self, reason: str) -> NoReturn:
        self.log("checkpoint save failed; ending the run", severity="ERROR", error=reason[:2000])
        self.peers.report_failure(reason[:2000])
        exit_now(CHECKPOINT_FAILED_EXIT)

    def peer_failed(self) -> None:
        """End this process if another one reported a failure."""
        if reason := self.peers.failure():
            self.log("another process's checkpoint save failed; ending the run", severity="ERROR", error=reason)
            exit_now(CHECKPOINT_FAILED_EXIT)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


@dataclass
class Clock:
    """A checkpoint due by time (the framework counts steps): every `every_seconds` since the last."""

    every_seconds: float
    last: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.every_seconds

    def reset(self) -> None:
        self.last = time.monotonic()


# -------------------------------------------------------------------------------------------- data
@dataclass
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    read_seconds: float = 0.0

    def fingerprint(self) -> str:
        """A short digest of the training examples: a resume on different data is refused."""
        digest = hashlib.sha256()
        for array in (self.x_train, self.y_train):
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).data)
        return digest.hexdigest()[:16]


def load_data(location: str, cache_dir: str = "", workers: int = 8) -> Dataset:
    """An .npz (Keras mnist.npz layout) or a folder of shards written by prepare_data.py.

    Shards are fetched in parallel and cached on local disk, so a restarted run reads nothing twice.
    """
    started = time.perf_counter()
    if location.endswith(".npz"):
        parent, _, name = location.rpartition("/")
        arrays = unpack(Store(parent or ".").read(name))
        return Dataset(
            arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"], time.perf_counter() - started
        )
    store = Store(location)
    cache = Path(cache_dir or tempfile.gettempdir()) / "tpu-platform-data" / re.sub(r"[^A-Za-z0-9]+", "_", location)
    cache.mkdir(parents=True, exist_ok=True)
    names = [n for n in store.list() if n.endswith(".npz")]
    if not names:
        raise FileNotFoundError(f"no .npz shards under {location}")

    def fetch(name: str) -> tuple[str, dict[str, np.ndarray]]:
        local = cache / name.replace("/", "_")
        if not local.exists():
            local.write_bytes(store.read(name))
        return name, unpack(local.read_bytes())

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        shards = dict(pool.map(fetch, names))
    parts: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    labels: dict[str, list[np.ndarray]] = {"train": [], "test": []}
    for name in sorted(shards):
        split = "test" if name.startswith("test") else "train"
        parts[split].append(shards[name]["x"])
        labels[split].append(shards[name]["y"])
    return Dataset(
        np.concatenate(parts["train"]),
        np.concatenate(labels["train"]),
        np.concatenate(parts["test"]),
        np.concatenate(labels["test"]),
        time.perf_counter() - started,
    )


def epoch_order(epoch: int, count: int, seed: int = 0) -> np.ndarray:
    """The same shuffled order for an epoch on every (re)start: resume continues the data position."""
    return np.random.default_rng(seed + epoch).permutation(count)


def batches(
    data: Dataset, batch_size: int, start_step: int, total_steps: int, per_call: int = 1, boundary: int = 0
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(first step, count, x, y) from `start_step` on: x[per_call, batch, ...] stacks the batches of the
    `count` steps from `first`. count is per_call, or fewer where a chunk would cross a multiple of
    `boundary` (the checkpoint interval) or the end; the rows after them are zeros, which no step may train
    on. One shape for every chunk, so a framework traces (compiles) its step once, not once more for each
    shorter chunk. per_call is capped at `boundary` and at the run's steps, so that no chunk is larger than a
    whole interval or run (a chunk that ends at an interval not a multiple of per_call is still mostly padding:
    8 of 32 in the seed's job, which costs a call, not a compile). Full batches only (static shapes for TPUs);
    built ahead on a thread, so training rarely waits."""
    per_epoch = len(data.x_train) // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(data.x_train)} training examples")
    if per_call < 1:
        raise ValueError(f"steps per call must be at least 1, not {per_call}")
    per_call = min(per_call, boundary or per_call, max(total_steps, 1))

    def rows(step: int) -> np.ndarray:
        epoch, index = divmod(step, per_epoch)
        return epoch_order(epoch, len(data.x_train))[index * batch_size : (index + 1) * batch_size]

    def gather(source: np.ndarray, order: np.ndarray) -> np.ndarray:
        """source's rows `order` [count, batch] into a new [per_call, batch, ...] array: the rows are copied
        once, straight into place, and only the padding rows are written besides. np.take into `out`, with
        mode "clip" (which these indices never need): with the default "raise", "`out` is always buffered"
        (the `take` docstring of numpy 2.4.6, the installed one), a second copy."""
        chunk = np.empty((per_call, *order.shape[1:], *source.shape[1:]), source.dtype)
        np.take(source, order, axis=0, out=chunk[: len(order)], mode="clip")
        chunk[len(order) :] = 0
        return chunk

    def produce(out: queue.Queue) -> None:
        step = start_step
        while step < total_steps:
            end = min(step + per_call, total_steps)
            if boundary:
                end = min(end, (step // boundary + 1) * boundary)
            order = np.stack([rows(s) for s in range(step, end)])
            out.put((step, end - step, gather(data.x_train, order), gather(data.y_train, order)))
            step = end
        out.put(None)

    prefetched: queue.Queue = queue.Queue(maxsize=2)
    threading.Thread(target=produce, args=(prefetched,), daemon=True).start()
    while (item := prefetched.get()) is not None:
        yield item


def tensorboard_dir(model_dir: str) -> str:
    """Where a workload writes its TensorBoard events: the run `train` below `<model-dir>/tensorboard/`."""
    return model_dir.rstrip("/") + "/tensorboard/train"


def steps_for(args: argparse.Namespace, examples: int) -> int:
    return args.steps or args.epochs * (examples // args.batch_size)


# ----------------------------------------------------------------------------------- the training loop
@dataclass
class Outcome:
    step: int
    preempted: bool
    metrics: dict[str, Any]  # steps, wall time, resumes, throughput, checkpoint and input figures


def check_identity(checkpoint_dir: str, identity: RunIdentity, process: int, peers: Peers) -> None:
    """Refuse (ResumeRefusedError, on every process) a run whose folder records another identity;
    record it (process 0) when there is none yet."""
    store = Store(checkpoint_dir)
    recorded = json.loads(store.read(IDENTITY)) if store.exists(IDENTITY) else None
    wrong = identity.mismatches(recorded) if recorded is not None else []
    if peers.any([bool(wrong)])[0]:
        raise ResumeRefusedError(
            f"the checkpoints in {checkpoint_dir} were written with {', '.join(wrong) or 'other settings'}; "
            "resuming them would mix two different runs. Start a new run id (the workload's `run` setting) "
            "to train from scratch, or restore the settings they were written with."
        )
    if recorded is None and process == 0:
        store.write(IDENTITY, json.dumps(asdict(identity), sort_keys=True).encode())


def resume(checkpoints: Checkpointer, log: Log) -> dict[str, Any] | None:
    """Restore the newest committed checkpoint that loads, newest first; its run state, or None if none.

    A checkpoint that cannot be read or restored (a corrupt or missing file) is skipped with a warning.
    If checkpoints exist but none loads, the run stops (ResumeRefusedError), rather than silently
    starting over under the same run id.
    """
    failures = []
    for step in reversed(checkpoints.steps()):
        try:
            state = checkpoints.run_state(step)
            checkpoints.restore(step)
            return state
        except Exception as error:  # any unreadable checkpoint: fall back to the previous one
            failures.append(f"step {step}: {type(error).__name__}: {str(error)[:300]}")
            log(
                "checkpoint cannot be loaded; falling back to the previous one",
                severity="WARNING",
                step=step,
                error=failures[-1],
            )
    if failures:
        raise ResumeRefusedError(
            f"no checkpoint in {checkpoints.where} can be loaded ({'; '.join(failures)}). "
            "Start a new run id (the workload's `run` setting) to train from scratch."
        )
    return None


def train(
    args: argparse.Namespace,
    log: Log,
    data: Dataset,
    checkpoints: Checkpointer | None,
    identity: RunIdentity,
    preemption: Preemption,
    step_fn: Callable[[np.ndarray, np.ndarray, int], Any],
    process: int = 0,
    peers: Peers | None = None,
    on_log: Callable[[int, float], None] | None = None,
) -> Outcome:
    """The loop every workload shares: resume, train, checkpoint on time and on SIGTERM.

    `step_fn(x, y, count)` trains on the first `count` of the global batches stacked as x[steps per call,
    batch, ...] (uint8 images, as stored; `batches` gives every chunk that one shape, padded after its
    `count` steps with rows no step may train on) in one call to the device, and returns the last loss as
    anything `float()` reads (the loop reads it only to log, every 50 steps or so, and before a save, so
    the host does not wait for the device every call); `on_log(step, loss)` sees each logged loss (the
    workload's TensorBoard). The checkpointer's framework saves by its step interval; the loop forces a save when
    `--checkpoint-every-minutes` have passed, at the end, and on SIGTERM.

    On many processes (`peers`), all resume from the same step, decide together at each step boundary
    whether a save is due by time and whether to stop (one host's SIGTERM stops them all), save
    together (the framework's collective save), and on a stop wait at a barrier until the checkpoint is
    committed: the slice stops at one step, resumable.
    """
    peers = peers or Peers()
    total = steps_for(args, len(data.x_train))
    state: dict[str, Any] = {"step": 0, "resumes": 0, "wall_seconds": 0.0}
    restore_seconds = 0.0
    if checkpoints:
        check_identity(args.checkpoint_dir, identity, process, peers)
        started = time.perf_counter()
        if (restored := resume(checkpoints, log)) is not None:
            state = {key: restored[key] for key in state}
            state["resumes"] += 1
            restore_seconds = time.perf_counter() - started
            log(RESTORED_MESSAGE, step=state["step"], resumes=state["resumes"], seconds=restore_seconds)
    if len({values[0] for values in peers.gather([state["step"]])}) > 1:  # a restart (systemd) lists again
        raise RuntimeError(f"the processes resumed from different steps: {peers.gather([state['step']])}")
    if state["step"] > total:
        raise ResumeRefusedError(f"the checkpoint is at step {state['step']}, beyond this run's {total} steps")

    fail_fast = FailFast(checkpoints, peers, log) if checkpoints else None
    try:
        return _train(args, log, data, checkpoints, preemption, step_fn, peers, on_log, state, restore_seconds)
    except CheckpointFailedError as failed:
        assert fail_fast
        fail_fast.save_failed(str(failed))
    except Exception:
        if fail_fast:  # a peer that ended for its failed save breaks this one's collectives
            fail_fast.peer_failed()
        raise
    finally:
        if fail_fast:
            fail_fast.stop()


class CheckpointFailedError(Exception):
    """A save, or the wait for one, raised: this process's checkpoint was not written."""


@contextlib.contextmanager
def _saving() -> Iterator[None]:
    try:
        yield
    except Exception as error:
        raise CheckpointFailedError(f"{type(error).__name__}: {error}") from error


def _train(
    args: argparse.Namespace,
    log: Log,
    data: Dataset,
    checkpoints: Checkpointer | None,
    preemption: Preemption,
    step_fn: Callable[[np.ndarray, np.ndarray, int], Any],
    peers: Peers,
    on_log: Callable[[int, float], None] | None,
    state: dict[str, Any],
    restore_seconds: float,
) -> Outcome:
    """`train`'s loop, from the resumed `state`."""
    total = steps_for(args, len(data.x_train))
    clock = Clock(60 * args.checkpoint_every_minutes)
    stalled = waited = 0.0
    start_step = step = state["step"]
    begun = session_start = time.perf_counter()
    # Chunks end at multiples of the step interval, so the framework's interval sees every one.
    stream = batches(data, args.batch_size, start_step, total, args.steps_per_call, args.checkpoint_every_steps)
    preempted = False
    while step < total:
        fetch = time.perf_counter()
        item = next(stream, None)
        waited += time.perf_counter() - fetch
        if item is None:
            break
        first, count, x, y = item
        loss = step_fn(x, y, count)  # not read here: reading it would wait for the device every call
        step = first + count
        if step // 50 > first // 50 or step == total:
            value = round(float(loss), 5)
            log("training", step=step, loss=value, total_steps=total)
            if on_log:
                on_log(step, value)
        if not checkpoints:
            preempted = peers.any([preemption.requested])[0]
            if preempted:
                break
            continue
        timed, stop = peers.any([clock.due(), preemption.requested])
        force = timed or stop or step == total
        if force or (args.checkpoint_every_steps and step % args.checkpoint_every_steps == 0):
            # A save copies the state once the chunk's steps have run (Orbax: transfer_arrays_to_host waits
            # for the arrays), and those steps may still be queued (JAX dispatches asynchronously): wait for
            # them first, so that the stall below is the save's own and the wait counts as training.
            float(loss)
        snapshot = time.perf_counter()
        state.update(step=step, wall_seconds=state["wall_seconds"] + snapshot - begun)
        begun = snapshot
        with _saving():
            saved = checkpoints.save(step, dict(state), force=force)
        if saved:
            clock.reset()
        if stop:
            with _saving():
                checkpoints.wait()
            if peers.count > 1:
                peers.barrier(f"stop-{step}")  # no process leaves before the checkpoint is committed
            preempted = True
        stall = time.perf_counter() - snapshot
        stalled += stall
        if saved:  # the agent's timeline reads it (run_contract/timeline.py): training stalled this long
            log(CHECKPOINT_MESSAGE, step=step, seconds=round(stall, 4))
        if stop:
            break
    if checkpoints:
        with _saving():
            checkpoints.wait()  # the last save is on storage before we go on
    if preempted:
        log(
            "SIGTERM: checkpoint written, exiting for preemption",
            severity="WARNING",
            step=step,
            signalled_here=preemption.requested,
        )

    wall = state["wall_seconds"] + time.perf_counter() - begun
    session = time.perf_counter() - session_start  # this process only, for throughput figures
    trained = step - start_step
    return Outcome(
        step=step,
        preempted=preempted,
        metrics={
            "steps": step,
            "wall_seconds": round(wall, 3),
            "resumes": state["resumes"],
            "examples_per_second": round(trained * args.batch_size / session, 1) if session else None,
            "input_wait_share": round(waited / session, 4) if session else None,
            "checkpoint_stall_share": round(stalled / session, 4) if session else None,
            "checkpoint_restore_seconds": round(restore_seconds, 4),
            "data_read_seconds": round(data.read_seconds, 4),
        },
    )


def finish(
    args: argparse.Namespace,
    program: str,
    model_files: dict[str, bytes],
    metrics: dict[str, Any],
    process: int,
) -> None:
    """Export the model and metrics, then mark the run complete beside its checkpoints (the platform's
    `<status-dir>/COMPLETE` is the agent's to write, once the command exits 0). Only process 0 writes."""
    if process != 0:
        return
    if args.model_dir:
        store = Store(args.model_dir)
        for name, data in model_files.items():
            store.write(name, data)
        store.write("metrics.json", json.dumps(metrics, sort_keys=True, indent=2).encode())
    if args.checkpoint_dir:
        Store(args.checkpoint_dir).write(COMPLETE, json.dumps(metrics, sort_keys=True).encode())


def status(checkpoint_dir: str, status_dir: str = "", run_id: str = "") -> str:
    """`complete` when this run finished: its checkpoints' marker, or the status marker naming this run.

    The status marker is per VM: a marker left by an earlier run id does not count for a new one."""
    done = bool(checkpoint_dir and Store(checkpoint_dir).exists(COMPLETE))
    if not done and status_dir and Store(status_dir).exists(COMPLETE):
        try:
            marked = json.loads(Store(status_dir).read(COMPLETE)).get("runId")
        except (ValueError, AttributeError):
            marked = None
        done = not run_id or marked == run_id
    return "complete" if done else "incomplete"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runlib.py")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("status", help="print `complete` once either of the run's completion markers exists")
    ask.add_argument("--checkpoint-dir", default="")
    ask.add_argument("--status-dir", default=os.environ.get(names.STATUS_DIR_ENV, ""))
    ask.add_argument("--run-id", default=os.environ.get(names.RUN_ID_ENV, ""))
    args = parser.parse_args(argv)
    print(status(args.checkpoint_dir, args.status_dir, args.run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
