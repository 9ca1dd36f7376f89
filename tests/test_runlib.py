"""The workloads' shared library: checkpoints are trusted only when committed; data order resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.workloads import WORKLOADS, run_workload, workloads_python

sys.path.insert(0, str(WORKLOADS))
import runlib


def test_uncommitted_checkpoint_is_never_picked(tmp_path):
    checkpoints = runlib.Checkpoints(runlib.Store(str(tmp_path)))
    checkpoints.save(10, {"state.json": b'{"step": 10}'})
    # A writer killed after its files but before the marker, and one killed halfway through a file.
    (tmp_path / "ckpt-0000000020").mkdir()
    (tmp_path / "ckpt-0000000020" / "state.json").write_text('{"step": 20}')
    (tmp_path / "ckpt-0000000030").mkdir()
    (tmp_path / "ckpt-0000000030" / "weights.npz.partial").write_bytes(b"\x00" * 7)
    step, files = checkpoints.latest() or (None, None)
    assert step == 10 and files == {"state.json": b'{"step": 10}'}


def test_old_checkpoints_are_rotated(tmp_path):
    checkpoints = runlib.Checkpoints(runlib.Store(str(tmp_path)), keep=2)
    for step in (1, 2, 3, 4):
        checkpoints.save(step, {"a.bin": bytes([step])})
    assert checkpoints.committed_steps() == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000003", "ckpt-0000000004"]


def test_completion_marker(tmp_path):
    checkpoints = runlib.Checkpoints(runlib.Store(str(tmp_path)))
    assert runlib.status(str(tmp_path)) == "incomplete"
    checkpoints.mark_complete({"steps": 5})
    assert runlib.status(str(tmp_path)) == "complete"
    assert checkpoints.complete() == {"steps": 5}


def test_resumed_batches_continue_the_data_position():
    data = runlib.Dataset(np.arange(100).reshape(100, 1), np.arange(100), np.zeros((1, 1)), np.zeros(1))
    straight = [(s, x.tolist()) for s, x, _ in runlib.batches(data, 10, 0, 25)]
    resumed = [(s, x.tolist()) for s, x, _ in runlib.batches(data, 10, 13, 25)]
    assert resumed == straight[13:]
    assert [s for s, _ in straight] == list(range(25))
    # Each epoch is a full permutation of the examples.
    first_epoch = [example for _, x in straight[:10] for example in x]
    assert sorted(first_epoch) == [[i] for i in range(100)]


def test_checkpoint_timer_by_steps_and_time():
    timer = runlib.CheckpointTimer(every_steps=10, every_seconds=3600)
    assert not timer.due(5) and timer.due(10)
    timer.done(10)
    assert not timer.due(15)
    timer.every_seconds = 0
    assert timer.due(11)


@pytest.mark.workloads
def test_sharded_data_round_trip(tmp_path):
    sample, shards = tmp_path / "mnist.npz", tmp_path / "shards"
    assert run_workload("sample_mnist.py", str(sample), "--train", "300", "--test", "50", cwd=tmp_path).returncode == 0
    done = run_workload("prepare_data.py", str(sample), str(shards), "--train-shards", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["shards"] == 6 and report["examples"] == 350
    loaded = runlib.load_data(str(shards), cache_dir=str(tmp_path / "cache"))
    original = runlib.unpack(sample.read_bytes())
    assert np.array_equal(loaded.x_train, original["x_train"]) and np.array_equal(loaded.y_test, original["y_test"])


@pytest.mark.slow
@pytest.mark.workloads
@pytest.mark.parametrize("program", ["tf_mnist.py", "jax_mnist.py"])
def test_kill_9_during_checkpointing_never_breaks_the_next_start(program, tmp_path):
    """Checkpoint every step and SIGKILL at arbitrary moments: every restart must still succeed."""
    sample = tmp_path / "mnist.npz"
    assert (
        run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "128", cwd=tmp_path).returncode == 0
    )
    args = [workloads_python(), str(WORKLOADS / program), "--data", str(sample), "--batch-size", "32",
            "--epochs", "4", "--checkpoint-every-steps", "1", "--checkpoint-dir", str(tmp_path / "ckpt")]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    checkpoints = runlib.Checkpoints(runlib.Store(str(tmp_path / "ckpt")))
    killed_at = []
    for delay in (0.05, 0.13, 0.29):
        process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        before = checkpoints.committed_steps()
        # Wait until this run is writing checkpoints, then kill it without warning.
        deadline = time.monotonic() + 120
        while checkpoints.committed_steps() == before and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.01)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at.append(checkpoints.committed_steps()[-1])
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["steps"] == 4 * (1024 // 32)
    assert metrics["resumes"] >= 1
    assert killed_at == sorted(killed_at) and killed_at[0] > 0
