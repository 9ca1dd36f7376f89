"""The seed's MNIST program (S8), run for real on the CPU with generated MNIST-shaped data."""

from __future__ import annotations

import json

import pytest

from tests.workloads import run_workload

pytestmark = [pytest.mark.slow, pytest.mark.workloads]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    done = run_workload("sample_mnist.py", str(folder / "mnist.npz"), "--train", "1024", "--test", "256", cwd=folder)
    assert done.returncode == 0, done.stderr
    return folder / "mnist.npz"


def test_trains_reports_and_saves(sample, tmp_path):
    done = run_workload(
        "tf_mnist.py",
        "--data", str(sample),
        "--epochs", "2",
        "--batch-size", "128",
        "--model-dir", str(tmp_path / "models"),
        "--checkpoint-dir", str(tmp_path / "checkpoints"),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Running on CPU with 1 replica(s)" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["device"] == "CPU"
    assert summary["wall_seconds"] > 0
    # The data is learnable: a model that trains gets far above chance (10%).
    assert summary["val_accuracy"] > 0.8
    assert (tmp_path / "models" / "mnist.keras").stat().st_size > 10_000


def test_bad_data_location_fails_clearly(tmp_path):
    done = run_workload("tf_mnist.py", "--data", str(tmp_path / "missing.npz"), "--epochs", "1", cwd=tmp_path)
    assert done.returncode != 0
    assert "missing.npz" in done.stderr
