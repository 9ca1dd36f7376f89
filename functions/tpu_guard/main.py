"""The TPU guard, deployed as two Cloud Run functions; decisions live in decisions.py.

- `on_budget`: triggered by the budget's Pub/Sub topic (Eventarc); stops or deletes the
  environment's TPU nodes when spend reaches the threshold.
- `recover`: called by Cloud Scheduler; re-creates preempted spot/preemptible nodes, counting
  recoveries per node in the state bucket so a node that keeps being preempted is given up on.

Settings come from the environment: PROJECT, ENVIRONMENT, ZONES (comma-separated), BUDGET_ACTION
(stop|delete), BUDGET_AT_PERCENT, DRY_RUN (true|false), MAX_ATTEMPTS, STATE_BUCKET.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import functions_framework
import google.auth
from decisions import Action, budget_actions, recovery_actions, recreate_body
from google.auth.transport.requests import AuthorizedSession

TPU = "https://tpu.googleapis.com/v2"
STORAGE = "https://storage.googleapis.com/storage/v1"


def _session() -> AuthorizedSession:
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def _log(message: str, severity: str = "INFO", **fields: Any) -> None:
    print(json.dumps({"severity": severity, "message": message, **fields}), flush=True)


def list_nodes(session: AuthorizedSession) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for zone in filter(None, os.environ["ZONES"].split(",")):
        response = session.get(f"{TPU}/projects/{os.environ['PROJECT']}/locations/{zone}/nodes")
        response.raise_for_status()
        nodes += response.json().get("nodes", [])
    return nodes


def _wait(session: AuthorizedSession, operation: dict[str, Any], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not operation.get("done") and time.monotonic() < deadline:
        time.sleep(10)
        operation = session.get(f"{TPU}/{operation['name']}").json()


def carry_out(session: AuthorizedSession, action: Action, nodes: dict[str, dict[str, Any]]) -> None:
    _log(f"{action.kind} {action.node}: {action.reason}", "NOTICE", dry_run=action.dry_run)
    if action.dry_run or action.kind == "give-up":
        return
    if action.kind == "stop":
        session.post(f"{TPU}/{action.node}:stop", json={}).raise_for_status()
    elif action.kind == "delete":
        session.delete(f"{TPU}/{action.node}").raise_for_status()
    elif action.kind == "recreate":
        body = recreate_body(nodes[action.node])
        deleted = session.delete(f"{TPU}/{action.node}")
        deleted.raise_for_status()
        _wait(session, deleted.json())
        parent, _, node_id = action.node.rpartition("/nodes/")
        session.post(f"{TPU}/{parent}/nodes", params={"nodeId": node_id}, json=body).raise_for_status()


@functions_framework.cloud_event
def on_budget(event: Any) -> None:
    notification = json.loads(base64.b64decode(event.data["message"]["data"]))
    session = _session()
    nodes = list_nodes(session)
    actions = budget_actions(
        notification,
        nodes,
        environment=os.environ["ENVIRONMENT"],
        at_percent=float(os.environ["BUDGET_AT_PERCENT"]),
        action=os.environ["BUDGET_ACTION"],
        dry_run=os.environ.get("DRY_RUN", "false") == "true",
    )
    by_name = {n["name"]: n for n in nodes}
    for action in actions:
        carry_out(session, action, by_name)


def _attempts_url() -> str:
    name = f"_tpu-guard/{os.environ['ENVIRONMENT']}/recoveries.json".replace("/", "%2F")
    return f"{STORAGE}/b/{os.environ['STATE_BUCKET']}/o/{name}"


@functions_framework.http
def recover(request: Any) -> tuple[str, int]:
    session = _session()
    found = session.get(_attempts_url(), params={"alt": "media"})
    attempts: dict[str, int] = found.json() if found.status_code == 200 else {}
    nodes = list_nodes(session)
    actions = recovery_actions(
        nodes, environment=os.environ["ENVIRONMENT"], attempts=attempts, max_attempts=int(os.environ["MAX_ATTEMPTS"])
    )
    by_name = {n["name"]: n for n in nodes}
    for action in actions:
        if action.kind == "give-up":
            _log(f"giving up on {action.node}: {action.reason}", "ERROR")
            continue
        carry_out(session, action, by_name)
        attempts[action.node] = attempts.get(action.node, 0) + 1
    if actions:
        upload = f"{STORAGE.replace('/storage/v1', '/upload/storage/v1')}/b/{os.environ['STATE_BUCKET']}/o"
        name = f"_tpu-guard/{os.environ['ENVIRONMENT']}/recoveries.json"
        session.post(upload, params={"uploadType": "media", "name": name}, data=json.dumps(attempts)).raise_for_status()
    return json.dumps([a.__dict__ for a in actions]), 200
