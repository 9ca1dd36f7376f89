#!/usr/bin/env python3
"""What every tpu-platform workload shares, with no ML framework imported here.

- One command-line contract: data, checkpoint and model locations, epochs/steps, batch size,
  checkpoint intervals (by steps and by minutes), run id.
- Storage for local paths and gs:// URLs (google-cloud-storage, which honours STORAGE_EMULATOR_HOST).
- Checkpoints that are never picked up half-written: files go to `ckpt-<step>/`, then a COMMITTED
  manifest is written last; resume takes the newest step that has its manifest and loads, falling
  back past one that does not. The manifest records what wrote it (program, framework version,
  batch size, data fingerprint): a run resumed with anything else is refused, not silently mixed.
  Writes happen on a background thread, so training waits only for the snapshot to host memory.
- Completion markers, so a finished run never starts again (the start-up script asks `status`):
  COMPLETE beside the checkpoints, and a JSON object at `<status-dir>/COMPLETE` that the platform's
  guard reacts to (it stops or deletes the TPU; the VM itself needs no TPU API rights).
- Preemption: SIGTERM sets a flag; the training loop writes a final checkpoint and exits.
- Structured log lines (JSON with severity, run id, step, loss) that Cloud Logging parses.
- Sharded training data: parallel reads of shard files, cached locally, prefetched.

As a program: `python3 runlib.py status --checkpoint-dir URL [--status-dir URL]` prints `complete`
(either marker exists) or `incomplete`.
"""

from __future__ import annotations

import argparse
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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

COMMITTED = "COMMITTED"
COMPLETE = "COMPLETE"
# Exit codes of the run contract (README, "The run contract"; sysexits.h): the platform's agent retries
# a run that exits EXIT_RETRY (stopped mid-run: it resumes from its checkpoint) and never one that
# exits REFUSED_EXIT (a configuration that cannot work: a resume that would mix two runs).
EXIT_RETRY = 75  # EX_TEMPFAIL
REFUSED_EXIT = 78  # EX_CONFIG
_CKPT = re.compile(r"ckpt-(\d{10})$")


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    # Defaults from the run contract's environment, so a command needs no flags for what the platform
    # already says.
    env = os.environ.get
    parser.add_argument("--data", default=env("TPU_PLATFORM_DATA", ""),
                        help="local path or gs:// URL: an .npz or a folder of shards")  # fmt: skip
    parser.add_argument("--checkpoint-dir", default=env("TPU_PLATFORM_CHECKPOINT_DIR", ""),
                        help="where checkpoints go (resumes from the newest)")  # fmt: skip
    parser.add_argument("--model-dir", default=env("TPU_PLATFORM_MODEL_DIR", ""),
                        help="where the final model and metrics.json go")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="total training steps (default: from --epochs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--checkpoint-every-steps", type=int, default=100)
    parser.add_argument("--checkpoint-every-minutes", type=float, default=10.0)
    parser.add_argument("--steps-per-call", type=int, default=32,
                        help="training steps per call to the device: fewer host round trips (S18)")  # fmt: skip
    parser.add_argument("--run-id", default=os.environ.get("TPU_PLATFORM_RUN_ID", "local"))
    parser.add_argument("--tpu", choices=("auto", "local", "none"), default="auto", help="use a TPU: auto-detect")
    # Under the platform's agent the agent writes the run-complete object when the command exits 0;
    # a program run by hand may still write it by naming the folder.
    parser.add_argument("--status-dir", default="",
                        help="where the run-complete object goes (the platform acts on it); empty: none")  # fmt: skip
    # Deprecated: the VM no longer acts on its own TPU (that needed TPU API rights); the platform reads
    # `<status-dir>/COMPLETE` instead. Accepted and ignored so older start-up scripts keep working.
    parser.add_argument("--on-completion", default="", help=argparse.SUPPRESS)
    parser.add_argument("--node", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.on_completion or args.node:
        _deprecated("--on-completion/--node")
    return args


def _deprecated(what: str) -> None:
    why = "the platform stops or deletes a finished run's TPU when <status-dir>/COMPLETE appears"
    print(json.dumps({"severity": "WARNING", "message": f"{what} is deprecated and ignored: {why}"}), flush=True)


# -------------------------------------------------------------------------------------------- logs
class Log:
    """One JSON object per line: Cloud Logging turns them into structured entries with severity."""

    def __init__(self, run_id: str, process: int = 0):
        self.run_id = run_id
        self.process = process

    def __call__(self, message: str, severity: str = "INFO", **fields: Any) -> None:
        entry = {"severity": severity, "message": message, "run_id": self.run_id, "process": self.process, **fields}
        print(json.dumps(entry, default=str), flush=True)


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


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint's state only makes sense with; recorded in each manifest, checked on resume."""

    program: str
    framework_version: str
    batch_size: int
    data_fingerprint: str

    def mismatches(self, manifest: dict[str, Any]) -> list[str]:
        return [
            f"{key} {manifest.get(key)!r} (now {value!r})"
            for key, value in asdict(self).items()
            if manifest.get(key) != value
        ]


@dataclass
class Checkpoints:
    """`ckpt-<step>/` folders of files, each trusted only once its COMMITTED manifest exists.

    `save` hands the files to one background writer (at most one save in flight; the next save or
    `wait` joins it); the manifest is written after every file, so a crash mid-save leaves an
    uncommitted folder that resume skips and the next commit sweeps away.
    """

    store: Store
    identity: RunIdentity | None = None
    keep: int = 3
    _writer: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint"), repr=False
    )
    _pending: concurrent.futures.Future | None = field(default=None, repr=False)

    def committed_steps(self) -> list[int]:
        return sorted(step for step, leaves in self._folders().items() if COMMITTED in leaves)

    def _folders(self) -> dict[int, set[str]]:
        folders: dict[int, set[str]] = {}
        for name in self.store.list():
            folder, _, leaf = name.rpartition("/")
            if match := _CKPT.match(folder):
                folders.setdefault(int(match[1]), set()).add(leaf)
        return folders

    def manifest(self, step: int) -> dict[str, Any]:
        return json.loads(self.store.read(f"ckpt-{step:010d}/{COMMITTED}"))

    def check_identity(self, step: int, manifest: dict[str, Any]) -> None:
        if self.identity and (wrong := self.identity.mismatches(manifest)):
            raise ResumeRefusedError(
                f"checkpoint ckpt-{step:010d} in {self.store.root} was written with {', '.join(wrong)}; "
                "resuming it would mix two different runs. Start a new run id (the workload's `run` "
                "setting) to train from scratch, or restore the settings it was written with."
            )

    def load(self, step: int) -> dict[str, bytes]:
        """The files of one committed checkpoint; ResumeRefusedError when another kind of run wrote it."""
        manifest = self.manifest(step)
        self.check_identity(step, manifest)
        return {name: self.store.read(f"ckpt-{step:010d}/{name}") for name in manifest["files"]}

    def latest(self) -> tuple[int, dict[str, bytes]] | None:
        steps = self.committed_steps()
        return (steps[-1], self.load(steps[-1])) if steps else None

    def save(self, step: int, files: dict[str, bytes]) -> None:
        """Write `files` as checkpoint `step` in the background (after any save still in flight)."""
        self.wait()
        self._pending = self._writer.submit(self._write, step, files)

    def wait(self) -> float | None:
        """Wait for the save in flight; returns the seconds it took to write, None if there was none."""
        pending, self._pending = self._pending, None
        return pending.result() if pending else None

    def _write(self, step: int, files: dict[str, bytes]) -> float:
        started = time.perf_counter()
        folder = f"ckpt-{step:010d}"
        for name, data in files.items():
            self.store.write(f"{folder}/{name}", data)
        manifest = {"step": step, "files": sorted(files), **(asdict(self.identity) if self.identity else {})}
        self.store.write(f"{folder}/{COMMITTED}", json.dumps(manifest, sort_keys=True).encode())
        self._clean_up(step)
        return time.perf_counter() - started

    def _clean_up(self, newest: int) -> None:
        """Rotate committed checkpoints beyond `keep`; sweep uncommitted folders older than `newest`
        (saves that died before their manifest). Newer uncommitted folders may be a save in progress."""
        folders = self._folders()
        committed = sorted(step for step, leaves in folders.items() if COMMITTED in leaves)
        doomed = [s for s in committed[: -self.keep]] + [
            s for s, leaves in folders.items() if COMMITTED not in leaves and s < newest
        ]
        for old in doomed:
            names = self.store.list(f"ckpt-{old:010d}/")
            for name in names:
                if not name.endswith(COMMITTED):
                    self.store.delete(name)
            if f"ckpt-{old:010d}/{COMMITTED}" in names:
                self.store.delete(f"ckpt-{old:010d}/{COMMITTED}")  # the manifest goes last

    def complete(self) -> dict[str, Any] | None:
        return json.loads(self.store.read(COMPLETE)) if self.store.exists(COMPLETE) else None

    def mark_complete(self, summary: dict[str, Any]) -> None:
        self.store.write(COMPLETE, json.dumps(summary, sort_keys=True).encode())


def pack(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpack(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data)) as loaded:
        return {k: loaded[k] for k in loaded.files}


# -------------------------------------------------------------------------------------- preemption
class Preemption:
    """GCE sends SIGTERM before reclaiming a spot VM; the loop checks `requested` after each step."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

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


@dataclass
class CheckpointTimer:
    every_steps: int
    every_seconds: float
    last_step: int = 0
    last_time: float = field(default_factory=time.monotonic)

    def due(self, step: int) -> bool:
        return step - self.last_step >= self.every_steps or time.monotonic() - self.last_time >= self.every_seconds

    def done(self, step: int) -> None:
        self.last_step, self.last_time = step, time.monotonic()


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
        return Dataset(arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"],
                       time.perf_counter() - started)  # fmt: skip
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
        np.concatenate(parts["train"]), np.concatenate(labels["train"]),
        np.concatenate(parts["test"]), np.concatenate(labels["test"]),
        time.perf_counter() - started,
    )  # fmt: skip


def epoch_order(epoch: int, count: int, seed: int = 0) -> np.ndarray:
    """The same shuffled order for an epoch on every (re)start: resume continues the data position."""
    return np.random.default_rng(seed + epoch).permutation(count)


def batches(
    data: Dataset, batch_size: int, start_step: int, total_steps: int, per_call: int = 1, boundary: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(first step, x, y) from `start_step` on: `per_call` full batches stacked as x[k, batch, ...] (k is
    smaller where a chunk would cross a multiple of `boundary`, the checkpoint interval, or the end).
    Full batches only (static shapes for TPUs); built ahead on a thread, so training rarely waits."""
    per_epoch = len(data.x_train) // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(data.x_train)} training examples")

    def rows(step: int) -> np.ndarray:
        epoch, index = divmod(step, per_epoch)
        return epoch_order(epoch, len(data.x_train))[index * batch_size : (index + 1) * batch_size]

    def produce(out: queue.Queue) -> None:
        step = start_step
        while step < total_steps:
            end = min(step + per_call, total_steps)
            if boundary:
                end = min(end, (step // boundary + 1) * boundary)
            order = np.stack([rows(s) for s in range(step, end)])
            out.put((step, data.x_train[order], data.y_train[order]))
            step = end
        out.put(None)

    prefetched: queue.Queue = queue.Queue(maxsize=2)
    threading.Thread(target=produce, args=(prefetched,), daemon=True).start()
    while (item := prefetched.get()) is not None:
        yield item


def steps_for(args: argparse.Namespace, examples: int) -> int:
    return args.steps or args.epochs * (examples // args.batch_size)


# ----------------------------------------------------------------------------------- the training loop
@dataclass
class Outcome:
    step: int
    preempted: bool
    metrics: dict[str, Any]  # steps, wall time, resumes, throughput, checkpoint and input figures


def resume(
    checkpoints: Checkpoints, restore: Callable[[dict[str, bytes]], dict[str, Any]], log: Log
) -> dict[str, Any] | None:
    """Restore the newest committed checkpoint that loads, newest first; None when there is none.

    A checkpoint that cannot be read or restored (a corrupt or missing file) is skipped with a warning;
    one written by another kind of run stops everything (ResumeRefusedError). If checkpoints exist but none
    loads, the run stops too, rather than silently starting over under the same run id.
    """
    steps = checkpoints.committed_steps()
    failures = []
    for step in reversed(steps):
        try:
            files = checkpoints.load(step)
            return restore(files)
        except ResumeRefusedError:
            raise
        except Exception as error:  # any unreadable checkpoint: fall back to the previous one
            failures.append(f"ckpt-{step:010d}: {type(error).__name__}: {error}")
            log("checkpoint cannot be loaded; falling back to the previous one", severity="WARNING",
                step=step, error=failures[-1])  # fmt: skip
    if failures:
        raise ResumeRefusedError(
            f"no checkpoint in {checkpoints.store.root} can be loaded ({'; '.join(failures)}). "
            "Start a new run id (the workload's `run` setting) to train from scratch."
        )
    return None


def train(
    args: argparse.Namespace,
    log: Log,
    data: Dataset,
    checkpoints: Checkpoints | None,
    preemption: Preemption,
    process: int,
    restore: Callable[[dict[str, bytes]], dict[str, Any]],
    step_fn: Callable[[np.ndarray, np.ndarray], Any],
    state_files: Callable[[dict[str, Any]], dict[str, bytes]],
    peers: Peers | None = None,
) -> Outcome:
    """The loop every workload shares: resume, train, checkpoint on time and on SIGTERM.

    `restore` loads a checkpoint's files into the model and returns its state (step, resumes,
    wall_seconds); `step_fn` trains on k global batches stacked as x[k, batch, ...] (uint8 images, as
    stored) in one call to the device, and returns the last loss as anything `float()` reads (the loop
    reads it only to log, so the host does not wait for the device every call); `state_files` snapshots
    the model and optimizer with the state into bytes (the training stalls for that only: the
    writing happens in the background). Only process 0 writes checkpoints (the state is replicated).

    On many processes (`peers`), all resume from the same step, decide together at each step boundary
    whether to checkpoint and whether to stop (one host's SIGTERM stops them all), and on a stop wait
    at a barrier until process 0's checkpoint is committed: the slice stops at one step, resumable.
    """
    peers = peers or Peers()
    total = steps_for(args, len(data.x_train))
    state: dict[str, Any] = {"step": 0, "resumes": 0, "wall_seconds": 0.0}
    restore_seconds = 0.0
    if checkpoints:
        started = time.perf_counter()
        if (restored := resume(checkpoints, restore, log)) is not None:
            state = restored
            state["resumes"] += 1
            restore_seconds = time.perf_counter() - started
            log("resumed from checkpoint", step=state["step"], resumes=state["resumes"], seconds=restore_seconds)
    if len({values[0] for values in peers.gather([state["step"]])}) > 1:  # a restart (systemd) lists again
        raise RuntimeError(f"the processes resumed from different steps: {peers.gather([state['step']])}")
    if state["step"] > total:
        raise ResumeRefusedError(f"the checkpoint is at step {state['step']}, beyond this run's {total} steps")

    timer = CheckpointTimer(args.checkpoint_every_steps, 60 * args.checkpoint_every_minutes, state["step"])
    write_seconds: list[float] = []
    stalled = waited = 0.0
    start_step = step = state["step"]
    begun = session_start = time.perf_counter()
    stream = batches(data, args.batch_size, start_step, total, args.steps_per_call, args.checkpoint_every_steps)
    preempted = False
    while step < total:
        fetch = time.perf_counter()
        item = next(stream, None)
        waited += time.perf_counter() - fetch
        if item is None:
            break
        first, x, y = item
        loss = step_fn(x, y)  # not read here: reading it would wait for the device every call
        step = first + len(x)
        if step // 50 > first // 50 or step == total:
            log("training", step=step, loss=round(float(loss), 5), total_steps=total)
        due, stop = peers.any([bool(checkpoints) and (timer.due(step) or step == total), preemption.requested])
        if checkpoints and (due or stop):
            snapshot = time.perf_counter()
            state.update(step=step, wall_seconds=state["wall_seconds"] + snapshot - begun)
            begun = snapshot
            if process == 0:
                if (seconds := checkpoints.wait()) is not None:
                    write_seconds.append(seconds)
                checkpoints.save(step, state_files(state))
                log("checkpoint saving", step=step)
                if stop and peers.count > 1 and (seconds := checkpoints.wait()) is not None:
                    write_seconds.append(seconds)
            if stop and peers.count > 1:
                peers.barrier(f"stop-{step}")  # no process leaves before the checkpoint is committed
            timer.done(step)
            stalled += time.perf_counter() - snapshot
        if stop:
            preempted = True
            break
    if checkpoints and (seconds := checkpoints.wait()) is not None:  # the last save is on disk before we go on
        write_seconds.append(seconds)
    if preempted:
        log("SIGTERM: checkpoint written, exiting for preemption", severity="WARNING", step=step,
            signalled_here=preemption.requested)  # fmt: skip

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
            "checkpoint_write_seconds": round(float(np.mean(write_seconds)), 4) if write_seconds else None,
            "checkpoint_restore_seconds": round(restore_seconds, 4),
            "data_read_seconds": round(data.read_seconds, 4),
        },
    )


def finish(
    args: argparse.Namespace,
    checkpoints: Checkpoints | None,
    program: str,
    model_files: dict[str, bytes],
    metrics: dict[str, Any],
    process: int,
) -> None:
    """Export the model and metrics, mark the run complete beside its checkpoints, then tell the
    platform: the object at `<status-dir>/COMPLETE` is what its guard acts on, so it comes last.

    Only process 0 writes."""
    if process != 0:
        return
    if args.model_dir:
        store = Store(args.model_dir)
        for name, data in model_files.items():
            store.write(name, data)
        store.write("metrics.json", json.dumps(metrics, sort_keys=True, indent=2).encode())
    if checkpoints is not None:
        checkpoints.mark_complete(metrics)
    if args.status_dir:
        Store(args.status_dir).write(COMPLETE, json.dumps(completion(args.run_id, program, metrics)).encode())


def completion(run_id: str, program: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The run-complete object: which run, written by runlib, when (RFC 3339, UTC), how far and with what
    figures. Its schema is the platform's (infra/completion_marker.py; tests/test_runlib.py checks this)."""
    now = datetime.now(timezone.utc)  # noqa: UP017 - TPU VM images run Python 3.10 (no datetime.UTC)
    finished = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {"runId": run_id, "writtenBy": "runlib", "program": program, "steps": metrics.get("steps"),
            "finishedAt": finished, "metrics": metrics}  # fmt: skip


def status(checkpoint_dir: str, status_dir: str = "", run_id: str = "") -> str:
    """`complete` when this run finished: its checkpoints' marker, or the status marker naming this run.

    The status marker is per VM: a marker left by an earlier run id does not count for a new one."""
    done = bool(checkpoint_dir and Checkpoints(Store(checkpoint_dir)).complete())
    if not done and status_dir and Store(status_dir).exists(COMPLETE):
        try:
            marked = json.loads(Store(status_dir).read(COMPLETE)).get("runId")
        except (ValueError, AttributeError):
            marked = None
        done = not run_id or marked == run_id
    return "complete" if done else "incomplete"


def announce(checkpoint_dir: str, status_dir: str, run_id: str, program: str) -> bool:
    """Write `<status-dir>/COMPLETE` again for a run complete beside its checkpoints.

    A VM that boots after its run completed (started by hand, or re-created) tells the platform
    again: the new object's finalize event makes the guard stop or delete the node once more, so
    finished work never keeps idle chips billing. Also heals a run that died between its two markers.
    """
    summary = Checkpoints(Store(checkpoint_dir)).complete() if checkpoint_dir else None
    if summary is None or not status_dir:
        return False
    Store(status_dir).write(COMPLETE, json.dumps(completion(run_id, program, summary)).encode())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runlib.py")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("status", help="print `complete` once either of the run's completion markers exists")
    ask.add_argument("--checkpoint-dir", default="")
    ask.add_argument("--status-dir", default=os.environ.get("TPU_PLATFORM_STATUS_DIR", ""))
    ask.add_argument("--run-id", default=os.environ.get("TPU_PLATFORM_RUN_ID", ""))
    tell = commands.add_parser("announce", help="write <status-dir>/COMPLETE again for a complete run")
    tell.add_argument("--checkpoint-dir", default=os.environ.get("TPU_PLATFORM_CHECKPOINT_DIR", ""))
    tell.add_argument("--status-dir", default=os.environ.get("TPU_PLATFORM_STATUS_DIR", ""))
    tell.add_argument("--run-id", default=os.environ.get("TPU_PLATFORM_RUN_ID", ""))
    tell.add_argument("--program", default=os.environ.get("TPU_PLATFORM_PROGRAM", ""))
    # Deprecated no-op, kept for start-up scripts rendered before the platform took this over.
    commands.add_parser("on-completion", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command == "status":
        print(status(args.checkpoint_dir, args.status_dir, args.run_id))
    elif args.command == "announce":
        told = announce(args.checkpoint_dir, args.status_dir, args.run_id, args.program)
        print("announced" if told else "nothing to announce")
    else:
        _deprecated("`runlib.py on-completion`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
