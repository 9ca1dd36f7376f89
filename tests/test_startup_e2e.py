"""The real rendered start-up script, booted in a sandbox against a GCS emulator and a metadata
server on loopback (see tests/sandbox.py for what is shimmed and why): it fetches the real VM agent
(vm_agent/, packaged as `pulumi up` uploads it) by its digest, and the agent runs the example folder
the stack names (workloads/tf_mnist, workloads/jax_mnist) from its content-hashed archive.

For both examples: first boot starts the run; SIGTERM (what GCE sends before a preemption) to the
agent reaches the program, which leaves a committed checkpoint in the bucket; the next boot resumes
from that step, not from zero, and finishes with the same step count as an uninterrupted run and
`resumes: 1`; a third boot runs nothing; the run's timeline holds both attempts, the SIGTERM with
nothing lost, the restore at that step and every save with the stall the program logged. The dev VM
says `onCompletion: stop`, yet the VM holds no TPU API right (tests/test_access.py, the workload
account's grants): the platform, not the VM, acts on a finished run.
And the guard's side of run to completion: the completion marker's event makes the guard stop the
node; a scheduled start of that VM afterwards does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import pytest
from google.cloud import storage

from infra.config import parse_stack_config
from infra.startup import AGENT_UNIT
from infra.tpu.metadata import source_digests, vm_metadata
from run_contract.timeline import RunEvents, measure
from tests.sandbox import Vm, deployed_stack, free_port, sandbox_sts, storage_emulator, wait_for
from tests.support import stack_config, with_object
from tests.workloads import WORKLOADS, run_workload, workloads_python
from tests.workloads import committed_steps as committed_checkpoints
from tools.standins.metadata import metadata_server

pytestmark = [pytest.mark.slow, pytest.mark.workloads]

BATCH, EPOCHS, TRAIN = 32, 12, 2048
TOTAL_STEPS = EPOCHS * (TRAIN // BATCH)  # what an uninterrupted run trains
# Two hosts' mean gradient equals one host's over the same global batch up to float summation order
# (measured: equal to the 5 decimals the log keeps).
LOSS_TOLERANCE = 1e-3


def installed_version(module: str) -> str:
    done = subprocess.run(
        [workloads_python(), "-c", f"import {module}; print({module}.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with storage_emulator() as host:
        os.environ["STORAGE_EMULATOR_HOST"] = host
        client = deployed_stack(("workloads/tf_mnist", "workloads/jax_mnist"))
        sample = tmp_path_factory.mktemp("data") / "mnist.npz"
        subprocess.run(
            [workloads_python(), str(WORKLOADS / "sample_mnist.py"), str(sample), "--train", str(TRAIN)], check=True
        )
        client.bucket("acme-ml-sandbox-dev-data").blob("mnist/mnist.npz").upload_from_filename(sample)
        yield client
        del os.environ["STORAGE_EMULATOR_HOST"]


def vm_metadata_for(
    program: str, framework_module: str, epochs: int = EPOCHS, run: str = "", vm: dict | None = None
) -> tuple[dict[str, str], str]:
    """The dev stack's VM, running `program` pinned to the framework the sandbox has, with small settings."""
    raw = with_object(
        stack_config(),
        "workloads",
        lambda w: w["mnist"].update(
            program=program,
            frameworkVersion=installed_version(framework_module),
            run=run or f"e2e-{program.replace('_', '-')}",
            epochs=epochs,
            batchSize=BATCH,
            checkpointEverySteps=20,
        ),
    )
    # JAX 0.7+ needs Python 3.11, which v4's tpu-ubuntu2204-base (Ubuntu 22.04) lacks: the plan refuses
    # it, so the JAX run takes a v5e, whose runtime's Python the start-up script checks at boot.
    jax_vm = {"acceleratorType": "v5litepod-4", "zone": "us-central1-a"} if program == "jax_mnist" else {}
    raw = with_object(raw, "tpuVms", lambda v: v[0].update(runtimeVersion=_runtime_for(program, raw), **jax_vm))
    if vm:

        def merged(vms: list) -> None:  # a None in `vm` unsets that key
            vms[0] = {k: x for k, x in {**vms[0], **vm}.items() if x is not None}

        raw = with_object(raw, "tpuVms", merged)
    cfg = parse_stack_config("dev", raw)
    metadata = vm_metadata(cfg, source_digests(cfg))[cfg.tpu_vms[0].name]
    return {**metadata, "agent-worker-number": "0"}, AGENT_UNIT


def _runtime_for(program: str, raw: dict[str, str]) -> str:
    version = json.loads(raw["tpu-platform:workloads"])["mnist"]["frameworkVersion"]
    # A -se runtime for TF: a -pjrt one points TF at /lib/libtpu.so (TF_PLUGGABLE_DEVICE_LIBRARY_PATH in the
    # unit), which a TPU VM has and this sandbox does not: TF's import would fail there, as it should.
    return "v2-alpha-tpuv5-lite" if program == "jax_mnist" else f"tpu-vm-tf-{version}-se"


def committed_steps(client: storage.Client, prefix: str) -> list[int]:
    names = [b.name.removeprefix(prefix) for b in client.list_blobs("acme-ml-sandbox-dev-checkpoints", prefix=prefix)]
    return committed_checkpoints(names)


@pytest.mark.parametrize(("program", "module"), [("tf_mnist", "tensorflow"), ("jax_mnist", "jax")])
def test_preempted_run_resumes_and_finishes_once(program, module, emulator, tmp_path):
    metadata, unit = vm_metadata_for(program, module)
    run = f"mnist/mnist-v2-spot/e2e-{program.replace('_', '-')}/"
    run_id = f"dev/{run.rstrip('/')}"
    with metadata_server(metadata) as metadata_host:
        vm = Vm(tmp_path, metadata_host, os.environ["STORAGE_EMULATOR_HOST"])

        # Boot 1: the run starts; preempt it once a checkpoint is committed.
        first = vm.boot(metadata["startup-script"])
        assert first.returncode == 0, first.stderr + first.stdout
        assert f"agent started as {unit}" in first.stdout
        try:
            wait_for(lambda: committed_steps(emulator, run), 180, "a first committed checkpoint", interval=0.2)
        except TimeoutError as error:
            raise AssertionError(f"{error}; the workload's log:\n{vm.log(unit)[-3000:]}") from None
        pid = vm.pid(unit)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # to the agent, as systemd stops the unit on a preemption
        wait_for(lambda: not vm.alive(unit), 60, "the agent to exit after SIGTERM")
        log = vm.log(unit)
        assert "SIGTERM: checkpoint written, exiting for preemption" in log, log[-3000:]
        state = json.loads(
            emulator.bucket(STATUS_BUCKET).blob(f"mnist-v2-spot/runs/{run_id}/status.json").download_as_bytes()
        )
        assert (state["state"], state["exitCode"]) == ("stopped", 75), state
        preempted_at = committed_steps(emulator, run)[-1]
        assert 0 < preempted_at < TOTAL_STEPS
        assert not emulator.bucket("acme-ml-sandbox-dev-checkpoints").blob(run + "COMPLETE").exists()

        # Boot 2: the run resumes from that step and finishes.
        second = vm.boot(metadata["startup-script"])
        assert second.returncode == 0, second.stderr + second.stdout
        wait_for(lambda: completed(emulator, run_id), 300, "the resumed run to finish", interval=0.5)
        log = vm.log(unit)
        resumed = [json.loads(line) for line in log.splitlines() if '"resumed from checkpoint"' in line]
        assert resumed and resumed[-1]["step"] == preempted_at, log[-3000:]
        metrics = json.loads(
            emulator.bucket("acme-ml-sandbox-dev-models").blob(run + "metrics.json").download_as_bytes()
        )
        assert metrics["steps"] == TOTAL_STEPS
        assert metrics["resumes"] == 1
        assert metrics["val_accuracy"] > 0.8
        structured = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"loss"' in line]
        assert structured and {"severity", "run_id", "step", "loss"} <= structured[-1].keys()
        assert structured[-1]["run_id"] == f"dev/{run.rstrip('/')}"

        assert completed(emulator, run_id)  # by the agent, when the program exited 0
        assert not sandbox_sts()[0].violations  # every token exchange the agent made was well formed

        # Boot 3 (the VM stopped and started again): the run is complete; the agent starts it no more.
        os.kill(vm.pid(unit) or 0, signal.SIGTERM)
        wait_for(lambda: not vm.alive(unit), 60, "the agent to exit when the VM stops")
        trained = vm.log(unit).count('"training"')
        third = vm.boot(metadata["startup-script"])
        assert third.returncode == 0, third.stderr
        wait_for(lambda: "not starting it again" in vm.log(unit), 60, "the agent to see the finished run")
        assert vm.log(unit).count('"training"') == trained
    check_timeline(emulator, run_id, vm.log(unit), preempted_at)


STATUS_BUCKET = "acme-ml-sandbox-dev-status"


def check_timeline(
    client: storage.Client, run_id: str, log: str, preempted_at: int, steps: int = TOTAL_STEPS, told: int = 1
) -> None:
    """The run's timeline against what the sandbox did: two boots of one attempt each, one stop on notice whose
    checkpoint was committed (nothing lost), one restore at that step in the seconds the program logged, every
    step, and every save with the stall the program logged, each after training began. `told`: how many SIGTERMs
    the record's own agent sent (a slice's worker 0 may see its program stop on another host's notice first).
    `log` is that worker's."""
    raw = client.bucket(STATUS_BUCKET).blob(f"mnist-v2-spot/runs/{run_id}/timeline.json").download_as_bytes()
    record = RunEvents.from_json(json.loads(raw))
    assert record.vm == "mnist-v2-spot" and record.step_lines_trusted
    events = record.events
    kinds = [e.kind for e in events]
    # Else: every event with its step and exit code, and the errors the log holds (what ended an attempt early).
    errors = [line for line in log.splitlines() if '"severity": "ERROR"' in line or "Terminating process" in line]
    described = ([(e.kind, e.step, e.code) for e in events], errors[-5:])
    assert kinds.count("agentStart") == 2 and kinds.count("programStart") == 2 and kinds.count("end") == 2, described
    # Exit 75 even when this agent's SIGTERM reaches the program on its way out (runlib ignores it then).
    assert kinds.count("sigterm") == told and [e.code for e in events if e.kind == "exit"] == [75, 0]
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    (restore,) = [line for line in lines if line.get("message") == "resumed from checkpoint"]
    assert [(e.step, e.seconds) for e in events if e.kind == "restored"] == [(preempted_at, restore["seconds"])]
    saves = [line["seconds"] for line in lines if line.get("message") == "checkpoint saved"]
    assert sorted(e.seconds or 0.0 for e in events if e.kind == "checkpoint") == pytest.approx(sorted(saves))
    measured = measure(events)
    assert (measured.preemptions, measured.lost_without_notice, measured.steps) == (1, 0, steps)
    seconds = measured.seconds
    assert seconds["wastedProgress"] == 0.0  # the save on notice kept every step trained
    assert seconds["restore"] == pytest.approx(restore["seconds"])
    # Each save of a step past the attempt's start, so after training began: every stall is a save's.
    assert seconds["checkpointSave"] == pytest.approx(sum(saves))
    assert min(seconds[k] for k in ("installs", "firstStep", "productive")) > 0
    assert (seconds["queue"], seconds["recoveryWait"], seconds["idle"]) == (0.0, 0.0, 0.0)  # no node records here
    unattributed = measured.billed_s - sum(seconds.values())
    assert unattributed >= 0
    print(f"{run_id}: {measured.billed_s:.1f} s billed, unattributed {unattributed:.1f} s (evaluation, export)")


def completed(client: storage.Client, run_id: str) -> bool:
    """The agent wrote the run's completion marker: the program exited 0 (the agent itself keeps running)."""
    marker = client.bucket(STATUS_BUCKET).get_blob("mnist-v2-spot/COMPLETE")
    return marker is not None and json.loads(marker.download_as_bytes()).get("runId") == run_id


NODE = "projects/acme-ml-sandbox/locations/us-central1-b/nodes/mnist-v2-spot"


def test_a_completed_run_is_stopped_by_the_guard_and_not_restarted_by_its_schedule(emulator, tmp_path, monkeypatch):
    """Run to completion, guard side: the marker's finalize event makes the guard stop the node on the
    TPU API stand-in (requests checked against tpu.v2); the morning's scheduled start then does nothing.

    The marker is the one the real workload writes (`TPU_PLATFORM_STATUS_DIR` from the VM's metadata);
    everything is the real start-up script, workload and guard.
    """
    import sys
    from datetime import UTC, datetime
    from pathlib import Path

    from cloudevents.http import CloudEvent
    from flask import Request
    from werkzeug.test import EnvironBuilder

    from tests.tpu_api import tpu_api_standin
    from tools.standins.contracts import CheckedSession

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"))
    import main as guard

    metadata, unit = vm_metadata_for("tf_mnist", "tensorflow")
    with metadata_server(metadata) as metadata_host, tpu_api_standin() as (url, tpu):
        tpu.add(
            {
                "name": NODE,
                "state": "READY",
                "acceleratorType": "v2-8",
                "runtimeVersion": "tpu-vm-tf-2.21.0-pjrt",
                "labels": {"environment": "dev", "managed-by": "pulumi"},
            }
        )
        vm = Vm(tmp_path, metadata_host, os.environ["STORAGE_EMULATOR_HOST"])
        first = vm.boot(metadata["startup-script"])
        assert first.returncode == 0, first.stderr + first.stdout
        wait_for(
            lambda: completed(emulator, "dev/mnist/mnist-v2-spot/e2e-tf-mnist"), 300, "the run to finish", interval=0.5
        )
        run = "mnist/mnist-v2-spot/e2e-tf-mnist/COMPLETE"  # runlib's own marker: the run is complete
        assert emulator.bucket("acme-ml-sandbox-dev-checkpoints").blob(run).exists(), vm.log(unit)[-2000:]

        marker = emulator.bucket(STATUS_BUCKET).get_blob("mnist-v2-spot/COMPLETE")
        assert marker is not None, vm.log(unit)[-2000:]  # written by the agent when the program exited 0
        assert json.loads(marker.download_as_bytes())["runId"] == "dev/mnist/mnist-v2-spot/e2e-tf-mnist"
        session = CheckedSession()
        settings = {
            "PROJECT": "acme-ml-sandbox",
            "ENVIRONMENT": "dev",
            "ZONES": "us-central1-b",
            "TPU_API_ENDPOINT": url,
            "STATUS_BUCKET": STATUS_BUCKET,
            "TPU_VMS": json.dumps(
                {"mnist-v2-spot": {"nodes": ["mnist-v2-spot"], "zones": ["us-central1-b"], "onCompletion": "stop"}}
            ),
        }
        for key, value in settings.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(guard, "_session", lambda: session)
        event = CloudEvent(
            {
                "type": "google.cloud.storage.object.v1.finalized",
                "time": datetime.now(UTC).isoformat(),
                "source": f"//storage.googleapis.com/projects/_/buckets/{STATUS_BUCKET}",
            },
            {"bucket": STATUS_BUCKET, "name": marker.name, "generation": str(marker.generation)},
        )
        guard.on_complete(event)
        assert tpu.nodes[NODE]["state"] == "STOPPED" and tpu.did("stop") == ["mnist-v2-spot"]

        start = Request(EnvironBuilder(method="POST", json={"node": "mnist-v2-spot"}).get_environ())
        answer, status = guard.scheduled_start(start)
        assert status == 200 and json.loads(answer)["did"] == "nothing", answer
        assert "completed its run" in json.loads(answer)["reason"]
        assert tpu.nodes[NODE]["state"] == "STOPPED" and tpu.did("start") == []
        assert tpu.violations == [] and session.violations == []


TWO_HOST_EPOCHS = 2  # 128 steps: a few checkpoints, quick on two CPU processes


def final_loss(log: str, step: int) -> float:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{") and '"training"' in line]
    return next(line["loss"] for line in lines if line["step"] == step)


def test_two_host_slice_trains_stops_together_on_one_sigterm_and_resumes(emulator, tmp_path):
    """A v5p-16 (two hosts of four chips) booted as two sandboxed workers of one slice: the real start-up
    script on each, with worker numbers 0 and 1 and the worker endpoints in their metadata (both on
    loopback; the coordinator's port is the sandbox's override). The script derives the coordinator and
    jax.distributed joins the two processes; each feeds half of every global batch; a SIGTERM to worker
    1 stops both at one step with a committed checkpoint; both resume and finish, at the loss of one
    process trained on the same global batches (tolerance: LOSS_TOLERANCE)."""
    slice_vm = {
        "acceleratorType": "v5p-16",
        "runtimeVersion": "v2-alpha-tpuv5",
        "onCompletion": "delete",
        "schedule": None,
    }  # a slice cannot be stopped: the guard deletes it once complete
    metadata, unit = vm_metadata_for("jax_mnist", "jax", TWO_HOST_EPOCHS, "e2e-two-host", slice_vm)
    metadata.pop("agent-worker-number")
    run = "mnist/mnist-v2-spot/e2e-two-host/"
    run_id = f"dev/{run.rstrip('/')}"
    total = TWO_HOST_EPOCHS * (TRAIN // BATCH)
    endpoints = "w-0:0:127.0.0.1,w-1:1:127.0.0.1"  # Cloud TPU's name:id:ip form, worker 0 first
    port = str(free_port())
    with contextlib.ExitStack() as stack:
        vms = []
        for worker in (0, 1):
            attributes = {**metadata, "agent-worker-number": str(worker), "worker-network-endpoints": endpoints}
            host = stack.enter_context(metadata_server(attributes))
            vm = Vm(tmp_path / f"worker-{worker}", host, os.environ["STORAGE_EMULATOR_HOST"])
            vm.env["TPU_PLATFORM_COORDINATOR_PORT"] = port
            vms.append(vm)

        def boot_all() -> None:
            for vm in vms:
                done = vm.boot(metadata["startup-script"])
                assert done.returncode == 0, done.stderr + done.stdout

        def logs() -> str:
            return "\n".join(f"--- worker {w}:\n{vm.log(unit)[-2500:]}" for w, vm in enumerate(vms))

        # Boot 1: both workers start; the unit's environment places each in the slice.
        boot_all()
        for worker, vm in enumerate(vms):
            env = (vm.root / "etc/tpu-platform/agent.env").read_text()
            assert f"TPU_PLATFORM_WORKER_ID={worker}\nTPU_PLATFORM_WORKER_COUNT=2\n" in env
            assert f"TPU_PLATFORM_COORDINATOR=127.0.0.1:{port}\n" in env
        try:
            wait_for(lambda: committed_steps(emulator, run), 180, "a first committed checkpoint", interval=0.2)
        except TimeoutError as error:
            raise AssertionError(f"{error}; the workers' logs:\n{logs()}") from None
        assert "in 2 process(es)" in vms[0].log(unit) and "in 2 process(es)" in vms[1].log(unit)
        pid = vms[1].pid(unit)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # only worker 1 is told of the preemption (its agent passes it on)

        def signalled() -> list[list[dict]]:
            return [
                [json.loads(line) for line in vm.log(unit).splitlines() if '"SIGTERM: checkpoint written' in line]
                for vm in vms
            ]

        wait_for(lambda: all(signalled()), 60, "both workers' programs to stop at one step after one SIGTERM")
        # The rest of the slice goes down with it, as a preempted slice does.
        os.kill(vms[0].pid(unit) or 0, signal.SIGTERM)
        for vm in vms:
            wait_for(lambda vm=vm: not vm.alive(unit), 60, "both agents to exit")
        stopped = signalled()
        assert [len(s) for s in stopped] == [1, 1], logs()
        assert [s[0]["signalled_here"] for s in stopped] == [False, True]
        preempted_at = committed_steps(emulator, run)[-1]
        assert stopped[0][0]["step"] == stopped[1][0]["step"] == preempted_at
        assert 0 < preempted_at < total
        assert not emulator.bucket("acme-ml-sandbox-dev-checkpoints").blob(run + "COMPLETE").exists()

        # Boot 2: both resume from that step and finish together.
        boot_all()
        finished = "the resumed slice to finish"
        try:
            wait_for(lambda: completed(emulator, run_id), 300, finished, interval=0.5)
        except TimeoutError as error:  # once in a clean-clone run, with no logs to say why: now they say
            raise AssertionError(f"{error}; the workers' logs:\n{logs()}") from None
        resumed = [
            [json.loads(line)["step"] for line in vm.log(unit).splitlines() if '"resumed from checkpoint"' in line]
            for vm in vms
        ]
        assert resumed == [[preempted_at], [preempted_at]], logs()
        models = emulator.bucket("acme-ml-sandbox-dev-models")
        metrics = json.loads(models.blob(run + "metrics.json").download_as_bytes())
        assert (metrics["steps"], metrics["resumes"]) == (total, 1)
        # Worker 0 keeps the slice's record; worker 1, told of the preemption, keeps none.
        told = vms[0].log(unit).count(f"stopping run {run_id}")
        assert told in (0, 1)  # worker 0's program may have stopped with worker 1's before its agent was told
        check_timeline(emulator, run_id, vms[0].log(unit), preempted_at, total, told)
        names = [b.name for b in emulator.list_blobs(STATUS_BUCKET, prefix=f"mnist-v2-spot/runs/{run_id}/")]
        assert [n for n in names if "timeline" in n] == [f"mnist-v2-spot/runs/{run_id}/timeline.json"], names

    # One process, the same global batches, no interruption: the slice reached its loss.
    sample = tmp_path / "mnist.npz"
    emulator.bucket("acme-ml-sandbox-dev-data").blob("mnist/mnist.npz").download_to_filename(sample)
    one = run_workload(
        "jax_mnist/jax_mnist.py",
        "--data",
        str(sample),
        "--epochs",
        str(TWO_HOST_EPOCHS),
        "--batch-size",
        str(BATCH),
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two_host = final_loss(vms[0].log(unit), total)
    assert two_host == pytest.approx(final_loss(one.stdout, total), abs=LOSS_TOLERANCE), (two_host, one.stdout[-500:])
