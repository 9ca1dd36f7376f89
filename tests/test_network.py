"""The private network: no public ingress, SSH through IAP only, NAT and Private Google Access."""

from __future__ import annotations

from infra.network import IAP_SSH_RANGE
from tests.support import fixture_config, plan, stack_config, with_object

FIREWALL = "gcp:compute/firewall:Firewall"


def test_subnets_have_private_google_access_and_flow_logs(small_plan):
    (subnet,) = small_plan.of_type("gcp:compute/subnetwork:Subnetwork")  # tests/stacks/Pulumi.small.yaml
    assert subnet.inputs["privateIpGoogleAccess"] is True
    assert subnet.inputs["ipCidrRange"] == "10.30.0.0/20"
    assert subnet.inputs["region"] == "us-central1"
    assert subnet.inputs["logConfig"]["flowSampling"] == 0.25


def test_one_subnet_router_and_nat_per_region(small_config):
    raw = with_object(small_config, "network", lambda n: n["subnets"].update({"europe-west4": "10.21.0.0/20"}))
    result = plan(raw, "small")
    for token in ("subnetwork:Subnetwork", "router:Router", "routerNat:RouterNat"):
        assert sorted(r.inputs["region"] for r in result.of_type(f"gcp:compute/{token}")) == [
            "europe-west4",
            "us-central1",
        ]
    for nat in result.of_type("gcp:compute/routerNat:RouterNat"):
        assert nat.inputs["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
        assert nat.inputs["natIpAllocateOption"] == "AUTO_ONLY"


def test_auto_subnets_are_off(small_plan):
    (network,) = small_plan.of_type("gcp:compute/network:Network")
    assert network.inputs["autoCreateSubnetworks"] is False


def test_ssh_only_from_iap_and_nothing_from_anywhere():
    """A property every shipped stack must keep, so it runs on them rather than on a fixture."""
    for stack in ("dev", "prod"):
        firewalls = plan(stack_config(stack), stack).of_type(FIREWALL)
        assert firewalls
        for rule in firewalls:
            assert rule.inputs["direction"] == "INGRESS"
            assert "0.0.0.0/0" not in rule.inputs.get("sourceRanges", [])
            assert rule.inputs["targetTags"] == ["tpu-vm"]
        ssh = [r for r in firewalls if any("22" in a.get("ports", []) for a in r.inputs["allows"])]
        assert len(ssh) == 1 and ssh[0].inputs["sourceRanges"] == [IAP_SSH_RANGE]
        internal = [r for r in firewalls if "sourceTags" in r.inputs]
        assert [r.inputs["sourceTags"] for r in internal] == [["tpu-vm"]]


def test_os_login_is_on_per_vm_not_project_wide():
    """Project metadata would need setCommonInstanceMetadata and act-as on the Compute default
    account (reference/gcp-iam/methods.json); each VM's own metadata switches OS Login on instead."""
    result = plan(fixture_config(), "small")
    assert not result.of_type("gcp:compute/projectMetadataItem:ProjectMetadataItem")
    for vm in result.of_type("gcp:tpu/v2Vm:V2Vm"):
        assert vm.inputs["metadata"]["enable-oslogin"] == "TRUE"
