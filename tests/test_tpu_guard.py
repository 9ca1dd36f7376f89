"""The TPU guard: its decisions on recorded node listings, and its entry points run against a TPU API
stand-in on loopback (which checks every request against tpu.v2's discovery document) and a real
Cloud Storage emulator for its state and the completion markers (requests checked against storage.v1).
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cloudevents.http import CloudEvent
from flask import Request
from google.cloud import storage
from werkzeug.test import EnvironBuilder

import run_contract
from infra.access import iamdata
from infra.access.identities import GUARD_METHODS, GUARD_PERMISSIONS, guard_identities, guard_role
from run_contract import completion_marker
from run_contract.paths import node_states_name
from run_contract.timeline import NOT_LISTED, NodeStates
from tests.sandbox import free_port, storage_emulator
from tests.support import fixture_config, plan, with_object
from tests.tpu_api import tpu_api_standin
from tools.standins.contracts import Call, CheckedSession, ContractError, api

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"))
import main as guard
from decisions import (
    GAVE_UP_EVENT,
    NODE_CREATE_FIELDS,
    PREEMPTED_EVENT,
    Action,
    RecoveryState,
    StateError,
    budget_actions,
    budget_message_problem,
    completion_step,
    completion_steps,
    completion_target,
    marker_problem,
    overrun_actions,
    recovery_actions,
    recovery_state,
    recreate_body,
    start_event,
    start_step,
    worth_redelivery,
)

PROJECT = "acme-ml-production"
PARENT = f"projects/{PROJECT}/locations/us-central1-a/nodes"
STATE_BUCKET, STATUS_BUCKET = "acme-ml-production-checkpoints", "acme-ml-production-tpu-status"
ACCOUNT, BUDGET = "012345-6789AB-CDEF01", "5c2f6b0e-1d2a-4b7c-9e3f-0a1b2c3d4e5f"
NOW = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def node(
    name: str,
    state: str,
    *,
    env: str = "prod",
    spot: bool = False,
    hosts: int = 1,
    zone: str = "us-central1-a",
    request: str = "",
) -> dict:
    """A node as `GET …/nodes` lists it (fields as the TPU API v2 returns them, both accelerator fields);
    `request`: the queued request that made it (Node.queuedResource), in the node's zone."""
    made_by = {"queuedResource": f"projects/{PROJECT}/locations/{zone}/queuedResources/{request}"} if request else {}
    return made_by | {
        "name": f"projects/{PROJECT}/locations/{zone}/nodes/{name}",
        "acceleratorType": "v5litepod-4" if hosts == 1 else "v5litepod-16",
        "acceleratorConfig": {"type": "V5LITE_POD", "topology": "2x2" if hosts == 1 else "4x4"},
        "runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
        "cidrBlock": "10.30.0.0/29",
        "state": state,
        "health": "HEALTHY",
        "createTime": "2026-11-29T08:00:00Z",
        "networkEndpoints": [{"ipAddress": f"10.30.0.{i + 2}", "port": 8470} for i in range(hosts)],
        "networkConfig": {"network": "projects/p/global/networks/tpu-prod", "enableExternalIps": False},
        "serviceAccount": {"email": "tpu-mnist-prod@acme-ml-production.iam.gserviceaccount.com"},
        "schedulingConfig": {"spot": True} if spot else {},
        "labels": {"environment": env, "managed-by": "pulumi", "workload": "mnist"},
        "metadata": {"startup-script": "#!/bin/bash"},
        "apiVersion": "V2",
        "id": "123",
    }


FALLBACK = "us-west4-a"  # where the queued multislice `q` landed: not its VM's first zone
QUEUED = f"projects/{PROJECT}/locations/{FALLBACK}/queuedResources/q"
LISTING = [
    node("trainer", "READY"),
    node("spot-a", "PREEMPTED", spot=True),
    node("slice", "READY", hosts=4),
    node("stopped", "STOPPED"),
    node("going", "DELETING"),
    node("other-env", "READY", env="dev"),
    {**node("hand-made", "READY"), "labels": {"environment": "prod"}},  # not created by this platform
    node("q-0", "READY", hosts=4, spot=True, zone=FALLBACK, request="q"),  # a queued multislice's two slices
    node("q-1", "READY", hosts=4, spot=True, zone=FALLBACK, request="q"),
]
# TPU_VMS, as infra/tpu_guard.py guard_vms writes it.
VMS = {
    "trainer": {"nodes": ["trainer"], "zones": ["us-central1-a"], "onCompletion": "stop"},
    "spot-a": {"nodes": ["spot-a"], "zones": ["us-central1-a"], "onCompletion": "delete"},
    "slice": {"nodes": ["slice"], "zones": ["us-central1-a"], "onCompletion": "keep"},
    "q": {"nodes": ["q-0", "q-1"], "zones": ["us-central1-a", FALLBACK], "onCompletion": "delete", "queuedApi": "v2"},
}
OVER = {"budgetAmount": 20000, "costAmount": 20500, "schemaVersion": "1.0", "budgetDisplayName": "prod"}
FRESH = RecoveryState(NOW.isoformat())


def finished(run: str = "prod/mnist/trainer/run-1") -> bytes:
    """A completion marker as the VM agent writes it."""
    made = completion_marker.marker(run, "vm-agent", "2026-11-30T08:00:00Z", "python train.py")
    return completion_marker.encode(made)


def http_request(body: dict | None = None) -> Request:
    return Request(EnvironBuilder(method="POST", json=body).get_environ())


TICK = http_request()  # what Cloud Scheduler sends to `recover`: nothing it reads


def kinds(actions):
    return [(a.kind, a.node.rsplit("/", 1)[-1]) for a in actions]


# --- decisions -----------------------------------------------------------------------------------


def test_below_the_threshold_nothing_happens():
    under = {**OVER, "costAmount": 15000}
    assert budget_actions(under, LISTING, environment="prod", at_percent=100, action="stop", dry_run=False) == []


def test_over_budget_stops_running_nodes_of_the_environment_only():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=100, action="stop", dry_run=False, vms=VMS)
    # Multi-host slices cannot be stopped: deleting is the only way to stop their cost. A queued request's
    # slices are deleted through the request, once.
    assert kinds(actions) == [("stop", "trainer"), ("delete", "slice"), ("delete-request", "q")]
    assert "102% of the budget" in actions[0].reason
    assert actions[2].node == QUEUED and actions[2].api == "v2"


def test_delete_mode_deletes_everything_of_the_environment_not_already_going():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=100, action="delete", dry_run=False)
    assert kinds(actions) == [
        ("delete", "trainer"),
        ("delete", "spot-a"),
        ("delete", "slice"),
        ("delete", "stopped"),
        ("delete-request", "q"),
    ]


def test_dry_run_marks_every_action():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=50, action="stop", dry_run=True)
    assert actions and all(a.dry_run for a in actions)


def test_only_this_environments_budget_is_obeyed():
    good = {"billingAccountId": ACCOUNT, "budgetId": BUDGET, "schemaVersion": "1.0"}
    assert budget_message_problem(good, billing_account=ACCOUNT, budget_id=BUDGET) is None
    full_name = f"billingAccounts/{ACCOUNT}/budgets/{BUDGET}"  # the budget resource's name works too
    assert budget_message_problem(good, billing_account=ACCOUNT, budget_id=full_name) is None
    assert "not this environment's budget" in str(
        budget_message_problem({**good, "budgetId": "other"}, billing_account=ACCOUNT, budget_id=BUDGET)
    )
    assert "billing account" in str(budget_message_problem({}, billing_account=ACCOUNT, budget_id=BUDGET))
    assert "refusing every message" in str(budget_message_problem(good, billing_account="", budget_id=""))


def test_a_failed_event_is_redelivered_only_while_young():
    window = timedelta(hours=1)
    assert worth_redelivery((NOW - timedelta(minutes=5)).isoformat(), NOW, window)
    assert not worth_redelivery((NOW - timedelta(days=2)).isoformat().replace("+00:00", "Z"), NOW, window)
    assert not worth_redelivery(None, NOW, window) and not worth_redelivery("yesterday", NOW, window)


def test_recovery_recreates_preempted_spot_nodes_until_the_cap():
    assert kinds(recovery_actions(LISTING, environment="prod", state=FRESH, max_attempts=3)) == [("recreate", "spot-a")]
    capped = RecoveryState(NOW.isoformat(), {f"{PARENT}/spot-a": 3})
    assert kinds(recovery_actions(LISTING, environment="prod", state=capped, max_attempts=3)) == [("give-up", "spot-a")]
    on_demand_preempted = [node("trainer", "PREEMPTED")]
    assert recovery_actions(on_demand_preempted, environment="prod", state=FRESH, max_attempts=3) == []


def test_recovery_counts_reset_per_window_and_unreadable_counts_fail_closed():
    stored = RecoveryState((NOW - timedelta(hours=3)).isoformat(), {"n": 3}, {"p": {"runtimeVersion": "x"}})
    assert recovery_state(stored.to_json(), NOW, timedelta(hours=24)).attempts == {"n": 3}
    reset = recovery_state(stored.to_json(), NOW + timedelta(days=1), timedelta(hours=24))
    assert reset.attempts == {} and reset.pending == stored.pending  # a recorded spec is never dropped
    assert recovery_state(None, NOW, timedelta(hours=24)) == FRESH
    for garbage in (b"{", b"[]", b'{"attempts": {}}', b'{"windowStart": "x", "attempts": {}, "pending": {}}'):
        with pytest.raises(StateError, match="not recovering anything"):
            recovery_state(garbage, NOW, timedelta(hours=24))


def test_a_recorded_spec_is_created_when_its_node_is_gone_and_forgotten_once_it_exists():
    record = {f"{PARENT}/spot-a": {"runtimeVersion": "x"}, f"{PARENT}/back": {"runtimeVersion": "y"}}
    state = RecoveryState(NOW.isoformat(), {}, record)
    listing = [node("back", "CREATING", spot=True)]
    assert kinds(recovery_actions(listing, environment="prod", state=state, max_attempts=3)) == [
        ("forget", "back"),
        ("create", "spot-a"),
    ]


def test_node_create_fields_are_the_schemas_writable_fields():
    """tpu.v2 Node: every property not marked readOnly, less `health` (output only per magic-modules)."""
    assert api("tpu.v2").writable_fields("Node") - {"health"} == NODE_CREATE_FIELDS


def test_recreate_body_is_a_valid_create_with_one_accelerator_field():
    body = recreate_body(node("spot-a", "PREEMPTED", spot=True))
    assert "acceleratorConfig" not in body and body["acceleratorType"] == "v5litepod-4"
    assert {"name", "state", "health", "createTime", "networkEndpoints", "apiVersion", "id", "cidrBlock"}.isdisjoint(
        body
    )
    assert body["schedulingConfig"] == {"spot": True} and body["labels"]["managed-by"] == "pulumi"
    create = Call("POST", f"https://tpu.googleapis.com/v2/{PARENT}?nodeId=spot-a", body)
    assert api("tpu.v2").check(create).id == "tpu.projects.locations.nodes.create"
    # Yesterday's body (GET output minus a hand list) carried output-only fields the schema refuses.
    old = {k: v for k, v in node("spot-a", "PREEMPTED").items() if k not in {"name", "state", "id"}}
    with pytest.raises(ContractError, match="createTime is output only"):
        api("tpu.v2").check(Call("POST", f"https://tpu.googleapis.com/v2/{PARENT}?nodeId=spot-a", old))


def test_completion_target_comes_from_the_stack_not_the_marker():
    def target(bucket: str, name: str):
        return completion_target(bucket, name, status_bucket=STATUS_BUCKET, vms=VMS)

    assert target(STATUS_BUCKET, "trainer/COMPLETE") == ("trainer", VMS["trainer"])
    assert "not a completion marker" in str(target(STATUS_BUCKET, "trainer/metrics.json"))
    assert "no completion action in this stack (onCompletion: keep)" in str(target(STATUS_BUCKET, "slice/COMPLETE"))
    assert "not a TPU VM of this stack" in str(target(STATUS_BUCKET, "other/COMPLETE"))
    assert "not in the status bucket" in str(target("elsewhere", "trainer/COMPLETE"))


def test_completion_finds_every_node_of_the_vm_wherever_it_landed():
    """A queued VM in its fallback zone, both slices of a multislice: one delete of their request. The
    configured zone and the VM's own name find neither (`q` in us-central1-a)."""

    def steps(vm: str, vms: dict) -> list[Action]:
        found = completion_steps(vm, LISTING, vms=vms, environment="prod")
        assert isinstance(found, list), found
        return found

    (step,) = steps("q", VMS)
    assert (step.kind, step.node, step.api) == ("delete-request", QUEUED, "v2")
    flex = {**VMS, "q": {**VMS["q"], "queuedApi": "v2alpha1"}}  # a flex-start request: made through v2alpha1
    assert [s.api for s in steps("q", flex)] == ["v2alpha1"]
    assert kinds(steps("trainer", VMS)) == [("stop", "trainer")]
    assert "has no node in us-central1-a, us-west4-a" in str(
        completion_steps("q", LISTING[:7], vms=VMS, environment="prod")
    )
    # Never stopped: the plan refuses stop for a queued VM; the guard would not turn it into a delete.
    stop = {**VMS, "q": {**VMS["q"], "onCompletion": "stop"}}
    assert "cannot be stopped" in str(completion_steps("q", LISTING, vms=stop, environment="prod"))
    other = [node("q-0", "READY", env="dev", zone=FALLBACK, request="q")]  # another environment's node
    assert "has no node" in str(completion_steps("q", other, vms=VMS, environment="prod"))


def test_completion_and_scheduled_start_are_idempotent():
    name = f"{PARENT}/trainer"
    assert completion_step("stop", name, node("trainer", "READY")).kind == "stop"  # type: ignore[union-attr]
    assert "already STOPPED" in str(completion_step("stop", name, node("trainer", "STOPPED")))
    assert "does not exist" in str(completion_step("delete", name, None))
    assert "already being deleted" in str(completion_step("delete", name, node("trainer", "DELETING")))
    stopped = node("trainer", "STOPPED")
    assert start_step(name, stopped, complete=False, environment="prod").kind == "start"  # type: ignore[union-attr]
    assert "completed its run" in str(start_step(name, stopped, complete=True, environment="prod"))
    assert "not STOPPED" in str(start_step(name, node("trainer", "READY"), complete=False, environment="prod"))
    assert "not a node of environment" in str(start_step(name, stopped, complete=False, environment="dev"))


def test_a_scheduled_start_reports_a_preempted_node_and_stays_quiet_about_nodes_meant_to_be_off():
    name, preempted = f"{PARENT}/spot-a", node("spot-a", "PREEMPTED", spot=True)
    assert "cannot be started, only re-created" in str(start_step(name, preempted, complete=False, environment="prod"))
    assert start_event(preempted, complete=False) == PREEMPTED_EVENT
    assert start_event(preempted, complete=True) is None  # a completed run is meant to be off
    for state in ("STOPPED", "READY", "STOPPING"):
        assert start_event(node("spot-a", state, spot=True), complete=False) is None
    assert start_event(None, complete=False) is None


# --- entry points against the stand-ins ----------------------------------------------------------


@pytest.fixture(scope="module")
def emulator():
    with storage_emulator() as host:
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = host
        client = storage.Client(project=PROJECT)
        for bucket in (STATE_BUCKET, STATUS_BUCKET):
            client.create_bucket(bucket)
        yield client
        if previous is None:
            del os.environ["STORAGE_EMULATOR_HOST"]


@pytest.fixture
def tpu(monkeypatch, emulator):
    """The TPU stand-in holding LISTING's managed nodes; the guard's environment; a checked session."""
    with tpu_api_standin() as (url, state):
        for listed in LISTING:
            state.add(listed)
        session = CheckedSession()
        settings = {
            "PROJECT": PROJECT,
            "ENVIRONMENT": "prod",
            "BUDGET_ACTION": "stop",
            "BUDGET_AT_PERCENT": "100",
            "BILLING_ACCOUNT": ACCOUNT,
            "BUDGET_ID": BUDGET,
            "MAX_ATTEMPTS": "2",
            "STATE_BUCKET": STATE_BUCKET,
            "STATUS_BUCKET": STATUS_BUCKET,
            "TPU_API_ENDPOINT": url,
            "TPU_VMS": json.dumps(VMS),
            "ZONES": f"us-central1-a,{FALLBACK}",
        }
        for key, value in settings.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(guard, "_session", lambda: session)
        monkeypatch.setenv("POLL_SECONDS", "0")
        for blob in emulator.list_blobs(STATE_BUCKET):
            blob.delete()
        for blob in emulator.list_blobs(STATUS_BUCKET):
            blob.delete()
        state.session = session  # type: ignore[attr-defined]
        yield state
        assert state.violations == [] and session.violations == []  # every request fits Google's schemas


def budget_event(attributes: dict[str, str], *, sent: datetime | None = None) -> CloudEvent:
    """What Eventarc delivers for a Pub/Sub message (google.cloud.pubsub.topic.v1.messagePublished)."""
    message = {
        "data": base64.b64encode(json.dumps(OVER).encode()).decode(),
        "attributes": attributes,
        "messageId": "1",
        "publishTime": (sent or datetime.now(UTC)).isoformat(),
    }
    return CloudEvent(
        {
            "type": "google.cloud.pubsub.topic.v1.messagePublished",
            "source": "//pubsub.googleapis.com/t",
            "time": (sent or datetime.now(UTC)).isoformat(),
        },
        {"message": message, "subscription": "projects/p/subscriptions/s"},
    )


AUTHENTIC = {"billingAccountId": ACCOUNT, "budgetId": BUDGET, "schemaVersion": "1.0"}


def test_budget_stops_every_running_node_even_when_one_fails(tpu):
    tpu.fail("stop")  # the first stop (trainer) answers 500
    with pytest.raises(RuntimeError, match=r"failed for .*trainer; asking for redelivery"):
        guard.on_budget(budget_event(AUTHENTIC))
    assert tpu.did("stop") == ["trainer"] and tpu.did("delete") == ["slice", "q"]  # the others still went
    assert not [n for n in tpu.nodes if "/nodes/q-" in n] and tpu.requests == set()  # the request took its slices
    # Redelivered: the trainer is stopped now, and nothing is done twice.
    guard.on_budget(budget_event(AUTHENTIC))
    assert tpu.did("stop") == ["trainer", "trainer"] and tpu.nodes[f"{PARENT}/trainer"]["state"] == "STOPPED"


def test_an_old_failing_budget_event_is_not_redelivered_for_days(tpu, capsys):
    tpu.fail("stop")
    guard.on_budget(budget_event(AUTHENTIC, sent=datetime.now(UTC) - timedelta(days=3)))  # no raise: acknowledged
    assert "not asking for redelivery" in capsys.readouterr().out


def test_a_message_that_is_not_this_budgets_is_ignored(tpu, capsys):
    guard.on_budget(budget_event({**AUTHENTIC, "budgetId": "someone-elses"}))
    assert tpu.calls == []
    assert "ignoring a message on the budget topic: budgetId 'someone-elses'" in capsys.readouterr().out


def test_a_node_running_past_its_max_run_hours_is_stopped_or_deleted_as_the_stack_says():
    # Every LISTING node was created 2026-11-29T08:00Z: 25 hours before NOW.
    vms = {
        "trainer": {**VMS["trainer"], "maxRunHours": 24},
        "stopped": {"nodes": ["stopped"], "zones": ["us-central1-a"], "onCompletion": "stop", "maxRunHours": 1},
        "other-env": {"nodes": ["other-env"], "zones": ["us-central1-a"], "onCompletion": "delete", "maxRunHours": 1},
        "q": {**VMS["q"], "maxRunHours": 12},  # a queued multislice in its fallback zone: one delete of the request
        "slice": {**VMS["slice"], "onCompletion": "delete"},  # no maxRunHours: only its marker ends it
    }
    overruns = overrun_actions(LISTING, environment="prod", vms=vms, now=NOW)
    assert kinds(overruns) == [("stop", "trainer"), ("delete-request", "q")]
    assert overruns[0].reason == "running 25.0 h, past maxRunHours 24"
    later = {**vms, "trainer": {**vms["trainer"], "maxRunHours": 26}}
    assert ("stop", "trainer") not in kinds(overrun_actions(LISTING, environment="prod", vms=later, now=NOW))


def test_a_node_is_its_vms_by_the_stacks_node_ids_not_by_the_look_of_its_name():
    """`trainer-1` is a VM of its own (kept running), not a slice of `trainer`; `q-0` in a zone the VM
    never asked for is not `q`'s."""
    vms = {
        "trainer": {**VMS["trainer"], "maxRunHours": 1},
        "trainer-1": {"nodes": ["trainer-1"], "zones": ["us-central1-a"], "onCompletion": "keep"},
        "q": {**VMS["q"], "maxRunHours": 1},
    }
    listing = [node("trainer-1", "READY"), node("q-0", "READY", zone="europe-west4-a", request="q")]
    assert overrun_actions(listing, environment="prod", vms=vms, now=NOW) == []


def recovery_record(emulator) -> dict:
    return json.loads(emulator.bucket(STATE_BUCKET).blob("_tpu-guard/prod/recovery.json").download_as_bytes())


def test_recovery_recreates_a_preempted_node_with_its_spec(tpu, emulator):
    before = recreate_body(tpu.nodes[f"{PARENT}/spot-a"])
    body, status = guard.recover(TICK)
    assert status == 200, body
    assert tpu.did("delete") == ["spot-a"] and tpu.did("create") == ["spot-a"]
    assert recreate_body(tpu.nodes[f"{PARENT}/spot-a"]) == before
    assert recovery_record(emulator)["attempts"] == {f"{PARENT}/spot-a": 1}
    # The spec is kept until a later run sees the node listed: a create that fails in its operation is retried.
    assert f"{PARENT}/spot-a" in recovery_record(emulator)["pending"]
    guard.recover(TICK)
    assert recovery_record(emulator)["pending"] == {} and tpu.did("create") == ["spot-a"]


def node_record(emulator, node_id: str) -> NodeStates:
    blob = emulator.bucket(STATE_BUCKET).blob(node_states_name("prod", node_id))
    return NodeStates.from_json(json.loads(blob.download_as_bytes()))


def test_each_check_keeps_the_stacks_nodes_changes_of_state(tpu, emulator, monkeypatch):
    """What billed time comes from: each of the stack's nodes' states as listed at each check, a change kept
    with when it was seen; a node no zone lists is NOT_LISTED; nodes not the stack's are not kept."""
    monkeypatch.setattr(guard, "_now", lambda: NOW)
    assert guard.recover(TICK)[1] == 200  # spot-a PREEMPTED: deleted and re-created (READY) in this check
    at = NOW.timestamp()
    assert node_record(emulator, "spot-a").transitions == (("PREEMPTED", at),)
    assert node_record(emulator, "trainer").transitions == (("READY", at),)
    assert node_record(emulator, "q-1").transitions == (("READY", at),)  # in its fallback zone
    names = {b.name for b in emulator.list_blobs(STATE_BUCKET, prefix="_tpu-guard/prod/nodes/")}
    assert names == {node_states_name("prod", n) for n in ("trainer", "spot-a", "slice", "q-0", "q-1")}
    later = NOW + timedelta(minutes=5)
    monkeypatch.setattr(guard, "_now", lambda: later)
    tpu.nodes[f"{PARENT}/trainer"]["state"] = "STOPPED"
    del tpu.nodes[f"{PARENT}/slice"]
    assert guard.recover(TICK)[1] == 200
    then = later.timestamp()
    assert node_record(emulator, "spot-a").transitions == (("PREEMPTED", at), ("READY", then))
    assert node_record(emulator, "trainer").transitions == (("READY", at), ("STOPPED", then))
    assert node_record(emulator, "slice").transitions == (("READY", at), (NOT_LISTED, then))
    assert node_record(emulator, "trainer").up(then + 60) == [(at, then)]
    assert node_record(emulator, "spot-a").up(then + 60) == [(then, then + 60)]


def test_a_recreated_nodes_creation_is_kept_at_its_create_time(tpu, emulator, monkeypatch):
    """The queue and recovery waits start at the node's createTime (tpu.v2 Node.createTime), not at the check
    that first saw the node: spot-a, re-created at one check, is CREATING from its createTime, then READY."""
    monkeypatch.setattr(guard, "_now", lambda: NOW)
    assert guard.recover(TICK)[1] == 200  # spot-a PREEMPTED: deleted and re-created in this check
    made = NOW + timedelta(seconds=40)
    tpu.nodes[f"{PARENT}/spot-a"]["createTime"] = made.isoformat().replace("+00:00", "Z")
    later = NOW + timedelta(minutes=5)
    monkeypatch.setattr(guard, "_now", lambda: later)
    assert guard.recover(TICK)[1] == 200
    at, then = NOW.timestamp(), later.timestamp()
    states = node_record(emulator, "spot-a")
    assert states.transitions == (("PREEMPTED", at), ("CREATING", made.timestamp()), ("READY", then))
    assert states.waits() == [("recoveryWait", at, then)]
    # A node READY at its first sight (created the day before) keeps no made-up creation.
    assert node_record(emulator, "trainer").transitions == (("READY", at),)


def test_a_failed_create_after_the_delete_does_not_lose_the_node(tpu, emulator):
    tpu.fail("create")
    _, status = guard.recover(TICK)
    assert status == 500 and f"{PARENT}/spot-a" not in tpu.nodes  # deleted, not re-created
    assert recovery_record(emulator)["pending"][f"{PARENT}/spot-a"]["runtimeVersion"] == "tpu-vm-tf-2.15.0-pjrt"
    # The next run re-creates it from the record, though nothing lists it any more.
    _, status = guard.recover(TICK)
    assert status == 200 and tpu.nodes[f"{PARENT}/spot-a"]["state"] == "READY"
    assert tpu.did("create") == ["spot-a", "spot-a"]
    guard.recover(TICK)  # now listed: the record goes
    assert recovery_record(emulator)["pending"] == {}


def test_recovery_gives_up_within_the_window_and_counts_again_after_it(tpu, emulator):
    record = emulator.bucket(STATE_BUCKET).blob("_tpu-guard/prod/recovery.json")
    capped = RecoveryState(datetime.now(UTC).isoformat(), {f"{PARENT}/spot-a": 2})
    record.upload_from_string(capped.to_json())
    guard.recover(TICK)
    assert tpu.did("delete") == []
    old = RecoveryState((datetime.now(UTC) - timedelta(days=2)).isoformat(), {f"{PARENT}/spot-a": 2})
    record.upload_from_string(old.to_json())
    guard.recover(TICK)
    assert tpu.did("create") == ["spot-a"] and recovery_record(emulator)["attempts"] == {f"{PARENT}/spot-a": 1}


def test_the_periodic_check_stops_a_node_past_its_max_run_hours(tpu, emulator, monkeypatch):
    monkeypatch.setenv("TPU_VMS", json.dumps({"trainer": {**VMS["trainer"], "maxRunHours": 1}}))
    body, status = guard.recover(TICK)
    assert status == 200, body
    assert tpu.did("stop") == ["trainer"] and "past maxRunHours 1" in body
    assert tpu.did("create") == ["spot-a"]  # recovery went on as before


def test_recovery_fails_closed_when_its_counts_cannot_be_read(tpu, emulator, monkeypatch):
    emulator.bucket(STATE_BUCKET).blob("_tpu-guard/prod/recovery.json").upload_from_string(b"{not json")
    body, status = guard.recover(TICK)
    assert status == 503 and "unreadable" in body and tpu.calls == []
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    _, status = guard.recover(TICK)
    assert status == 503 and tpu.calls == []


def marker_event(name: str, bucket: str = STATUS_BUCKET) -> CloudEvent:
    """What Eventarc delivers when an object is written (google.cloud.storage.object.v1.finalized)."""
    return CloudEvent(
        {
            "type": "google.cloud.storage.object.v1.finalized",
            "time": datetime.now(UTC).isoformat(),
            "source": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
            "subject": f"objects/{name}",
        },
        {"bucket": bucket, "name": name, "generation": "1", "contentType": "application/json"},
    )


def test_completion_marker_stops_its_node_once(tpu, emulator):
    emulator.bucket(STATUS_BUCKET).blob("trainer/COMPLETE").upload_from_string(finished())
    guard.on_complete(marker_event("trainer/COMPLETE"))
    assert tpu.did("stop") == ["trainer"] and tpu.did("delete") == []  # the stack says stop; the marker is not asked
    guard.on_complete(marker_event("trainer/COMPLETE"))  # redelivered
    assert tpu.did("stop") == ["trainer"]


def test_completion_marker_deletes_when_the_stack_says_delete(tpu, emulator):
    emulator.bucket(STATUS_BUCKET).blob("spot-a/COMPLETE").upload_from_string(finished())
    guard.on_complete(marker_event("spot-a/COMPLETE"))
    assert tpu.did("delete") == ["spot-a"] and f"{PARENT}/spot-a" not in tpu.nodes
    guard.on_complete(marker_event("spot-a/COMPLETE"))  # redelivered: the node is gone, nothing to do
    assert tpu.did("delete") == ["spot-a"]


def test_completion_of_a_queued_vm_deletes_its_request_in_the_zone_it_landed_in(tpu, emulator):
    """`q` asked for us-central1-a first and got its fallback zone; both slices go with their request."""
    emulator.bucket(STATUS_BUCKET).blob("q/COMPLETE").upload_from_string(finished())
    guard.on_complete(marker_event("q/COMPLETE"))
    (call,) = [c for c, m in zip(tpu.calls, tpu.methods, strict=True) if m.endswith("queuedResources.delete")]
    assert call.url.endswith(f"/v2/{QUEUED}?force=true")
    assert not [n for n in tpu.nodes if "/nodes/q-" in n] and tpu.requests == set()
    listed = [
        c.url.split("/locations/")[1].split("/")[0]
        for c, m in zip(tpu.calls, tpu.methods, strict=True)
        if m.endswith("nodes.list")
    ]
    assert listed == ["us-central1-a", FALLBACK]  # the VM's zones, each listed
    guard.on_complete(marker_event("q/COMPLETE"))  # redelivered: nothing left, nothing done
    assert tpu.did("delete") == ["q"]


def test_a_flex_start_request_is_deleted_through_the_version_it_was_made_with(tpu, emulator, monkeypatch):
    monkeypatch.setenv("TPU_VMS", json.dumps({**VMS, "q": {**VMS["q"], "queuedApi": "v2alpha1"}}))
    emulator.bucket(STATUS_BUCKET).blob("q/COMPLETE").upload_from_string(finished())
    guard.on_complete(marker_event("q/COMPLETE"))
    # The stand-in checks it against tpu.v2alpha1's discovery document.
    assert [c.url.split("/")[1] for c in tpu.calls if c.method == "DELETE"] == ["v2alpha1"]
    assert tpu.requests == set()


def test_a_completion_that_cannot_list_a_zone_is_handed_back(tpu, emulator):
    emulator.bucket(STATUS_BUCKET).blob("q/COMPLETE").upload_from_string(finished())
    tpu.fail("list")  # us-central1-a cannot be listed; the request is found in the fallback zone all the same
    with pytest.raises(RuntimeError, match="completion action of q: failed for us-central1-a"):
        guard.on_complete(marker_event("q/COMPLETE"))
    assert tpu.requests == set()


def test_other_objects_and_vms_are_ignored(tpu):
    for event in (
        marker_event("trainer/metrics.json"),
        marker_event("stopped/COMPLETE"),
        marker_event("trainer/COMPLETE", bucket=STATE_BUCKET),
    ):
        guard.on_complete(event)
    assert tpu.calls == []


def start(body: dict) -> tuple[dict, int]:
    answer, status = guard.scheduled_start(http_request(body))
    return json.loads(answer), status


def test_scheduled_start_starts_a_stopped_node_whose_run_is_not_complete(tpu):
    assert start({"node": "stopped"}) == ({"node": "stopped", "did": "started"}, 200)
    assert tpu.nodes[f"{PARENT}/stopped"]["state"] == "READY"
    answer, status = start({"node": "trainer"})
    assert status == 200 and answer["did"] == "nothing" and "READY, not STOPPED" in answer["reason"]


def test_a_marker_of_an_earlier_run_neither_stops_nor_blocks_the_current_run(tpu, emulator, monkeypatch):
    """A new run id trains again (CURRENT_RUNS): an old run's marker is not this run's completion."""
    monkeypatch.setenv(
        "CURRENT_RUNS", json.dumps({"trainer": "dev/mnist/trainer/run-2", "stopped": "dev/x/stopped/run-2"})
    )
    emulator.bucket(STATUS_BUCKET).blob("trainer/COMPLETE").upload_from_string(finished("dev/mnist/trainer/run-1"))
    guard.on_complete(marker_event("trainer/COMPLETE"))
    assert tpu.did("delete") == [] and tpu.did("stop") == []
    emulator.bucket(STATUS_BUCKET).blob("stopped/COMPLETE").upload_from_string(finished("dev/x/stopped/run-1"))
    assert start({"node": "stopped"}) == ({"node": "stopped", "did": "started"}, 200)
    emulator.bucket(STATUS_BUCKET).blob("trainer/COMPLETE").upload_from_string(finished("dev/mnist/trainer/run-2"))
    guard.on_complete(marker_event("trainer/COMPLETE"))
    assert tpu.did("stop") == ["trainer"]


def test_only_a_completion_marker_counts_as_one():
    """Strict: the schema of completion_marker.py; before, anything unreadable counted as the current run's."""
    runs = {"trainer": "prod/mnist/trainer/run-1"}
    assert marker_problem("trainer", finished(), runs) is None
    assert marker_problem("trainer", finished(), {}) is None  # a VM the stack gives no run id: any run
    assert "not a completion marker: not JSON" in str(marker_problem("trainer", b"not json", runs))
    assert "there is no marker" in str(marker_problem("trainer", None, runs))
    for content in (b"{}", b"[]", b'{"runId": "prod/mnist/trainer/run-1"}', b'"done"'):
        assert "not a completion marker" in str(marker_problem("trainer", content, runs)), content
    assert "not the current run" in str(marker_problem("trainer", finished("prod/mnist/trainer/run-0"), runs))


def test_content_that_is_not_a_marker_neither_stops_a_node_nor_blocks_its_start(tpu, emulator, capsys):
    emulator.bucket(STATUS_BUCKET).blob("trainer/COMPLETE").upload_from_string(b"not json")
    guard.on_complete(marker_event("trainer/COMPLETE"))
    assert tpu.did("stop") == [] and "trainer/COMPLETE is not a completion marker" in capsys.readouterr().out
    emulator.bucket(STATUS_BUCKET).blob("stopped/COMPLETE").upload_from_string(b'{"runId": "x"}')
    assert start({"node": "stopped"}) == ({"node": "stopped", "did": "started"}, 200)


def test_scheduled_start_never_restarts_a_completed_run(tpu, emulator):
    emulator.bucket(STATUS_BUCKET).blob("stopped/COMPLETE").upload_from_string(finished())
    answer, status = start({"node": "stopped"})
    assert status == 200 and answer["did"] == "nothing" and "completed its run" in answer["reason"]
    assert tpu.did("start") == [] and tpu.nodes[f"{PARENT}/stopped"]["state"] == "STOPPED"


def logged(out: str) -> list[dict]:
    """The guard's structured log lines (one JSON object a line, as Cloud Run parses stdout)."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_scheduled_start_of_a_preempted_node_does_not_start_it_and_reports_it(tpu, capsys):
    answer, status = start({"node": "spot-a"})
    assert status == 200 and answer["did"] == "nothing" and "PREEMPTED" in answer["reason"]
    assert tpu.did("start") == [] and tpu.nodes[f"{PARENT}/spot-a"]["state"] == "PREEMPTED"
    (report,) = [line for line in logged(capsys.readouterr().out) if line.get("event")]
    assert report["severity"] == "ERROR"
    assert (report["event"], report["environment"], report["node"]) == (PREEMPTED_EVENT, "prod", "spot-a")


def test_scheduled_start_of_a_completed_or_stopped_node_reports_nothing(tpu, emulator, capsys):
    emulator.bucket(STATUS_BUCKET).blob("spot-a/COMPLETE").upload_from_string(finished())
    start({"node": "spot-a"})  # preempted, but its run is complete: meant to be off
    start({"node": "stopped"})
    assert [line for line in logged(capsys.readouterr().out) if line.get("event")] == []


def test_recovery_that_gives_up_reports_the_node(tpu, emulator, capsys):
    record = emulator.bucket(STATE_BUCKET).blob("_tpu-guard/prod/recovery.json")
    record.upload_from_string(RecoveryState(datetime.now(UTC).isoformat(), {f"{PARENT}/spot-a": 2}).to_json())
    guard.recover(TICK)
    (report,) = [line for line in logged(capsys.readouterr().out) if line.get("event")]
    assert (report["event"], report["node"], report["severity"]) == (GAVE_UP_EVENT, "spot-a", "ERROR")


def test_scheduled_start_refuses_bad_bodies_and_fails_closed(tpu, monkeypatch):
    assert start({"vm": "stopped"})[1] == 400 and start({"node": "../x/y"})[1] == 400
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    answer, status = start({"node": "stopped"})
    assert status == 503 and answer["did"] == "nothing" and tpu.calls == []


def test_the_guards_role_holds_exactly_what_its_calls_need(tpu, emulator):
    """Every TPU method the guard called (recorded by the stand-in, from the discovery document),
    mapped to its permission through Google's method table, against the role the program grants."""
    guard.on_budget(budget_event(AUTHENTIC))
    guard.recover(TICK)
    emulator.bucket(STATUS_BUCKET).blob("trainer/COMPLETE").upload_from_string(finished())
    guard.on_complete(marker_event("trainer/COMPLETE"))
    start({"node": "stopped"})
    # Google's method-to-permission table (shared/reference/gcp-iam/methods.json): queuedResources.delete
    # asks tpu.nodes.delete, the rest `tpu.<collection>.<verb>`.
    assert set(tpu.methods) == set(GUARD_METHODS), f"called {sorted(set(tpu.methods))}"
    called = iamdata.permissions_for(tuple(sorted(set(tpu.methods))))
    assert called == GUARD_PERMISSIONS, f"calls need {sorted(called)}, the role holds {sorted(GUARD_PERMISSIONS)}"


# --- the guard's resources in the plan -----------------------------------------------------------


def test_guard_resources_in_production():
    result = plan(fixture_config("production"), "production")
    functions = {f.inputs["name"]: f for f in result.of_type("gcp:cloudfunctionsv2/function:Function")}
    assert set(functions) == {"tpu-budget-guard-production", "tpu-recovery-production", "tpu-complete-production"}
    budget = functions["tpu-budget-guard-production"]
    assert budget.inputs["eventTrigger"]["pubsubTopic"] == "projects/fixture-production/topics/production-budget-alerts"
    assert budget.inputs["serviceConfig"]["environmentVariables"]["BUDGET_ACTION"] == "stop"
    assert budget.inputs["serviceConfig"]["ingressSettings"] == "ALLOW_INTERNAL_ONLY"
    (schedule,) = [
        j for j in result.of_type("gcp:cloudscheduler/job:Job") if j.inputs["name"] == "tpu-recovery-production"
    ]
    assert schedule.inputs["schedule"] == "*/10 * * * *"
    assert schedule.inputs["httpTarget"]["oidcToken"]["serviceAccountEmail"].startswith("tpu-guard-invoker-production@")
    assert guard_role("production").permissions == tuple(GUARD_PERMISSIONS)  # made by the bootstrap, granted here
    assert any(
        g.inputs["role"] == guard_role("production").name("fixture-production")
        for g in result.of_type("gcp:projects/iAMMember:IAMMember")
    )
    # the guard's function source (the stack's other object is a workload source archive: infra/artifacts.py)
    (guard,) = [o for o in result.of_type("gcp:storage/bucketObject:BucketObject") if o.name == "guard-archive"]
    archive = guard.inputs["source"]["archive"]
    contract = [f"run_contract/{name}" for name in run_contract.files()]
    assert sorted(archive) == ["decisions.py", "main.py", "requirements.txt", *contract]


@pytest.mark.parametrize("stack", ["production", "scheduled"])  # the recovery job; the scheduled starts
def test_each_scheduler_job_waits_as_long_as_the_guard_function_it_calls_may_run(stack):
    """cloudscheduler.v1 Job.attemptDeadline: HTTP targets default to 3 minutes, after which the request
    is cancelled; recovery may wait 15 minutes on one delete (main.Tpu.wait) before it creates."""
    result = plan(fixture_config(stack), stack)
    functions = {f.inputs["name"]: f.inputs for f in result.of_type("gcp:cloudfunctionsv2/function:Function")}
    checked = 0
    for job in result.of_type("gcp:cloudscheduler/job:Job"):
        called = job.inputs["httpTarget"]["uri"].rsplit("/", 1)[-1]
        if called not in functions:
            continue  # a job that calls the TPU API itself: it answers at once with an operation
        timeout = functions[called]["serviceConfig"]["timeoutSeconds"]
        deadline = float(job.inputs["attemptDeadline"].removesuffix("s"))
        assert deadline == timeout and 15 <= deadline <= 1800, (job.name, deadline, timeout)
        checked += 1
    assert checked
    if stack == "production":
        (recovery,) = [f for n, f in functions.items() if n.startswith("tpu-recovery-")]
        wait = inspect.signature(guard.Tpu.wait).parameters["timeout"].default
        assert recovery["serviceConfig"]["timeoutSeconds"] >= wait + 60  # a delete's wait, then its create


def test_guard_identity_is_narrow():
    result = plan(fixture_config("production"), "production")
    guard = "serviceAccount:tpu-guard-production@fixture-production.iam.gserviceaccount.com"
    project_roles = [
        g.inputs["role"] for g in result.of_type("gcp:projects/iAMMember:IAMMember") if g.inputs["member"] == guard
    ]
    # Its TPU role, and Eventarc's event receiver (direct Cloud Storage events need it on the trigger's account).
    # (Registration order follows when each role name resolves, so compare sorted.)
    assert sorted(project_roles) == [
        "projects/fixture-production/roles/tpuPlatformGuardProduction",
        "roles/eventarc.eventReceiver",
    ]
    # Act-as on the workload account only (it re-creates its nodes), granted by the bootstrap.
    assert guard_identities("production", ("tpu-mnist-production",)).acts_as == (
        ("tpu-guard-production", "tpu-mnist-production"),
    )


def test_no_guard_without_a_feature_that_needs_it():
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: [vm.pop("schedule") for vm in vms])
    raw = with_object(raw, "tpuVms", lambda vms: [vm.update(onCompletion="keep") for vm in vms])
    result = plan(with_object(raw, "budget", lambda b: b.update(amount=2000)), "scheduled")
    assert not result.of_type("gcp:cloudfunctionsv2/function:Function")
    assert "cloudfunctions.googleapis.com" not in result.outputs["enabledApis"]


def test_budget_action_needs_the_budget_topic():
    from tests.support import with_object
    from tests.test_config import problems_of

    raw = with_object(fixture_config("small"), "automation", lambda a: a.update(budgetAction={"action": "stop"}))
    assert "tpu-platform:automation.budgetAction" in problems_of(raw)
    assert "set tpu-platform:budget.pubsubTopic: true" in problems_of(raw)
    bad = with_object(fixture_config("production"), "automation", lambda a: a["budgetAction"].update(action="pause"))
    assert "automation.budgetAction.action = 'pause': must be one of delete, stop" in problems_of(bad, "production")


def test_a_node_still_being_deleted_keeps_its_recorded_spec():
    """A delete that outlived its wait: the node is listed DELETING; its spec must survive for the create."""
    state = RecoveryState("2026-01-01T00:00:00+00:00", {}, {f"{PARENT}/spot-a": {"acceleratorType": "v5litepod-4"}})
    deleting = [
        {"name": f"{PARENT}/spot-a", "state": "DELETING", "labels": {"environment": "prod", "managed-by": "pulumi"}}
    ]
    assert recovery_actions(deleting, environment="prod", state=state, max_attempts=2) == []


def test_a_preempted_node_of_a_queued_request_is_left_to_pulumi():
    node = {
        "name": f"{PARENT}/q-0",
        "state": "PREEMPTED",
        "schedulingConfig": {"spot": True},
        "labels": {"environment": "prod", "managed-by": "pulumi"},
        "queuedResource": "projects/p/locations/z/queuedResources/q",
    }
    state = RecoveryState("2026-01-01T00:00:00+00:00", {}, {})
    assert recovery_actions([node], environment="prod", state=state, max_attempts=2) == []
