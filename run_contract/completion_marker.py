"""The completion marker: `<vm>/COMPLETE` in the run-status bucket, written when a stack's run has finished.

One definition for every runtime that writes or reads it: the VM agent writes it (vm_agent/runner.py), a
program run by hand may with runlib (workloads/lib/runlib.py), the guard stops or deletes the VM when it
appears (functions/tpu_guard/), and the Pulumi program leaves a deleted VM undeclared (infra/run_status.py).
Part of the run contract's package (run_contract/), which ships inside each of those runtimes.

A marker is a JSON object with exactly these members:

- `runId`: the run it completes (a non-empty string: the stack's run id, infra/tpu/metadata.py `run_id`);
- `writtenBy`: what wrote it, one of WRITERS;
- `finishedAt`: when, in RFC 3339 UTC with a `Z` (`2026-12-01T12:00:00Z`);
- optionally `program` (a string), `steps` (an integer or null) and `metrics` (an object).

Anything else (not JSON, not an object, a member missing, unknown or of the wrong type) is not a marker:
the guard acts on none and the program counts no run complete by it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

NAME = "COMPLETE"  # the object's leaf name, under the VM's folder of the run-status bucket
WRITERS = ("vm-agent", "runlib")
REQUIRED = ("runId", "writtenBy", "finishedAt")
OPTIONAL = ("program", "steps", "metrics")
_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?Z")


def marker(
    run_id: str,
    written_by: str,
    finished_at: str,
    program: str = "",
    steps: int | None = None,
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A marker with these members; ValueError when they do not make one."""
    value: dict[str, Any] = {"runId": run_id, "writtenBy": written_by, "finishedAt": finished_at}
    if program:
        value["program"] = program
    if steps is not None:
        value["steps"] = steps
    if metrics:
        value["metrics"] = dict(metrics)
    why = problem(value)
    if why:
        raise ValueError(f"not a completion marker: {why}")
    return value


def encode(value: dict[str, Any]) -> bytes:
    """The object's bytes (sorted keys: the same marker, the same bytes)."""
    return json.dumps(value, sort_keys=True).encode()


def problem(value: object) -> str | None:
    """Why a decoded JSON value is not a marker, or None."""
    if not isinstance(value, dict):
        return f"a JSON object is expected, not {type(value).__name__}"
    missing = [k for k in REQUIRED if k not in value]
    if missing:
        return f"{', '.join(missing)} missing"
    unknown = sorted(k for k in value if k not in REQUIRED + OPTIONAL)
    if unknown:
        return f"unknown member {', '.join(unknown)} (a marker has {', '.join(REQUIRED + OPTIONAL)})"
    if not isinstance(value["runId"], str) or not value["runId"]:
        return f"runId {value['runId']!r} is not a non-empty string"
    if value["writtenBy"] not in WRITERS:
        return f"writtenBy {value['writtenBy']!r} is not one of {', '.join(WRITERS)}"
    if not _utc_time(value["finishedAt"]):
        return f"finishedAt {value['finishedAt']!r} is not an RFC 3339 UTC time like 2026-12-01T12:00:00Z"
    if "program" in value and not isinstance(value["program"], str):
        return f"program {value['program']!r} is not a string"
    steps = value.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)):
        return f"steps {steps!r} is not an integer"
    if "metrics" in value and not isinstance(value["metrics"], dict):
        return f"metrics {value['metrics']!r} is not an object"
    return None


def decode(data: bytes | str | None) -> tuple[dict[str, Any] | None, str]:
    """(the marker, "") for the stored bytes, or (None, why they are not one)."""
    if data is None:
        return None, "there is no marker"
    try:
        value = json.loads(data)
    except ValueError as error:
        return None, f"not JSON ({error})"
    why = problem(value)
    return (None, why) if why else (value, "")


def run_of(data: bytes | str | None) -> str | None:
    """The run a stored marker completes; None when there is none, or it is not a marker."""
    found, _ = decode(data)
    return found["runId"] if found else None


def _utc_time(text: object) -> bool:
    match = _TIME.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return False
    try:
        datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return False
    return True
