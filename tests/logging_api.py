"""A stand-in for Cloud Logging's `entries:list` on loopback, checking each request against Google's
discovery document (logging.v2) and answering with the entries it holds whose log name and labels the
request's filter names (the `labels.KEY="VALUE"`, `logName="…"` and `timestamp>"…"` terms that
`tpu-runs logs` sends, joined by AND; any other term is a 400, so a new filter shape fails loudly).
A log view named in `resourceNames` (`projects/P/locations/global/buckets/B/views/V`) shows only the
entries of the log it was made for: the platform makes each researcher's view with the filter
`LOG_ID("V")` (infra/researchers.py), so here a view V holds the entries of `projects/P/logs/V`.
A test may instead give the sinks and views of a plan (`route`): then a view shows what a sink routed into its
bucket, and what its own filter lets through (`SOURCE()`, `resource.type` and `LOG_ID()` terms, the only ones
logging.v2 LogView.filter takes); a sink routes an entry its filter matches, whose terms may also name
`resource.labels.KEY` and a quoted label key such as `labels."k8s-pod/app"`, as GKE's container entries carry.

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
from urllib.parse import quote

from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve

_TERM = re.compile(
    r'(?P<key>logName|timestamp|resource\.type|resource\.labels\.[a-z_]+|labels\.[A-Za-z]+|labels\."[^"]+")'
    r'\s*(?P<op>=|>)\s*"(?P<value>[^"]*)"'
)
# The qualifiers of a log view's filter besides resource.type (logging.v2 LogView.filter).
_VIEW_TERM = re.compile(r'(?P<function>SOURCE|LOG_ID)\("(?P<value>[^"]*)"\)')


@dataclass
class LoggingState:
    entries: list[dict[str, Any]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    time_series: list[dict[str, Any]] = field(default_factory=list)
    sinks: list[tuple[str, str]] = field(default_factory=list)  # (destination bucket path, filter)
    views: dict[str, tuple[str, str]] = field(default_factory=dict)  # view name -> (its bucket path, its filter)

    def route(self, sinks: list[dict[str, Any]], views: list[dict[str, Any]]) -> None:
        """The plan's ProjectSink and LogView inputs: sinks into log buckets, and views of those buckets."""
        self.sinks += [(s["destination"].removeprefix("logging.googleapis.com/"), s["filter"]) for s in sinks]
        self.views.update({f"{v['bucket']}/views/{v['name']}": (v["bucket"], v.get("filter") or "") for v in views})

    def shown(self, view: str) -> list[dict[str, Any]]:
        """What a view shows: entries a sink routed to its bucket that its own filter lets through."""
        if view not in self.views:  # a researcher's view of `_Default`: its own log only
            project, view_id = view.split("/locations/")[0], view.rsplit("/", 1)[1]
            return [e for e in self.entries if e.get("logName") == f"{project}/logs/{view_id}"]
        bucket, view_filter = self.views[view]
        routed = [e for e in self.entries if any(b == bucket and matches(e, f) for b, f in self.sinks)]
        return [e for e in routed if view_shows(e, view_filter)]


def _value(entry: dict[str, Any], key: str) -> Any:
    if key.startswith("resource."):
        resource = entry.get("resource") or {}
        return resource.get("type") if key == "resource.type" else (resource.get("labels") or {}).get(key[16:])
    if key.startswith("labels."):
        return (entry.get("labels") or {}).get(key[7:].strip('"'))
    return entry.get(key)


def matches(entry: dict[str, Any], log_filter: str) -> bool:
    for term in log_filter.split(" AND "):
        found = _TERM.fullmatch(term.strip())
        if not found:
            raise ValueError(f"filter term {term!r} is not one the stand-in knows")
        key, op, value = found["key"], found["op"], found["value"]
        have = _value(entry, key)
        if (op == "=" and have != value) or (op == ">" and not (have or "") > value):
            return False
    return True


def view_shows(entry: dict[str, Any], view_filter: str) -> bool:
    """A log view's filter: SOURCE("projects/P"), LOG_ID("ID") and resource.type terms, joined by AND."""
    for term in filter(None, (t.strip() for t in view_filter.split(" AND "))):
        function = _VIEW_TERM.fullmatch(term)
        log_name = str(entry.get("logName", ""))
        if function and function["function"] == "SOURCE":
            if not log_name.startswith(f"{function['value']}/logs/"):
                return False
        elif function:
            if log_name.rsplit("/logs/", 1)[-1] != quote(function["value"], safe=""):
                return False
        elif not term.startswith("resource.type") or not matches(entry, term):
            raise ValueError(f"view filter term {term!r}: a log view filters on SOURCE(), resource.type, LOG_ID()")
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
        try:
            shown = [e for v in views for e in self.state.shown(v)] if views else self.state.entries
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
