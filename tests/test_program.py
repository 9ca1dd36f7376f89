"""The shipped stacks' inventories, and what holds for any stack's plan: its outputs, its parenting, its isolation."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support import fixture_config, plan, shipped_plan
from tools.offline.runner import run_program

# Hand-written inventories: a change in what a stack creates must show up here, on purpose.
INVENTORY = {
    "dev": {
        # 8 base + Cloud Scheduler and the 5 serverless APIs of the guard (completion, scheduled starts)
        # + Container Scanning for the image repository (Artifact Registry is among the guard's).
        "gcp:projects/service:Service": 16,
        # data, checkpoints, models, run status, the guard's function source, artifacts (source archives)
        "gcp:storage/bucket:Bucket": 6,
        # the guard's source; the tf_mnist example's archive; the VM agent's and its wheelhouse (the start-up
        # script fetches both)
        "gcp:storage/bucketObject:BucketObject": 4,
        "gcp:projects/iAMAuditConfig:IAMAuditConfig": 1,  # Cloud Storage Data Access logs
        # Its accounts and custom roles, and act-as on them, are the bootstrap's (none here).
        # Waits for fresh grants: the VM's, and the guard functions'.
        "time:index/sleep:Sleep": 2,
        # log + metric writer; scheduler and guard roles; event receiver; builder (Google's agents: bootstrap)
        "gcp:projects/iAMMember:IAMMember": 6,
        # data, checkpoints, models; the VM's own status prefix; the guard's status; the builder's source;
        # the workload's source archives (its own and the agent's: one grant, one condition for both)
        "gcp:storage/bucketIAMMember:BucketIAMMember": 7,
        "gcp:monitoring/notificationChannel:NotificationChannel": 1,
        "gcp:billing/budget:Budget": 1,
        "tpu-platform:project:Apis": 1,
        "tpu-platform:storage:Buckets": 1,
        "tpu-platform:iam:WorkloadIdentity": 1,
        "tpu-platform:billing:BudgetAlerts": 1,
        "gcp:compute/network:Network": 1,
        "gcp:compute/subnetwork:Subnetwork": 1,
        "gcp:compute/router:Router": 1,
        "gcp:compute/routerNat:RouterNat": 1,
        "gcp:compute/firewall:Firewall": 1,
        "gcp:tpu/v2Vm:V2Vm": 1,
        "tpu-platform:network:PrivateNetwork": 1,
        "tpu-platform:tpu:TpuVm": 1,
        "gcp:cloudscheduler/job:Job": 2,
        "gcp:cloudfunctionsv2/function:Function": 2,  # completion, scheduled start
        "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": 2,
        "tpu-platform:lifecycle:TpuSchedules": 1,
        "tpu-platform:lifecycle:RunStatus": 1,
        "tpu-platform:automation:TpuGuard": 1,
        # idle, preempted (a scheduled spot VM); no "not reporting": its only VM is off by schedule
        "gcp:monitoring/alertPolicy:AlertPolicy": 2,
        "gcp:monitoring/dashboard:Dashboard": 1,
        "tpu-platform:monitoring:TpuMonitoring": 1,
        "gcp:artifactregistry/repository:Repository": 2,  # the workloads' images, the guard's functions' images
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": 1,  # the build account writes the latter
        "tpu-platform:artifacts:WorkloadArtifacts": 1,
    },
    "prod": {
        # 8 base + Pub/Sub; + Cloud Scheduler and the 5 serverless APIs of the TPU guard; + Container
        # Scanning. The CMEK key's grant is the bootstrap's, so no Cloud KMS API here.
        "gcp:projects/service:Service": 17,
        "gcp:storage/bucket:Bucket": 6,  # + artifacts
        "gcp:storage/bucketObject:BucketObject": 4,  # + the tf_mnist example's archive, the VM agent's, its wheels
        "gcp:projects/iAMAuditConfig:IAMAuditConfig": 1,
        "time:index/sleep:Sleep": 3,  # each VM's, the guard functions'
        "gcp:projects/iAMMember:IAMMember": 5,
        # 3 workload + 2 VM status prefixes + guard + builder + the workload's source archive
        "gcp:storage/bucketIAMMember:BucketIAMMember": 8,
        "gcp:monitoring/notificationChannel:NotificationChannel": 2,
        "gcp:monitoring/alertPolicy:AlertPolicy": 3,  # idle, not reporting (mnist-v5e), recovery gave up
        "gcp:monitoring/dashboard:Dashboard": 1,
        "gcp:pubsub/topic:Topic": 1,
        "gcp:billing/budget:Budget": 1,
        "gcp:compute/network:Network": 1,
        "gcp:compute/subnetwork:Subnetwork": 1,
        "gcp:compute/router:Router": 1,
        "gcp:compute/routerNat:RouterNat": 1,
        "gcp:compute/firewall:Firewall": 1,
        "gcp:tpu/v2Vm:V2Vm": 2,
        "gcp:cloudfunctionsv2/function:Function": 3,  # budget, completion, recovery
        "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": 3,
        "gcp:cloudscheduler/job:Job": 1,
        "tpu-platform:project:Apis": 1,
        "tpu-platform:storage:Buckets": 1,
        "tpu-platform:iam:WorkloadIdentity": 1,
        "tpu-platform:billing:BudgetAlerts": 1,
        "tpu-platform:network:PrivateNetwork": 1,
        "tpu-platform:tpu:TpuVm": 2,
        "tpu-platform:monitoring:TpuMonitoring": 1,
        "tpu-platform:lifecycle:RunStatus": 1,
        "tpu-platform:automation:TpuGuard": 1,
        "gcp:artifactregistry/repository:Repository": 2,  # CMEK, as the buckets
        "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": 1,
        "tpu-platform:artifacts:WorkloadArtifacts": 1,
    },
}


@pytest.mark.parametrize("stack", sorted(INVENTORY))
def test_inventory(stack):
    result = shipped_plan(stack)
    assert dict(Counter(r.type for r in result.resources)) == INVENTORY[stack]


def test_outputs_name_what_the_plan_declares(small_plan):
    """What a consumer reads from the outputs: names the program derives, and the resources it declares
    (a bucket's URL and a budget's name are the provider's: the output must be that resource's)."""
    outputs, state = small_plan.outputs, {r.inputs.get("name") or r.name: r.state for r in small_plan.resources}
    assert outputs["project"] == "fixture-project"
    purposes = ("data", "checkpoints", "models", "status", "artifacts")
    assert outputs["bucketUrls"] == {p: state[f"fixture-project-small-{p}"]["url"] for p in purposes}
    assert outputs["serviceAccounts"] == {"mnist": "tpu-mnist-small@fixture-project.iam.gserviceaccount.com"}
    (budget,) = small_plan.of_type("gcp:billing/budget:Budget")
    assert outputs["budgetName"] == budget.state["name"]
    services = small_plan.of_type("gcp:projects/service:Service")
    assert outputs["enabledApis"] == sorted(s.inputs["service"] for s in services)
    (images,) = small_plan.of_type("gcp:artifactregistry/repository:Repository")
    assert (images.inputs["location"], images.inputs["repositoryId"]) == ("us-central1", "tpu-small")
    assert outputs["imageRegistry"] == "us-central1-docker.pkg.dev/fixture-project/tpu-small"


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_children_are_parented_to_their_component(stack):
    result = plan(fixture_config(stack), stack)
    components = {r.urn: r for r in result.resources if not r.custom}
    for resource in result.resources:
        if resource.custom:
            assert resource.parent in components, f"{resource.name} is not inside a component"
            assert resource.name.startswith(components[resource.parent].name)


def test_runs_are_isolated_and_deterministic():
    first = run_program("scheduled", fixture_config("scheduled"))
    run_program("production", fixture_config("production"))
    again = run_program("scheduled", fixture_config("scheduled"))
    assert sorted(r.urn for r in first.resources) == sorted(r.urn for r in again.resources)
    assert first.outputs == again.outputs
