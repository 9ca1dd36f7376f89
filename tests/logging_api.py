"""A stand-in for Cloud Logging's `entries:list` on loopback, checking each request against Google's
discovery document (logging.v2) and answering with the entries it holds whose log name and labels the
request's filter names (the `labels.KEY="VALUE"`, `logName="…"` and `timestamp>"…"` terms that
`tpu-runs logs` sends, joined by AND; any other term is a 400, so a new filter shape fails loudly).
A log view named in `resourceNames` (`projects/P/locations/global/buckets/B/views/V`) shows only the
entries of the log it was made for: the platform makes each researcher's view with the filter
`LOG_ID("V")` (infra/researchers.py), so here a view V holds the entries of `projects/P/logs/V`.

It also takes what the VM's telemetry writes, so one test can follow a line from the program to the
researcher: `entries:write` (each entry kept with the request's logName and resource, as Logging
stores them) and Cloud Monitoring's `timeSeries.create` (checked against monitoring.v3, kept in
`time_series`): point the agent's TPU_PLATFORM_LOGGING_URL and TPU_PLATFORM_MONITORING_URL here.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve

_TERM = re.compile(r'(?P<key>logName|timestamp|labels\.[A-Za-z]+)(?P<op>=|>)"(?P<value>[^"]*)"')


@dataclass
class LoggingState:
    entries: list[dict[str, Any]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    time_series: list[dict[str, Any]] = field(default_factory=list)


def matches(entry: dict[str, Any], log_filter: str) -> bool:
    for term in log_filter.split(" AND "):
        found = _TERM.fullmatch(term.strip())
        if not found:
            raise ValueError(f"filter term {term!r} is not one the stand-in knows")
        key, op, value = found["key"], found["op"], found["value"]
        have = entry.get(key) if not key.startswith("labels.") else entry.get("labels", {}).get(key[7:])
        if (op == "=" and have != value) or (op == ">" and not (have or "") > value):
            return False
    return True


class _Handler(Handler):
    state: ClassVar[LoggingState]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.body() or b"{}")
        try:
            method = api("monitoring.v3" if self.path.startswith("/v3/") else "logging.v2").check(
                Call("POST", self.path, body)
            )
        except ContractError as error:
            self.state.violations.append(str(error))
            self.answer(400, {"error": {"code": 400, "message": str(error)}})
            return
        self.state.methods.append(method.id)
        self.state.bodies.append(body)
        if method.id == "logging.entries.write":
            defaults = {key: body[key] for key in ("logName", "resource") if key in body}
            self.state.entries += [{**defaults, **entry} for entry in body.get("entries", [])]
            self.answer(200, {})
            return
        if method.id == "monitoring.projects.timeSeries.create":
            self.state.time_series += body.get("timeSeries", [])
            self.answer(200, {})
            return
        views = [r for r in body.get("resourceNames", []) if "/views/" in r]
        shown = [
            e
            for e in self.state.entries
            if not views
            or any(e.get("logName") == f"{v.split('/locations/')[0]}/logs/{v.rsplit('/', 1)[1]}" for v in views)
        ]
        try:
            found = [e for e in shown if matches(e, body.get("filter", ""))]
        except ValueError as error:
            self.answer(400, {"error": {"code": 400, "message": str(error)}})
            return
        found.sort(key=lambda e: e.get("timestamp", ""))
        self.answer(200, {"entries": found} if found else {})


@contextlib.contextmanager
def logging_standin() -> Iterator[tuple[str, LoggingState]]:
    """Yields the stand-in's base URL (for LOGGING_API_ENDPOINT) and its state."""
    state = LoggingState()
    with serve(_Handler, state=state) as url:
        yield url, state
