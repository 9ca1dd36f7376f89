"""Running the workload programs as the VM does: a separate interpreter with the framework installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"


def workloads_python() -> str:
    python = ROOT / os.environ.get("WORKLOADS_PYTHON", ".venv-workloads/bin/python")  # relative to the repo
    if not python.exists():
        raise RuntimeError(f"{python} is missing: `make test` creates it from requirements-workloads.txt")
    return str(python)


def workload_probe(script: str, *args: str, env: dict[str, str] | None = None, without: tuple[str, ...] = ()) -> dict:
    """Run `script` (already formatted) in the workloads' Python on the CPU, with `args`; the last line it printed,
    as JSON. `env` is added to this process's environment, less the names in `without`."""
    environment = {k: v for k, v in os.environ.items() if k not in without}
    done = subprocess.run(
        [workloads_python(), "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The engines a multi-host run meets, and what each puts in a worker's environment about its slice.
ENGINES = ("vm", "gke")


def slice_environment(engine: str, worker: int, count: int, port: int) -> dict[str, str]:
    """Worker `worker` of a `count`-host slice on loopback, its coordinator at `port`, as each engine says it:
    the VM's start-up script writes the platform's variables (infra/startup.py slice_env); a GKE pod gets
    only what GKE injects into an Indexed Job asking for google.com/tpu (every host, worker 0 first), the
    port moved as the sandbox moves the start-up script's (TPU_PLATFORM_COORDINATOR_PORT)."""
    if engine == "vm":
        return {
            "TPU_WORKER_ID": str(worker),
            "TPU_PLATFORM_WORKER_ID": str(worker),
            "TPU_PLATFORM_WORKER_COUNT": str(count),
            "TPU_PLATFORM_COORDINATOR": f"127.0.0.1:{port}" if count > 1 else "",
        }
    assert engine == "gke", engine
    return {
        "TPU_WORKER_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * count),
        "TPU_PLATFORM_COORDINATOR_PORT": str(port),
    }


def run_workload(program: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [workloads_python(), str(WORKLOADS / program), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def train_briefly(program: str, sample: Path, folder: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """An example trained for two epochs of 128-image batches on `sample`, its model under `folder`/models."""
    args = ("--data", str(sample), "--epochs", "2", "--batch-size", "128", "--model-dir", str(folder / "models"))
    return run_workload(program, *args, *more, cwd=folder)


# A committed checkpoint of each example, by the names under its checkpoint folder: Orbax's
# `<step>/commit_success.txt` (written last, on a local disk as on Cloud Storage), TensorFlow's
# `ckpt-<step>.index` (TensorFlow writes it after the data; tf_mnist uploads it after the data too).
_COMMITTED = re.compile(r"(?:(\d+)/commit_success\.txt|ckpt-(\d+)\.index)")


def committed_steps(names: Iterable[str]) -> list[int]:
    """The steps of the committed checkpoints among `names` (relative to a run's checkpoint folder)."""
    return sorted(int(m[1] or m[2]) for name in names if (m := _COMMITTED.fullmatch(name)))


def checkpoint_names(folder: Path) -> list[str]:
    """The names of the files under a local checkpoint folder, relative to it. os.walk skips folders
    that vanish while it walks (a framework renaming or rotating them away)."""
    return [str((Path(parent) / name).relative_to(folder)) for parent, _, names in os.walk(folder) for name in names]


READ_SCALARS = """
import glob, json, sys
import tensorflow as tf
from tensorflow.python.framework import tensor_util
scalars = {}
for path in sorted(glob.glob(sys.argv[1] + "/events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            simple = value.HasField("simple_value")
            number = value.simple_value if simple else float(tensor_util.MakeNdarray(value.tensor))
            scalars.setdefault(value.tag, []).append([event.step, number, plugin or "simple_value"])
print(json.dumps(scalars))
"""


def tensorboard_scalars(folder: Path) -> dict[str, list[list]]:
    """Each tag's [step, value, kind] in a folder's event files, read by TensorFlow's own reader; kind is
    the plug-in a tensor summary names (TensorBoard's scalars plug-in reads "scalars") or simple_value."""
    return workload_probe(READ_SCALARS, str(folder))
