"""The private network: no public ingress, SSH through IAP only, NAT and Private Google Access."""

from __future__ import annotations

import pytest

from infra.network import IAP_SSH_RANGE
from tests.support import fixture_config, plan, with_object

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
    """Whatever the stack: a sandbox and a production stack (the multi-host jobs' rules: below)."""
    for stack in ("scheduled", "production"):
        firewalls = plan(fixture_config(stack), stack).of_type(FIREWALL)
        assert firewalls
        for rule in firewalls:
            assert rule.inputs["direction"] == "INGRESS"
            assert "0.0.0.0/0" not in rule.inputs.get("sourceRanges", [])
            assert rule.inputs["targetTags"] == ["tpu-vm"]
        ssh = [r for r in firewalls if any("22" in a.get("ports", []) for a in r.inputs["allows"])]
        assert len(ssh) == 1 and ssh[0].inputs["sourceRanges"] == [IAP_SSH_RANGE]
        # A rule between VMs only for a job of more than one host, and only from its own tag to its own tag.
        internal = [r for r in firewalls if "sourceTags" in r.inputs]
        assert all(r.inputs["sourceTags"] == r.inputs["targetTags"] == [r.inputs["name"]] for r in internal)


def test_os_login_is_on_per_vm_not_project_wide():
    """Project metadata would need setCommonInstanceMetadata and act-as on the Compute default
    account (reference/gcp-iam/methods.json); each VM's own metadata switches OS Login on instead."""
    result = plan(fixture_config(), "small")
    assert not result.of_type("gcp:compute/projectMetadataItem:ProjectMetadataItem")
    for vm in result.of_type("gcp:tpu/v2Vm:V2Vm"):
        assert vm.inputs["metadata"]["enable-oslogin"] == "TRUE"


def jobs_plan():
    """Three VMs of one stack: a two-host slice, a multislice of two one-host slices, and a single host."""
    import json as _json

    raw = fixture_config("small")
    vm = _json.loads(raw["tpu-platform:tpuVms"])[0]
    base = {k: v for k, v in vm.items() if k not in ("schedule", "onCompletion", "maxRunHours")}
    budget = {**_json.loads(raw["tpu-platform:budget"]), "failOverBudget": False}  # a v2-32 costs more
    vms = [
        {
            **base,
            "name": "slice",
            "acceleratorType": "v2-32",
            "runtimeVersion": "tpu-vm-tf-2.14.1-pod",
            "zone": "us-central1-a",
        },
        {**base, "name": "single"},
    ]
    return plan({**raw, "tpu-platform:tpuVms": _json.dumps(vms), "tpu-platform:budget": _json.dumps(budget)}, "small")


def test_the_hosts_of_a_slice_reach_each_other_and_no_other_vm():
    """Per job, a tag and one rule from that tag to that tag (TPU node tags): a single host gets neither, and
    no rule lets every TPU VM reach every other (the stack's one `between-tpu-workers` rule before)."""
    result = jobs_plan()
    nodes = {n.inputs["name"]: n.inputs["tags"] for n in result.of_type("gcp:tpu/v2Vm:V2Vm")}
    assert nodes == {"slice": ["tpu-vm", "tpu-small-job-slice"], "single": ["tpu-vm"]}
    internal = [r for r in result.of_type(FIREWALL) if "sourceTags" in r.inputs]
    assert [(r.inputs["sourceTags"], r.inputs["targetTags"]) for r in internal] == [
        (["tpu-small-job-slice"], ["tpu-small-job-slice"])
    ]
    assert not [r for r in result.of_type(FIREWALL) if r.inputs.get("sourceTags") == ["tpu-vm"]]


def test_a_multislice_shares_one_job_tag_across_its_slices():
    def multislice(vms):
        vms[:] = [{**vms[0], "name": "ms", "capacity": "queued", "nodeCount": 2, "provisioning": "spot"}]

    result = plan(with_object(fixture_config("production"), "tpuVms", multislice), "production")
    # One VM entry, both slices: one tag, one rule.
    internal = [
        (r.inputs["sourceTags"], r.inputs["targetTags"]) for r in result.of_type(FIREWALL) if "sourceTags" in r.inputs
    ]
    assert internal == [(["tpu-production-job-ms"], ["tpu-production-job-ms"])]


def google_only(**network: str):
    return with_object(fixture_config("small"), "network", lambda n: n.update(egress="google-only", **network))


def test_egress_google_only_denies_all_but_googles_apis_and_the_jobs_hosts_and_says_what_it_cannot():
    result = plan(google_only(), "small")
    egress = {r.inputs["name"]: r.inputs for r in result.of_type(FIREWALL) if r.inputs["direction"] == "EGRESS"}
    assert egress["tpu-small-egress-google"]["destinationRanges"] == ["199.36.153.8/30"]  # private.googleapis.com
    assert egress["tpu-small-egress-google"]["allows"] == [{"protocol": "tcp", "ports": ["443"]}]
    assert egress["tpu-small-egress-jobs"]["destinationRanges"] == ["10.30.0.0/20"]  # the stack's subnet
    deny = egress["tpu-small-egress-deny"]
    assert deny["destinationRanges"] == ["0.0.0.0/0"] and deny["denies"] == [{"protocol": "all"}]
    assert deny["priority"] > egress["tpu-small-egress-google"]["priority"]  # a lower number wins
    assert all(r["targetTags"] == ["tpu-vm"] for r in egress.values())
    zones = {z.inputs["dnsName"]: z.inputs for z in result.of_type("gcp:dns/managedZone:ManagedZone")}
    assert set(zones) == {"googleapis.com.", "pkg.dev.", "gcr.io."}
    assert all(z["visibility"] == "private" for z in zones.values())
    records = {r.inputs["name"]: r.inputs for r in result.of_type("gcp:dns/recordSet:RecordSet")}
    assert records["*.googleapis.com."]["rrdatas"] == ["private.googleapis.com."]
    assert records["private.googleapis.com."]["rrdatas"] == [
        "199.36.153.8",
        "199.36.153.9",
        "199.36.153.10",
        "199.36.153.11",
    ]
    assert "dns.googleapis.com" in {s.inputs["service"] for s in result.of_type("gcp:projects/service:Service")}
    (warning,) = [w for w in result.warnings if "network.egress" in w]
    assert "Cloud NGFW" in warning and "VPC Service Controls" in warning


def test_open_egress_is_the_default_and_makes_no_egress_rule_or_zone():
    result = plan(fixture_config("small"), "small")
    assert not [r for r in result.of_type(FIREWALL) if r.inputs["direction"] == "EGRESS"]
    assert not result.of_type("gcp:dns/managedZone:ManagedZone")


def test_a_package_index_is_an_artifact_registry_python_repository_with_google_only_egress():
    from infra.config import parse_stack_config
    from infra.config.problems import ConfigError

    index = "https://us-central1-python.pkg.dev/fixture-project/pypi/simple/"
    assert parse_stack_config("small", google_only(packageIndex=index)).network.package_index == index
    open_egress = with_object(fixture_config("small"), "network", lambda n: n.update(packageIndex=index))
    with pytest.raises(ConfigError, match="only with egress: google-only"):
        parse_stack_config("small", open_egress)
    with pytest.raises(ConfigError, match=r"network\.packageIndex"):
        parse_stack_config("small", google_only(packageIndex="https://pypi.org/simple/"))


def test_the_deployers_needs_for_google_only_include_the_private_zones_bound_to_the_network():
    """The permission model prices the zones and records: a private zone is bound to its network on create."""
    from infra.access.model import needs_of
    from tools.offline.access import declared

    result = plan(google_only(), "small")
    needed = needs_of(declared(result), result.project).in_scope(f"projects/{result.project}")
    assert {
        "dns.managedZones.create",
        "dns.networks.bindPrivateDNSZone",
        "dns.changes.create",
        "dns.resourceRecordSets.create",
    } <= needed
    assert "serviceusage.services.enable" in needed  # dns.googleapis.com


def test_a_tensorflow_pod_runtime_is_warned_that_a_runs_credentials_cannot_resolve_its_workers():
    """TPUClusterResolver(TPU_NAME) calls the TPU API; a run's narrowed token is Cloud Storage only."""
    result = jobs_plan()
    (warning,) = [w for w in result.warnings if "TPU_NAME" in w]
    assert "tpuVms[slice].runtimeVersion" in warning and "tpu-vm-tf-2.14.1-pod" in warning
    assert not [
        w for w in plan(fixture_config("small"), "small").warnings if "TPU_NAME" in w
    ]  # single-host TF: nothing to say
