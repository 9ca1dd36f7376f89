"""Queued TPU capacity: request bodies checked against Google's discovery documents, and the dynamic
provider driven against a TPU API stand-in on loopback that walks the queued states."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest
import requests

from infra.tpu import queued_api as api
from infra.tpu.backend import TpuNodeSpec
from infra.tpu.cloud_tpu import BACKENDS
from infra.tpu.queued import (
    BASE_URL_ENV,
    PollSettings,
    QueuedCapacity,
    QueuedTpuError,
    QueuedTpuProvider,
    request_from_props,
)
from tests.queued_tpu_standin import Scenario, StandIn, request_errors
from tools.standins.contracts import api as contract
from tools.standins.contracts import document

ROOT = Path(__file__).resolve().parent.parent
FAST = PollSettings(interval_s=0.01, operation_timeout_s=5, fallback_wait_s=0.2, settle_wait_s=0)
NET = "projects/p/global/networks/tpu"


def subnet(region: str) -> str:
    return f"projects/p/regions/{region}/subnetworks/tpu-{region}"


def props(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "queuedResourceId": "train-v5e",
        "project": "p",
        "zones": [
            {"zone": "us-west4-a", "subnetwork": subnet("us-west4")},
            {"zone": "us-central1-a", "subnetwork": subnet("us-central1")},
        ],
        "acceleratorType": "v5litepod-16",
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        "provisioning": "spot",
        "serviceAccountEmail": "wl-mnist@p.iam.gserviceaccount.com",
        "network": NET,
        "reservationName": "",
        "nodeCount": 1,
        "maxRunDurationSeconds": 0,
        "secureBoot": False,
        "metadata": {"startup-script": "#!/bin/bash\necho hi\n"},
        "labels": {"workload": "mnist", "stack": "dev"},
        "tags": ["tpu-vm"],
        "description": "mnist on v5litepod-16 (dev)",
    }
    return {**base, **over}


def provider() -> QueuedTpuProvider:
    return QueuedTpuProvider(FAST, session_factory=requests.Session)


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    def start(scenario: Scenario | None = None) -> StandIn:
        s = StandIn(scenario).__enter__()
        started.append(s)
        monkeypatch.setenv(BASE_URL_ENV, s.url)
        return s

    started: list[StandIn] = []
    yield start
    for s in started:
        s.__exit__(None)
        assert s.invalid == [], "a request broke tpu.v2.json / tpu.v2alpha1.json"


# --- request bodies against the discovery documents


def body_errors(req: api.QueuedRequest, zone: str) -> list[str]:
    url, query = api.create_url("https://tpu.googleapis.com/", req, zone)
    path = url.removeprefix("https://tpu.googleapis.com/")
    return request_errors("POST", path, {k: [v] for k, v in query.items()}, api.create_body(req, zone))


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"provisioning": "on-demand"},
        {"provisioning": "reserved", "zones": props()["zones"][:1]},
        {"provisioning": "reserved", "reservationName": "team-v5e", "zones": props()["zones"][:1]},
        {"nodeCount": 2},
        {"secureBoot": True},
        {"provisioning": "flex-start", "maxRunDurationSeconds": 7200},
        {"provisioning": "flex-start", "maxRunDurationSeconds": 7200, "nodeCount": 2},
    ],
    ids=["spot", "on-demand", "any-reservation", "named-reservation", "multislice", "secure-boot", "flex", "flex-ms"],
)
def test_create_body_is_valid_for_tpu_discovery_document(over: dict[str, Any]) -> None:
    req = request_from_props(props(**over))
    assert api.problems(req) == []
    for z in req.zones:
        assert body_errors(req, z.zone) == []


def test_spot_reservation_and_multislice_map_as_gcloud_does() -> None:
    spot = api.create_body(request_from_props(props()), "us-central1-a")
    assert spot["spot"] == {}
    node = spot["tpu"]["nodeSpec"][0]
    assert node["nodeId"] == "train-v5e" and node["parent"] == "projects/p/locations/us-central1-a"
    assert node["node"]["networkConfig"]["subnetwork"] == subnet("us-central1")
    assert node["node"]["networkConfig"]["enableExternalIps"] is False
    one_zone = props()["zones"][:1]
    named = api.create_body(
        request_from_props(props(provisioning="reserved", reservationName="team-v5e", zones=one_zone)), "us-west4-a"
    )
    assert named["reservationName"] == "projects/p/locations/us-west4-a/reservations/team-v5e"
    anyres = api.create_body(request_from_props(props(provisioning="reserved", zones=one_zone)), "us-west4-a")
    assert anyres["reservationName"] == "projects/p/locations/us-west4-a/reservations/-"
    ms = api.create_body(request_from_props(props(nodeCount=2)), "us-west4-a")["tpu"]["nodeSpec"][0]
    assert ms["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "train-v5e"} and "nodeId" not in ms
    flex_req = request_from_props(props(provisioning="flex-start", maxRunDurationSeconds=3600, nodeCount=2))
    assert flex_req.api_version == "v2alpha1"
    flex = api.create_body(flex_req, "us-west4-a")
    assert flex["provisioningModel"] == "FLEX_START" and flex["runDuration"] == {"maxRunDuration": "3600s"}
    assert "multiNodeParams" in flex["tpu"]["nodeSpec"][0]


def test_the_checker_rejects_misspelt_field_bad_enum_output_only_and_missing_required() -> None:
    req = request_from_props(props())
    body = api.create_body(req, "us-west4-a")
    create = "tpu.projects.locations.queuedResources.create"

    def errors(value: dict[str, Any], version: str = "v2") -> str:
        return "; ".join(contract(f"tpu.{version}").problems("QueuedResource", value, writing=True, method=create))

    assert errors(body) == ""
    typo = copy.deepcopy(body)
    typo["tpu"]["nodeSpec"][0]["node"]["serviceAcount"] = typo["tpu"]["nodeSpec"][0]["node"].pop("serviceAccount")
    assert "unknown field tpu.nodeSpec[0].node.serviceAcount" in errors(typo)
    # v2alpha1's name for multislice is not v2's.
    wrong_version = copy.deepcopy(body)
    wrong_version["tpu"]["nodeSpec"][0]["multiNodeParams"] = {"nodeCount": 2}
    assert "unknown field tpu.nodeSpec[0].multiNodeParams" in errors(wrong_version)
    # Flex-start is not in v2 at all.
    assert "unknown field provisioningModel" in errors({**body, "provisioningModel": "FLEX_START"})
    assert "must be one of" in errors({**body, "provisioningModel": "FLEXSTART"}, "v2alpha1")
    assert "state is output only" in errors({**body, "state": {"state": "ACTIVE"}})
    missing = copy.deepcopy(body)
    del missing["tpu"]["nodeSpec"][0]["node"]["runtimeVersion"]
    assert "required field tpu.nodeSpec[0].node.runtimeVersion is missing" in errors(missing)
    assert request_errors("DELETE", "v2/projects/p/locations/z/queuedResources/q", {"forse": ["true"]}, None)
    assert request_errors("DELETE", "v2/projects/p/locations/z/queuedResources/q", {"force": ["yes"]}, None)


def test_queued_resources_have_no_update_method_so_inputs_replace() -> None:
    qr = document("tpu.v2")["resources"]["projects"]["resources"]["locations"]["resources"]["queuedResources"]
    assert "patch" not in qr["methods"] and "update" not in qr["methods"]
    assert "force" in qr["methods"]["delete"]["parameters"]


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"provisioning": "preemptible"}, "provisioning 'preemptible'"),
        ({"reservationName": "team-v5e"}, "needs provisioning 'reserved'"),
        ({"provisioning": "reserved", "reservationName": "team-v5e"}, "belongs to one zone"),
        ({"provisioning": "flex-start"}, "flex-start needs a maximum run duration"),
        ({"maxRunDurationSeconds": 60}, "only flex-start"),
        ({"nodeCount": 0}, "nodeCount 0"),
        ({"zones": [props()["zones"][0], props()["zones"][0]]}, "each zone may appear once"),
        ({"zones": [{"zone": "us-west4-a", "subnetwork": ""}]}, "has no subnetwork"),
        ({"queuedResourceId": "bad/name"}, "allowed characters"),
    ],
)
def test_bad_requests_are_refused_with_the_key_and_value(over: dict[str, Any], needle: str) -> None:
    found = api.problems(request_from_props(props(**over)))
    assert any(needle in p for p in found), found
    check = provider().check({}, props(**over))
    assert check.failures and any(needle in f.reason for f in check.failures)


@pytest.mark.parametrize(
    "code,message,capacity",
    [
        (8, 'There is no more capacity in the zone "europe-west4-a"; you can try in another zone', True),
        (9, "Insufficient reserved capacity. Contact customer support to increase your reservation.", True),
        (8, "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute'", False),
        (3, "Cloud TPU received a bad request.", False),
        (9, "The network is not ready", False),
    ],
)
def test_capacity_errors_are_told_apart(code: int, message: str, capacity: bool) -> None:
    assert api.is_capacity_error(code, message) is capacity


# --- the provider against the stand-in


@pytest.mark.parametrize("how", ["http", "operation", "failed"])
def test_stockout_in_first_zone_creates_in_fallback_and_records_it(standin, how: str) -> None:
    s = standin(Scenario(stockout={"us-west4-a": how}))
    result = provider().create(props())
    assert result.outs is not None
    assert result.outs["zone"] == "us-central1-a"
    assert result.id == "projects/p/locations/us-central1-a/queuedResources/train-v5e"
    assert result.outs["nodeNames"] == ["projects/p/locations/us-central1-a/nodes/train-v5e"]
    skipped = result.outs["skippedZones"]
    assert len(skipped) == 1 and skipped[0].startswith("us-west4-a: ") and "no more capacity" in skipped[0]
    # Nothing is left behind in the zone that stocked out.
    assert list(s.resources) == [result.id]
    creates = [r for r in s.requests if r["method"] == "POST"]
    assert [c["path"].split("/")[4] for c in creates] == ["us-west4-a", "us-central1-a"]


def test_all_zones_stocked_out_fails_naming_each_zone(standin) -> None:
    s = standin(Scenario(stockout={"us-west4-a": "failed", "us-central1-a": "operation"}))
    with pytest.raises(QueuedTpuError, match=r"no capacity in any zone tried \(us-west4-a: .*; us-central1-a: "):
        provider().create(props())
    assert s.resources == {}


def test_waiting_in_a_zone_with_a_fallback_moves_on_after_the_wait(standin) -> None:
    s = standin(Scenario(states=["WAITING_FOR_RESOURCES"]))
    result = provider().create(props())
    assert result.outs is not None
    # The first zone kept waiting past fallback_wait_s: withdrawn; the last zone returns still queued.
    assert result.outs["zone"] == "us-central1-a"
    assert result.outs["state"] == "WAITING_FOR_RESOURCES"
    assert "still WAITING_FOR_RESOURCES" in result.outs["skippedZones"][0]
    assert list(s.resources) == [result.id]


def test_up_returns_while_queued_and_refresh_follows_to_active(standin) -> None:
    standin(
        Scenario(
            states=["WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
        )
    )
    p = provider()
    one_zone = props(zones=props()["zones"][:1])
    created = p.create(one_zone)
    assert created.outs is not None and created.outs["state"] == "WAITING_FOR_RESOURCES"
    seen = [p.read(created.id, created.outs).outs["state"] for _ in range(4)]  # type: ignore[index]
    assert seen[-2:] == ["PROVISIONING", "ACTIVE"]
    # A queued or active request is left alone by `up`.
    assert p.diff(created.id, {**created.outs, "state": "ACTIVE"}, one_zone).changes is False


@pytest.mark.parametrize("dead", ["failed", "preempted"])
def test_failed_or_suspended_request_is_reported_by_refresh_and_replaced_by_up(standin, dead: str) -> None:
    one_zone = props(zones=props()["zones"][:1])
    s = standin(Scenario(states=["ACTIVE"]))
    p = provider()
    created = p.create(one_zone)
    assert created.outs is not None and created.outs["state"] == "ACTIVE"
    if dead == "preempted":
        s.preempt(created.id)
        expected = ("SUSPENDED", "SERVICE")
    else:
        err = {"code": 13, "message": "internal error"}
        s.resources[created.id]["steps"] = [{"state": "FAILED", "failedData": {"error": err}}]
        expected = ("FAILED", "")
    read = p.read(created.id, created.outs)
    assert read.outs is not None
    assert (read.outs["state"], read.outs["stateInitiator"]) == expected
    diff = p.diff(created.id, read.outs, one_zone)
    assert diff.changes and diff.replaces == ["state"] and diff.delete_before_replace
    # What `up` then does: delete (force) and create again.
    p.delete(created.id, read.outs)
    again = p.create(one_zone)
    assert again.outs is not None and again.outs["state"] == "ACTIVE" and again.id == created.id


def test_refresh_of_a_request_deleted_outside_pulumi_drops_it_from_state(standin) -> None:
    s = standin(Scenario(states=["ACTIVE"]))
    p = provider()
    created = p.create(props())
    s.resources.clear()
    assert p.read(created.id, created.outs or {}).id == ""


def test_destroy_deletes_with_force_and_removes_the_nodes(standin) -> None:
    s = standin(Scenario(states=["ACTIVE"]))
    p = provider()
    created = p.create(props(nodeCount=2))
    assert created.outs is not None
    assert s.nodes == {
        "projects/p/locations/us-west4-a/nodes/train-v5e-0",
        "projects/p/locations/us-west4-a/nodes/train-v5e-1",
    }
    p.delete(created.id, created.outs)
    deletes = [r for r in s.requests if r["method"] == "DELETE"]
    assert deletes and all(d["query"] == {"force": ["true"]} for d in deletes)
    assert s.resources == {} and s.nodes == set()
    p.delete(created.id, created.outs)  # already gone: nothing to do


def test_multislice_request_with_two_nodes(standin) -> None:
    s = standin(Scenario(states=["ACTIVE"]))
    created = provider().create(props(nodeCount=2, zones=props()["zones"][:1]))
    assert created.outs is not None
    assert created.outs["nodeNames"] == [
        "projects/p/locations/us-west4-a/nodes/train-v5e-0",
        "projects/p/locations/us-west4-a/nodes/train-v5e-1",
    ]
    body = next(r["body"] for r in s.requests if r["method"] == "POST")
    assert body["tpu"]["nodeSpec"][0]["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "train-v5e"}


def test_flex_start_goes_through_v2alpha1(standin) -> None:
    s = standin(Scenario(states=["ACTIVE"]))
    p = provider()
    created = p.create(props(provisioning="flex-start", maxRunDurationSeconds=7200, zones=props()["zones"][:1]))
    assert created.outs is not None and created.outs["apiVersion"] == "v2alpha1"
    p.delete(created.id, created.outs)
    assert {r["path"].split("/")[0] for r in s.requests} == {"v2alpha1"}


def test_diff_replaces_on_inputs_but_keeps_a_slice_when_only_unused_fallbacks_change(standin) -> None:
    standin(Scenario(stockout={"us-west4-a": "http"}, states=["ACTIVE"]))
    p = provider()
    created = p.create(props())
    outs = created.outs or {}
    assert p.diff(created.id, outs, props(labels={"workload": "other"})).replaces == ["labels"]
    assert p.diff(created.id, outs, props(metadata={"startup-script": "new"})).replaces == ["metadata"]
    # It runs in us-central1-a: dropping the first zone, or adding another, changes no TPU.
    only_got = props(zones=[props()["zones"][1], {"zone": "us-south1-a", "subnetwork": subnet("us-south1")}])
    d = p.diff(created.id, outs, only_got)
    assert d.changes and d.replaces == []
    assert p.update(created.id, outs, only_got).outs["zones"] == only_got["zones"]  # type: ignore[index]
    # Without the zone it got, it must move.
    assert p.diff(created.id, outs, props(zones=props()["zones"][:1])).replaces == ["zones"]


def test_create_leaves_nothing_behind_when_it_fails_for_another_reason(standin) -> None:
    s = standin(Scenario(states=[{"state": "FAILED", "failedData": {"error": {"code": 3, "message": "bad runtime"}}}]))
    with pytest.raises(QueuedTpuError, match="FAILED: 3: bad runtime"):
        provider().create(props())
    assert s.resources == {}


def test_serialised_provider_loads_in_a_fresh_process() -> None:
    # Pulumi pickles the provider into state by value (dill, module rewritten to __main__) and the
    # dynamic-provider host loads it in another process: it must load and work there.
    from pulumi.dynamic.dynamic import serialize_provider

    blob = serialize_provider(QueuedTpuProvider(FAST))
    code = (
        "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read()));"
        "print(type(p.poll).__name__, p.poll.interval_s, p.diff('x', {'state': 'SUSPENDED'}, {}).replaces)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["PollSettings", "0.01", "['state']"]


def test_the_provider_that_deployed_stacks_keep_in_state_still_loads() -> None:
    """Every queued VM's state holds its provider as Pulumi pickled it (`__provider`, serialize_provider):
    dill refers to the class by its import path, `infra.tpu.queued.QueuedTpuProvider` (and PollSettings
    beside it), so moving or renaming them would leave every existing stack unable to refresh, update or
    destroy its queued TPUs. The snapshot is that value as the plans of the shipped queued examples
    recorded it before this test was written (commit 9e2cec6; the plan shows it only as "[secret]")."""
    blob = (ROOT / "tests" / "snapshots" / "queued-provider.b64").read_text().strip()
    code = (
        "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.stdin.read()));"
        "print(type(p).__module__, type(p).__qualname__, type(p.poll).__qualname__, p.poll.operation_timeout_s,"
        " p.diff('x', {'state': 'SUSPENDED'}, {}).replaces)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.split() == ["infra.tpu.queued", "QueuedTpuProvider", "PollSettings", "900.0", "['state']"]


# --- declaration through the backend, under Pulumi mocks


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        self.resources.append(args)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        return {}, None


def test_backend_declares_a_queued_resource_with_fallback_subnets() -> None:
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, preview=False)
    spec = TpuNodeSpec(
        node_id="train-v5e",
        project="p",
        zone="us-west4-a",
        accelerator_type="v5litepod-16",
        runtime_version="v2-alpha-tpuv5-lite",
        provisioning="spot",
        service_account_email=pulumi.Output.from_input("wl@p.iam.gserviceaccount.com"),
        network=NET,
        subnetwork=pulumi.Output.from_input(subnet("us-west4")),
        secure_boot=False,
        labels={"workload": "mnist"},
        tags=["tpu-vm"],
        metadata={"startup-script": "#!/bin/bash\n"},
        description="mnist",
    )
    capacity = QueuedCapacity(fallback_zones=(("us-central1-a", pulumi.Output.from_input(subnet("us-central1"))),))
    node = BACKENDS["queued"].create_node("vm-node", spec, pulumi.ResourceOptions(), capacity)  # type: ignore[call-arg]

    @pulumi.runtime.test
    def check() -> pulumi.Output[Any]:
        def assert_inputs(_: Any) -> None:
            (args,) = [r for r in mocks.resources if r.name == "vm-node"]
            assert args.typ == "pulumi-python:dynamic/tpu:QueuedResource"
            assert args.inputs["zones"] == [
                {"zone": "us-west4-a", "subnetwork": subnet("us-west4")},
                {"zone": "us-central1-a", "subnetwork": subnet("us-central1")},
            ]
            assert args.inputs["serviceAccountEmail"] == "wl@p.iam.gserviceaccount.com"
            assert args.inputs["__provider"]  # the provider travels in state, serialised
            assert api.problems(request_from_props(args.inputs)) == []

        return node.urn.apply(assert_inputs)

    check()
