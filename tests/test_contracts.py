"""What the program declares that Google reads as an API body, checked against Google's discovery
documents: Cloud Scheduler jobs (cloudscheduler.v1 Job) and, where a job calls a Google API itself,
its URL, method and body (tpu.v2); the dashboard (monitoring.v1 Dashboard; dashboards are not in
v3); the alert policies (monitoring.v3 AlertPolicy); the firewall rules (compute.v1 Firewall) and the
private DNS zones of `egress: google-only` (dns.v1 ManagedZone, ResourceRecordSet). And the checker
itself: a misspelt field, a wrong enum value, a wrong method or query parameter each fail.
"""

from __future__ import annotations

import base64
import json
import re
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support import fixture_config, plan, with_object
from tools.offline.runner import PlanResult
from tools.standins.contracts import Call, ContractError, api, document

NODE = "projects/acme-ml-sandbox/locations/us-central1-b/nodes/mnist-v2-spot"
TPU = "https://tpu.googleapis.com/v2"
APIS_BY_HOST = {"tpu.googleapis.com": "tpu.v2", "storage.googleapis.com": "storage.v1"}


@cache
def planned(stack: str) -> PlanResult:
    return plan(fixture_config(stack), stack)


def wire(value: Any) -> Any:
    """Pulumi's wire format carries every number as a float; the API's integers are whole numbers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [wire(v) for v in value]
    return value


# --- the checker ---------------------------------------------------------------------------------


def test_valid_requests_name_their_method():
    assert api("tpu.v2").check(Call("POST", f"{TPU}/{NODE}:stop", {})).id == "tpu.projects.locations.nodes.stop"
    assert api("tpu.v2").check(Call("GET", f"{TPU}/{NODE}")).id == "tpu.projects.locations.nodes.get"
    upload = Call("POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=a%2Fb.json", b"{}")
    assert api("storage.v1").check(upload).id == "storage.objects.insert"
    read = Call("GET", "/storage/v1/b/bkt/o/a%2Fb.json?alt=media")
    assert api("storage.v1").check(read).id == "storage.objects.get"


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (Call("POST", f"{TPU}/{NODE}:stop", {"force": True}), "unknown field force"),
        (
            Call("POST", f"{TPU}/{NODE.rsplit('/', 1)[0]}?nodeId=n", {"acceleratorTyp": "v5litepod-4"}),
            "unknown field acceleratorTyp",
        ),
        (
            Call("POST", f"{TPU}/{NODE.rsplit('/', 1)[0]}?nodeId=n", {"schedulingConfig": {"spot": "yes"}}),
            "schedulingConfig.spot must be true or false",
        ),
        (
            Call("POST", f"{TPU}/{NODE.rsplit('/', 1)[0]}?nodeId=n", {"dataDisks": [{"mode": "RW"}]}),
            "dataDisks\\[0\\].mode = 'RW': must be one of",
        ),
        (Call("POST", f"{TPU}/{NODE.rsplit('/', 1)[0]}?nodeId=n", {"state": "READY"}), "state is output only"),
        (Call("PUT", f"{TPU}/{NODE}:stop", {}), "no method of tpu.v2 has this path; that path takes POST"),
        (Call("POST", f"{TPU}/{NODE}:halt", {}), "no method of tpu.v2 has this path"),
        (Call("GET", f"{TPU}/{NODE}?view=full"), "query parameter 'view' is not one of"),
        (Call("GET", "/storage/v1/b/bkt/o/x?alt=text"), "alt='text': must be one of json, media"),
        (Call("GET", f"{TPU}/{NODE}", {"x": 1}), "takes no body"),
    ],
)
def test_misspelt_or_wrong_requests_fail(call, why):
    name = "storage.v1" if "/storage/" in call.url else "tpu.v2"
    with pytest.raises(ContractError, match=why):
        api(name).check(call)


NODES = f"{TPU}/{NODE.rsplit('/', 1)[0]}?nodeId=n"
LOGS = "/v2/entries:write"
ENTRY = {"textPayload": "hi"}
GLOBAL = {"type": "global", "labels": {"project_id": "p"}}


@pytest.mark.parametrize(
    ("name", "call", "why"),
    [
        # "Required." begins the description (field_behavior REQUIRED).
        ("tpu.v2", Call("POST", NODES, {"acceleratorType": "v5litepod-4"}), "required field runtimeVersion"),
        (
            "tpu.v2",
            Call("POST", NODES, {"runtimeVersion": "v2-alpha-tpuv5-lite", "acceleratorConfig": {"type": "V5E"}}),
            "required field acceleratorConfig.topology",
        ),
        # storage.v1 names the methods that require a field (annotations.required).
        ("storage.v1", Call("POST", "/storage/v1/b?project=p", {"location": "US"}), "required field name"),
        # An entry's logName and resource may come from the request's defaults, but from somewhere.
        ("logging.v2", Call("POST", LOGS, {"entries": [ENTRY]}), r"entries\[0\]\.logName is missing"),
        ("logging.v2", Call("POST", LOGS, {}), "required field entries"),
        ("tpu.v2", Call("DELETE", f"{TPU}/{NODE}?force=yes".replace("nodes", "queuedResources")), "true or false"),
    ],
)
def test_a_request_without_a_required_field_fails(name, call, why):
    with pytest.raises(ContractError, match=why):
        api(name).check(call)


def test_required_fields_that_are_output_only_conditional_or_defaulted_are_not_asked_for():
    logs = api("logging.v2")
    assert logs.check(Call("POST", LOGS, {"logName": "projects/p/logs/l", "resource": GLOBAL, "entries": [ENTRY]}))
    entry = {**ENTRY, "logName": "projects/p/logs/l", "resource": GLOBAL}
    assert logs.check(Call("POST", LOGS, {"entries": [entry]}))
    node = {"runtimeVersion": "v2-alpha-tpuv5-lite", "acceleratorType": "v5litepod-4"}
    assert api("tpu.v2").check(Call("POST", NODES, node)).id == "tpu.projects.locations.nodes.create"
    # A partial update names what it sets: required fields outside its mask stay as they are.
    patch = Call("PATCH", f"{TPU}/{NODE}?updateMask=labels", {"labels": {"a": "b"}})
    assert api("tpu.v2").check(patch).id == "tpu.projects.locations.nodes.patch"


UPLOAD = "/upload/storage/v1/b/bkt/o"


def multipart(metadata: Any, content_type: str = "application/json; charset=UTF-8") -> tuple[bytes, str]:
    """A multipart/related upload body as google-cloud-storage sends one: metadata, then the bytes."""
    boundary = "==0123456789=="
    body = (
        f"--{boundary}\r\ncontent-type: {content_type}\r\n\r\n{json.dumps(metadata)}\r\n"
        f"--{boundary}\r\ncontent-type: text/plain\r\n\r\nthe bytes\r\n--{boundary}--"
    ).encode()
    return body, f'multipart/related; boundary="{boundary}"'


def test_multipart_and_resumable_uploads_are_checked_like_any_body():
    storage = api("storage.v1")
    body, kind = multipart({"name": "a/b.json", "metadata": {"k": "v"}})
    assert storage.check(Call("POST", f"{UPLOAD}?uploadType=multipart", body, kind)).id == "storage.objects.insert"
    start = Call("POST", f"{UPLOAD}?uploadType=resumable", {"name": "a/b.json"})
    assert storage.check(start).id == "storage.objects.insert"
    chunk = Call("PUT", f"{UPLOAD}?uploadType=resumable&upload_id=xyz", b"the bytes")
    assert storage.check(chunk).id == "storage.objects.insert"
    legacy = Call("POST", "/resumable/upload/storage/v1/b/bkt/o?uploadType=resumable&name=a", None)
    assert storage.check(legacy).id == "storage.objects.insert"


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (Call("POST", f"{UPLOAD}?uploadType=multipart", *multipart({"nmae": "a"})), "unknown field nmae"),
        (
            Call("POST", f"{UPLOAD}?uploadType=multipart", *multipart({"name": "a", "metadata": {"k": 1}})),
            "metadata.k must be a string",
        ),
        (Call("POST", f"{UPLOAD}?uploadType=multipart", *multipart({"name": "a"}, "text/plain")), "JSON metadata"),
        (Call("POST", f"{UPLOAD}?uploadType=multipart", b"bytes", "application/octet-stream"), "multipart/related"),
        (Call("POST", f"{UPLOAD}?uploadType=multipart", *multipart({})), "the object has no name"),
        (Call("POST", f"{UPLOAD}?uploadType=resumable", {"name": "a", "acl": "private"}), "acl must be a list"),
        (Call("POST", f"{UPLOAD}?uploadType=resumable", {}), "the object has no name"),
        (Call("POST", f"{UPLOAD}?uploadType=media", b"bytes"), "the object has no name"),
        (Call("POST", f"{UPLOAD}?uploadType=chunked&name=a", b"bytes"), "uploadType='chunked'"),
        (Call("PUT", f"{UPLOAD}?uploadType=media&upload_id=x", b"bytes"), "upload_id belongs to a resumable"),
        (Call("PUT", f"{UPLOAD}?uploadType=media", b"bytes"), "no method of storage.v1 has this path"),
    ],
)
def test_an_upload_with_a_bad_body_fails(call, why):
    with pytest.raises(ContractError, match=why):
        api("storage.v1").check(call)


def test_a_misspelt_resource_field_fails():
    with pytest.raises(ContractError, match=r"unknown field mosaicLayout\.tiles\[0\]\.widht"):
        api("monitoring.v1").check_resource("Dashboard", {"mosaicLayout": {"tiles": [{"widht": 6}]}})
    with pytest.raises(ContractError, match="combiner = 'ANY': must be one of"):
        api("monitoring.v3").check_resource("AlertPolicy", {"combiner": "ANY"})


# --- what the program declares -------------------------------------------------------------------


def scheduler_jobs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (s, wire(j.inputs))
        for s in ("scheduled", "production")
        for j in planned(s).of_type("gcp:cloudscheduler/job:Job")
    ]


def test_every_scheduler_job_is_a_valid_cloud_scheduler_job():
    jobs = scheduler_jobs()
    assert jobs
    for _, inputs in jobs:
        body = {k: v for k, v in inputs.items() if k not in ("project", "region")}
        body["name"] = f"projects/{inputs['project']}/locations/{inputs['region']}/jobs/{inputs['name']}"
        api("cloudscheduler.v1").check_resource("Job", body)


def test_every_scheduler_job_that_calls_a_google_api_sends_a_valid_request():
    checked = []
    for _, inputs in scheduler_jobs():
        target = inputs["httpTarget"]
        host = urlsplit(target["uri"]).netloc
        if host not in APIS_BY_HOST:
            continue  # a function of ours: its contract is the guard's (tests/test_tpu_guard.py)
        body = json.loads(base64.b64decode(target["body"])) if "body" in target else None
        method = api(APIS_BY_HOST[host]).check(Call(target["httpMethod"], target["uri"], body))
        assert "oauthToken" in target, f"{target['uri']}: a Google API takes an OAuth token, not OIDC"
        checked.append(method.id.rsplit(".", 1)[-1])
    assert checked, "no scheduler job calls a Google API in the planned stacks: nothing was checked"


def test_a_misspelt_scheduler_target_fails():
    (_, inputs), *_ = scheduler_jobs()
    target = inputs["httpTarget"]
    with pytest.raises(ContractError, match=r"no method of tpu\.v2"):
        api("tpu.v2").check(Call(target["httpMethod"], target["uri"].rsplit(":", 1)[0] + ":strat", {}))
    with pytest.raises(ContractError, match=r"unknown field httpTarget\.oauthTokens"):
        api("cloudscheduler.v1").check_resource("Job", {"httpTarget": {"oauthTokens": {}}})


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_the_dashboard_is_a_valid_monitoring_v1_dashboard(stack):
    (dashboard,) = planned(stack).of_type("gcp:monitoring/dashboard:Dashboard")
    api("monitoring.v1").check_resource("Dashboard", json.loads(dashboard.inputs["dashboardJson"]))


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_every_alert_policy_is_a_valid_monitoring_v3_alert_policy(stack):
    policies = planned(stack).of_type("gcp:monitoring/alertPolicy:AlertPolicy")
    assert policies
    for policy in policies:
        body = {k: v for k, v in wire(policy.inputs).items() if k != "project"}
        api("monitoring.v3").check_resource("AlertPolicy", body)


@pytest.mark.parametrize("stack", ["production", "sources"])  # production: the stack's key; sources: pinned images
def test_the_image_repository_is_a_valid_artifact_registry_v1_repository(stack):
    """The repository as the provider sends it (Repository.create's body): every field known, every enum
    value allowed (format, enablementConfig, a cleanup policy's action and tagState), olderThan a
    google-duration. repositoryId is a query parameter; project and location are the URL's. The provider
    sends cleanupPolicies as a map keyed by id (magic-modules mmv1/products/artifactregistry/
    Repository.yaml: `cleanupPolicies: type: Map, key_name: id`), as the API declares the field."""
    result = planned(stack)
    # The workloads' repository (not the guard functions').
    (repository,) = [
        r
        for r in result.of_type("gcp:artifactregistry/repository:Repository")
        if r.inputs["repositoryId"] == f"tpu-{stack}"
    ]
    body = {k: v for k, v in wire(repository.inputs).items() if k not in ("repositoryId", "project", "location")}
    body["cleanupPolicies"] = {p["id"]: {k: v for k, v in p.items() if k != "id"} for p in body["cleanupPolicies"]}
    assert {"keep-newest", "delete-old-untagged"} <= set(body["cleanupPolicies"])
    api("artifactregistry.v1").check_resource("Repository", body)


def test_a_cleanup_policy_the_api_does_not_know_fails():
    policy = {"action": "DELETE", "condition": {"tagState": "UNTAGGED_ONLY", "olderThan": "30d"}}
    with pytest.raises(ContractError, match=r"tagState = 'UNTAGGED_ONLY'.*olderThan = '30d': a duration"):
        api("artifactregistry.v1").check_resource("Repository", {"cleanupPolicies": {"old": policy}})


def test_a_docker_version_is_named_by_its_digest_as_the_keep_policy_assumes():
    """The keep policy matches the stack's images by version name prefix `sha256:<hex>`
    (infra/artifacts.py): Google's artifactregistry.v1 document names a version `…/versions/sha256:…`
    (Tag.version), and a version name prefix is matched on any prefix (CleanupPolicyCondition)."""
    schemas = document("artifactregistry.v1")["schemas"]
    assert "/versions/sha256:" in schemas["Tag"]["properties"]["version"]["description"]
    prefixes = schemas["CleanupPolicyCondition"]["properties"]["versionNamePrefixes"]
    assert prefixes["type"] == "array" and "prefix" in prefixes["description"]
    (repository,) = plan(fixture_config("sources"), "sources").of_type("gcp:artifactregistry/repository:Repository")
    keep = next(p for p in repository.inputs["cleanupPolicies"] if p["id"] == "keep-used-by-stack")
    assert keep["condition"]["versionNamePrefixes"]
    assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", v) for v in keep["condition"]["versionNamePrefixes"])


# --- the network: firewall rules and private DNS zones --------------------------------------------


@cache
def google_only() -> PlanResult:
    """The small fixture with `egress: google-only` and a two-host slice: every kind of rule the network makes
    (IAP's SSH, a job's own, the egress allows and the deny) and the private zones."""

    def two_hosts(vms: list[dict[str, Any]]) -> None:
        vms[0].update(acceleratorType="v2-32", runtimeVersion="tpu-vm-tf-2.14.1-pod", zone="us-central1-a")
        vms[0].pop("schedule", None)

    raw = with_object(fixture_config("small"), "network", lambda n: n.update(egress="google-only"))
    raw = with_object(raw, "tpuVms", two_hosts)
    raw = with_object(raw, "budget", lambda b: b.update(failOverBudget=False))  # a v2-32 costs more
    return plan(raw, "small")


def firewall_body(inputs: dict[str, Any]) -> dict[str, Any]:
    """A firewall as the provider sends it (magic-modules mmv1/products/compute/Firewall.yaml, commit 059355fc:
    `allow`/`deny` are the API's `allowed`/`denied`, a rule's `protocol` its `IPProtocol`; a `log_config` block
    is sent with `enable: true`, its custom expand); project is the URL's."""
    body = {k: v for k, v in wire(inputs).items() if k not in ("project", "allows", "denies")}
    for ours, theirs in (("allows", "allowed"), ("denies", "denied")):
        if ours in inputs:
            body[theirs] = [
                {"IPProtocol": r["protocol"], **({"ports": r["ports"]} if "ports" in r else {})} for r in inputs[ours]
            ]
    if "logConfig" in body:
        body["logConfig"] = {"enable": True, **body["logConfig"]}
    return body


def test_every_firewall_rule_is_a_valid_compute_v1_firewall():
    rules = google_only().of_type("gcp:compute/firewall:Firewall")
    directions = {(r.inputs["direction"], "allows" in r.inputs, "sourceTags" in r.inputs) for r in rules}
    assert directions == {
        ("INGRESS", True, False),
        ("INGRESS", True, True),
        ("EGRESS", True, False),
        ("EGRESS", False, False),
    }
    for rule in rules:
        api("compute.v1").check_resource("Firewall", firewall_body(rule.inputs))


def test_a_firewall_log_setting_the_api_does_not_know_fails():
    (rule, *_) = google_only().of_type("gcp:compute/firewall:Firewall")
    with pytest.raises(ContractError, match=r"logConfig\.metadata = 'ALL': must be one of"):
        api("compute.v1").check_resource("Firewall", firewall_body({**rule.inputs, "logConfig": {"metadata": "ALL"}}))
    with pytest.raises(ContractError, match=r"unknown field allowed\[0\]\.protocol"):
        api("compute.v1").check_resource("Firewall", {"allowed": [{"protocol": "tcp"}]})


def test_every_private_zone_and_record_is_a_valid_cloud_dns_v1_resource():
    """A zone as sent to managedZones.create; a record set to resourceRecordSets.create, whose zone and project
    are the URL's."""
    zones = google_only().of_type("gcp:dns/managedZone:ManagedZone")
    records = google_only().of_type("gcp:dns/recordSet:RecordSet")
    assert len(zones) == 3 and len(records) == 6
    for zone in zones:
        api("dns.v1").check_resource("ManagedZone", {k: v for k, v in wire(zone.inputs).items() if k != "project"})
    for record in records:
        body = {k: v for k, v in wire(record.inputs).items() if k not in ("project", "managedZone")}
        api("dns.v1").check_resource("ResourceRecordSet", body)
    with pytest.raises(ContractError, match="visibility = 'internal': must be one of"):
        api("dns.v1").check_resource("ManagedZone", {"visibility": "internal"})
