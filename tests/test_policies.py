"""Each policy with one compliant and one violating resource, called directly; then the whole pack."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import grpc
import pulumi_gcp as gcp
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from policy import policies
from tests.support import FIXTURE_STACKS, fixture_config, plan, policies_as_bootstrapped, shipped_plan
from tools.offline import __main__ as offline_cli
from tools.offline.policy_check import check_policies
from tools.offline.runner import run_program

ROOT = Path(__file__).resolve().parents[1]
OPTS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def violations(rule, resource_type: str, props: dict) -> list[str]:
    found: list[str] = []
    rule(ResourceValidationArgs(resource_type, props, f"urn:x::{resource_type}::r", "r", OPTS, None), found.append)
    return found


GOOD_BUCKET = {
    "name": "acme-dev-data",
    "uniformBucketLevelAccess": True,
    "publicAccessPrevention": "enforced",
    "labels": {"environment": "dev", "owner": "ml", "purpose": "data"},
}
GOOD_VM = {
    "serviceAccount": {"email": "tpu-mnist-dev@acme.iam.gserviceaccount.com"},
    "networkConfig": {"enableExternalIps": False},
    "labels": {"environment": "dev", "owner": "ml"},
}

CLUSTER, NODE_POOL = policies.CLUSTER, policies.NODE_POOL
GOOD_CLUSTER = {
    "privateClusterConfig": {"enablePrivateNodes": True},
    "enableLegacyAbac": False,
    "workloadIdentityConfig": {"workloadPool": "acme.svc.id.goog"},
    "nodeConfig": {
        "serviceAccount": "tpu-gke-nodes-dev@acme.iam.gserviceaccount.com",
        "workloadMetadataConfig": {"mode": "GKE_METADATA"},
    },
}
V5E_SLICE = {
    "nodeConfig": {"machineType": "ct5lp-hightpu-4t"},
    "nodeCount": 4,
    "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
}
TPU7X_SLICE = {
    "nodeConfig": {"machineType": "tpu7x-standard-4t"},
    "nodeCount": 2,
    "placementPolicy": {"type": "", "policyName": "tpu-dev-iron-slice", "tpuTopology": "2x2x2"},
}
FLEX_SLICE = {**V5E_SLICE, "autoscaling": {"minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"}}

CASES = [
    # rule, type, compliant props, violating props, expected words
    (policies.no_service_account_keys, "gcp:serviceaccount/account:Account", {}, None, "keys"),
    (
        policies.tpu_vm_dedicated_service_account,
        "gcp:tpu/v2Vm:V2Vm",
        GOOD_VM,
        {**GOOD_VM, "serviceAccount": {"email": "123-compute@developer.gserviceaccount.com"}},
        "default Compute Engine",
    ),
    (
        policies.tpu_vm_dedicated_service_account,
        "gcp:tpu/v2Vm:V2Vm",
        GOOD_VM,
        {k: v for k, v in GOOD_VM.items() if k != "serviceAccount"},
        "default Compute Engine",
    ),
    (
        policies.tpu_vm_no_external_ip,
        "gcp:tpu/v2Vm:V2Vm",
        GOOD_VM,
        {**GOOD_VM, "networkConfig": {"enableExternalIps": True}},
        "no external IP",
    ),
    (
        policies.bucket_uniform_access,
        "gcp:storage/bucket:Bucket",
        GOOD_BUCKET,
        {**GOOD_BUCKET, "uniformBucketLevelAccess": False},
        "uniform",
    ),
    (
        policies.bucket_public_access_prevention,
        "gcp:storage/bucket:Bucket",
        GOOD_BUCKET,
        {**GOOD_BUCKET, "publicAccessPrevention": "inherited"},
        "public access prevention",
    ),
    (
        policies.bucket_no_public_members,
        "gcp:storage/bucketIAMMember:BucketIAMMember",
        {"member": "serviceAccount:a@b.iam.gserviceaccount.com"},
        {"member": "allUsers"},
        "public",
    ),
    (
        policies.bucket_no_public_members,
        "gcp:storage/bucketIAMBinding:BucketIAMBinding",
        {"members": ["group:ml@acme.example"]},
        {"members": ["allAuthenticatedUsers"]},
        "public",
    ),
    (
        policies.firewall_no_open_ingress,
        "gcp:compute/firewall:Firewall",
        {"sourceRanges": ["35.235.240.0/20"], "allows": [{"protocol": "tcp", "ports": ["22"]}]},
        {"sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp", "ports": ["20-30"]}]},
        "0.0.0.0/0",
    ),
    (
        policies.firewall_no_open_ingress,
        "gcp:compute/firewall:Firewall",
        {"sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp", "ports": ["443"]}]},
        {"sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "all"}]},
        "all ports",
    ),
    (
        policies.required_labels,
        "gcp:storage/bucket:Bucket",
        GOOD_BUCKET,
        {**GOOD_BUCKET, "labels": {"environment": "dev"}},
        "missing labels owner",
    ),
    (
        policies.gke_private_nodes,
        CLUSTER,
        GOOD_CLUSTER,
        {**GOOD_CLUSTER, "privateClusterConfig": {"enablePrivateNodes": False}},
        "no external IP",
    ),
    (
        policies.gke_private_nodes,
        CLUSTER,
        GOOD_CLUSTER,
        {k: v for k, v in GOOD_CLUSTER.items() if k != "privateClusterConfig"},
        "enablePrivateNodes",
    ),
    (policies.gke_no_legacy_abac, CLUSTER, GOOD_CLUSTER, {**GOOD_CLUSTER, "enableLegacyAbac": True}, "RBAC only"),
    (
        policies.gke_workload_identity,
        CLUSTER,
        GOOD_CLUSTER,
        {k: v for k, v in GOOD_CLUSTER.items() if k != "workloadIdentityConfig"},
        "enable Workload Identity",
    ),
    (
        policies.gke_workload_identity,
        NODE_POOL,
        V5E_SLICE,
        {**V5E_SLICE, "nodeConfig": {"workloadMetadataConfig": {"mode": "GCE_METADATA"}}},
        "node's account",
    ),
    (
        policies.gke_nodes_dedicated_service_account,
        NODE_POOL,
        V5E_SLICE,
        {**V5E_SLICE, "nodeConfig": {"serviceAccount": "123-compute@developer.gserviceaccount.com"}},
        "default Compute Engine",
    ),
    (
        policies.gke_tpu_slices_placed,
        NODE_POOL,
        V5E_SLICE,
        {**V5E_SLICE, "placementPolicy": {"type": "", "tpuTopology": "4x4"}},
        "needs COMPACT placement",
    ),
    (
        policies.gke_tpu_slices_placed,
        NODE_POOL,
        TPU7X_SLICE,
        {**TPU7X_SLICE, "placementPolicy": {"type": "COMPACT", "tpuTopology": "2x2x2"}},
        "workload policy",
    ),
    (
        policies.gke_tpu_slices_placed,
        NODE_POOL,
        FLEX_SLICE,
        {**FLEX_SLICE, "autoscaling": {"totalMaxNodeCount": 4}},
        "sized per zone",
    ),
    (
        policies.gke_tpu_slices_placed,
        NODE_POOL,
        FLEX_SLICE,
        {**FLEX_SLICE, "autoscaling": {"maxNodeCount": 8}},
        "maxNodeCount 4, not 8",
    ),
]


@pytest.mark.parametrize(("rule", "resource_type", "good", "bad", "words"), CASES)
def test_resource_rule(rule, resource_type, good, bad, words):
    assert violations(rule, resource_type, good) == []
    if bad is None:  # the type itself is the violation
        bad_type, bad = "gcp:serviceaccount/key:Key", {}
    else:
        bad_type = resource_type
    found = violations(rule, bad_type, bad)
    assert len(found) == 1 and words in found[0]


def test_unknown_values_are_not_violations():
    # In a real preview, computed values arrive as None.
    assert (
        violations(policies.tpu_vm_dedicated_service_account, "gcp:tpu/v2Vm:V2Vm", {"serviceAccount": {"email": None}})
        == []
    )


def test_single_host_tpu_pools_and_unknown_accounts_are_not_gke_violations():
    single = {"nodeConfig": {"machineType": "ct6e-standard-1t", "serviceAccount": None}, "nodeCount": 3}
    for rule in (policies.gke_tpu_slices_placed, policies.gke_nodes_dedicated_service_account):
        assert violations(rule, NODE_POOL, single) == []
    one_host = {"nodeConfig": {"machineType": "ct4p-hightpu-4t"}, "placementPolicy": {"tpuTopology": "2x2x1"}}
    assert violations(policies.gke_tpu_slices_placed, NODE_POOL, one_host) == []


def stack_resource(resource_type: str, props: dict, name: str, dependencies=()) -> PolicyResource:
    return PolicyResource(resource_type, props, f"urn:{name}", name, OPTS, None, None, list(dependencies), {})


def stack_violations(rule, resources) -> list[str]:
    found: list[str] = []
    rule(StackValidationArgs(resources), lambda message, urn=None: found.append(message))
    return found


def test_budget_in_every_stack_that_spends():
    vm = stack_resource("gcp:tpu/v2Vm:V2Vm", {}, "vm")
    budget = stack_resource("gcp:billing/budget:Budget", {}, "b")
    assert stack_violations(policies.budget_in_every_stack, [vm, budget]) == []
    assert "budget" in stack_violations(policies.budget_in_every_stack, [vm])[0]
    # A stack of identities and a state bucket (the bootstrap) runs up no bill.
    bucket = stack_resource("gcp:storage/bucket:Bucket", {}, "state")
    assert stack_violations(policies.budget_in_every_stack, [bucket]) == []


def test_spot_tpu_needs_a_checkpoint_grant():
    bucket = stack_resource(
        "gcp:storage/bucket:Bucket", {"name": "ck", "labels": {"purpose": "checkpoints"}}, "checkpoints"
    )
    grant = stack_resource(
        "gcp:storage/bucketIAMMember:BucketIAMMember", {"bucket": "ck", "role": "roles/storage.objectUser"}, "grant"
    )
    spot = {"schedulingConfig": {"spot": True}}
    safe = stack_resource("gcp:tpu/v2Vm:V2Vm", spot, "vm", [grant])
    unsafe = stack_resource("gcp:tpu/v2Vm:V2Vm", spot, "vm", [])
    on_demand = stack_resource("gcp:tpu/v2Vm:V2Vm", {"schedulingConfig": {"spot": False}}, "vm", [])
    assert stack_violations(policies.spot_tpu_has_checkpoints, [bucket, grant, safe]) == []
    assert stack_violations(policies.spot_tpu_has_checkpoints, [bucket, grant, on_demand]) == []
    assert "cannot write checkpoints" in stack_violations(policies.spot_tpu_has_checkpoints, [bucket, grant, unsafe])[0]


def bucket(labels: dict, cmek: bool = False, name: str = "b") -> PolicyResource:
    encryption = (
        {"encryption": {"defaultKmsKeyName": "projects/k/locations/us/keyRings/r/cryptoKeys/c"}} if cmek else {}
    )
    return stack_resource("gcp:storage/bucket:Bucket", {**GOOD_BUCKET, "labels": labels, **encryption}, name)


PRODUCTION = {"environment": "live", "owner": "ml", "environment-class": "production"}


def test_production_is_what_the_program_labels_not_the_stack_name():
    # A stack whose resources carry environment-class=production needs CMEK on every bucket, even unlabelled ones.
    assert stack_violations(policies.bucket_cmek_in_production, [bucket(PRODUCTION, cmek=True)]) == []
    found = stack_violations(policies.bucket_cmek_in_production, [bucket(PRODUCTION, cmek=True), bucket({}, name="x")])
    assert len(found) == 1 and "bucket x of a production stack" in found[0]
    # The name alone decides nothing: a stack called prod without the label is not production to the pack.
    assert stack_violations(policies.bucket_cmek_in_production, [bucket({"environment": "prod", "owner": "ml"})]) == []
    # The label on any labelled resource marks the stack (here a Pub/Sub topic's).
    topic = stack_resource("gcp:pubsub/topic:Topic", {"labels": PRODUCTION}, "t")
    assert len(stack_violations(policies.bucket_cmek_in_production, [topic, bucket({})])) == 1


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stacks_pass_every_policy(stack):
    assert check_policies(shipped_plan(stack)) == []


def test_a_gke_stack_passes_every_policy():
    result = plan(fixture_config("gke"), "gke")
    assert result.of_type(NODE_POOL) and policies_as_bootstrapped(result) == []


def weakened_program() -> None:
    """The real program plus what a careless change could add by hand, bypassing the stack config."""
    runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
    gcp.projects.IAMMember("rogue-editor", project="fixture-project", role="roles/editor", member="user:a@acme.example")
    gcp.storage.BucketIAMMember(
        "rogue-public", bucket="fixture-project-small-data", role="roles/storage.objectViewer", member="allUsers"
    )
    gcp.tpu.V2Vm(
        "rogue-vm",
        zone="us-central1-b",
        runtime_version="tpu-vm-tf-2.14.1",
        accelerator_type="v2-8",
        network_config=gcp.tpu.V2VmNetworkConfigArgs(enable_external_ips=True),
        scheduling_config=gcp.tpu.V2VmSchedulingConfigArgs(spot=True),
        labels={"environment": "small", "owner": "fixture-team"},
    )


def test_weakened_stack_fails_with_the_expected_violations():
    found = check_policies(run_program("small", fixture_config("small"), program=weakened_program))
    assert {(v.policy, v.resource) for v in found} == {
        ("no-dangerous-grants", "rogue-editor"),
        ("no-escalation-method", "rogue-editor"),  # Editor holds every permission of several methods
        ("bucket-no-public-members", "rogue-public"),
        ("tpu-vm-no-external-ip", "rogue-vm"),
        ("tpu-vm-dedicated-service-account", "rogue-vm"),
        ("spot-tpu-has-checkpoints", "rogue-vm"),
    }
    assert all(v.enforcement == "mandatory" for v in found)


def test_offline_plan_exits_3_on_mandatory_violations(monkeypatch, capsys):
    weakened = run_program("small", fixture_config("small"), program=weakened_program)
    monkeypatch.setattr(offline_cli, "plan_stack", lambda stack, stack_file=None, state=None: weakened)
    assert offline_cli.main(["plan", "--stack-file", str(FIXTURE_STACKS / "Pulumi.small.yaml")]) == 3
    out, err = capsys.readouterr()
    assert "[mandatory] tpu-vm-no-external-ip: rogue-vm:" in out
    assert "6 mandatory policy violation(s)" in err


def test_the_pack_serves_every_rule(tmp_path):
    """Start the real pack as `pulumi preview --policy-pack` does and ask it what it enforces."""
    pack = subprocess.Popen(
        [sys.executable, "__main__.py"], cwd=ROOT / "policy", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert pack.stdout is not None
        port = int(pack.stdout.readline().strip())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = analyzer_pb2_grpc.AnalyzerStub(channel).GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    finally:
        pack.kill()
        pack.wait()
    assert info.name == "tpu-platform"
    assert sorted(p.name for p in info.policies) == sorted(r.name for r in policies.RULES)
    levels = {p.name: analyzer_pb2.EnforcementLevel.Name(p.enforcementLevel) for p in info.policies}
    assert levels["required-labels"] == "ADVISORY"
    assert levels["tpu-vm-no-external-ip"] == "MANDATORY"


def test_a_project_grant_conditioned_on_a_tpu_node_name_is_refused():
    """Cloud TPU ignores resource attributes: such a condition would grant every node."""
    project = "p-123456"
    role = stack_resource(
        "gcp:projects/iAMCustomRole:IAMCustomRole",
        {"project": project, "roleId": "stopper", "permissions": ["tpu.nodes.stop"]},
        "role",
    )
    node = f'resource.name == "projects/{project}/locations/z/nodes/n"'
    grant = stack_resource(
        "gcp:projects/iAMMember:IAMMember",
        {
            "project": project,
            "role": f"projects/{project}/roles/stopper",
            "member": "user:w@example.com",
            "condition": {"title": "t", "expression": node},
        },
        "grant",
    )
    found = stack_violations(policies.conditions_only_where_supported, [role, grant])
    assert len(found) == 1 and "tpu.googleapis.com" in found[0]
    bucket = 'resource.name.startsWith("projects/_/buckets/b/")'
    on_storage = stack_resource(
        "gcp:projects/iAMMember:IAMMember",
        {
            "project": project,
            "role": "roles/storage.objectViewer",
            "member": "user:a@example.com",
            "condition": {"title": "t", "expression": bucket},
        },
        "storage",
    )
    assert stack_violations(policies.conditions_only_where_supported, [on_storage]) == []
