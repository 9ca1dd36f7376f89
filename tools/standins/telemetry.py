"""Loopback stand-ins for what the VM's telemetry talks to: Cloud Logging's and Cloud Monitoring's write
endpoints, every request checked against the APIs' discovery documents as it arrives. The metadata
server's token and zone are tools/standins/metadata.py's.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve


@dataclass
class Received:
    """What the API stand-in saw: each call with its method id, and every contract violation."""

    calls: list[tuple[str, Call, str]] = field(default_factory=list)  # (method id, call, Authorization)
    violations: list[str] = field(default_factory=list)
    status: int = 200  # what to answer
    hold: threading.Event | None = None  # when set, requests wait for it before answering
    held: threading.Event = field(default_factory=threading.Event)  # set once a request waits on `hold`

    def bodies(self, method_id: str) -> list[dict[str, Any]]:
        return [call.body for mid, call, _ in self.calls if mid == method_id]


class _ApiHandler(Handler):
    received: ClassVar[Received]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.body()
        if self.received.hold is not None:
            self.received.held.set()
            self.received.hold.wait(30)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = raw
        call = Call("POST", self.path, body)
        name = "logging.v2" if self.path.startswith("/v2/") else "monitoring.v3"
        try:
            method = api(name).check(call).id
        except ContractError as error:
            # As Google answers a request its schema refuses: 400 INVALID_ARGUMENT, nothing written.
            self.received.violations.append(str(error))
            self.received.calls.append(("?", call, self.headers.get("Authorization", "")))
            self.answer(400, {"error": {"code": 400, "message": str(error), "status": "INVALID_ARGUMENT"}})
            return
        self.received.calls.append((method, call, self.headers.get("Authorization", "")))
        self.answer(self.received.status, {})


@contextlib.contextmanager
def google_apis() -> Iterator[tuple[str, Received]]:
    """One loopback server for logging.googleapis.com (/v2/...) and monitoring.googleapis.com (/v3/...);
    yields its base URL and what it received."""
    received = Received()
    with serve(_ApiHandler, received=received) as url:
        try:
            yield url, received
        finally:
            if received.hold is not None:
                received.hold.set()  # before the server stops: a held request would keep it waiting
