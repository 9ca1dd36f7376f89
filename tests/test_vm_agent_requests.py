"""Self-service runs end to end: `tpu-runs` (the real CLI code) submits into the GCS emulator, the real
agent (`python -m vm_agent` with the system Python and agent.env) takes and runs the request, its
telemetry ships the program's lines and metrics to loopback stand-ins of Cloud Logging and Cloud
Monitoring (checked against their discovery documents), and `tpu-runs` lists, follows, stops and
fetches. The stack file is tests/stacks/Pulumi.self-service.yaml; the VM's names and buckets are derived
from it as the stack derives them.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from run_contract import paths
from run_contract.timeline import RunEvents, measure
from tests.runs_cloud import RunsCloud, runs_cloud
from tests.sandbox import wait_for
from tests.vm_agent_support import agent_environ, run_spec, start_agent, trainer_folder
from tpu_runs import cli
from vm_agent.settings import Settings, SettingsError

EXAMPLE = Path(__file__).resolve().parent / "stacks" / "Pulumi.self-service.yaml"
STACK = cli.load_stack("self-service", EXAMPLE)
PROJECT = STACK.cfg.project
SHARED = "shared-v5e-8"  # selfService: true
REVIEWED = "reviewed-v5e-8"  # selfService: false
CHECKPOINTS = STACK.cfg.bucket_name("checkpoints")
ALICE = "user:alice@acme.example"
OWNER = paths.member_key(ALICE)  # her folders: her runs are `<OWNER>/<runId>` to the agent


class Cloud(RunsCloud):
    """The emulator, the stand-ins, and `tpu-runs` pointed at them."""

    def tpu_runs(self, *argv: str) -> int:
        argv = (argv[0], "--stack", "self-service", "--stack-file", str(EXAMPLE), *argv[1:])
        return cli.main(argv, requests.Session())

    def state(self, vm: str, run_id: str, owner: str = OWNER) -> dict[str, Any]:
        """A run's state: one of ALICE's by default, the stack's with owner=""."""
        raw = self.read(STACK.status, f"{vm}/runs/{owner + '/' if owner else ''}{run_id}/status.json")
        return json.loads(raw) if raw else {}

    def steps(self, vm: str, run_id: str) -> list[int]:
        names = self.names(CHECKPOINTS, f"mnist/{vm}/{OWNER}/{run_id}/")
        return sorted(int(n.rsplit("ckpt-", 1)[1][:-5]) for n in names if "/ckpt-" in n)


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    buckets = (STACK.status, STACK.artifacts, STACK.models, CHECKPOINTS)
    with runs_cloud(
        Cloud, monkeypatch, tmp_path, project=PROJECT, buckets=buckets, vms=(SHARED, REVIEWED), requester=ALICE
    ) as cloud:
        yield cloud


class Agent:
    """The agent of one VM of the example stack, as the start-up script would configure it."""

    def __init__(self, cloud: Cloud, vm: str, **extra: str):
        settings = STACK.vm(vm)
        self.env = agent_environ(
            cloud.tmp / vm,
            cloud.metadata,
            cloud.storage,
            TPU_PLATFORM_STACK="self-service",
            TPU_PLATFORM_VM=vm,
            TPU_PLATFORM_PROJECT=PROJECT,
            TPU_PLATFORM_STATUS_DIR=f"gs://{STACK.status}/{vm}",
            TPU_PLATFORM_ARTIFACTS=f"gs://{STACK.artifacts}",
            TPU_PLATFORM_SELF_SERVICE="1" if settings.self_service else "0",
            TPU_PLATFORM_WORKLOAD=settings.workload,
            TPU_PLATFORM_MODELS=f"gs://{STACK.models}",
            TPU_PLATFORM_CHECKPOINTS=f"gs://{CHECKPOINTS}",
            TPU_PLATFORM_LOGGING_URL=cloud.logging,
            TPU_PLATFORM_MONITORING_URL=cloud.logging,
            **extra,
        )
        (cloud.tmp / vm).mkdir(exist_ok=True)
        self.log_path = cloud.tmp / vm / "agent.log"
        self.process: subprocess.Popen = start_agent(self.env, self.log_path)

    def shut_down(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def lines(self, message: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{") and message in line]

    def wait(self, predicate: Any, what: str, timeout: float = 120) -> None:
        try:
            wait_for(predicate, timeout, what, interval=0.3)
        except TimeoutError as error:
            raise AssertionError(f"{error}; the agent's log:\n{self.log()[-4000:]}") from None


@pytest.mark.slow
def test_a_submitted_run_is_run_followed_stopped_with_a_checkpoint_and_the_next_fetched(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
):
    folder = trainer_folder(cloud.tmp)
    submit = ("submit", "--vm", SHARED, "--folder", str(folder), "--env", "STEP_SECONDS=0.2")
    assert cloud.tpu_runs(*submit, "--run-id", "exp-1", "--", "python", "train.py", "--steps", "1000") == 0
    assert cloud.tpu_runs(*submit, "--run-id", "exp-2", "--", "python", "train.py", "--steps", "3") == 0
    agent = Agent(cloud, SHARED)
    try:
        agent.wait(lambda: len(cloud.steps(SHARED, "exp-1")) >= 3, "exp-1's checkpoints")
        running = cloud.state(SHARED, "exp-1")
        assert running["state"] == "running" and running["requester"] == ALICE
        assert running["request"].startswith(f"{SHARED}/requests/{OWNER}/")  # kept for the researcher side
        assert cloud.state(SHARED, "exp-2")["state"] == "queued"  # in order: one at a time

        capsys.readouterr()
        assert cloud.tpu_runs("list", "--vm", SHARED) == 0
        listed = capsys.readouterr().out
        assert "exp-1" in listed and "running" in listed and "exp-2" in listed and "queued" in listed

        # The program's lines reach Cloud Logging, in ALICE's own log (the one her log view shows), with the
        # run's labels; `tpu-runs logs` finds them through her view.
        agent.wait(lambda: any(e.get("jsonPayload", {}).get("step") for e in cloud.logs.entries), "shipped lines")
        assert cloud.tpu_runs("logs", "--vm", SHARED, "exp-1") == 0
        out = capsys.readouterr().out
        assert '"step": 1}' in out and '"loss": 0.9' in out
        entry = next(e for e in cloud.logs.entries if e.get("jsonPayload", {}).get("step") == 1)
        assert entry["labels"] == {"runId": f"{OWNER}/exp-1", "vm": SHARED, "worker": "0", "stack": "self-service"}
        assert entry["logName"] == f"projects/{PROJECT}/logs/{paths.researcher_log(ALICE)}"
        assert entry["resource"]["type"] == "generic_node" and entry["resource"]["labels"]["node_id"] == SHARED

        # Another researcher cannot stop it: a stop in Bob's folder (the only one IAM lets him write) names
        # Bob's exp-1, which does not exist; ALICE's keeps running.
        bob = "user:bob@acme.example"
        google = cli.Google(requests.Session(), "self-service")
        google.create(
            STACK.status, cli._request_name(SHARED, bob, "exp-1", stop=True), b'{"stop": "exp-1"}', cli.JSON_BYTES
        )
        agent.wait(
            lambda: agent.lines(f"stop {paths.member_key(bob)}/exp-1: no such self-service run"),
            "the agent to drop Bob's stop",
        )
        assert cloud.state(SHARED, "exp-1")["state"] == "running"

        # The researcher stops exp-1: SIGTERM, its checkpoint committed, exit 75; exp-2 runs next.
        assert cloud.tpu_runs("stop", "--vm", SHARED, "exp-1") == 0
        agent.wait(lambda: cloud.state(SHARED, "exp-1").get("state") == "stopped", "exp-1 to stop")
        stopped = cloud.state(SHARED, "exp-1")
        assert stopped["exitCode"] == 75 and stopped["request"] == running["request"]
        committed = agent.lines("SIGTERM: checkpoint committed")[0]["step"]
        assert cloud.steps(SHARED, "exp-1")[-1] == committed
        agent.wait(lambda: cloud.state(SHARED, "exp-2").get("state") == "finished", "exp-2 to finish")
    finally:
        assert agent.shut_down() == 0
    assert "Traceback" not in agent.log()

    # Training metrics reached Cloud Monitoring, labelled with the run; and, when it stopped, its time by
    # category as its record measures it, the categories its untrusted step lines decide marked so.
    points = [s for s in cloud.logs.time_series if s["metric"]["labels"]["run_id"] == f"{OWNER}/exp-1"]
    assert {s["metric"]["type"] for s in points} == {
        "custom.googleapis.com/tpu_platform/loss",
        "custom.googleapis.com/tpu_platform/run_seconds",
    }
    assert points[0]["metric"]["labels"]["vm"] == SHARED
    assert cloud.logs.violations == []
    goodput = {s["metric"]["labels"]["category"]: s for s in points if s["metric"]["type"].endswith("/run_seconds")}
    record = json.loads(cloud.read(STACK.status, f"{SHARED}/runs/{OWNER}/exp-1/timeline.json") or b"null")
    measured = measure(RunEvents.from_json(record).events).seconds
    for category in ("installs", "firstStep", "productive"):
        assert goodput[category]["points"][0]["value"]["doubleValue"] == pytest.approx(measured[category])
        assert measured[category] > 0
    assert goodput["productive"]["metric"]["labels"]["untrusted"] == "true"
    assert goodput["installs"]["metric"]["labels"]["untrusted"] == "false"  # the agent's own events

    # Shared capacity: no completion marker (the guard would stop or delete the VM).
    assert cloud.read(STACK.status, f"{SHARED}/COMPLETE") is None
    # exp-2's model and TensorBoard events are where `tpu-runs fetch` reads; it fetches them.
    assert cloud.tpu_runs("fetch", "--vm", SHARED, "exp-2", "--to", "exp-2") == 0
    assert json.loads((cloud.tmp / "exp-2" / "model.json").read_text())["steps"] == 3
    assert list((cloud.tmp / "exp-2" / "tensorboard").glob("events.out.tfevents.*"))
    contract = agent.lines('"contract"')[-1]["env"]
    assert contract["TPU_PLATFORM_MODEL_DIR"] == f"gs://{STACK.models}/mnist/{SHARED}/{OWNER}/exp-2"
    assert contract["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CHECKPOINTS}/mnist/{SHARED}/{OWNER}/exp-2"


@pytest.mark.parametrize(
    ("vm", "extra", "why"),
    [
        (REVIEWED, {}, f"TPU VM {REVIEWED} does not take self-service runs"),
        # A multi-host slice: every worker would have to run it; not built, so refused in words.
        (SHARED, {"TPU_PLATFORM_WORKER_COUNT": "2"}, f"TPU VM {SHARED} is a slice of 2 hosts"),
    ],
)
def test_a_request_the_vm_cannot_take_is_refused_by_its_agent_and_recorded(cloud: Cloud, vm, extra, why):
    # `tpu-runs submit` refuses a VM without selfService before any call; someone with wider rights
    # writes the request as the CLI would (its own naming and spec), and the VM's agent refuses it.
    spec = json.loads(run_spec("exp-9", {"kind": "image", "image": "x"}, ["python", "t.py"], requester=ALICE))
    spec["source"] = {"kind": "folder", "uri": f"gs://{STACK.artifacts}/sources/{'a' * 64}.tar.gz", "sha256": "a" * 64}
    google = cli.Google(requests.Session(), "self-service")
    request = cli._request_name(vm, ALICE, "exp-9")
    google.create(STACK.status, request, json.dumps(spec).encode(), cli.JSON_BYTES)
    agent = Agent(cloud, vm, **extra)
    try:
        agent.wait(lambda: cloud.state(vm, "exp-9"), "the refusal's record", timeout=60)
    finally:
        assert agent.shut_down() == 0
    record = cloud.state(vm, "exp-9")
    assert record["state"] == "failed" and record["request"] == request
    assert why in record["reason"]
    assert cloud.names(STACK.status, f"{vm}/requests/") == []
    assert not agent.lines("starting run") and "Traceback" not in agent.log()


def exp_1_checkpointing(cloud: Cloud, step_seconds: float) -> Agent:
    """`tpu-runs submit` of exp-1 (12 steps) to the shared VM, and its agent, once the run has written
    two checkpoints (the agent is shut down if it never does). Its first session holds at step 3 until
    it is stopped: a stop that comes late on a loaded machine still finds it running, where it could
    otherwise have trained all 12 steps and be exiting when the SIGTERM came."""
    folder = trainer_folder(cloud.tmp)
    submit = ("submit", "--vm", SHARED, "--folder", str(folder), "--env", f"STEP_SECONDS={step_seconds}")
    submit = (*submit, "--env", "HOLD_AT_STEP=3")
    assert cloud.tpu_runs(*submit, "--run-id", "exp-1", "--", "python", "train.py", "--steps", "12") == 0
    agent = Agent(cloud, SHARED)
    try:
        agent.wait(lambda: len(cloud.steps(SHARED, "exp-1")) >= 2, "exp-1's checkpoints")
    except BaseException:
        agent.shut_down()
        raise
    return agent


@pytest.mark.slow
def test_the_stacks_run_comes_first_and_a_preempted_request_resumes_after_it(cloud: Cloud):
    agent = exp_1_checkpointing(cloud, step_seconds=0.2)
    try:
        # The stack's run appears (pulumi up): the request makes way, with its checkpoint.
        assert cloud.read(STACK.status, cloud.state(SHARED, "exp-1")["request"]) is None  # taken once
        sha = cloud.state(SHARED, "exp-1")["source"]["sha256"]
        stack_run = run_spec(
            "self-service/mnist/shared-v5e-8/r1",
            {"kind": "folder", "uri": f"gs://{STACK.artifacts}/sources/{sha}.tar.gz", "sha256": sha},
            ["python", "train.py", "--steps", "3"],
            env={"STEP_SECONDS": "0"},
            checkpointDir=f"gs://{CHECKPOINTS}/mnist/{SHARED}/r1",
        )
        cloud.metadata.set("tpu-platform-run", stack_run)
        agent.wait(
            lambda: cloud.state(SHARED, "self-service/mnist/shared-v5e-8/r1", owner="").get("state") == "finished",
            "the stack's run to finish",
        )
        paused = agent.lines("comes first")
        assert paused, agent.log()[-3000:]
        agent.wait(lambda: cloud.state(SHARED, "exp-1").get("state") == "finished", "exp-1 to resume and finish")
    finally:
        assert agent.shut_down() == 0
    resumed = agent.lines("resumed from checkpoint")
    assert resumed and resumed[-1]["step"] == agent.lines("SIGTERM: checkpoint committed")[0]["step"]
    assert cloud.steps(SHARED, "exp-1")[-1] == 12
    assert cloud.state(SHARED, "exp-1")["request"].startswith(f"{SHARED}/requests/{OWNER}/")


@pytest.mark.slow
def test_a_request_run_stopped_by_the_vm_shutting_down_resumes_on_the_next_boot(cloud: Cloud):
    agent = exp_1_checkpointing(cloud, step_seconds=0.25)
    assert agent.shut_down() == 0  # a spot preemption or a stop of the VM
    waiting = cloud.state(SHARED, "exp-1")
    assert waiting["state"] == "queued" and "shutdown or preemption" in waiting["error"], agent.log()[-3000:]
    assert cloud.names(STACK.status, f"{SHARED}/requests/") == []  # nothing left to take: the state is the record
    committed = agent.lines("SIGTERM: checkpoint committed")[0]["step"]

    agent = Agent(cloud, SHARED)  # the next boot
    try:
        agent.wait(lambda: cloud.state(SHARED, "exp-1").get("state") == "finished", "exp-1 to resume and finish")
    finally:
        assert agent.shut_down() == 0
    assert agent.lines("resumes after a restart")
    assert agent.lines("resumed from checkpoint")[-1]["step"] == committed
    assert cloud.steps(SHARED, "exp-1")[-1] == 12


def test_the_settings_self_service_runs_need_are_checked_in_agent_env():
    base = {"TPU_PLATFORM_STACK": "s", "TPU_PLATFORM_VM": SHARED, "TPU_PLATFORM_STATUS_DIR": "gs://b/v"}
    with pytest.raises(SettingsError) as error:
        Settings.from_environ({**base, "TPU_PLATFORM_SELF_SERVICE": "1", "TPU_PLATFORM_MODELS": "s3://m"})
    assert error.value.problems == [
        "TPU_PLATFORM_MODELS='s3://m' does not match gs://[a-z0-9][a-z0-9._-]*[a-z0-9]",
        "TPU_PLATFORM_WORKLOAD is missing (self-service runs keep their files under it)",
    ]
    settings = Settings.from_environ({**base, "TPU_PLATFORM_SELF_SERVICE": "1", "TPU_PLATFORM_WORKLOAD": "mnist"})
    assert (settings.workload, settings.models, settings.checkpoints) == ("mnist", "", "")
