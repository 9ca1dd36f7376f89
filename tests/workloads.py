"""Running the workload programs as the VM does: a separate interpreter with the framework installed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"


def workloads_python() -> str:
    python = ROOT / os.environ.get("WORKLOADS_PYTHON", ".venv-workloads/bin/python")  # relative to the repo
    if not python.exists():
        raise RuntimeError(f"{python} is missing: `make test` creates it from requirements-workloads.txt")
    return str(python)


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
