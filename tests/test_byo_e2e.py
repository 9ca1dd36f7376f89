"""Bring your own code through a stack file alone, end to end: the stack's
workload names a folder of this repository outside workloads/ or an image of the stack's registry, and
a command; the real config reader parses it, the real metadata renderer plans the VM's metadata, and
the REAL rendered start-up script boots in the sandbox (tests/sandbox.py: GCS emulator, loopback
metadata server with `wait_for_change`), fetches the real VM agent by digest, and the agent runs it.

- A folder (tests/agent_sources/trainer, its own requirement `tinyckpt`): preempted (SIGTERM to the
  agent, as systemd stops the unit), resumed from its checkpoint on the next boot, completed.
- An image by digest, through the docker shim (tests/vm_agent_support.py) on the VM's PATH: the same,
  and the shim's record shows the container's hardening (the run's uid, no capability, no host network
  on one host) and the contract's environment.
- A changed run setting in the stack, re-rendered and set on the running metadata server (what
  `pulumi up` does to the VM's metadata), starts the new run with no reboot; the old run leaves a
  committed checkpoint and ends `stopped`, exit 75.

Offline stand-ins, said plainly: the trainer's requirement comes from a local wheel served on loopback (PIP_FIND_LINKS,
PIP_NO_INDEX in the VM's environment) instead of the package index; the sandbox's python3 shim
(tests/sandbox.py PYTHON3_SHIM) is the image's Python the folder's virtualenv is made from; the docker
shim runs the image's files locally. No TensorFlow or JAX is imported by the trainer.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.cloud import storage

from infra.config import parse_stack_config
from infra.packaging import repository_folder
from infra.startup import AGENT_UNIT, RUN_ATTRIBUTE
from infra.tpu.metadata import source_digests, vm_metadata
from tests.sandbox import Vm, deployed_stack, storage_emulator, wait_for
from tests.support import stack_config, with_object
from tests.vm_agent_support import CONTRACT, image_folder, install_docker_shim, wheel_index
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server

pytestmark = pytest.mark.slow

TRAINER = "tests/agent_sources/trainer"
IMAGE = f"us-central1-docker.pkg.dev/acme-ml-sandbox/tpu-dev/trainer@sha256:{'e' * 64}"
STEPS = 12
VM = "mnist-v2-spot"  # the dev stack's VM; its workload `mnist` is replaced by the team's own
CHECKPOINTS = "acme-ml-sandbox-dev-checkpoints"
MODELS = "acme-ml-sandbox-dev-models"
STATUS = "acme-ml-sandbox-dev-status"


@pytest.fixture(scope="module")
def emulator() -> Iterator[storage.Client]:
    with storage_emulator() as host:
        os.environ["STORAGE_EMULATOR_HOST"] = host
        client = deployed_stack((TRAINER,))
        yield client
        del os.environ["STORAGE_EMULATOR_HOST"]


def metadata_for(workload: dict[str, Any]) -> dict[str, str]:
    """The dev stack with `workload` as its VM's workload, read and planned by the real program."""

    def replace(workloads: dict[str, Any]) -> None:
        workloads["mnist"] = workload

    cfg = parse_stack_config("dev", with_object(stack_config(), "workloads", replace))
    return {**vm_metadata(cfg, source_digests(cfg))[VM], "agent-worker-number": "0"}


def folder_workload(run: str, steps: int = STEPS, step_seconds: str = "0.25") -> dict[str, Any]:
    return {
        "source": {"folder": TRAINER},
        "command": ["python", "train.py", "--steps", str(steps)],
        "env": {"STEP_SECONDS": step_seconds},
        "run": run,
    }


def sandboxed_vm(tmp_path: Path, metadata_host: str, image: Path | None = None) -> Vm:
    vm = Vm(tmp_path, metadata_host, os.environ["STORAGE_EMULATOR_HOST"])
    install_docker_shim(vm.shims)  # on the VM's PATH, where the agent finds `docker`
    vm.env.update(
        {
            "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": wheel_index(),  # the folder's requirement, offline
            "DOCKER_SHIM_STATE": str(tmp_path / "docker"),
            "DOCKER_SHIM_TOKEN": SANDBOX_TOKEN,
            "DOCKER_SHIM_IMAGES": json.dumps({IMAGE: str(image)} if image else {}),
        }
    )
    return vm


def status(client: storage.Client, run_id: str) -> dict[str, Any]:
    blob = client.bucket(STATUS).get_blob(f"{VM}/runs/{run_id}/status.json")
    return json.loads(blob.download_as_bytes()) if blob else {}


def completion(client: storage.Client) -> dict[str, Any]:
    blob = client.bucket(STATUS).get_blob(f"{VM}/COMPLETE")
    return json.loads(blob.download_as_bytes()) if blob else {}


def steps(client: storage.Client, prefix: str) -> list[int]:
    names = [b.name for b in client.list_blobs(CHECKPOINTS, prefix=prefix)]
    return sorted(int(n.rsplit("/ckpt-", 1)[1][:-5]) for n in names if "/ckpt-" in n)


def lines(vm: Vm, message: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in vm.log(AGENT_UNIT).splitlines() if line.startswith("{") and message in line]


def boot(vm: Vm, metadata: dict[str, str]) -> None:
    done = vm.boot(metadata["startup-script"])
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"agent started as {AGENT_UNIT}" in done.stdout
    # The agent reads and writes objects through Google's library, from its own environment on the VM.
    env = vm.root / "opt/tpu-platform/agent-env"
    assert f"agent environment {env}/" in done.stdout and " verified" in done.stdout
    waiting(vm, lambda: lines(vm, "objects through google-cloud-storage"), 60, "the agent's start")
    (started,) = lines(vm, "objects through google-cloud-storage")[-1:]
    assert f"({env}/" in started["message"]


def waiting(vm: Vm, predicate, timeout: float, what: str) -> None:
    try:
        wait_for(predicate, timeout, what, interval=0.3)
    except TimeoutError as error:
        raise AssertionError(f"{error}; the agent's log:\n{vm.log(AGENT_UNIT)[-3000:]}") from None


def shut_down(vm: Vm) -> None:
    """What systemd does when the VM is preempted or stopped: SIGTERM to the agent."""
    os.kill(vm.pid(AGENT_UNIT) or 0, signal.SIGTERM)
    wait_for(lambda: not vm.alive(AGENT_UNIT), 60, "the agent to exit after SIGTERM")


def preempted_resumed_completed(client: storage.Client, vm: Vm, metadata: dict[str, str], run_id: str) -> None:
    prefix = run_id.split("/", 1)[1] + "/"  # the run's checkpoint folder: <workload>/<vm>/<run>/
    boot(vm, metadata)
    waiting(vm, lambda: len(steps(client, prefix)) >= 2, 180, "two committed checkpoints")
    shut_down(vm)
    stopped = status(client, run_id)
    assert (stopped["state"], stopped["exitCode"]) == ("stopped", 75), vm.log(AGENT_UNIT)[-3000:]
    assert lines(vm, "SIGTERM: checkpoint committed, exiting 75")
    preempted_at = steps(client, prefix)[-1]
    assert 0 < preempted_at < STEPS
    assert completion(client).get("runId") != run_id

    boot(vm, metadata)  # the next boot: the same run resumes from its checkpoint and finishes
    waiting(vm, lambda: status(client, run_id).get("state") == "finished", 180, "the resumed run to finish")
    assert lines(vm, "resumed from checkpoint")[-1]["step"] == preempted_at
    assert steps(client, prefix)[-1] == STEPS
    marker = completion(client)
    assert (marker["runId"], marker["steps"]) == (run_id, STEPS)
    assert status(client, run_id)["exitCode"] == 0
    assert vm.starts() == 2  # two boots, two agents
    shut_down(vm)


def test_a_folder_of_the_stack_is_preempted_resumed_and_completed(emulator, tmp_path):
    metadata = metadata_for(folder_workload("byo-folder"))
    spec = json.loads(metadata[RUN_ATTRIBUTE])
    sha256 = repository_folder(TRAINER).sha256
    assert spec["source"] == {
        "kind": "folder",
        "sha256": sha256,
        "uri": f"gs://acme-ml-sandbox-dev-artifacts/sources/{sha256}.tar.gz",
    }
    assert sha256 not in metadata["startup-script"]  # the script carries the agent, the run spec the folder
    run_id = f"dev/mnist/{VM}/byo-folder"
    with metadata_server(metadata) as host:
        vm = sandboxed_vm(tmp_path, host)
        preempted_resumed_completed(emulator, vm, metadata, run_id)
    contract = lines(vm, '"contract"')[0]
    assert contract["env"]["TPU_PLATFORM_RUN_ID"] == run_id
    assert contract["env"]["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CHECKPOINTS}/mnist/{VM}/byo-folder"
    assert f"/venvs/{sha256[:16]}-" in contract["tinyckpt"]  # its own requirement, in its own virtualenv
    model = json.loads(emulator.bucket(MODELS).blob(f"mnist/{VM}/byo-folder/model.json").download_as_bytes())
    assert model["steps"] == STEPS


def test_an_image_of_the_stack_runs_with_the_tpu_flags_and_is_preempted_resumed_and_completed(emulator, tmp_path):
    workload = {
        "source": {"image": IMAGE},
        "command": ["python3", "train.py", "--steps", str(STEPS)],
        "env": {"STEP_SECONDS": "0.25", "STORAGE_EMULATOR_HOST": os.environ["STORAGE_EMULATOR_HOST"]},
        "run": "byo-image",
    }
    metadata = metadata_for(workload)
    assert json.loads(metadata[RUN_ATTRIBUTE])["source"] == {"kind": "image", "image": IMAGE}
    run_id = f"dev/mnist/{VM}/byo-image"
    with metadata_server(metadata) as host:
        vm = sandboxed_vm(tmp_path, host, image_folder(tmp_path / "image-files"))
        preempted_resumed_completed(emulator, vm, metadata, run_id)
    calls = [json.loads(line) for line in (tmp_path / "docker" / "calls.jsonl").read_text().splitlines()]
    assert calls[:2] == [
        ["login", "-u", "oauth2accesstoken", "--password-stdin", "https://us-central1-docker.pkg.dev"],
        ["pull", IMAGE],
    ]
    runs = [call for call in calls if call[0] == "run"]
    assert len(runs) == 2  # preempted, then resumed
    for run in runs:
        # Not Google's --privileged --net=host: the run's uid, no capability, one host needs no host network.
        assert {"--rm", "--cap-drop=ALL", "--security-opt=no-new-privileges"} <= set(run)
        assert "--privileged" not in run and "--net=host" not in run and "--user" in run
        passed = {run[i + 1] for i, word in enumerate(run) if word == "-e"}
        assert set(CONTRACT) | {"STEP_SECONDS", "STORAGE_EMULATOR_HOST"} <= passed
        assert run[run.index(IMAGE) :] == [IMAGE, "python3", "train.py", "--steps", str(STEPS)]
    contract = lines(vm, '"contract"')[0]
    assert contract["env"]["TPU_PLATFORM_RUN_ID"] == run_id
    assert contract["env"]["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CHECKPOINTS}/mnist/{VM}/byo-image"
    assert "/venvs/" not in contract["python"]  # the image's own interpreter, no virtualenv of the agent's


def test_a_changed_run_setting_in_the_stack_starts_a_new_run_without_a_reboot(emulator, tmp_path):
    before = metadata_for(folder_workload("byo-a", steps=1000, step_seconds="0.2"))
    after = metadata_for(folder_workload("byo-b", steps=3, step_seconds="0"))  # the stack file, edited
    # `pulumi up` changes only the run attribute: the start-up script (a reboot's business) is unchanged.
    assert {k for k in before if before[k] != after[k]} == {RUN_ATTRIBUTE}
    old, new = f"dev/mnist/{VM}/byo-a", f"dev/mnist/{VM}/byo-b"
    with metadata_server(before) as host:
        vm = sandboxed_vm(tmp_path, host)
        boot(vm, before)
        agent = vm.pid(AGENT_UNIT)
        try:
            waiting(vm, lambda: len(steps(emulator, f"mnist/{VM}/byo-a/")) >= 2, 180, "the first run's checkpoints")
            host.set(RUN_ATTRIBUTE, after[RUN_ATTRIBUTE])
            waiting(vm, lambda: status(emulator, new).get("state") == "finished", 180, "the new run to finish")
            assert vm.pid(AGENT_UNIT) == agent and vm.alive(AGENT_UNIT)  # the same agent: no reboot
            assert vm.starts() == 1
        finally:
            shut_down(vm)
    stopped = status(emulator, old)
    assert (stopped["state"], stopped["exitCode"]) == ("stopped", 75), vm.log(AGENT_UNIT)[-3000:]
    committed = lines(vm, "SIGTERM: checkpoint committed")[0]["step"]
    assert steps(emulator, f"mnist/{VM}/byo-a/")[-1] == committed  # the old run's last step is in the bucket
    assert completion(emulator)["runId"] == new
    assert steps(emulator, f"mnist/{VM}/byo-b/") == [1, 2, 3]  # a new run: from zero, in its own folder
