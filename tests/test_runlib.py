"""The workloads' shared library: checkpoints are trusted only when committed; data order resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import SupportsFloat

import numpy as np
import pytest

from run_contract.timeline import CHECKPOINT_MESSAGE, step_line
from tests.support import Writes
from tests.workloads import WORKLOADS, checkpoint_names, committed_steps, run_workload, workloads_python

sys.path.insert(0, str(WORKLOADS))
import runlib

IDENTITY = runlib.RunIdentity("toy", "numpy 1", 8, "f1ngerpr1nt")


def test_completion_marker(tmp_path):
    assert runlib.status(str(tmp_path)) == "incomplete"
    (tmp_path / runlib.COMPLETE).write_text(json.dumps({"steps": 5}))
    assert runlib.status(str(tmp_path)) == "complete"


# A toy workload for the shared loop: the "model" is one number that each step adds the batch to, and
# its checkpoints are files `<step>.json` (the model and the run state) in a folder, as a framework's.
class Toy:
    def __init__(self, folder: Path, every_steps: int) -> None:
        self.weight = 0.0
        self.folder, self.every_steps, self.where = folder, every_steps, str(folder)
        folder.mkdir(parents=True, exist_ok=True)

    def step(self, x: np.ndarray, y: np.ndarray, count: int) -> SupportsFloat:  # a loss as runlib reads it
        self.weight += float(x[:count].sum())
        return self.weight

    def steps(self) -> list[int]:
        return sorted(int(p.stem) for p in self.folder.glob("*.json") if p.stem.isdigit())

    def run_state(self, step: int) -> dict:
        return json.loads((self.folder / f"{step}.json").read_text())["run"]

    def restore(self, step: int) -> None:
        self.weight = json.loads((self.folder / f"{step}.json").read_text())["weight"]

    def save(self, step: int, run_state: dict, force: bool) -> bool:
        if not force and step % self.every_steps:
            return False
        (self.folder / f"{step}.json").write_text(json.dumps({"weight": self.weight, "run": run_state}))
        return True

    def wait(self) -> None:
        pass

    def failure(self) -> str | None:
        return None


def toy_run(tmp_path, *flags: str, identity: runlib.RunIdentity = IDENTITY) -> tuple[runlib.Outcome, Toy]:
    data = runlib.Dataset(np.ones((64, 1)), np.zeros(64), np.zeros((1, 1)), np.zeros(1))
    args = runlib.parse_args("toy", ["--checkpoint-dir", str(tmp_path / "ckpt"), "--batch-size", "8", *flags])
    toy = Toy(tmp_path / "ckpt", args.checkpoint_every_steps)
    log = runlib.Log("toy")
    return runlib.train(args, log, data, toy, identity, no_preemption(), toy.step), toy


def no_preemption() -> runlib.Preemption:
    quiet = runlib.Preemption.__new__(runlib.Preemption)  # without taking over this process's SIGTERM
    quiet.requested = False
    return quiet


def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path, capsys):
    toy_run(tmp_path, "--steps", "12", "--checkpoint-every-steps", "4")  # checkpoints at 4, 8, 12
    (tmp_path / "ckpt" / "12.json").write_text("not json")
    outcome, toy = toy_run(tmp_path, "--steps", "16", "--checkpoint-every-steps", "4")
    assert "checkpoint cannot be loaded; falling back" in capsys.readouterr().out
    assert outcome.metrics["resumes"] == 1 and outcome.step == 16
    assert toy.weight == 16 * 8  # resumed at step 8 with the weight of step 8, and trained 8 more


def test_resume_refuses_when_no_checkpoint_loads(tmp_path):
    toy_run(tmp_path, "--steps", "4", "--checkpoint-every-steps", "4")
    (tmp_path / "ckpt" / "4.json").write_text("{}")
    with pytest.raises(runlib.ResumeRefusedError, match=r"no checkpoint .* can be loaded.*new run id"):
        toy_run(tmp_path, "--steps", "8")


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        (runlib.RunIdentity("other_program", "numpy 1", 8, "f1ngerpr1nt"), "program 'toy'"),
        (runlib.RunIdentity("toy", "numpy 1", 16, "f1ngerpr1nt"), "batch_size 8 (now 16)"),
        (runlib.RunIdentity("toy", "numpy 2", 8, "f1ngerpr1nt"), "framework_version"),
        (runlib.RunIdentity("toy", "numpy 1", 8, "other data"), "data_fingerprint"),
    ],
)
def test_resume_with_another_program_batch_size_framework_or_data_is_refused(tmp_path, changed, named):
    toy_run(tmp_path, "--steps", "4", "--checkpoint-every-steps", "4")
    with pytest.raises(runlib.ResumeRefusedError, match="Start a new run id") as refused:
        toy_run(tmp_path, "--steps", "8", identity=changed)
    assert named in str(refused.value)
    assert runlib.status(str(tmp_path / "ckpt")) == "incomplete"  # not marked complete with 0 steps trained


def test_the_step_interval_is_the_frameworks_and_the_end_and_the_clock_force_a_save(tmp_path):
    toy_run(tmp_path, "--steps", "14", "--checkpoint-every-steps", "4", "--steps-per-call", "3")
    # Chunks of 3 steps stop at multiples of 4, so the framework sees 4, 8, 12; the end forces 14.
    assert Toy(tmp_path / "ckpt", 4).steps() == [4, 8, 12, 14]
    toy_run(
        tmp_path / "timed",
        "--steps",
        "6",
        "--checkpoint-every-steps",
        "100",
        "--steps-per-call",
        "1",
        "--checkpoint-every-minutes",
        "0",
    )
    assert Toy(tmp_path / "timed" / "ckpt", 100).steps() == list(range(1, 7))  # due by time after every step


class Lazy:
    """A step's loss as a device value: reading it (`float`) waits until the steps that make it have run."""

    def __init__(self, value: float) -> None:
        self.value, self.read = value, False

    def __float__(self) -> float:
        self.read = True
        return self.value


class Queued(Toy):
    """A framework that runs steps asynchronously: at each save, whether the loop had waited for the chunk's
    steps (read its loss) first; a save would otherwise count their time as its own."""

    def __init__(self, folder: Path, every_steps: int) -> None:
        super().__init__(folder, every_steps)
        self.losses: list[Lazy] = []
        self.waited: list[bool] = []

    def step(self, x: np.ndarray, y: np.ndarray, count: int) -> Lazy:
        self.losses.append(Lazy(float(super().step(x, y, count))))
        return self.losses[-1]

    def save(self, step: int, run_state: dict, force: bool) -> bool:
        saved = super().save(step, run_state, force)
        if saved:
            self.waited.append(self.losses[-1].read)
        return saved


def test_the_loop_waits_for_a_chunks_steps_before_it_times_a_save_and_only_then(tmp_path):
    data = runlib.Dataset(np.ones((64, 1)), np.zeros(64), np.zeros((1, 1)), np.zeros(1))
    flags = ["--checkpoint-dir", str(tmp_path), "--batch-size", "8", "--steps", "14", "--checkpoint-every-steps", "4"]
    args = runlib.parse_args("toy", [*flags, "--steps-per-call", "3"])
    toy = Queued(tmp_path, 4)
    runlib.train(args, runlib.Log("toy"), data, toy, IDENTITY, no_preemption(), toy.step)
    assert toy.steps() == [4, 8, 12, 14] and toy.waited == [True] * 4
    # Chunks 0-3, 3-4, 4-7, 7-8, 8-11, 11-12, 12-14: the host waits only at the four that end at a save.
    assert [loss.read for loss in toy.losses] == [False, True, False, True, False, True, True]


def test_a_finished_run_marks_its_checkpoints_and_never_writes_the_platforms_completion_object(tmp_path):
    """Only the VM agent writes `<status-dir>/COMPLETE` (the object the guard acts on, where no run's
    credentials reach): runlib marks the run complete beside its checkpoints and leaves the status folder be."""
    outcome, _ = toy_run(tmp_path, "--steps", "4")
    folders = [
        "--model-dir",
        str(tmp_path / "model"),
        "--status-dir",
        str(tmp_path / "status"),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    args = runlib.parse_args("toy", [*folders, "--run-id", "dev/mnist/vm/r1"])
    runlib.finish(args, "toy", {"model.bin": b"m"}, outcome.metrics, process=0)
    assert not (tmp_path / "status").exists()
    assert (tmp_path / "model" / "model.bin").read_bytes() == b"m"
    assert runlib.status(str(tmp_path / "ckpt")) == "complete"
    assert not hasattr(runlib, "announce")  # nor writes it again later


def test_the_status_command_reads_the_status_dir_from_the_environment(tmp_path, capsys, monkeypatch):
    (tmp_path / "COMPLETE").write_text("{}")
    monkeypatch.setenv("TPU_PLATFORM_STATUS_DIR", str(tmp_path))
    assert runlib.main(["status", "--checkpoint-dir", str(tmp_path / "ckpt")]) == 0
    assert capsys.readouterr().out == "complete\n"


# A program that has taken its SIGTERM and leaves with the contract's code (here 75, after a committed stop),
# then meets a notice late in its interpreter's finalization, as a slice's host does when its own agent is
# told after a peer's notice stopped it: the object below sends it when `__main__`'s names are cleared.
LATE_NOTICE = """
import os, signal, sys
sys.path.insert(0, {workloads!r})
import runlib

class LateNotice:
    def __init__(self):
        self.kill, self.pid = os.kill, os.getpid()

    def __del__(self):
        self.kill(self.pid, signal.SIGTERM)

preemption = runlib.Preemption()
notice = LateNotice()
sys.exit(75)
"""


def test_a_sigterm_while_the_program_is_on_its_way_out_leaves_its_exit_code_alone():
    """CPython's finalization gives SIGTERM back its default action (`_PySignal_Fini`) before it tears down
    the modules (jaxlib's runtime takes a tenth of a second or more); a notice then would end the program by
    that signal (-15), not with the code it chose."""
    done = subprocess.run(
        [sys.executable, "-c", LATE_NOTICE.format(workloads=str(WORKLOADS))], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 75, (done.returncode, done.stderr[-2000:])


def test_resumed_batches_continue_the_data_position():
    data = runlib.Dataset(np.arange(100).reshape(100, 1), np.arange(100), np.zeros((1, 1)), np.zeros(1))
    straight = [(s, x[0].tolist()) for s, _, x, _ in runlib.batches(data, 10, 0, 25)]
    resumed = [(s, x[0].tolist()) for s, _, x, _ in runlib.batches(data, 10, 13, 25)]
    assert resumed == straight[13:]
    assert [s for s, _ in straight] == list(range(25))
    # Each epoch is a full permutation of the examples.
    first_epoch = [example for _, x in straight[:10] for example in x]
    assert sorted(first_epoch) == [[i] for i in range(100)]


def test_chunks_of_steps_stop_at_checkpoint_steps_hold_the_same_batches_and_have_one_shape():
    data = runlib.Dataset(np.arange(1, 101).reshape(100, 1), np.arange(1, 101), np.zeros((1, 1)), np.zeros(1))
    one_by_one = [(x[0], y[0]) for _, _, x, y in runlib.batches(data, 10, 3, 25)]
    chunks = list(runlib.batches(data, 10, 3, 25, per_call=8, boundary=10))
    assert [(first, count) for first, count, _, _ in chunks] == [(3, 7), (10, 8), (18, 2), (20, 5)]
    # One shape for every chunk (a framework traces its step once): the short ones padded with zeros.
    assert {(x.shape, y.shape) for _, _, x, y in chunks} == {((8, 10, 1), (8, 10))}
    assert np.array_equal(
        np.concatenate([x[:count] for _, count, x, _ in chunks]), np.stack([x for x, _ in one_by_one])
    )
    assert np.array_equal(
        np.concatenate([y[:count] for _, count, _, y in chunks]), np.stack([y for _, y in one_by_one])
    )
    assert all(not x[count:].any() and not y[count:].any() for _, count, x, y in chunks)  # no example is 0
    # Never more steps per call than the checkpoint interval or the run holds.
    assert {x.shape[0] for _, _, x, _ in runlib.batches(data, 10, 0, 25, per_call=32, boundary=10)} == {10}
    assert {x.shape[0] for _, _, x, _ in runlib.batches(data, 10, 0, 5, per_call=32, boundary=10)} == {5}


def test_steps_per_call_below_one_is_refused():
    data = runlib.Dataset(np.zeros((100, 1)), np.zeros(100), np.zeros((1, 1)), np.zeros(1))
    with pytest.raises(ValueError, match="steps per call must be at least 1, not 0"):
        next(runlib.batches(data, 10, 0, 25, per_call=0))


def test_the_clock_is_due_after_its_interval():
    clock = runlib.Clock(every_seconds=3600)
    assert not clock.due()
    clock.every_seconds = 0
    assert clock.due()


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
@pytest.mark.parametrize("program", ["tf_mnist/tf_mnist.py", "jax_mnist/jax_mnist.py"])
def test_kill_9_during_checkpointing_never_breaks_the_next_start(program, tmp_path):
    """Checkpoint every step and SIGKILL at arbitrary moments: every restart must still succeed."""
    sample = tmp_path / "mnist.npz"
    assert (
        run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "128", cwd=tmp_path).returncode == 0
    )
    args = [
        workloads_python(),
        str(WORKLOADS / program),
        "--data",
        str(sample),
        "--batch-size",
        "32",
        "--epochs",
        "4",
        "--checkpoint-every-steps",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}

    def committed() -> list[int]:
        return committed_steps(checkpoint_names(tmp_path / "ckpt"))

    killed_at = []
    for delay in (0.05, 0.13, 0.29):
        process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        before = committed()
        # Wait until this run is writing checkpoints, then kill it without warning.
        deadline = time.monotonic() + 120
        while committed() == before and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.01)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at.append(committed()[-1])
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["steps"] == 4 * (1024 // 32)
    assert metrics["resumes"] >= 1
    assert killed_at == sorted(killed_at) and killed_at[0] > 0


@pytest.mark.slow
@pytest.mark.workloads
@pytest.mark.parametrize(
    ("program", "newest"), [("tf_mnist/tf_mnist.py", "ckpt-24.data-*"), ("jax_mnist/jax_mnist.py", "24/train/**/d/*")]
)
def test_a_corrupt_newest_checkpoint_is_skipped_for_the_one_before(program, newest, tmp_path):
    """The framework's own checks find the damage (TensorFlow's checksums, TensorStore's reads); the
    run resumes from the checkpoint before it and finishes."""
    sample, ckpt = tmp_path / "mnist.npz", tmp_path / "ckpt"
    assert run_workload("sample_mnist.py", str(sample), "--train", "256", "--test", "64", cwd=tmp_path).returncode == 0
    common = [
        "--data",
        str(sample),
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every-steps",
        "8",
        "--batch-size",
        "32",
    ]
    first = run_workload(program, *common, "--steps", "24", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert committed_steps(checkpoint_names(ckpt)) == [8, 16, 24]
    (ckpt / "COMPLETE").unlink()  # reopen the run, as if it had been preempted
    damaged = [path for path in ckpt.glob(newest) if path.is_file()]
    assert damaged
    for path in damaged:
        path.write_bytes(b"\x00" * path.stat().st_size)
    done = run_workload(program, *common, "--steps", "32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines if line.get("message", "").startswith("checkpoint cannot be loaded")] == [24]
    assert [line["step"] for line in lines if line.get("message") == "resumed from checkpoint"] == [16]
    assert lines[-1]["steps"] == 32 and lines[-1]["resumes"] == 1


@pytest.mark.slow
def test_the_programs_refuse_each_others_checkpoints_and_another_batch_size(tmp_path):
    sample, ckpt = tmp_path / "mnist.npz", str(tmp_path / "ckpt")
    assert run_workload("sample_mnist.py", str(sample), "--train", "256", "--test", "64", cwd=tmp_path).returncode == 0
    common = ["--data", str(sample), "--checkpoint-dir", ckpt, "--checkpoint-every-steps", "2"]
    first = run_workload("tf_mnist/tf_mnist.py", *common, "--batch-size", "32", "--steps", "4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (tmp_path / "ckpt" / "COMPLETE").unlink()  # reopen the run, as if it had been preempted
    for program, batch, wrong in (
        ("jax_mnist/jax_mnist.py", "32", "program 'tf_mnist'"),
        ("tf_mnist/tf_mnist.py", "64", "batch_size 32"),
    ):
        done = run_workload(program, *common, "--batch-size", batch, "--steps", "8", cwd=tmp_path)
        assert done.returncode == runlib.REFUSED_EXIT, done.stderr[-3000:]
        refusal = [json.loads(line) for line in done.stdout.splitlines() if '"ERROR"' in line]
        assert refusal and wrong in refusal[0]["message"] and "Start a new run id" in refusal[0]["message"]
        assert "Traceback" not in done.stderr
    assert runlib.status(ckpt) == "incomplete"


def test_a_status_marker_counts_only_for_the_run_it_names(tmp_path):
    """The status marker is per VM: a new run id must train again, not read an old run's marker."""
    status_dir = tmp_path / "status"
    runlib.Store(str(status_dir)).write(runlib.COMPLETE, json.dumps({"runId": "dev/mnist/vm/run-1"}).encode())
    assert runlib.status("", str(status_dir), "dev/mnist/vm/run-1") == "complete"
    assert runlib.status("", str(status_dir), "dev/mnist/vm/run-2") == "incomplete"


def test_the_run_contract_environment_gives_the_defaults_and_the_agent_writes_the_status(monkeypatch):
    """Under the platform's agent a command needs no location flags (docs/run-contract.md), and
    the program does not write `<status-dir>/COMPLETE`: the agent does, when the command exits 0."""
    contract = {
        "TPU_PLATFORM_DATA": "gs://d/mnist.npz",
        "TPU_PLATFORM_CHECKPOINT_DIR": "gs://c/run",
        "TPU_PLATFORM_MODEL_DIR": "gs://m/run",
        "TPU_PLATFORM_RUN_ID": "dev/mnist/vm/r1",
        "TPU_PLATFORM_STATUS_DIR": "gs://s/vm",
    }
    for name, value in contract.items():
        monkeypatch.setenv(name, value)
    args = runlib.parse_args("toy", [])
    assert (args.data, args.checkpoint_dir, args.model_dir, args.run_id) == (
        "gs://d/mnist.npz",
        "gs://c/run",
        "gs://m/run",
        "dev/mnist/vm/r1",
    )
    assert args.status_dir == ""
    assert (runlib.EXIT_RETRY, runlib.REFUSED_EXIT) == (75, 78)  # EX_TEMPFAIL, EX_CONFIG of sysexits.h


def test_the_programs_defaults_are_the_stack_settings_defaults():
    """A command run by hand trains as a stack's workload with no settings does: one set of defaults."""
    from infra.config.settings import setting

    args = runlib.parse_args("toy", [])
    keys = ("epochs", "batchSize", "checkpointEverySteps", "checkpointEveryMinutes")
    assert (args.epochs, args.batch_size, args.checkpoint_every_steps, args.checkpoint_every_minutes) == tuple(
        setting(f"workloads.<name>.{key}").default for key in keys
    )


def test_each_save_is_a_step_line_the_agents_timeline_reads(tmp_path, capsys):
    """The agent's timeline counts the saves a program reports (run_contract/timeline.py): runlib says each one,
    with the step it holds and how long training stalled for it."""
    _, toy = toy_run(tmp_path, "--steps", "14", "--checkpoint-every-steps", "4", "--steps-per-call", "3")
    lines = [step_line(line) for line in capsys.readouterr().out.splitlines()]
    saves = [line for line in lines if line and line.get("message") == CHECKPOINT_MESSAGE]
    assert [line["step"] for line in saves] == toy.steps() == [4, 8, 12, 14]
    assert all(isinstance(line["seconds"], float) and line["seconds"] >= 0 for line in saves)


def test_each_log_line_reaches_stdout_in_one_write(monkeypatch):
    """A log entry is written as the run contract's one-write line (run_contract/lines.py), so nothing else the
    program writes lands inside it (a sandboxed jax_mnist run saw TensorStore's C++ log inside its first
    "checkpoint saved" entry)."""
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    runlib.Log("run", 1)(CHECKPOINT_MESSAGE, step=20)
    entry = {"severity": "INFO", "message": CHECKPOINT_MESSAGE, "run_id": "run", "process": 1, "step": 20}
    assert out.writes == [json.dumps(entry) + "\n"]


# --- a checkpoint that cannot be written ends the run -----------------------------------------------


class TellingPeers(runlib.Peers):
    """Peers as another process would see them: what this one reported, and a failure reported to it."""

    def __init__(self, reported: str | None = None) -> None:
        self.told: list[str] = []
        self.reported = reported

    def report_failure(self, reason: str) -> None:
        self.told.append(reason)

    def failure(self) -> str | None:
        return self.reported


class Stalling(Toy):
    """A framework's async saves: the save at `failed_at` fails in the background (failure() says so, as
    Orbax's save thread would), and the save at `stalls_at` waits until `released`, as the next save of a
    failed host waits at the framework's barrier."""

    def __init__(self, folder: Path, failed_at: int | None, stalls_at: int) -> None:
        super().__init__(folder, 4)
        self.failed_at, self.stalls_at = failed_at, stalls_at
        self.failed: str | None = None
        self.released = threading.Event()

    def save(self, step: int, run_state: dict, force: bool) -> bool:
        saved = super().save(step, run_state, force)
        if step == self.failed_at:
            self.failed = "OSError: [Errno 5] Input/output error"
        if step == self.stalls_at:
            assert self.released.wait(60), "not released: the failure went unnoticed"
        return saved

    def failure(self) -> str | None:
        return self.failed


class Refusing(Toy):
    def save(self, step: int, run_state: dict, force: bool) -> bool:
        if step == 8:
            raise OSError(28, "No space left on device")
        return super().save(step, run_state, force)


@pytest.fixture
def exits(monkeypatch):
    """runlib.exit_now's codes, recorded: the process is pytest's. It releases a stalled save (as the end
    of the process would) and ends the thread that called it."""
    codes: list[int] = []
    stalled: list[Stalling] = []

    def record(code: int):
        codes.append(code)
        for toy in stalled:
            toy.released.set()
        raise SystemExit(code)  # a thread ends quietly on it

    monkeypatch.setattr(runlib, "exit_now", record)
    monkeypatch.setattr(runlib.FailFast, "POLL_SECONDS", 0.01)
    return codes, stalled


# The recorded end of the process ends the fail-fast thread with SystemExit, which pytest reports.
ENDS_A_THREAD = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")


def train_with(tmp_path, toy: Toy, peers: runlib.Peers) -> None:
    data = runlib.Dataset(np.ones((64, 1)), np.zeros(64), np.zeros((1, 1)), np.zeros(1))
    args = runlib.parse_args(
        "toy",
        ["--checkpoint-dir", str(toy.folder), "--batch-size", "8", "--steps", "16", "--checkpoint-every-steps", "4"],
    )
    runlib.train(args, runlib.Log("toy"), data, toy, IDENTITY, no_preemption(), toy.step, peers=peers)


def errors(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if '"severity": "ERROR"' in line]


def test_a_save_that_raises_ends_the_run_with_the_failure_code_and_tells_the_other_processes(tmp_path, exits, capsys):
    toy, peers = Refusing(tmp_path / "ckpt", 4), TellingPeers()
    with pytest.raises(SystemExit):
        train_with(tmp_path, toy, peers)
    assert exits[0] == [runlib.CHECKPOINT_FAILED_EXIT] == [74]  # EX_IOERR: failed, retried
    assert peers.told == ["OSError: [Errno 28] No space left on device"]
    assert [e["message"] for e in errors(capsys.readouterr().out)] == ["checkpoint save failed; ending the run"]
    assert toy.steps() == [4]


@ENDS_A_THREAD
def test_a_save_that_fails_in_the_background_ends_the_run_while_the_next_save_waits(tmp_path, exits, capsys):
    toy, peers = Stalling(tmp_path / "ckpt", failed_at=4, stalls_at=8), TellingPeers()
    exits[1].append(toy)
    train_with(tmp_path, toy, peers)  # released by the (recorded) end of the process
    assert exits[0] == [74]
    assert peers.told == ["OSError: [Errno 5] Input/output error"]
    assert errors(capsys.readouterr().out)[0]["message"] == "checkpoint save failed; ending the run"


@ENDS_A_THREAD
def test_a_failure_another_process_reports_ends_this_one_while_its_save_waits(tmp_path, exits, capsys):
    toy, peers = Stalling(tmp_path / "ckpt", failed_at=None, stalls_at=8), TellingPeers("process 1: OSError: ...")
    exits[1].append(toy)
    train_with(tmp_path, toy, peers)
    assert exits[0][0] == 74
    assert peers.told == []  # it failed nothing itself
    ended = errors(capsys.readouterr().out)[0]
    assert (ended["message"], ended["error"]) == (
        "another process's checkpoint save failed; ending the run",
        "process 1: OSError: ...",
    )
