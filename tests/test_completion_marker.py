"""The completion marker's one schema (run_contract/completion_marker.py): what it accepts and refuses
(tests/test_run_contract.py checks that every artefact ships it)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from run_contract import completion_marker

ROOT = Path(__file__).resolve().parents[1]
CANONICAL = ROOT / "run_contract" / "completion_marker.py"
GOOD = {"runId": "dev/mnist/vm/run-1", "writtenBy": "vm-agent", "finishedAt": "2026-12-01T12:00:00Z"}


def test_a_marker_has_a_run_a_writer_and_a_time():
    assert completion_marker.problem(GOOD) is None
    full = {**GOOD, "writtenBy": "runlib", "program": "python train.py", "steps": 12, "metrics": {"loss": 0.1}}
    assert completion_marker.problem(full) is None
    assert completion_marker.problem({**GOOD, "steps": None, "finishedAt": "2026-12-01T12:00:00.123456Z"}) is None
    made = completion_marker.marker("dev/mnist/vm/run-1", "vm-agent", "2026-12-01T12:00:00Z", "train", 3, {})
    assert made == {**GOOD, "program": "train", "steps": 3}
    assert completion_marker.decode(completion_marker.encode(made)) == (made, "")
    assert completion_marker.run_of(completion_marker.encode(made)) == "dev/mnist/vm/run-1"
    with pytest.raises(ValueError, match="not a completion marker: finishedAt 'now'"):
        completion_marker.marker("dev/mnist/vm/run-1", "vm-agent", "now")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ([GOOD], "a JSON object is expected, not list"),
        ({"runId": "r"}, "writtenBy, finishedAt missing"),
        ({**GOOD, "action": "delete"}, "unknown member action"),
        ({**GOOD, "runId": ""}, "runId '' is not a non-empty string"),
        ({**GOOD, "runId": 7}, "runId 7 is not a non-empty string"),
        ({**GOOD, "writtenBy": "me"}, "writtenBy 'me' is not one of vm-agent, runlib"),
        ({**GOOD, "finishedAt": "2026-12-01T12:00:00+00:00"}, "not an RFC 3339 UTC time"),
        ({**GOOD, "finishedAt": "2026-13-01T12:00:00Z"}, "not an RFC 3339 UTC time"),
        ({**GOOD, "finishedAt": "yesterday"}, "not an RFC 3339 UTC time"),
        ({**GOOD, "steps": "12"}, "steps '12' is not an integer"),
        ({**GOOD, "steps": True}, "steps True is not an integer"),
        ({**GOOD, "metrics": [1]}, "metrics [1] is not an object"),
        ({**GOOD, "program": ["python"]}, "program ['python'] is not a string"),
    ],
)
def test_anything_else_is_not_a_marker(value, why):
    assert why in str(completion_marker.problem(value))
    assert completion_marker.decode(json.dumps(value).encode())[0] is None


def test_bytes_that_are_not_json_are_not_a_marker():
    for data in (b"not json", b"", b"\xff", None):
        found, why = completion_marker.decode(data)
        assert found is None and why
        assert completion_marker.run_of(data) is None


def test_the_schema_imports_only_the_standard_library():
    """It ships inside the guard and the agent, where nothing of this repository is importable."""
    tree = ast.parse(CANONICAL.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
