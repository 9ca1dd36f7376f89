"""The real rendered start-up script, booted in a sandbox against a GCS emulator and a metadata
server on loopback (see tests/sandbox.py for what is shimmed and why).

For both workloads: first boot starts the run; SIGTERM mid-training (what GCE sends before a
preemption) leaves a committed checkpoint in the bucket; the next boot resumes from that step, not
from zero, and finishes with the same step count as an uninterrupted run and `resumes: 1`; a third
boot does nothing. The dev VM says `onCompletion: stop`, yet the VM calls no TPU API (a stand-in on
loopback records any call): the platform, not the VM, acts on a finished run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess

import pytest
from google.cloud import storage

from infra.config import parse_stack_config
from infra.tpu.metadata import render_metadata, startup_spec
from tests.sandbox import Vm, metadata_server, storage_emulator, tpu_api, wait_for
from tests.support import stack_config, with_object
from tests.workloads import WORKLOADS, workloads_python

pytestmark = pytest.mark.slow

BATCH, EPOCHS, TRAIN = 32, 12, 2048
TOTAL_STEPS = EPOCHS * (TRAIN // BATCH)  # what an uninterrupted run trains


def installed_version(module: str) -> str:
    done = subprocess.run(
        [workloads_python(), "-c", f"import {module}; print({module}.__version__)"],
        capture_output=True, text=True, check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    with storage_emulator() as host:
        os.environ["STORAGE_EMULATOR_HOST"] = host
        client = storage.Client()
        for purpose in ("data", "checkpoints", "models"):
            client.create_bucket(f"acme-ml-sandbox-dev-{purpose}")
        sample = tmp_path_factory.mktemp("data") / "mnist.npz"
        subprocess.run(
            [workloads_python(), str(WORKLOADS / "sample_mnist.py"), str(sample), "--train", str(TRAIN)], check=True
        )
        client.bucket("acme-ml-sandbox-dev-data").blob("mnist/mnist.npz").upload_from_filename(sample)
        yield client
        del os.environ["STORAGE_EMULATOR_HOST"]


def vm_metadata_for(program: str, framework_module: str) -> tuple[dict[str, str], str]:
    """The dev stack's VM, running `program` pinned to the framework the sandbox has, with small settings."""
    raw = with_object(stack_config(), "workloads", lambda w: w["mnist"].update(
        program=program, frameworkVersion=installed_version(framework_module), run=f"e2e-{program.replace('_', '-')}",
        epochs=EPOCHS, batchSize=BATCH, checkpointEverySteps=20,
    ))  # fmt: skip
    raw = with_object(raw, "tpuVms", lambda v: v[0].update(runtimeVersion=_runtime_for(program, raw)))
    cfg = parse_stack_config("dev", raw)
    spec = startup_spec(cfg, cfg.tpu_vms[0])
    metadata = render_metadata(dataclasses.replace(spec))
    return {**metadata, "agent-worker-number": "0"}, spec.unit


def _runtime_for(program: str, raw: dict[str, str]) -> str:
    version = json.loads(raw["tpu-platform:workloads"])["mnist"]["frameworkVersion"]
    return "tpu-ubuntu2204-base" if program == "jax_mnist" else f"tpu-vm-tf-{version}-pjrt"


def committed_steps(client: storage.Client, prefix: str) -> list[int]:
    names = [b.name for b in client.list_blobs("acme-ml-sandbox-dev-checkpoints", prefix=prefix)]
    return sorted(int(n.split("/ckpt-")[1][:10]) for n in names if n.endswith("/COMMITTED"))


@pytest.mark.parametrize(("program", "module"), [("tf_mnist", "tensorflow"), ("jax_mnist", "jax")])
def test_preempted_run_resumes_and_finishes_once(program, module, emulator, tmp_path):
    metadata, unit = vm_metadata_for(program, module)
    run = f"mnist/mnist-v2-spot/e2e-{program.replace('_', '-')}/"
    with metadata_server(metadata) as metadata_host, tpu_api() as (api_url, api_calls):
        vm = Vm(tmp_path, metadata_host, os.environ["STORAGE_EMULATOR_HOST"], api_url)

        # Boot 1: the run starts; preempt it once a checkpoint is committed.
        first = vm.boot(metadata["startup-script"])
        assert first.returncode == 0, first.stderr + first.stdout
        assert f"workload mnist started as {unit}" in first.stdout
        wait_for(lambda: committed_steps(emulator, run), 180, "a first committed checkpoint", interval=0.2)
        pid = vm.pid(unit)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not vm.alive(unit), 60, "the workload to exit after SIGTERM")
        log = vm.log(unit)
        assert "SIGTERM: checkpoint written, exiting for preemption" in log, log[-3000:]
        preempted_at = committed_steps(emulator, run)[-1]
        assert 0 < preempted_at < TOTAL_STEPS
        assert not emulator.bucket("acme-ml-sandbox-dev-checkpoints").blob(run + "COMPLETE").exists()

        # Boot 2: the run resumes from that step and finishes.
        second = vm.boot(metadata["startup-script"])
        assert second.returncode == 0, second.stderr + second.stdout
        wait_for(lambda: not vm.alive(unit), 300, "the resumed run to finish", interval=0.5)
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
        assert api_calls == []  # the VM needs no TPU API rights: the platform's guard stops it

        # Boot 3: the run is complete; nothing starts.
        starts = vm.starts()
        third = vm.boot(metadata["startup-script"])
        assert third.returncode == 0, third.stderr
        assert "already completed its run; not starting it again" in third.stdout
        assert vm.starts() == starts
        assert api_calls == []
