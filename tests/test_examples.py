"""The example stacks (examples/Pulumi.*.yaml), each planned offline.

The queued-capacity examples each declare one queued request through the dynamic provider, with the
stack's settings mapped onto it, and the deployer computed from that plan holds what the provider's
calls need. The GKE example declares a cluster and three slice pools (spot, flex-start, TPU7x), and the
queues of two teams sharing them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest

from infra.access.model import needs_of
from infra.config import docs, parse_stack_config
from infra.config.stackfile import ROOT, load_stack_yaml, read_stack_config, stack_of
from infra.gke.queues import queue_objects
from infra.gke.specs import shape_of
from infra.tpu import queued_api as api
from infra.tpu.queued import request_from_props
from tests.support import deploys, policies_as_bootstrapped
from tools.offline.access import access_of, declared
from tools.offline.runner import PlanResult, plan_stack

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
QUEUED = "pulumi-python:dynamic/tpu:QueuedResource"


@cache
def planned(name: str) -> PlanResult:
    path = EXAMPLES / f"Pulumi.{name}.yaml"
    return plan_stack(stack_of(path), path)


def the_request(name: str) -> dict:
    (node,) = planned(name).of_type(QUEUED)
    assert not planned(name).of_type("gcp:tpu/v2Vm:V2Vm")
    return node.inputs


@pytest.mark.parametrize("name", ["queued-spot", "multislice", "reserved"])
def test_each_example_plans_one_valid_queued_request(name):
    inputs = the_request(name)
    assert api.problems(request_from_props(inputs)) == []
    vm = next(iter(planned(name).outputs["tpuVms"].values()))
    assert vm["capacity"] == "queued" and vm["zone"] == "us-central1-a"  # the zone the request got
    assert vm["sshCommand"].startswith(f"gcloud compute tpus tpu-vm ssh {inputs['queuedResourceId']}")


def test_queued_spot_slice_falls_back_in_order_each_zone_with_its_subnet():
    inputs = the_request("queued-spot")
    assert inputs["provisioning"] == "spot" and inputs["acceleratorType"] == "v5litepod-16"
    assert [(z["zone"], z["subnetwork"].rsplit("/", 1)[-1]) for z in inputs["zones"]] == [
        ("us-central1-a", "tpu-queued-spot-us-central1"),
        ("us-west4-a", "tpu-queued-spot-us-west4"),
        ("us-west1-c", "tpu-queued-spot-us-west1"),
    ]
    # maxRunHours reaches the guard, which deletes the slice once it runs past 48 hours, in whichever of its
    # zones the request got, through the request.
    (guard,) = [
        r
        for r in planned("queued-spot").of_type("gcp:cloudfunctionsv2/function:Function")
        if r.inputs["serviceConfig"]["environmentVariables"].get("MAX_ATTEMPTS")
    ]
    env = guard.inputs["serviceConfig"]["environmentVariables"]
    assert json.loads(env["TPU_VMS"]) == {
        "mnist-v5e-16": {
            "nodes": ["mnist-v5e-16"],
            "zones": ["us-central1-a", "us-west4-a", "us-west1-c"],
            "onCompletion": "delete",
            "maxRunHours": 48,
            "queuedApi": "v2",
        }
    }
    assert set(env["ZONES"].split(",")) == {"us-central1-a", "us-west4-a", "us-west1-c"}


def test_multislice_asks_for_two_slices_and_costs_both():
    inputs = the_request("multislice")
    assert api.node_ids(request_from_props(inputs)) == ["mnist-ms-0", "mnist-ms-1"]
    assert int(inputs["nodeCount"]) == 2
    body = api.create_body(request_from_props(inputs), "us-central1-a")
    assert body["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "mnist-ms"}
    (cost,) = planned("multislice").outputs["costEstimate"]["vms"]
    assert (cost["chips"], cost["slices"]) == (32, 2)
    assert (
        planned("multislice")
        .outputs["tpuVms"]["mnist-ms"]["sshCommand"]
        .startswith("gcloud compute tpus tpu-vm ssh mnist-ms-0 ")
    )


def test_reservation_is_named_in_its_zone():
    inputs = the_request("reserved")
    body = api.create_body(request_from_props(inputs), "us-central1-a")
    assert (
        body["reservationName"] == "projects/acme-ml-experiments/locations/us-central1-a/reservations/ml-research-v5e"
    )
    (cost,) = planned("reserved").outputs["costEstimate"]["vms"]
    assert "reserved priced at the on-demand list price" in cost["notes"][0]


def test_the_deployer_of_a_queued_plan_may_make_and_remove_the_request():
    result = planned("queued-spot")
    needs = needs_of(declared(result), result.project)
    node = "tpu-mnist-v5e-16-node"
    by_permission = needs.permissions[f"projects/{result.project}"]
    for permission in ("tpu.nodes.create", "tpu.nodes.get", "tpu.nodes.delete", "tpu.operations.get"):
        assert any(node in who for who in by_permission[permission]), permission
    account = f"tpu-mnist-queued-spot@{result.project}.iam.gserviceaccount.com"
    assert any(node in who for who in needs.act_as[account])
    plans = deploys(result.config, result.stack)
    assert {"tpu.nodes.create", "tpu.nodes.delete"} <= set(access_of(result.stack, plans).deployer_permissions)


# --- the GKE engine's example -------------------------------------------------------------------


def test_the_gke_example_plans_a_cluster_and_its_three_slice_pools():
    result = planned("gke")
    assert not result.of_type("gcp:tpu/v2Vm:V2Vm") and not result.of_type(QUEUED)
    pools = {r.inputs["name"]: r.inputs for r in result.of_type("gcp:container/nodePool:NodePool")}
    assert set(pools) == {"system", "v5e-spot-0", "v5e-spot-1", "v6e-flex-0", "tpu7x-0"}
    assert pools["v5e-spot-0"]["nodeConfig"]["spot"] is True
    assert pools["v6e-flex-0"]["nodeConfig"]["flexStart"] is True
    assert pools["v6e-flex-0"]["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"}
    (policy,) = result.of_type("gcp:compute/resourcePolicy:ResourcePolicy")
    assert pools["tpu7x-0"]["placementPolicy"]["policyName"] == policy.inputs["name"]
    assert pools["tpu7x-0"]["nodeConfig"]["reservationAffinity"]["values"] == ["ml-research-tpu7x"]
    gke = result.outputs["gke"]
    assert gke["dnsEndpoint"].endswith(".us-central1.gke.goog") and gke["name"] == "tpu-gke"
    assert gke["slicePools"]["tpu7x"]["workloadPolicy"] == policy.inputs["name"]


def test_the_gke_example_queues_two_teams_on_its_pools():
    """The queues phase in the environment's stack: one object group through a provider of the stack's own
    cluster, after the pools, holding what infra/gke/queues.py renders from the example's teams."""
    result = planned("gke")
    cfg = parse_stack_config("gke", read_stack_config("gke", ROOT, EXAMPLES / "Pulumi.gke.yaml"))
    assert cfg.gke is not None and [t.name for t in cfg.gke.teams] == ["vision", "nlp"]
    (group,) = result.of_type("kubernetes:yaml/v2:ConfigGroup")
    pools = {p.name: shape_of(p) for p in cfg.gke.slice_pools}
    assert group.inputs["objs"] == queue_objects(cfg.gke.teams, pools)
    quotas = {
        o["metadata"]["name"]: {
            f["name"]: f["resources"][0]["nominalQuota"] for f in o["spec"]["resourceGroups"][0]["flavors"]
        }
        for o in group.inputs["objs"]
        if o["kind"] == "ClusterQueue"
    }
    assert quotas == {
        "vision": {"tpu-v5-lite-podslice-4x4-spot": 16, "tpu-v6e-slice-4x4": 0, "tpu7x-2x2x2": 8},
        "nlp": {"tpu-v5-lite-podslice-4x4-spot": 16, "tpu-v6e-slice-4x4": 16, "tpu7x-2x2x2": 0},
    }
    (queues,) = result.of_type("tpu-platform:gke:TeamQueues")
    slices = {r.urn for r in result.of_type("gcp:container/nodePool:NodePool") if r.inputs["name"] != "system"}
    assert slices <= set(queues.dependencies)  # a queue lends only chips whose slices exist
    (provider,) = result.of_type("pulumi:providers:kubernetes")
    server = json.loads(provider.inputs["kubeconfig"])["clusters"][0]["cluster"]["server"]
    assert server == "https://" + result.outputs["gke"]["dnsEndpoint"]
    assert group.provider.startswith(provider.urn)
    assert result.outputs["gke"]["teams"]["nlp"] == {"namespace": "team-nlp", "localQueue": "nlp", "priority": "medium"}
    (cluster,) = result.of_type("gcp:container/cluster:Cluster")
    assert cluster.inputs["authenticatorGroupsConfig"] == {"securityGroup": "gke-security-groups@acme-ml.example"}


def test_the_gke_example_costs_each_pool_by_its_model():
    cost = planned("gke").outputs["costEstimate"]
    rows = {p["name"]: p for p in cost["pools"]}
    assert (rows["v5e-spot"]["provisioning"], rows["v5e-spot"]["chips"]) == ("spot", 32)
    assert rows["v6e-flex"]["hoursBasis"] == "up to"
    assert cost["unpriced"] == ["tpu7x"] and cost["vms"] == []


def test_the_gke_example_passes_the_policy_pack_and_its_deployer_is_computed():
    result = planned("gke")
    assert policies_as_bootstrapped(result) == []  # its teams' member role, as the bootstrap makes it
    access = access_of(result.stack, deploys(result.config, result.stack))
    assert {"container.clusters.create", "compute.resourcePolicies.create"} <= set(access.deployer_permissions)
    # The queues phase reaches the cluster's DNS endpoint, which IAM guards (container.clusters.connect).
    assert "container.clusters.connect" in access.deployer_permissions
    assert "roles/container.defaultNodeServiceAccount" in access.grantable_roles


@pytest.mark.parametrize("name", sorted(p.name.split(".")[1] for p in EXAMPLES.glob("Pulumi.*.yaml")))
def test_each_example_matches_the_stack_file_schema(name):
    validator = jsonschema.Draft202012Validator(json.loads(docs.SCHEMA_FILE.read_text()))
    assert list(validator.iter_errors(load_stack_yaml((EXAMPLES / f"Pulumi.{name}.yaml").read_text()))) == []
