"""The agent as the VM runs it (`python -m vm_agent` with the system Python and agent.env), against
a real GCS emulator and a loopback metadata server that waits for changes (tests/sandbox.py).

- A folder source outside workloads/ with its own requirement, and an image through the docker shim:
  each preempted (SIGTERM to the agent: the VM shutting down), resumed from its checkpoint on the
  next start (a reboot), completed (status.json and COMPLETE), and not started again after that. Its
  timeline is checked category by category, and the simulation fed its figures predicts it within 10%.
- A changed `tpu-platform-run` starts the new run without a reboot; the old one leaves a committed
  checkpoint and ends `stopped` with exit 75.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra.goodput.interval import SPOT_NOTICE_S, Losses, Phases
from run_contract import timeline
from run_contract.timeline import RunTimeline
from tests.sandbox import storage_emulator, wait_for
from tests.vm_agent_support import (
    ARTIFACTS,
    CHECKPOINTS,
    MODELS,
    REGISTRY,
    STATUS,
    agent_environ,
    image_folder,
    pack,
    run_spec,
    start_agent,
    trainer_folder,
)
from tools.offline import simulation
from tools.standins.metadata import metadata_server
from tpu_runs import report
from vm_agent import agent
from vm_agent.gcs import Storage

IMAGE = f"{REGISTRY}/trainer@sha256:{'c' * 64}"
BOOT_SECONDS = 7.5  # each sandbox boot's kernel-to-agent time, as its /proc/uptime says
# Each step's time in the preempted runs: the sandbox's training, most of a run as on a TPU (the agent's own
# bookkeeping, a few tenths of a second a boot, is the unattributed remainder).
STEP_SECONDS = 0.5


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent")
    with storage_emulator() as host:
        storage = Storage(environ={"STORAGE_EMULATOR_HOST": host})
        for bucket in (ARTIFACTS, STATUS, CHECKPOINTS, MODELS):
            storage.client.create_bucket(bucket)
        archive, sha = pack(trainer_folder(tmp))
        storage.write(ARTIFACTS, f"sources/{sha}.tar.gz", archive, "application/gzip")
        yield {"host": host, "storage": storage, "sha": sha, "image": image_folder(tmp)}


def folder_source(cloud) -> dict:
    return {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{cloud['sha']}.tar.gz", "sha256": cloud["sha"]}


def trainer_spec(cloud, name: str, steps: int, step_seconds: str, **fields: object) -> str:
    """The trainer folder's run `dev/trainer/trainer-1/<name>`, checkpointing under `<name>/`, complete at its end."""
    return run_spec(
        f"dev/trainer/trainer-1/{name}",
        folder_source(cloud),
        ["python", "train.py", "--steps", str(steps)],
        env={"STEP_SECONDS": step_seconds},
        checkpointDir=f"gs://{CHECKPOINTS}/{name}",
        completion=True,
        **fields,
    )


def read_json(cloud, bucket: str, name: str) -> dict | None:
    names = cloud["storage"].list(bucket, name)
    return json.loads(cloud["storage"].read(bucket, name)) if name in names else None


def state(cloud, vm: str, run_id: str) -> dict:
    return read_json(cloud, STATUS, f"{vm}/runs/{run_id}/status.json") or {}


def wait_state(cloud, vm: str, run_id: str, wanted: str, timeout: float, what: str) -> None:
    """Until the run's state record says `wanted`."""
    wait_for(lambda: state(cloud, vm, run_id).get("state") == wanted, timeout, what, interval=0.3)


def steps(cloud, prefix: str) -> list[int]:
    names = cloud["storage"].list(CHECKPOINTS, prefix)
    return sorted(int(n.rsplit("ckpt-", 1)[1][:-5]) for n in names if "/ckpt-" in n)


class Vm:
    """A sandboxed VM for the agent: its root, its log, and boots of the agent."""

    def __init__(self, tmp: Path, cloud, metadata_host: str, vm: str):
        images = json.dumps({IMAGE: str(cloud["image"])})
        self.env = agent_environ(
            tmp,
            metadata_host,
            cloud["host"],
            DOCKER_SHIM_IMAGES=images,
            TPU_PLATFORM_VM=vm,
            TPU_PLATFORM_STATUS_DIR=f"gs://{STATUS}/{vm}",
        )
        self.log_path = tmp / "agent.log"
        self.tmp = tmp
        self.process: subprocess.Popen | None = None
        self.states = timeline.NodeStates(vm)  # the node's states, as the TPU API would list them

    def _now_in(self, state: str, at: float) -> None:
        self.states = self.states.observe(state, at) or self.states

    def boot(self, uptime: float = BOOT_SECONDS) -> None:
        """The agent started `uptime` seconds after the VM's kernel (the agent reads it under its root): the
        node READY since its kernel started."""
        proc = Path(self.env["TPU_PLATFORM_ROOT"]) / "proc"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / "uptime").write_text(f"{uptime} 0.0\n")
        if self.states.transitions:  # a reboot: the kernel starts after the node left READY, not before
            time.sleep(max(0.0, self.states.transitions[-1][1] + uptime - time.time()))
        self._now_in("READY", time.time() - uptime)
        self.process = start_agent(self.env, self.log_path)

    def shut_down(self, state: str = "STOPPED") -> int:
        """What systemd does at shutdown or preemption: SIGTERM to the agent, then wait for it; then the node
        is in `state` (PREEMPTED for a preemption)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._now_in(state, time.time())
        return code

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def lines(self, message: str) -> list[dict]:
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{") and message in line]


def preempt_resume_complete(cloud, vm: Vm, run_id: str, prefix: str) -> None:
    vm.boot()
    try:
        wait_for(lambda: len(steps(cloud, prefix)) >= 2, 120, "two committed checkpoints", interval=0.2)
    except TimeoutError as error:
        raise AssertionError(f"{error}; the agent's log:\n{vm.log()[-3000:]}") from None
    assert vm.shut_down("PREEMPTED") == 0
    stopped = state(cloud, vm.env["TPU_PLATFORM_VM"], run_id)
    assert (stopped["state"], stopped["exitCode"]) == ("stopped", 75), vm.log()[-3000:]
    assert vm.lines("SIGTERM: checkpoint committed, exiting 75")
    preempted_at = steps(cloud, prefix)[-1]
    assert 0 < preempted_at < 12
    assert read_json(cloud, STATUS, f"{vm.env['TPU_PLATFORM_VM']}/COMPLETE") is None

    vm.boot()  # the reboot: the same desired run resumes from its checkpoint
    try:
        wait_state(cloud, vm.env["TPU_PLATFORM_VM"], run_id, "finished", 120, "the resumed run to finish")
    except TimeoutError as error:
        raise AssertionError(f"{error}; the agent's log:\n{vm.log()[-3000:]}") from None
    assert vm.lines("resumed from checkpoint")[-1]["step"] == preempted_at
    assert steps(cloud, prefix)[-1] == 12
    # The agent writes the marker after the run's state, last, since the guard stops the VM when it appears.
    marker_path = f"{vm.env['TPU_PLATFORM_VM']}/COMPLETE"
    marker = wait_for(lambda: read_json(cloud, STATUS, marker_path), 30, "the completion marker", interval=0.2)
    assert isinstance(marker, dict) and marker["runId"] == run_id and marker["steps"] == 12
    assert vm.shut_down() == 0

    vm.boot()  # after completion: not started again, the marker told again
    wait_for(lambda: vm.lines("already finished; not starting it again"), 30, "the agent to see the run is done")
    assert vm.shut_down() == 0
    assert len(vm.lines("SIGTERM: checkpoint committed")) == 1
    assert len([line for line in vm.log().splitlines() if '"contract"' in line]) == 2  # two starts, no third
    check_timeline(cloud, vm, run_id, preempted_at)


def check_timeline(cloud, vm: Vm, run_id: str, preempted_at: int) -> None:
    """The run's timeline against what the sandbox did: two boots, one preemption with its checkpoint saved on
    notice (no step lost), a restore, 12 steps, the program's own save times; the record adds up."""
    record = read_json(cloud, STATUS, f"{vm.env['TPU_PLATFORM_VM']}/runs/{run_id}/timeline.json")
    assert record is not None, vm.log()[-3000:]
    events = timeline.RunEvents.from_json(record)
    assert events.step_lines_trusted and record["untrusted"] == []  # the stack's own run
    kinds = [e.kind for e in events.events]
    assert kinds.count("boot") == kinds.count("agentStart") == 2  # the third boot started nothing
    assert kinds.count("sigterm") == 1 and kinds.count("restored") == 1 and kinds.count("end") == 2
    assert [e.code for e in events.events if e.kind == "exit"] == [75, 0]
    windows = vm.states.up(time.time())
    assert [s for s, _ in vm.states.transitions] == ["READY", "PREEMPTED", "READY", "STOPPED", "READY", "STOPPED"]
    measured = timeline.measure(events.events, windows)
    assert measured.node_billed  # every boot's billed window is the node's
    assert (measured.preemptions, measured.lost_without_notice, measured.steps) == (1, 0, 12)
    seconds = measured.seconds
    lives = [events.events[: kinds.index("end") + 1], events.events[kinds.index("end") + 1 :]]
    # Boot runs from the node's READY (the kernel's start) to the agent's: the sandbox's uptime, and the
    # agent's own start-up.
    started = [next(e.at for e in life if e.kind == "agentStart") for life in lives]
    assert seconds["boot"] == pytest.approx(sum(a - w[0] for a, w in zip(started, windows, strict=False)))
    assert seconds["boot"] >= 2 * BOOT_SECONDS
    saved = {line["step"]: line["seconds"] for line in vm.lines('"checkpoint saved"')}
    # The program's own figures; each attempt's first save, of a step past its start, comes before its first step
    # line: training had begun, and the save's stall is a save's.
    assert sorted(saved) == list(range(1, 13))
    assert seconds["checkpointSave"] == pytest.approx(sum(saved.values()))
    # Saved on notice: the preempted attempt's last step line follows its last committed checkpoint's.
    first_boot = events.events[: kinds.index("end") + 1]
    last_save = [e for e in first_boot if e.kind == "checkpoint"][-1]
    last_step = [e for e in first_boot if e.kind in ("step", "firstStep")][-1]
    assert last_save.step == last_step.step == preempted_at
    assert seconds["wastedProgress"] == 0.0  # nothing trained after the checkpoint saved on notice
    # Each step sleeps STEP_SECONDS: the steps between each attempt's first and last line (12 - 2) at least.
    assert seconds["productive"] + seconds["checkpointSave"] + seconds["wastedProgress"] >= 10 * STEP_SECONDS
    assert seconds["firstStep"] >= 2 * STEP_SECONDS and seconds["installs"] > 0 and seconds["restore"] > 0
    # Billed from each boot's READY to the run's end in it; the third boot ran nothing.
    assert measured.billed_s == pytest.approx(sum(life[-1].at - w[0] for life, w in zip(lives, windows, strict=False)))
    run = RunTimeline.of(
        run_id=run_id,
        vm=events.vm,
        accelerator_type="v5litepod-1",
        chips=1,
        provisioning="spot",
        zone="us-central1-a",
        billed_s=measured.billed_s,
        measured=seconds,
    )
    assert sum(run.seconds[c.key] for c in timeline.CATEGORIES if c.billed) == pytest.approx(measured.billed_s)
    share = run.seconds["unattributed"] / measured.billed_s
    print(
        f"{run_id}: unattributed {run.seconds['unattributed']:.3f} s of {measured.billed_s:.3f} s billed ({share:.2%})"
    )
    # No phase of the run is missing from the categories: the remainder is exactly what the design leaves
    # unattributed, in each boot from the program's last step or save line to the run's end (the program's exit,
    # then the agent's status and completion marker). From the events, not the categories, so a phase measured
    # short or not at all fails here; how long the bookkeeping takes (the machine's load) does not.
    trained = ("firstStep", "step", "checkpoint")
    last_lines = [max(i for i, e in enumerate(life) if e.kind in trained) for life in lives]
    assert [[e.kind for e in life[i + 1 :]] for life, i in zip(lives, last_lines, strict=True)] == [["exit", "end"]] * 2
    bookkeeping = sum(life[-1].at - life[i].at for life, i in zip(lives, last_lines, strict=True))
    assert run.seconds["unattributed"] == pytest.approx(bookkeeping, abs=1e-6)
    # The VM's idle time: each boot after its run's end until the node stopped, and the whole third boot.
    idle = sum(w[1] - life[-1].at for life, w in zip(lives, windows, strict=False)) + windows[2][1] - windows[2][0]
    assert report.idle_seconds(windows, [measured]) == pytest.approx(idle)
    check_simulation(events.events, lives, windows, measured)


def check_simulation(events, lives, windows, measured: timeline.Measured) -> None:
    """The simulation (tools/offline/simulation.py) fed this run's measured figures and its preemption predicts
    its billed time and its time to finish within 10%. Fed: each boot's mean boot, installs and first step, the
    restore, the program's mean save and step times (from its step lines), the preemption's time after the
    first READY and its save on notice (SIGTERM to the run's end in that boot), and the time until the node was
    READY again as the guard's re-creation. What it adds itself: how steps, saves, restarts and the save on
    notice make up a run."""
    attempts = measured.preemptions + 1
    seconds = measured.seconds
    saves = [e.seconds or 0.0 for e in events if e.kind == "checkpoint"]
    save_s = sum(saves) / len(saves)
    # The agent keeps an attempt's first and last step lines (and every save): the steps between, less their saves.
    trained = stepped = 0.0
    for life in lives:
        first = next(e for e in life if e.kind == "firstStep")
        last = [e for e in life if e.kind == "step"][-1]
        assert first.step is not None and last.step is not None
        stalled = sum(e.seconds or 0.0 for e in life if e.kind == "checkpoint" and first.at < e.at <= last.at)
        trained, stepped = trained + last.at - first.at - stalled, stepped + last.step - first.step
    step_s = trained / stepped
    sigterm = next(e for e in lives[0] if e.kind == "sigterm")
    scenario = simulation.Scenario(
        interval_s=step_s,  # the trainer commits a checkpoint after every step
        save_s=save_s,
        losses=Losses(notice_s=SPOT_NOTICE_S, commit_s=lives[0][-1].at - sigterm.at),
        phases=Phases(
            boot_s=seconds["boot"] / attempts,
            installs_s=seconds["installs"] / attempts,
            restore_s=seconds["restore"] / measured.preemptions,  # a first start restores nothing
            first_step_s=seconds["firstStep"] / attempts,
        ),
        recovery_every_s=1e-3,
        delete_s=0.0,
        create_s=windows[1][0] - windows[0][1],
        work_s=(measured.steps - attempts) * step_s,  # each attempt's first step is in its firstStep
        preempted_after_s=(sigterm.at - windows[0][0],),
    )
    predicted = simulation.simulate(scenario, seed=0)
    finished = lives[1][-1].at - windows[0][0]
    print(
        f"simulated: billed {predicted.billed_s:.2f} s (measured {measured.billed_s:.2f} s), finished after "
        f"{predicted.finished_s:.2f} s (measured {finished:.2f} s)"
    )
    assert predicted.preemptions == 1 and predicted.seconds["wastedProgress"] == 0
    assert predicted.billed_s == pytest.approx(measured.billed_s, rel=0.10)
    assert predicted.finished_s == pytest.approx(finished, rel=0.10)


@pytest.mark.slow
def test_a_folder_source_is_preempted_resumed_and_completed(cloud, tmp_path):
    run_id = "dev/trainer/trainer-1/folder"
    spec = trainer_spec(cloud, "folder", 12, str(STEP_SECONDS), modelDir=f"gs://{MODELS}/folder")
    with metadata_server({"tpu-platform-run": spec}) as metadata:
        vm = Vm(tmp_path, cloud, metadata, "folder-vm")
        preempt_resume_complete(cloud, vm, run_id, "folder/")
    contract = vm.lines('"contract"')[0]
    assert contract["env"]["TPU_PLATFORM_MODEL_DIR"] == f"gs://{MODELS}/folder"
    assert f"/venvs/{cloud['sha'][:16]}-" in contract["tinyckpt"]  # its own requirement, in its own virtualenv
    assert json.loads(cloud["storage"].read(MODELS, "folder/model.json"))["steps"] == 12


@pytest.mark.slow
def test_an_image_source_runs_with_the_tpu_flags_and_is_preempted_resumed_and_completed(cloud, tmp_path):
    run_id = "dev/trainer/trainer-1/image"
    spec = run_spec(
        run_id,
        {"kind": "image", "image": IMAGE},
        ["python3", "train.py", "--steps", "12"],
        env={"STEP_SECONDS": str(STEP_SECONDS), "STORAGE_EMULATOR_HOST": cloud["host"]},
        checkpointDir=f"gs://{CHECKPOINTS}/image",
        completion=True,
    )
    with metadata_server({"tpu-platform-run": spec}) as metadata:
        vm = Vm(tmp_path, cloud, metadata, "image-vm")
        preempt_resume_complete(cloud, vm, run_id, "image/")
    calls = [json.loads(line) for line in (tmp_path / "docker" / "calls.jsonl").read_text().splitlines()]
    assert calls[0] == ["login", "-u", "oauth2accesstoken", "--password-stdin", "https://us-central1-docker.pkg.dev"]
    assert calls[1] == ["pull", IMAGE]
    run = next(call for call in calls if call[0] == "run")
    # Hardened where Google's guide says --privileged --net=host (vm_agent/runner.py container_argv).
    assert {"--rm", "--cap-drop=ALL", "--security-opt=no-new-privileges"} <= set(run)
    assert "--privileged" not in run and "--net=host" not in run  # one host: no host network
    # The agent's own network, the run's own address on it; made once, before the first run.
    assert next(c for c in calls if c[0] == "network" and c[1] != "inspect")[:2] == ["network", "create"]
    assert run[run.index("--network") + 1] == "tpu-platform-runs"
    assert run[run.index("--ip") + 1].startswith("172.31.254.")
    assert "GCE_METADATA_HOST" in {run[i + 1] for i, word in enumerate(run) if word == "-e"}  # the proxy's listener
    assert run[run.index("--ulimit") + 1] == "memlock=-1:-1"
    assert int(run[run.index("--user") + 1].split(":")[0]) >= 61184  # the run's own uid (vm_agent/isolation.py)
    passed = {run[i + 1] for i, word in enumerate(run) if word == "-e"}
    assert {"TPU_PLATFORM_RUN_ID", "TPU_RUNTIME_FLAG", "STEP_SECONDS"} <= passed
    assert not any("=" in name for name in passed)  # values travel in the environment, not in argv (ps)
    contract = vm.lines('"contract"')[0]
    assert contract["env"]["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CHECKPOINTS}/image"
    assert contract["env"]["TPU_PLATFORM_RUN_ID"] == run_id
    assert contract["python"].startswith("/") and "/venvs/" not in contract["python"]  # the image's own


@pytest.mark.slow
def test_a_changed_run_setting_starts_the_new_run_without_a_reboot(cloud, tmp_path):
    first = trainer_spec(cloud, "a", 1000, "0.2")
    second = trainer_spec(cloud, "b", 3, "0")
    with metadata_server({"tpu-platform-run": first}) as metadata:
        vm = Vm(tmp_path, cloud, metadata, "change-vm")
        vm.boot()
        try:
            wait_for(lambda: len(steps(cloud, "a/")) >= 2, 120, "the first run's checkpoints", interval=0.2)
            metadata.set("tpu-platform-run", second)  # what `pulumi up` changing the run settings does
            wait_state(cloud, "change-vm", "dev/trainer/trainer-1/b", "finished", 120, "the new run to finish")
        finally:
            code = vm.shut_down()
        assert code == 0
    old = state(cloud, "change-vm", "dev/trainer/trainer-1/a")
    assert (old["state"], old["exitCode"]) == ("stopped", 75), vm.log()[-3000:]
    committed = vm.lines("SIGTERM: checkpoint committed")[0]["step"]
    assert steps(cloud, "a/")[-1] == committed  # the old run's last step is in the bucket
    assert read_json(cloud, STATUS, "change-vm/COMPLETE")["runId"] == "dev/trainer/trainer-1/b"  # type: ignore[index]
    assert vm.process is not None and len(vm.lines("agent stopped")) == 1  # one agent all along: no reboot


def test_a_refused_spec_is_logged_and_recorded_and_the_agent_keeps_waiting(cloud, tmp_path):
    bad = json.dumps(
        {
            "runId": "dev/trainer/trainer-1/bad",
            "source": {"kind": "folder", "uri": "gs://elsewhere/x.tar.gz", "sha256": "0" * 64},
            "command": ["python", "train.py"],
            "requester": "stack",
        }
    )
    with metadata_server({"tpu-platform-run": bad}) as metadata:
        vm = Vm(tmp_path, cloud, metadata, "bad-vm")
        vm.boot()
        try:
            wait_for(lambda: state(cloud, "bad-vm", "dev/trainer/trainer-1/bad"), 30, "the refusal's record")
        finally:
            assert vm.shut_down() == 0
    record = state(cloud, "bad-vm", "dev/trainer/trainer-1/bad")
    assert record["state"] == "failed"
    assert "must be under the stack's artifacts bucket" in record["error"]
    refused = vm.lines("refused run spec")
    assert refused and refused[0]["severity"] == "ERROR" and "Traceback" not in vm.log()


def test_bad_agent_settings_exit_78_with_one_line_naming_each_problem(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "TPU_PLATFORM_VM": "v",
        "TPU_PLATFORM_GRACE_SECONDS": "soon",
        "TPU_PLATFORM_REGISTRY": "docker.io/x",
    }
    done = subprocess.run(["/usr/bin/python3", "-m", "vm_agent"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78
    line = json.loads(done.stdout.strip())
    assert line["severity"] == "CRITICAL"
    for says in (
        "TPU_PLATFORM_STACK is missing",
        "TPU_PLATFORM_STATUS_DIR is missing",
        "TPU_PLATFORM_GRACE_SECONDS='soon'",
        "TPU_PLATFORM_REGISTRY='docker.io/x'",
    ):
        assert says in line["message"]


def test_a_poll_interval_that_is_not_a_number_is_a_settings_problem_not_a_traceback(tmp_path, capsys):
    env = {
        "TPU_PLATFORM_STACK": "dev",
        "TPU_PLATFORM_VM": "v",
        "TPU_PLATFORM_STATUS_DIR": str(tmp_path),
        "TPU_PLATFORM_POLL_SECONDS": "often",
    }
    assert agent.main(env) == 78
    line = json.loads(capsys.readouterr().out.strip())
    assert line["severity"] == "CRITICAL" and "TPU_PLATFORM_POLL_SECONDS='often'" in line["message"]


@pytest.mark.slow
def test_a_removed_run_stops_cleanly_and_resumes_when_it_is_wanted_again(cloud, tmp_path):
    spec = trainer_spec(cloud, "again", 8, "0.25")
    with metadata_server({"tpu-platform-run": spec}) as metadata:
        vm = Vm(tmp_path, cloud, metadata, "again-vm")
        vm.boot()
        try:
            wait_for(lambda: len(steps(cloud, "again/")) >= 2, 120, "checkpoints", interval=0.2)
            metadata.delete("tpu-platform-run")  # the stack no longer wants a run on this VM
            wait_state(cloud, "again-vm", "dev/trainer/trainer-1/again", "stopped", 60, "the run to stop")
            stopped_at = steps(cloud, "again/")[-1]
            metadata.set("tpu-platform-run", spec)
            wait_state(cloud, "again-vm", "dev/trainer/trainer-1/again", "finished", 120, "the run to finish")
        finally:
            assert vm.shut_down() == 0
    assert vm.lines("resumed from checkpoint")[-1]["step"] == stopped_at
    assert state(cloud, "again-vm", "dev/trainer/trainer-1/again")["exitCode"] == 0
