"""Every TPU VM: own identity, no external IP, the stack's network, labels and its rendered workload."""

from __future__ import annotations

import json

import pytest

from infra.packaging import repository_folder
from infra.tpu.cloud_tpu import CLOUD_PLATFORM_SCOPE
from infra.tpu.metadata import agent_package
from run_contract import paths
from tests.support import depends_on, fixture_config, plan, with_object

V2VM = "gcp:tpu/v2Vm:V2Vm"
IN_PLACE = {"description", "labels", "metadata", "tags", "dataDisks"}  # what V2Vm updates without replacing


def vms(stack: str = "scheduled", raw=None):
    result = plan(raw or fixture_config(stack), stack)
    return result, result.of_type(V2VM)


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_vm_identity_network_and_labels(stack):
    result, nodes = vms(stack)
    (network,) = result.of_type("gcp:compute/network:Network")
    (subnet,) = result.of_type("gcp:compute/subnetwork:Subnetwork")
    assert nodes
    for vm in nodes:
        assert vm.inputs["serviceAccount"] == {
            "email": f"tpu-mnist-{stack}@{result.project}.iam.gserviceaccount.com",  # its workload's own account
            "scopes": [CLOUD_PLATFORM_SCOPE],
        }
        assert "compute@developer.gserviceaccount.com" not in vm.inputs["serviceAccount"]["email"]
        config = vm.inputs["networkConfig"]
        assert config["enableExternalIps"] is False
        assert config["network"] == f"projects/{result.project}/global/networks/{network.inputs['name']}"
        assert config["subnetwork"].endswith(f"/subnetworks/{subnet.inputs['name']}")
        assert {"environment", "workload", "owner", "provisioning"} <= set(vm.inputs["labels"])
        assert vm.inputs["labels"]["environment"] == stack
        assert vm.inputs["tags"] == ["tpu-vm"]
        assert vm.inputs["metadata"]["enable-oslogin"] == "TRUE"
        assert vm.inputs["metadata"]["block-project-ssh-keys"] == "TRUE"


def test_metadata_carries_the_run_spec_and_the_agents_digest():
    """The workload reaches the VM as a run spec (docs/run-contract.md) naming its source folder's archive
    by digest; the start-up script carries only the agent's digest, not the program."""
    _, (vm,) = vms()
    metadata = vm.inputs["metadata"]
    agent, program = agent_package(), repository_folder("workloads/tf_mnist")
    script = metadata["startup-script"]
    assert f"readonly AGENT_SHA256={agent.sha256}\n" in script
    assert "readonly FRAMEWORK_VERSION=2.14.1" in script  # tensorflow-tpu 2.14.1 does not exist: the image has it
    assert "def main(" not in script  # no program source inlined any more
    run = json.loads(metadata["tpu-platform-run"])
    assert run["runId"] == "scheduled/mnist/office-v2/r1" and run["requester"] == "stack" and run["completion"]
    assert run["source"] == {
        "kind": "folder",
        "uri": f"gs://fixture-project-scheduled-artifacts/{paths.source_object(program.sha256)}",
        "sha256": program.sha256,
    }
    assert run["command"][:4] == ["python", "tf_mnist.py", "--epochs", "5"]
    assert run["data"] == "gs://fixture-project-scheduled-data/mnist/mnist.npz"
    assert run["checkpointDir"] == "gs://fixture-project-scheduled-checkpoints/mnist/office-v2/r1"
    env = metadata["tpu-platform-env"]
    assert "TPU_PLATFORM_ARTIFACTS=gs://fixture-project-scheduled-artifacts\n" in env


def test_provisioning_models_map_to_scheduling():
    _, (spot,) = vms("scheduled")
    on_demand, _spot = sorted(vms("production")[1], key=lambda r: r.name)
    assert spot.inputs["schedulingConfig"] == {"spot": True, "preemptible": False, "reserved": False}
    assert on_demand.inputs["schedulingConfig"] == {"spot": False, "preemptible": False, "reserved": False}
    raw = with_object(fixture_config("production"), "tpuVms", lambda v: v[0].update(provisioning="reserved"))
    reserved, _spot = sorted(vms("production", raw)[1], key=lambda r: r.name)
    assert reserved.inputs["schedulingConfig"]["reserved"] is True


def test_secure_boot_where_the_generation_supports_it():
    _, (v2,) = vms("scheduled")
    v5e, _spot = sorted(vms("production")[1], key=lambda r: r.name)
    assert "shieldedInstanceConfig" not in v2.inputs
    assert v5e.inputs["shieldedInstanceConfig"] == {"enableSecureBoot": True}


def test_vm_waits_for_tpu_api_grants_and_nat():
    result, (vm,) = vms()
    by_type = {r.type: r for r in result.resources}
    services = {s.inputs["service"]: s.urn for s in result.of_type("gcp:projects/service:Service")}
    assert depends_on(result, vm, services["tpu.googleapis.com"])
    assert depends_on(result, vm, by_type["gcp:compute/routerNat:RouterNat"].urn)
    for grant in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember"):
        if grant.name.startswith(("workload-", "run-status")):  # its own account's grants, not the guard's
            assert grant.urn in vm.dependencies


def test_changing_only_the_workload_updates_the_vm_in_place():
    _, (before,) = vms()
    raw = with_object(fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(epochs=9, batchSize=512))
    _, (after,) = vms("scheduled", raw)
    changed = {k for k in before.inputs.keys() | after.inputs.keys() if before.inputs.get(k) != after.inputs.get(k)}
    assert changed == {"metadata"}
    assert changed <= IN_PLACE
    assert before.urn == after.urn


def test_outputs_give_the_iap_ssh_command_and_console_link():
    outputs = plan(fixture_config("scheduled"), "scheduled").outputs["tpuVms"]["office-v2"]
    assert outputs["sshCommand"] == (
        "gcloud compute tpus tpu-vm ssh office-v2 --zone us-central1-b --project fixture-project --tunnel-through-iap"
    )
    assert outputs["consoleUrl"].endswith("/tpus/details/us-central1-b/office-v2?project=fixture-project")
    assert (outputs["acceleratorType"], outputs["provisioning"], outputs["hosts"]) == ("v2-8", "spot", 1)
    assert 1000 < outputs["startupScriptBytes"] < 256 * 1024


def test_multi_host_slices_ssh_to_every_worker():
    def to_pod(vms):
        vms[0].update(acceleratorType="v2-32", zone="us-central1-a", runtimeVersion="tpu-vm-tf-2.14.1-pod")
        vms[0].pop("schedule")  # the TPU API cannot stop a multi-host slice
        vms[0]["onCompletion"] = "delete"

    raw = with_object(fixture_config("scheduled"), "budget", lambda b: b.update(amount=10_000))  # a slice costs more
    outputs = plan(with_object(raw, "tpuVms", to_pod), "scheduled").outputs["tpuVms"]["office-v2"]
    assert outputs["hosts"] == 4 and outputs["sshCommand"].endswith("--worker=all")
