"""The benchmark scripts still run (tiny sizes); their figures are for docs/performance.md, not asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.workloads import workloads_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.workloads]


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_plan_scale_benchmark_runs():
    out = run("benchmarks/plan_scale.py", "--sizes", "1", "3", "--on-completion", "delete")
    assert "marginal cost 1 -> 3 VMs" in out
    assert "floor s" in out and "policy pack" in out  # the SDK's floor beside the program, the extras alone
    # The plan's garbage is collected on a line of its own, before the extras, so none of them pays for it.
    assert "extras, ms per extra TPU VM: collector (the plan's garbage)" in out
    assert ", stack reader" in out and "who-can-do-what" in out


def test_workload_benchmark_runs():
    out = run("benchmarks/workloads.py", "--python", workloads_python(), "--train", "1024", "--steps", "30")
    assert "prepare_data:" in out and "tf_mnist" in out and "jax_mnist" in out


def test_telemetry_benchmark_runs():
    out = run("benchmarks/telemetry.py", "--lines", "200")
    assert "us/line on the run's path" in out and "event file:" in out


def test_packaging_benchmark_runs():
    out = run("benchmarks/source_archives.py", "--folder", "workloads", "--repeat", "1")
    assert "workloads:" in out and "tar.gz" in out


def test_goodput_model_benchmark_runs():
    out = run("benchmarks/goodput_model.py", "--cells", "1", "--events", "100")
    assert "sim/model" in out and len(out.splitlines()) == 2


def test_goodput_recording_benchmark_runs():
    out = run("benchmarks/goodput_recording.py", "--lines", "200")
    assert "us/line on the run's path" in out and "the record's write" in out


def test_agent_environment_benchmark_runs():
    # The pinned wheelhouse, as make agent-wheelhouse built it; installed, checked and the agent started from it.
    out = run("benchmarks/agent_environment.py", "--repeat", "1", "--python", sys.executable)
    assert "first boot, the environment installed" in out and "later boot, the environment checked" in out
    assert "agent start to ready (python -m vm_agent)" in out
