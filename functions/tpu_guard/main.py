"""The TPU guard, deployed as Cloud Run functions; decisions live in decisions.py.

- `on_budget`: triggered by the budget's Pub/Sub topic (Eventarc); stops or deletes the
  environment's TPU nodes when spend reaches the threshold. Messages that are not this
  environment's budget (attributes billingAccountId, budgetId) are ignored, with a log line.
- `recover`: called by Cloud Scheduler; re-creates preempted spot/preemptible nodes, counting
  recoveries per node and window in the state bucket so a node that keeps being preempted is given
  up on. It records a node's spec before deleting it, so a failed create is retried from the record.
  It also stops or deletes (as TPU_VMS says) a node running past its VM's maxRunHours.
- `on_complete`: triggered when `gs://<STATUS_BUCKET>/<vm>/COMPLETE` is written (Eventarc, Cloud
  Storage object finalized); stops or deletes that VM's nodes as TPU_VMS says, in whichever of the VM's
  zones they are (a queued VM's fallback zone; every slice of a multislice). A queued VM's TPUs are
  deleted through their queued request (force=true), never node by node.
- `scheduled_start`: called by Cloud Scheduler with `{"node": "<vm>"}`; starts the node only if it
  is STOPPED and its run is not complete.

One node that fails never stops the others: each failure is logged, and the event is handed back for
redelivery only while it is young (RETRY_MINUTES), so Pub/Sub does not redeliver it for days.

Settings come from the environment: PROJECT, ENVIRONMENT, ZONES (comma-separated), BUDGET_ACTION
(stop|delete), BUDGET_AT_PERCENT, BILLING_ACCOUNT, BUDGET_ID, DRY_RUN (true|false), MAX_ATTEMPTS,
RECOVERY_WINDOW_HOURS (default 24), STATE_BUCKET, STATUS_BUCKET, TPU_VMS (JSON {"<vm>": {"nodes": [node
ids], "zones": [zones], "onCompletion": "keep"|"stop"|"delete", "maxRunHours": <hours, optional>,
"queuedApi": "v2"|"v2alpha1" (queued VMs only)}}; infra/tpu_guard.py guard_vms), RETRY_MINUTES (default 60).
TPU_API_ENDPOINT and STORAGE_EMULATOR_HOST point it at stand-ins in tests (Google's own clients
read STORAGE_EMULATOR_HOST the same way).
"""

from __future__ import annotations

import base64
import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import functions_framework
import google.auth
import requests
from decisions import (
    COMPLETE_MARKER,
    GAVE_UP_EVENT,
    Action,
    RecoveryState,
    StateError,
    budget_actions,
    budget_message_problem,
    completion_steps,
    completion_target,
    created_at,
    marker_problem,
    node_states,
    overrun_actions,
    owner,
    recovery_actions,
    recovery_state,
    recreate_body,
    short_name,
    start_event,
    start_step,
    worth_redelivery,
)
from google.auth.transport.requests import AuthorizedSession

from run_contract.paths import guard_prefix, node_states_name
from run_contract.timeline import NodeStates


def _session() -> requests.Session:
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def _log(message: str, severity: str = "INFO", **fields: Any) -> None:
    print(json.dumps({"severity": severity, "message": message, **fields}), flush=True)


def _event(event: str, node: str) -> dict[str, str]:
    """The fields an alert policy's log filter matches: the event, the environment and the node."""
    return {"event": event, "environment": os.environ.get("ENVIRONMENT", ""), "node": node.rsplit("/", 1)[-1]}


def _now() -> datetime:
    return datetime.now(UTC)


class Tpu:
    """The calls the guard makes to the Cloud TPU API v2."""

    def __init__(self, session: requests.Session):
        self.session = session
        self.endpoint = os.environ.get("TPU_API_ENDPOINT", "https://tpu.googleapis.com").rstrip("/")
        self.api = self.endpoint + "/v2"

    def list(self, zone: str) -> list[dict[str, Any]]:
        parent = f"{self.api}/projects/{os.environ['PROJECT']}/locations/{zone}/nodes"
        nodes: list[dict[str, Any]] = []
        page = ""
        while True:
            response = self.session.get(parent, params={"pageToken": page} if page else None)
            response.raise_for_status()
            listing = response.json()
            nodes += listing.get("nodes", [])
            page = listing.get("nextPageToken", "")
            if not page:
                return nodes

    def stop(self, name: str) -> dict[str, Any]:
        return self._ok(self.session.post(f"{self.api}/{name}:stop", json={}))

    def start(self, name: str) -> dict[str, Any]:
        return self._ok(self.session.post(f"{self.api}/{name}:start", json={}))

    def delete(self, name: str) -> dict[str, Any]:
        return self._ok(self.session.delete(f"{self.api}/{name}"))

    def delete_request(self, name: str, api: str) -> dict[str, Any]:
        """Delete a queued request and, first, its nodes (tpu.v2 queuedResources.delete `force`)."""
        return self._ok(self.session.delete(f"{self.endpoint}/{api}/{name}", params={"force": "true"}))

    def create(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        parent, _, node_id = name.rpartition("/nodes/")
        return self._ok(self.session.post(f"{self.api}/{parent}/nodes", params={"nodeId": node_id}, json=body))

    def wait(self, operation: dict[str, Any], timeout: float = 900) -> None:
        """Until the long-running operation is done; raises if it failed or took too long."""
        deadline = time.monotonic() + timeout
        while not operation.get("done"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"operation {operation.get('name')} not done after {timeout:g}s")
            time.sleep(float(os.environ.get("POLL_SECONDS", "10")))
            operation = self._ok(self.session.get(f"{self.api}/{operation['name']}"))
        if "error" in operation:
            raise RuntimeError(f"operation {operation.get('name')} failed: {operation['error']}")

    @staticmethod
    def _ok(response: requests.Response) -> dict[str, Any]:
        response.raise_for_status()
        return response.json()


class Objects:
    """Small JSON objects in one bucket, through the Cloud Storage JSON API."""

    def __init__(self, session: requests.Session, bucket: str):
        self.session = session
        self.bucket = bucket
        self.host = os.environ.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").rstrip("/")

    def _url(self, name: str) -> str:
        return f"{self.host}/storage/v1/b/{self.bucket}/o/{quote(name, safe='')}"

    def read(self, name: str) -> bytes | None:
        """The object's bytes, None if it does not exist; raises on any other failure (fail closed)."""
        response = self.session.get(self._url(name), params={"alt": "media"})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.content

    def write(self, name: str, data: bytes) -> None:
        self.session.post(
            f"{self.host}/upload/storage/v1/b/{self.bucket}/o",
            params={"uploadType": "media", "name": name},
            data=data,
            headers={"Content-Type": "application/octet-stream"},  # JSON bytes, read back as bytes
        ).raise_for_status()


def list_nodes(tpu: Tpu, zones: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Every node in `zones` (default: the environment's), and the zones that could not be listed."""
    nodes: list[dict[str, Any]] = []
    failed: list[str] = []
    for zone in zones if zones is not None else filter(None, os.environ["ZONES"].split(",")):
        try:
            nodes += tpu.list(zone)
        except requests.RequestException as error:
            _log(f"cannot list TPU nodes in {zone}: {error}", "ERROR")
            failed.append(zone)
    return nodes, failed


def carry_out(tpu: Tpu, action: Action) -> None:
    """Stop, delete or start one node (recovery has its own sequence)."""
    _log(f"{action.kind} {action.node}: {action.reason}", "NOTICE", dry_run=action.dry_run)
    if action.dry_run:
        return
    if action.kind == "stop":
        tpu.stop(action.node)
    elif action.kind == "delete":
        tpu.delete(action.node)
    elif action.kind == "delete-request":
        tpu.delete_request(action.node, action.api)
    elif action.kind == "start":
        tpu.start(action.node)
    else:
        raise ValueError(f"carry_out cannot {action.kind}")


def _each(actions: list[Action], do: Any) -> list[str]:
    """Do every action, whatever happens to the others; the nodes that failed."""
    failed = []
    for action in actions:
        try:
            do(action)
        except Exception as error:  # one node's failure must not stop the rest
            _log(f"{action.kind} {action.node} failed: {error!r}", "ERROR")
            failed.append(action.node)
    return failed


def _hand_back(what: str, failed: list[str], event_time: str | None) -> None:
    """Raise (so the event is redelivered) while it is young; after that, log and let it go."""
    if not failed:
        return
    window = timedelta(minutes=float(os.environ.get("RETRY_MINUTES", "60")))
    if worth_redelivery(event_time, _now(), window):
        raise RuntimeError(f"{what}: failed for {', '.join(failed)}; asking for redelivery")
    _log(f"{what}: failed for {', '.join(failed)}; not asking for redelivery after {window}", "ERROR")


@functions_framework.cloud_event
def on_budget(event: Any) -> None:
    message = event.data["message"]
    attributes = message.get("attributes") or {}
    problem = budget_message_problem(
        attributes,
        billing_account=os.environ.get("BILLING_ACCOUNT", ""),
        budget_id=os.environ.get("BUDGET_ID", ""),
    )
    if problem:
        _log(f"ignoring a message on the budget topic: {problem}", "WARNING", attributes=attributes)
        return
    notification = json.loads(base64.b64decode(message["data"]))
    tpu = Tpu(_session())
    nodes, unlisted = list_nodes(tpu)
    actions = budget_actions(
        notification,
        nodes,
        environment=os.environ["ENVIRONMENT"],
        at_percent=float(os.environ["BUDGET_AT_PERCENT"]),
        action=os.environ["BUDGET_ACTION"],
        dry_run=os.environ.get("DRY_RUN", "false") == "true",
        vms=_vms(),
    )
    failed = _each(actions, lambda action: carry_out(tpu, action))
    _hand_back("budget action", [*unlisted, *failed], event["time"])


def _state_name() -> str:
    return f"{guard_prefix(os.environ['ENVIRONMENT'])}recovery.json"


def record_node_states(state_bucket: Objects, nodes: list[dict[str, Any]], at: float) -> None:
    """Keep each of the stack's nodes' changes of state, seen in this listing of every zone at `at` (billed
    time: run_contract/timeline.py NodeStates). Seen at this check: a change comes up to one schedule period
    before it; a node's creation is its createTime (the queue and recovery waits start there). Kept after
    recovery has acted (a read per node must not delay it); a record that cannot be kept is logged, never in
    the way of recovery."""
    vms = _vms()
    created = {short_name(n["name"]): created_at(n) for n in nodes if owner(n, vms) is not None}
    for node_id, state in sorted(node_states(nodes, vms).items()):
        name = node_states_name(os.environ["ENVIRONMENT"], node_id)
        when = created.get(node_id)
        try:
            stored = state_bucket.read(name)
            record = NodeStates.from_json(json.loads(stored)) if stored else NodeStates(node_id)
            changed = record.observe(state, at, when.timestamp() if when else None)
            if changed is not None:
                state_bucket.write(name, json.dumps(changed.to_json()).encode())
        except (requests.RequestException, ValueError) as error:  # TimelineError is a ValueError
            _log(f"cannot keep {node_id}'s states: {error!r}", "WARNING")


@functions_framework.http
def recover(request: Any) -> tuple[str, int]:
    session = _session()
    tpu, state_bucket = Tpu(session), Objects(session, os.environ["STATE_BUCKET"])
    window = timedelta(hours=float(os.environ.get("RECOVERY_WINDOW_HOURS", "24")))
    try:
        state = recovery_state(state_bucket.read(_state_name()), _now(), window)
    except (requests.RequestException, StateError) as error:
        # Fail closed: without the counts, a node preempted in a loop would be re-created forever.
        _log(f"cannot read the recovery state; recovering nothing: {error!r}", "ERROR")
        return json.dumps({"error": "recovery state unreadable"}), 503
    nodes, unlisted = list_nodes(tpu)
    if unlisted:
        return json.dumps({"error": f"cannot list zones {unlisted}"}), 503
    listed_at = _now().timestamp()
    actions = recovery_actions(
        nodes, environment=os.environ["ENVIRONMENT"], state=state, max_attempts=int(os.environ["MAX_ATTEMPTS"])
    )
    by_name = {n["name"]: n for n in nodes}
    attempts, pending = dict(state.attempts), dict(state.pending)

    def save() -> None:
        state_bucket.write(_state_name(), RecoveryState(state.window_start, attempts, pending).to_json())

    def recover_one(action: Action) -> None:
        if action.kind == "give-up":  # the alert "TPU VM preempted and not recovered" matches the event
            _log(f"{action.kind} {action.node}: {action.reason}", "ERROR", **_event(GAVE_UP_EVENT, action.node))
            return
        _log(f"{action.kind} {action.node}: {action.reason}", "NOTICE")
        if action.kind == "forget":
            pending.pop(action.node, None)
            save()
            return
        if action.kind == "recreate":
            pending.setdefault(action.node, recreate_body(by_name[action.node]))
            save()  # the spec is safe before the node is deleted
            tpu.wait(tpu.delete(action.node))
        # The record stays until a later run sees the node listed ("forget"): a create that fails inside
        # its long-running operation is retried from it.
        tpu.create(action.node, pending[action.node])
        attempts[action.node] = attempts.get(action.node, 0) + 1
        save()

    failed = _each(actions, recover_one)
    overruns = overrun_actions(nodes, environment=os.environ["ENVIRONMENT"], vms=_vms(), now=_now())
    failed += _each(overruns, lambda action: carry_out(tpu, action))
    record_node_states(state_bucket, nodes, listed_at)
    done = [
        {"kind": a.kind, "node": a.node, "reason": a.reason, "failed": a.node in failed} for a in [*actions, *overruns]
    ]
    return json.dumps(done), 500 if failed else 200


def _vms() -> dict[str, dict[str, Any]]:
    """TPU_VMS: each VM's node ids, zones and what the stack says to do with them."""
    return json.loads(os.environ.get("TPU_VMS") or "{}")


def _current_runs() -> dict[str, str]:
    """CURRENT_RUNS: each VM's run id as the stack declares it now."""
    return json.loads(os.environ.get("CURRENT_RUNS") or "{}")


@functions_framework.cloud_event
def on_complete(event: Any) -> None:
    data = event.data
    vms = _vms()
    target = completion_target(
        data.get("bucket", ""), data.get("name", ""), status_bucket=os.environ["STATUS_BUCKET"], vms=vms
    )
    if isinstance(target, str):
        _log(f"ignoring gs://{data.get('bucket')}/{data.get('name')}: {target}")
        return
    vm, entry = target
    session = _session()
    tpu = Tpu(session)
    try:
        marker = Objects(session, os.environ["STATUS_BUCKET"]).read(f"{vm}/{COMPLETE_MARKER}")
        problem = marker_problem(vm, marker, _current_runs())
        if problem:
            _log(f"completion of {vm}: {problem}; nothing to do", "WARNING")
            return
    except requests.RequestException as error:
        _log(f"completion of {vm}: cannot read its marker: {error!r}", "ERROR")
        _hand_back("completion action", [vm], event["time"])
        return
    # Wherever its TPUs are: every zone the VM may have landed in, every slice.
    nodes, unlisted = list_nodes(tpu, list(entry["zones"]))
    steps = completion_steps(vm, nodes, vms=vms, environment=os.environ["ENVIRONMENT"])
    if isinstance(steps, str):
        _log(f"completion of {vm}: {steps}")
        steps = []
    failed = _each(steps, lambda action: carry_out(tpu, action))
    _hand_back(f"completion action of {vm}", [*unlisted, *failed], event["time"])


@functions_framework.http
def scheduled_start(request: Any) -> tuple[str, int]:
    body = request.get_json(silent=True) or {}
    vm = body.get("node") if isinstance(body, dict) else None
    if not isinstance(vm, str) or not vm or "/" in vm:
        return json.dumps({"error": 'expected a JSON body {"node": "<vm name>"}'}), 400
    session = _session()
    tpu = Tpu(session)
    try:
        marker = Objects(session, os.environ["STATUS_BUCKET"]).read(f"{vm}/{COMPLETE_MARKER}")
        problem = marker_problem(vm, marker, _current_runs())
        if problem and marker is not None:
            _log(f"scheduled start of {vm}: {problem}", "WARNING")
        complete = problem is None
    except requests.RequestException as error:
        # Fail closed: never start a node whose run may be complete.
        _log(f"cannot read the completion marker of {vm}; not starting it: {error!r}", "ERROR")
        return json.dumps({"node": vm, "did": "nothing", "error": "completion marker unreadable"}), 503
    nodes, unlisted = list_nodes(tpu)
    found = [n for n in nodes if n["name"].rsplit("/", 1)[-1] == vm]
    if not found and unlisted:
        return json.dumps({"node": vm, "did": "nothing", "error": f"cannot list zones {unlisted}"}), 503
    name = found[0]["name"] if found else vm
    step = start_step(name, found[0] if found else None, complete=complete, environment=os.environ["ENVIRONMENT"])
    if isinstance(step, str):
        event = start_event(found[0] if found else None, complete=complete)
        if event:  # meant to run, cannot: reported (infra/monitoring.py alerts on the event), not retried
            _log(f"scheduled start of {vm}: {step}", "ERROR", **_event(event, vm))
        else:
            _log(f"scheduled start of {vm}: {step}")
        return json.dumps({"node": vm, "did": "nothing", "reason": step}), 200
    try:
        carry_out(tpu, step)
    except requests.RequestException as error:
        _log(f"scheduled start of {vm} failed: {error!r}", "ERROR")
        return json.dumps({"node": vm, "did": "nothing", "error": str(error)}), 502
    return json.dumps({"node": vm, "did": "started"}), 200
