#!/usr/bin/env python3
"""What every tpu-platform workload shares, with no ML framework imported here.

- One command-line contract: data, checkpoint and model locations, epochs/steps, batch size,
  checkpoint intervals (by steps and by minutes), run id.
- Storage for local paths and gs:// URLs (google-cloud-storage, which honours STORAGE_EMULATOR_HOST).
- Checkpoints that are never picked up half-written: files go to `ckpt-<step>/`, then a COMMITTED
  marker is written last; resume takes the newest step that has its marker.
- A completion marker, so a finished run never starts again (the start-up script asks `status`).
- Preemption: SIGTERM sets a flag; the training loop writes a final checkpoint and exits.
- Structured log lines (JSON with severity, run id, step, loss) that Cloud Logging parses.
- Sharded training data: parallel reads of shard files, cached locally, prefetched.

As a program: `python3 runlib.py status --checkpoint-dir URL` prints `complete` or `incomplete`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

COMMITTED = "COMMITTED"
COMPLETE = "COMPLETE"
_CKPT = re.compile(r"ckpt-(\d{10})$")


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default="", help="local path or gs:// URL: an .npz or a folder of shards")
    parser.add_argument("--checkpoint-dir", default="", help="where checkpoints go (resumes from the newest)")
    parser.add_argument("--model-dir", default="", help="where the final model and metrics.json go")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="total training steps (default: from --epochs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--checkpoint-every-steps", type=int, default=100)
    parser.add_argument("--checkpoint-every-minutes", type=float, default=10.0)
    parser.add_argument("--run-id", default=os.environ.get("TPU_PLATFORM_RUN_ID", "local"))
    parser.add_argument("--tpu", choices=("auto", "local", "none"), default="auto", help="use a TPU: auto-detect")
    parser.add_argument("--on-completion", choices=("keep", "stop", "delete"), default="keep",
                        help="what to do with this TPU once the run is complete")  # fmt: skip
    parser.add_argument("--node", default="", help="this TPU node: projects/P/locations/Z/nodes/N")
    return parser.parse_args(argv)


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
            if path.parent != Path(self.root) and not any(path.parent.iterdir()):
                path.parent.rmdir()


# ------------------------------------------------------------------------------------- checkpoints
@dataclass
class Checkpoints:
    """`ckpt-<step>/` folders of files, each trusted only once its COMMITTED marker exists."""

    store: Store
    keep: int = 3

    def committed_steps(self) -> list[int]:
        steps = set()
        for name in self.store.list():
            folder, _, leaf = name.rpartition("/")
            match = _CKPT.match(folder)
            if match and leaf == COMMITTED:
                steps.add(int(match[1]))
        return sorted(steps)

    def latest(self) -> tuple[int, dict[str, bytes]] | None:
        steps = self.committed_steps()
        if not steps:
            return None
        folder = f"ckpt-{steps[-1]:010d}"
        manifest = json.loads(self.store.read(f"{folder}/{COMMITTED}"))
        return steps[-1], {name: self.store.read(f"{folder}/{name}") for name in manifest["files"]}

    def save(self, step: int, files: dict[str, bytes]) -> float:
        """Write the files, then the marker; returns seconds taken. Older checkpoints beyond `keep` go."""
        started = time.perf_counter()
        folder = f"ckpt-{step:010d}"
        for name, data in files.items():
            self.store.write(f"{folder}/{name}", data)
        self.store.write(f"{folder}/{COMMITTED}", json.dumps({"step": step, "files": sorted(files)}).encode())
        for old in self.committed_steps()[: -self.keep]:
            for name in self.store.list(f"ckpt-{old:010d}/"):
                if not name.endswith(COMMITTED):
                    self.store.delete(name)
            self.store.delete(f"ckpt-{old:010d}/{COMMITTED}")  # the marker goes last
        return time.perf_counter() - started

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
    data: Dataset, batch_size: int, start_step: int, total_steps: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(step, x, y) from `start_step` on, full batches only (static shapes for TPUs), prefetched."""
    per_epoch = len(data.x_train) // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch size {batch_size} exceeds the {len(data.x_train)} training examples")

    def produce(out: queue.Queue) -> None:
        for step in range(start_step, total_steps):
            epoch, index = divmod(step, per_epoch)
            order = epoch_order(epoch, len(data.x_train))[index * batch_size : (index + 1) * batch_size]
            out.put((step, data.x_train[order], data.y_train[order]))
        out.put(None)

    prefetched: queue.Queue = queue.Queue(maxsize=4)
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


def train(
    args: argparse.Namespace,
    log: Log,
    data: Dataset,
    checkpoints: Checkpoints | None,
    preemption: Preemption,
    process: int,
    restore: Callable[[dict[str, bytes]], dict[str, Any]],
    step_fn: Callable[[np.ndarray, np.ndarray], float],
    state_files: Callable[[dict[str, Any]], dict[str, bytes]],
) -> Outcome:
    """The loop every workload shares: resume, train, checkpoint on time and on SIGTERM.

    `restore` loads a checkpoint's files into the model and returns its state (step, resumes,
    wall_seconds); `step_fn` trains one global batch and returns the loss; `state_files` serialises
    the model and optimizer with the state. Only process 0 writes checkpoints.
    """
    total = steps_for(args, len(data.x_train))
    state: dict[str, Any] = {"step": 0, "resumes": 0, "wall_seconds": 0.0}
    restore_seconds = 0.0
    if checkpoints and (latest := checkpoints.latest()):
        started = time.perf_counter()
        state = restore(latest[1])
        state["resumes"] += 1
        restore_seconds = time.perf_counter() - started
        log("resumed from checkpoint", step=state["step"], resumes=state["resumes"], seconds=restore_seconds)

    timer = CheckpointTimer(args.checkpoint_every_steps, 60 * args.checkpoint_every_minutes, state["step"])
    save_seconds: list[float] = []
    waited = 0.0
    start_step = step = state["step"]
    begun = session_start = time.perf_counter()
    stream = batches(data, args.batch_size, start_step, total)
    preempted = False
    while step < total:
        fetch = time.perf_counter()
        item = next(stream, None)
        waited += time.perf_counter() - fetch
        if item is None:
            break
        step, x, y = item
        loss = step_fn(x, y)
        step += 1
        if step % 50 == 0 or step == total:
            log("training", step=step, loss=round(loss, 5), total_steps=total)
        if checkpoints and (timer.due(step) or preemption.requested or step == total):
            state.update(step=step, wall_seconds=state["wall_seconds"] + time.perf_counter() - begun)
            begun = time.perf_counter()
            if process == 0:
                save_seconds.append(checkpoints.save(step, state_files(state)))
                log("checkpoint written", step=step, seconds=round(save_seconds[-1], 4))
            timer.done(step)
        if preemption.requested:
            log("SIGTERM: checkpoint written, exiting for preemption", severity="WARNING", step=step)
            preempted = True
            break

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
            "checkpoint_write_seconds": round(float(np.mean(save_seconds)), 4) if save_seconds else None,
            "checkpoint_restore_seconds": round(restore_seconds, 4),
            "data_read_seconds": round(data.read_seconds, 4),
        },
    )


def finish(
    checkpoints: Checkpoints | None,
    model_dir: str,
    model_files: dict[str, bytes],
    metrics: dict[str, Any],
    process: int,
    on_completion: str = "keep",
    node: str = "",
) -> None:
    """Export the model and metrics, mark the run complete, then keep, stop or delete the TPU.

    Only process 0 writes and acts."""
    if process != 0:
        return
    if model_dir:
        store = Store(model_dir)
        for name, data in model_files.items():
            store.write(name, data)
        store.write("metrics.json", json.dumps(metrics, sort_keys=True, indent=2).encode())
    if checkpoints is not None:
        checkpoints.mark_complete(metrics)
    apply_on_completion(on_completion, node)


# ---------------------------------------------------------------------------------- run to completion
def _metadata_token() -> str:
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["access_token"]


def node_action(action: str, node: str) -> int:
    """Stop or delete this TPU node through the TPU API, as the VM's own service account.

    `node` is `projects/P/locations/Z/nodes/N`; the account may do this to its own node only.
    """
    api = os.environ.get("TPU_PLATFORM_TPU_API", "https://tpu.googleapis.com")
    url, method = (f"{api}/v2/{node}:stop", "POST") if action == "stop" else (f"{api}/v2/{node}", "DELETE")
    request = urllib.request.Request(
        url,
        data=b"{}" if method == "POST" else None,
        method=method,
        headers={"Authorization": f"Bearer {_metadata_token()}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def apply_on_completion(action: str, node: str) -> str:
    """What a finished run does with its TPU: keep it, stop it or delete it."""
    if action in ("stop", "delete") and node:
        status_code = node_action(action, node)
        print(json.dumps({"severity": "NOTICE", "message": f"run complete: {action} requested for {node}",
                          "status": status_code}), flush=True)  # fmt: skip
    return action


def status(checkpoint_dir: str) -> str:
    return "complete" if checkpoint_dir and Checkpoints(Store(checkpoint_dir)).complete() else "incomplete"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runlib.py")
    commands = parser.add_subparsers(dest="command", required=True)
    ask = commands.add_parser("status", help="print `complete` once the run's completion marker exists")
    ask.add_argument("--checkpoint-dir", required=True)
    act = commands.add_parser("on-completion", help="keep, stop or delete this TPU (a finished run)")
    act.add_argument("--action", default=os.environ.get("TPU_PLATFORM_ON_COMPLETION", "keep"))
    act.add_argument("--node", default=os.environ.get("TPU_PLATFORM_NODE", ""))
    args = parser.parse_args(argv)
    if args.command == "status":
        print(status(args.checkpoint_dir))
    else:
        print(apply_on_completion(args.action, args.node))
    return 0


if __name__ == "__main__":
    sys.exit(main())
