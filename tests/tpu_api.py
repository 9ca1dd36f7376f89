"""A stand-in for the Cloud TPU API v2 on loopback, holding nodes, that checks every request it
receives against Google's discovery document (tools/standins/contracts.py) and answers a request that does
not fit with 400, as the real API would.

It keeps what the guard relies on: nodes by name, `list` per zone, `get` (404 when absent), `stop`
and `start` (single-host nodes), `delete` and `create` (`nodeId`, 409 when it exists), each answered
with a long-running operation that is not done yet, and `operations.get` (done when asked). `fail` makes the next calls
of one kind answer 500, to test what the guard does when a call fails.

Queued requests too, as far as the guard touches them: a node a request made names it (Node.queuedResource),
and `queuedResources.delete` removes the request, with `force=true` its nodes first, and without it
answers 400 while the request still has nodes (tpu.v2.json queuedResources.delete `force`). Requests are
addressed through v2 or v2alpha1 (a flex-start request's version), each checked against its own document.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve


@dataclass
class TpuState:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: set[str] = field(default_factory=set)  # queued resources by name
    calls: list[Call] = field(default_factory=list)  # every request, as received
    methods: list[str] = field(default_factory=list)  # the discovery method id of each valid request
    violations: list[str] = field(default_factory=list)
    authorization: list[str] = field(default_factory=list)  # the Authorization header of each request
    failures: dict[str, int] = field(default_factory=dict)  # method id suffix -> how many calls fail
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, node: dict[str, Any]) -> None:
        self.nodes[node["name"]] = copy.deepcopy(node)
        if node.get("queuedResource"):
            self.requests.add(node["queuedResource"])

    def fail(self, kind: str, times: int = 1) -> None:
        """The next `times` calls of `kind` (e.g. 'create', 'stop') answer 500."""
        self.failures[kind] = times

    def did(self, kind: str) -> list[str]:
        """The short node names (or zones, for list) that valid calls of `kind` were made for, in order."""
        out = []
        for call, method in zip(self.calls, self.methods, strict=True):
            if method.rsplit(".", 1)[-1] == kind:
                path = urlsplit(call.url).path.split("/", 2)[2].rsplit(":", 1)[0]
                node_id = parse_qs(urlsplit(call.url).query).get("nodeId", [""])[0]
                out.append(node_id or path.rsplit("/", 1)[-1])
        return out


class _Handler(Handler):
    state: ClassVar[TpuState]

    def _handle(self) -> None:
        raw = self.body()
        body = json.loads(raw) if raw else None
        call = Call(self.command, self.path, body)
        state = self.state
        with state.lock:
            state.calls.append(call)
            state.authorization.append(self.headers.get("Authorization", ""))
            try:
                version = urlsplit(self.path).path.split("/")[1]
                method = api("tpu.v2alpha1" if version == "v2alpha1" else "tpu.v2").check(call)
            except ContractError as error:
                state.violations.append(str(error))
                state.methods.append("invalid")
                self.answer(400, {"error": {"code": 400, "message": str(error), "status": "INVALID_ARGUMENT"}})
                return
            state.methods.append(method.id)
            kind = method.id.rsplit(".", 1)[-1]
            if state.failures.get(kind):
                state.failures[kind] -= 1
                self.answer(500, {"error": {"code": 500, "message": f"stand-in: {kind} fails", "status": "INTERNAL"}})
                return
            status, answer = self._apply(method.id, urlsplit(self.path), body or {})
        self.answer(status, answer)

    def _apply(self, method: str, url: Any, body: dict[str, Any]) -> tuple[int, Any]:
        nodes = self.state.nodes
        path = url.path.split("/", 2)[2]
        name = path.rsplit(":", 1)[0]
        operation = {"name": f"{'/'.join(name.split('/')[:4])}/operations/op-{len(self.state.calls)}", "done": False}
        if method.endswith("nodes.list"):
            found = [n for n in nodes.values() if n["name"].startswith(path + "/")]
            return 200, {"nodes": found} if found else {}
        if method.endswith("operations.get"):
            return 200, {"name": path, "done": True}
        if method.endswith("nodes.create"):
            node_id = parse_qs(url.query).get("nodeId", [""])[0]
            full = f"{path}/{node_id}"
            if "acceleratorType" in body and "acceleratorConfig" in body:
                # The provider's `conflicts` (magic-modules tpuv2/Vm.yaml): one or the other, never both.
                return 400, {"error": {"code": 400, "message": "acceleratorType and acceleratorConfig both set"}}
            if full in nodes:
                return 409, {"error": {"code": 409, "message": f"{full} already exists", "status": "ALREADY_EXISTS"}}
            nodes[full] = {**copy.deepcopy(body), "name": full, "state": "READY"}
            return 200, operation
        if method.endswith("queuedResources.delete"):
            if name not in self.state.requests:
                return 404, {"error": {"code": 404, "message": f"{name} not found", "status": "NOT_FOUND"}}
            made = [n for n, node in nodes.items() if node.get("queuedResource") == name]
            if made and parse_qs(url.query).get("force") != ["true"]:
                return 400, {"error": {"code": 400, "message": f"{name} has nodes", "status": "FAILED_PRECONDITION"}}
            for made_node in made:
                del nodes[made_node]
            self.state.requests.discard(name)
            return 200, operation
        node = nodes.get(name)
        if node is None:
            return 404, {"error": {"code": 404, "message": f"{name} not found", "status": "NOT_FOUND"}}
        if method.endswith("nodes.get"):
            return 200, node
        if method.endswith("nodes.delete"):
            del nodes[name]
        elif method.endswith("nodes.stop"):
            node["state"] = "STOPPED"
        elif method.endswith("nodes.start"):
            node["state"] = "READY"
        return 200, operation

    do_GET = do_POST = do_DELETE = do_PATCH = _handle  # noqa: N815 - the http.server method names


@contextlib.contextmanager
def tpu_api_standin() -> Iterator[tuple[str, TpuState]]:
    """Yields the stand-in's base URL (for TPU_API_ENDPOINT) and its state."""
    state = TpuState()
    with serve(_Handler, state=state) as url:
        yield url, state
