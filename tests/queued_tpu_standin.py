"""A TPU API stand-in for queued resources on loopback, which checks every request against Google's
discovery document (google-api-python-client's `tpu.v2.json` / `tpu.v2alpha1.json`), with the checker
every stand-in shares (tools/standins/contracts.py).

It implements queuedResources create / get / delete and operations get, walks each request through
the states a scenario gives (e.g. WAITING_FOR_RESOURCES -> PROVISIONING -> ACTIVE), answers stock-outs
for chosen zones (as an HTTP 429 RESOURCE_EXHAUSTED, a failed create operation, or a FAILED request),
and can preempt (SUSPENDED). A request that breaks the discovery document gets HTTP 400 and is kept
in `invalid`, so a test fails on it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve


def request_errors(http_method: str, path: str, query: dict[str, list[str]], body: Any) -> list[str]:
    """What the TPU API's discovery document does not allow in a request (tools/standins/contracts.py)."""
    version = path.split("/", 1)[0]
    if version not in ("v2", "v2alpha1"):
        return [f"unknown API version in {path}"]
    url = f"/{path}?{urlencode(query, doseq=True)}" if query else f"/{path}"
    try:
        api(f"tpu.{version}").check(Call(http_method, url, body))
    except ContractError as error:
        return [str(error)]
    return []


WALK = ("WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")


@dataclass
class Scenario:
    """How the stand-in answers, per zone."""

    # Zone -> how it stocks out: "http" (429 on create), "operation" (create operation fails, code 8)
    # or "failed" (the request is accepted, then goes FAILED with a capacity error).
    stockout: dict[str, str] = field(default_factory=dict)
    # States each request walks through, one step per get (a name, or a whole QueuedResourceState);
    # the last one stays.
    states: list[str | dict[str, Any]] = field(
        default_factory=lambda: ["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    )


STOCKOUT = (
    'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU Nodes are offered'
)


class StandIn:
    def __init__(self, scenario: Scenario | None = None):
        self.scenario = scenario or Scenario()
        self.requests: list[dict[str, Any]] = []  # every request: method, path, query, body
        self.invalid: list[str] = []
        self.resources: dict[str, dict[str, Any]] = {}  # full name -> {"body", "steps", "state", …}
        self.operations: dict[str, dict[str, Any]] = {}
        self.nodes: set[str] = set()
        self._lock = threading.Lock()
        self._n = 0
        standin = self

        class StandInHandler(Handler):
            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                raw = self.body()
                body = json.loads(raw) if raw else None
                self.answer(*standin.handle(method, url.path.lstrip("/"), parse_qs(url.query), body))

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self._serve("POST")

            def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
                self._serve("DELETE")

        self._handler = StandInHandler
        self._serving = contextlib.ExitStack()
        self.url = ""  # its base URL, ending in "/", once entered

    def __enter__(self) -> StandIn:
        self.url = self._serving.enter_context(serve(self._handler)) + "/"
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.close()

    # --- what a test may do to the live state
    def preempt(self, name: str) -> None:
        with self._lock:
            r = self.resources[name]
            r["steps"] = []
            r["state"] = {"state": "SUSPENDED", "stateInitiator": "SERVICE", "suspendedData": {}}
            self.nodes -= set(r["nodes"])

    # --- the API
    def _op(self, zone_parent: str, version: str, done: bool, error: dict[str, Any] | None = None) -> dict[str, Any]:
        self._n += 1
        op: dict[str, Any] = {"name": f"{zone_parent}/operations/operation-{self._n}", "done": done}
        if error:
            op["error"] = error
        self.operations[op["name"]] = {"op": {**op, "done": True}, "version": version}
        return op

    @staticmethod
    def _error(status: int, rpc: str, message: str) -> tuple[int, dict[str, Any]]:
        return status, {"error": {"code": status, "message": message, "status": rpc}}

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        with self._lock:
            self.requests.append({"method": method, "path": path, "query": query, "body": body})
            errs = request_errors(method, path, query, body)
            if errs:
                self.invalid += errs
                return self._error(400, "INVALID_ARGUMENT", "; ".join(errs))
            version, name = path.split("/", 1)
            parts = name.split("/")
            zone_parent = "/".join(parts[:4])
            zone = parts[3]
            if "/operations/" in name:
                op = self.operations.get(name)
                return (200, op["op"]) if op else self._error(404, "NOT_FOUND", name)
            if method == "POST":
                full = f"{name}/{query['queuedResourceId'][0]}"
                how = self.scenario.stockout.get(zone)
                if how == "http":
                    return self._error(429, "RESOURCE_EXHAUSTED", STOCKOUT.format(zone=zone))
                if full in self.resources:
                    return self._error(409, "ALREADY_EXISTS", f"{full} already exists")
                spec = body["tpu"]["nodeSpec"][0]
                multi = spec.get("multisliceParams") or spec.get("multiNodeParams")
                ids = [f"{multi['nodeIdPrefix']}-{i}" for i in range(multi["nodeCount"])] if multi else [spec["nodeId"]]
                steps = list(self.scenario.states)
                if how == "failed":
                    err = {"code": 8, "message": STOCKOUT.format(zone=zone)}
                    steps = ["WAITING_FOR_RESOURCES", {"state": "FAILED", "failedData": {"error": err}}]
                self.resources[full] = {
                    "body": body,
                    "version": version,
                    "steps": steps,
                    "state": {"state": "CREATING"},
                    "nodes": [f"{zone_parent}/nodes/{i}" for i in ids],
                }
                if how == "operation":
                    error = {"code": 8, "message": STOCKOUT.format(zone=zone)}
                    self.resources[full]["steps"] = []
                    self.resources[full]["state"] = {"state": "FAILED", "failedData": {"error": error}}
                    return 200, self._op(zone_parent, version, done=False, error=error)
                return 200, self._op(zone_parent, version, done=False)
            r = self.resources.get(name)
            if r is None:
                return self._error(404, "NOT_FOUND", f"{name} not found")
            if method == "GET":
                if r["steps"]:
                    step = r["steps"].pop(0)
                    r["state"] = step if isinstance(step, dict) else {"state": step}
                    if r["state"]["state"] == "ACTIVE":
                        self.nodes |= set(r["nodes"])
                return 200, {**r["body"], "name": name, "state": r["state"]}
            # DELETE: without force, only when no node is left (tpu.v2.json queuedResources.delete `force`).
            live = set(r["nodes"]) & self.nodes
            if live and query.get("force") != ["true"]:
                return self._error(400, "FAILED_PRECONDITION", f"{name} still has nodes {sorted(live)}")
            self.nodes -= live
            del self.resources[name]
            return 200, self._op(zone_parent, version, done=False)
