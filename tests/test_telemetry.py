"""The VM's telemetry (vm_agent/telemetry.py) against loopback Logging, Monitoring and metadata servers,
every request body checked against the logging.v2 / monitoring.v3 discovery documents."""

from __future__ import annotations

import ast
import copy
import json
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.access.identities import WORKLOAD_METHODS
from run_contract import metrics
from tests.sandbox import wait_for
from tests.support import STEP_LINE_CATEGORIES
from tools.standins.contracts import Call, ContractError, api
from tools.standins.metadata import SANDBOX_TOKEN, ZONE, metadata_server, sandbox_credentials
from tools.standins.telemetry import Received, google_apis
from vm_agent import telemetry
from vm_agent.telemetry import METHODS, Telemetry, severity_of

ROOT = Path(__file__).resolve().parents[1]
WRITE = "logging.entries.write"
CREATE = "monitoring.projects.timeSeries.create"


@dataclass(frozen=True)
class RunSpec:  # what the agent's run spec offers telemetry (telemetry.Run)
    run_id: str
    model_dir: str = ""


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    telemetry: Telemetry
    received: Received
    clock: Clock
    warnings: list[str]
    metadata_asked: list[str]


def env_for(api_url: str, metadata_host: str) -> dict[str, str]:
    return {
        "TPU_PLATFORM_PROJECT": "acme-ml-sandbox",
        "TPU_PLATFORM_STACK": "dev",
        "TPU_PLATFORM_VM": "mnist-dev",
        "TPU_PLATFORM_WORKER_ID": "1",
        "TPU_PLATFORM_LOGGING_URL": api_url,
        "TPU_PLATFORM_MONITORING_URL": api_url,
        "GCE_METADATA_HOST": metadata_host,
    }


@pytest.fixture
def rig() -> Iterator[Rig]:
    with google_apis() as (api_url, received), metadata_server() as metadata:
        clock, warnings = Clock(), []
        # Flushed by hand in the tests: the background thread's period is out of the way.
        shipper = Telemetry(
            env_for(api_url, metadata),
            clock=clock,
            warn=warnings.append,
            flush_every_s=3600,
            credentials=sandbox_credentials(),
        )
        yield Rig(shipper, received, clock, warnings, metadata.asked)
        shipper.close(5)


def test_json_lines_become_structured_entries_and_others_text(rig):
    run = RunSpec("exp-42")
    rig.telemetry.ship(json.dumps({"severity": "WARNING", "message": "slow input", "step": 3}) + "\n", run)
    rig.telemetry.ship(json.dumps({"level": "error", "message": "nan seen"}), run)
    rig.telemetry.ship("plain text from the program\n", run)
    rig.telemetry.ship("[1, 2]", run)  # JSON, but not an object: text
    rig.telemetry.flush()

    assert not rig.received.violations
    (body,) = rig.received.bodies(WRITE)
    assert body["logName"] == "projects/acme-ml-sandbox/logs/tpu-workload"
    assert body["resource"] == {
        "type": "generic_node",
        "labels": {"project_id": "acme-ml-sandbox", "location": ZONE, "namespace": "dev", "node_id": "mnist-dev"},
    }
    first, second, text, listed = body["entries"]
    labels = {"runId": "exp-42", "vm": "mnist-dev", "worker": "1", "stack": "dev"}
    assert first["labels"] == second["labels"] == text["labels"] == labels
    assert (first["severity"], first["jsonPayload"]["message"]) == ("WARNING", "slow input")
    assert (second["severity"], second["jsonPayload"]["message"]) == ("ERROR", "nan seen")
    assert (text["textPayload"], text["severity"]) == ("plain text from the program", "DEFAULT")
    assert "jsonPayload" not in text and "textPayload" not in first
    assert listed["textPayload"] == "[1, 2]"
    assert {auth for _, _, auth in rig.received.calls} == {f"Bearer {SANDBOX_TOKEN}"}
    assert rig.telemetry.counts.entries_sent == 4


@pytest.mark.parametrize(
    ("given", "severity"),
    [
        ("INFO", "INFO"),
        ("warn", "WARNING"),
        ("Fatal", "CRITICAL"),
        (40, "ERROR"),
        (10, "DEBUG"),
        ("loud", "DEFAULT"),
        (None, "DEFAULT"),
        (True, "DEFAULT"),
        ("notice", "NOTICE"),
    ],
)
def test_severity_mapped_to_loggings_names(given, severity):
    assert severity_of(given) == severity
    enum = api("logging.v2").doc["schemas"]["LogEntry"]["properties"]["severity"]["enum"]
    assert severity in enum


def test_training_lines_become_custom_metrics_one_point_per_series_at_most_every_10s(rig):
    run = RunSpec("exp-42")
    line = {"message": "training", "step": 10, "loss": 2.5, "steps_per_s": 4.0, "examples_per_s": 512.0}
    rig.telemetry.ship(json.dumps(line), run)
    rig.telemetry.ship(json.dumps({**line, "step": 20, "loss": 2.0}), run)  # same flush: the latest wins
    rig.telemetry.flush()
    rig.clock.now += 4
    rig.telemetry.ship(json.dumps({**line, "step": 30, "loss": 1.5}), run)
    rig.telemetry.flush()  # 4 s after the first write: held back
    assert len(rig.received.bodies(CREATE)) == 1
    rig.clock.now += 6
    rig.telemetry.flush()  # 10 s: the held value goes

    assert not rig.received.violations
    first, second = rig.received.bodies(CREATE)
    for body in (first, second):
        kinds = [s["metric"]["type"] for s in body["timeSeries"]]
        assert len(kinds) == len(set(kinds))  # one point per series per request
        assert all(len(s["points"]) == 1 for s in body["timeSeries"])
    series = {s["metric"]["type"]: s for s in first["timeSeries"]}
    assert set(series) == {f"custom.googleapis.com/tpu_platform/{m}" for m in ("loss", "steps_per_s", "examples_per_s")}
    loss = series["custom.googleapis.com/tpu_platform/loss"]
    for written in series.values():
        written_as_declared(written)
    assert loss["metric"]["labels"] == {"run_id": "exp-42", "vm": "mnist-dev", "worker": "1"}
    assert (loss["metricKind"], loss["valueType"]) == ("GAUGE", "DOUBLE")
    assert loss["points"][0]["value"] == {"doubleValue": 2.0}
    assert loss["resource"]["type"] == "generic_node"
    later = {s["metric"]["type"]: s for s in second["timeSeries"]}["custom.googleapis.com/tpu_platform/loss"]
    assert later["points"][0]["value"] == {"doubleValue": 1.5}
    assert later["points"][0]["interval"]["endTime"] > loss["points"][0]["interval"]["endTime"]


def test_every_metric_is_declared_once_in_a_descriptor_monitoring_v3_accepts():
    """The declarations (run_contract/metrics.py) against Google's MetricDescriptor schema, enums and all; no
    two of one type."""
    monitoring = api("monitoring.v3")
    for metric in metrics.METRICS:
        monitoring.check_resource("MetricDescriptor", metric.descriptor())
        assert metric.type.startswith("custom.googleapis.com/")  # user-defined metrics' domain
    assert len({m.type for m in metrics.METRICS}) == len(metrics.METRICS)
    with pytest.raises(ContractError, match="metricKind"):
        monitoring.check_resource("MetricDescriptor", {**metrics.RUN_SECONDS.descriptor(), "metricKind": "SOMETIMES"})


def written_as_declared(series: dict) -> None:
    """A written series is its declaration's: its type declared, its labels exactly the declared keys, its
    kind and value type the declared ones (the first write creates the descriptor from them)."""
    declared = {m.type: m for m in metrics.METRICS}[series["metric"]["type"]]
    assert set(series["metric"]["labels"]) == set(declared.label_keys)
    assert (series["metricKind"], series["valueType"]) == (declared.kind, declared.value_type)


def test_a_runs_time_by_category_becomes_run_seconds_points_as_declared(rig):
    """What the timeline publishes when a run ends in a boot: one run_seconds series per category the agent
    measures, labelled with the category and whether a program's step lines decide it."""
    seconds = {key: float(i) for i, key in enumerate(metrics.AGENT_CATEGORIES, start=1)}
    rig.telemetry.run_seconds("user-a@x.example/exp-1", seconds, trusted=False)
    rig.telemetry.flush()
    assert not rig.received.violations  # the request, checked against monitoring.v3 timeSeries.create
    (body,) = rig.received.bodies(CREATE)
    by_category = {s["metric"]["labels"]["category"]: s for s in body["timeSeries"]}
    assert set(by_category) == set(metrics.AGENT_CATEGORIES) == set(seconds)
    assert not {"queue", "recoveryWait", "idle"} & set(by_category)  # the TPU API's, the guard's, the VM's
    for category, series in by_category.items():
        written_as_declared(series)
        assert series["metric"]["type"] == "custom.googleapis.com/tpu_platform/run_seconds"
        assert series["points"][0]["value"] == {"doubleValue": seconds[category]}
        assert series["metric"]["labels"]["run_id"] == "user-a@x.example/exp-1"
        untrusted = category in STEP_LINE_CATEGORIES
        assert series["metric"]["labels"]["untrusted"] == ("true" if untrusted else "false"), category
    rig.telemetry.run_seconds("user-a@x.example/exp-1", seconds, trusted=False)
    rig.telemetry.flush()  # the same series, at once: held back for Monitoring's 10 s a series
    assert len(rig.received.bodies(CREATE)) == 1


def test_lines_without_a_step_or_with_non_numbers_make_no_metric(rig):
    run = RunSpec("exp-42")
    for line in (
        {"loss": 1.0},
        {"step": 1},
        {"step": "1", "loss": 1.0},
        {"step": 1, "loss": "low"},
        {"step": True, "loss": 1.0},
        {"step": 1, "loss": float("nan")},
    ):
        rig.telemetry.ship(json.dumps(line), run)
    rig.telemetry.flush()
    assert rig.received.bodies(CREATE) == []
    assert len(rig.received.bodies(WRITE)[0]["entries"]) == 6


def test_a_misspelt_field_fails_the_contract(rig):
    """The check the stand-ins make is not a rubber stamp: the same bodies, one key misspelt, fail."""
    run = RunSpec("exp-42")
    rig.telemetry.ship(json.dumps({"step": 1, "loss": 1.0}), run)
    rig.telemetry.flush()
    ((_, log_call, _),) = [c for c in rig.received.calls if c[0] == WRITE]
    ((_, metric_call, _),) = [c for c in rig.received.calls if c[0] == CREATE]
    api("logging.v2").check(log_call)
    api("monitoring.v3").check(metric_call)

    bad_log = copy.deepcopy(log_call.body)
    bad_log["entries"][0]["jsonPayloda"] = bad_log["entries"][0].pop("jsonPayload")
    with pytest.raises(ContractError, match="jsonPayloda"):
        api("logging.v2").check(Call("POST", log_call.url, bad_log))
    bad_metric = copy.deepcopy(metric_call.body)
    bad_metric["timeSeries"][0]["points"][0]["value"] = {"doubleValu": 1.0}
    with pytest.raises(ContractError, match="doubleValu"):
        api("monitoring.v3").check(Call("POST", metric_call.url, bad_metric))
    bad_kind = copy.deepcopy(metric_call.body)
    bad_kind["timeSeries"][0]["metricKind"] = "GAUGES"
    with pytest.raises(ContractError, match="GAUGES"):
        api("monitoring.v3").check(Call("POST", metric_call.url, bad_kind))


def test_refused_requests_are_dropped_with_a_counted_warning_and_the_run_goes_on(rig):
    rig.received.status = 503
    run = RunSpec("exp-42")
    rig.telemetry.ship("one", run)
    rig.telemetry.flush()
    rig.telemetry.ship("two", run)
    rig.telemetry.flush()
    assert rig.telemetry.counts.failed_requests == 2
    assert rig.telemetry.counts.lost_entries == 2
    assert any("503" in w and "2 failed requests" in w for w in rig.warnings)
    rig.received.status = 200
    rig.telemetry.ship("three", run)
    rig.telemetry.flush()
    assert rig.telemetry.counts.entries_sent == 1


def test_unreachable_endpoints_never_raise():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    warnings: list[str] = []
    shipper = Telemetry(
        env_for(dead, dead.removeprefix("http://")),
        warn=warnings.append,
        flush_every_s=3600,
        credentials=sandbox_credentials(),
    )
    shipper.ship(json.dumps({"step": 1, "loss": 1.0}), RunSpec("exp-42"))
    shipper.flush()
    counts = shipper.close(5)
    assert counts.lost_entries == 1 and counts.lost_points == 1
    assert warnings


def test_ship_never_waits_for_a_hanging_endpoint_and_a_full_queue_drops_with_a_warning():
    with google_apis() as (api_url, received), metadata_server() as metadata:
        received.hold = threading.Event()  # the API takes every request and answers nothing yet
        warnings: list[str] = []
        shipper = Telemetry(
            env_for(api_url, metadata),
            warn=warnings.append,
            flush_every_s=0.01,
            queue_size=5,
            credentials=sandbox_credentials(),
        )
        run = RunSpec("exp-42")
        shipper.ship("first", run)  # the thread takes it and hangs in its request
        assert received.held.wait(30)  # before any other line is shipped, so its batch is that line alone
        done = threading.Event()

        def print_a_lot() -> None:
            for i in range(200):
                shipper.ship(f"line {i}", run)
            done.set()

        threading.Thread(target=print_a_lot, daemon=True).start()
        assert done.wait(30), "ship blocked while the endpoint hung"
        assert shipper.counts.dropped_lines >= 200 - 5
        assert any("queue full" in w for w in warnings)
        received.hold.set()
        shipper.close(10)


def test_close_sends_what_is_left(rig):
    run = RunSpec("exp-42")
    for i in range(3):
        rig.telemetry.ship(f"line {i}", run)
    counts = rig.telemetry.close(5)
    assert counts.entries_sent == 3
    assert [e["textPayload"] for e in rig.received.bodies(WRITE)[0]["entries"]] == ["line 0", "line 1", "line 2"]


def test_a_run_without_the_attributes_is_a_warning_not_an_exception(rig):
    rig.telemetry.ship("hello", object())  # type: ignore[arg-type]
    assert any("could not ship" in w for w in rig.warnings)


def test_the_zone_is_asked_once_with_the_metadata_flavor_header(rig):
    """The token is the credentials' (google-auth's, renewed there: tests/test_vm_agent_sources.py); the zone is
    asked of the metadata server once (the stand-in refuses a request without `Metadata-Flavor: Google`)."""
    run = RunSpec("exp-42")
    for _ in range(3):
        rig.telemetry.ship("x", run)
        rig.telemetry.flush()
    assert rig.metadata_asked == ["/computeMetadata/v1/instance/zone"]
    assert len(rig.received.bodies(WRITE)) == 3


def test_the_api_stand_in_refuses_what_google_would_with_a_400():
    """A write the schema refuses (here an entry with no log name, from neither it nor the request) is
    answered 400, as Google does, not taken: a shipper that sent it would see its batch lost."""
    import urllib.error
    import urllib.request

    with google_apis() as (api_url, received):
        body = json.dumps({"entries": [{"textPayload": "x"}]}).encode()
        request = urllib.request.Request(f"{api_url}/v2/entries:write", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert len(received.violations) == 1 and "logName is missing" in received.violations[0]


def test_production_endpoints_are_googles():
    shipper = Telemetry({})
    assert shipper.logging_url == "https://logging.googleapis.com"
    assert shipper.monitoring_url == "https://monitoring.googleapis.com"
    assert shipper.metadata_url == "http://metadata.google.internal/computeMetadata/v1"
    assert api("logging.v2").host == "logging.googleapis.com"
    assert api("monitoring.v3").host == "monitoring.googleapis.com"


def test_the_workload_account_is_granted_every_method_telemetry_calls(rig):
    """The permission model (tests/test_access.py) proves WORKLOAD_METHODS['project'] is granted; here:
    the methods the code really calls, as the contract check names them, are exactly METHODS and in it."""
    rig.telemetry.ship(json.dumps({"step": 1, "loss": 1.0}), RunSpec("exp-42"))
    rig.telemetry.flush()
    called = {method for method, _, _ in rig.received.calls}
    assert called == set(METHODS)
    assert set(METHODS) <= set(WORKLOAD_METHODS["project"])


@pytest.mark.parametrize("module", ["telemetry", "tensorboard"])
def test_runs_on_the_vm_images_python(module):
    """The VM image's Python is 3.10 (catalog os_python: Ubuntu 22.04); the standard library and the agent's own
    environment (google-auth, protobuf, google-crc32c and requests, from requirements-agent.lock) only."""
    from infra.catalog import load_catalog

    major, minor = min(tuple(int(p) for p in v.split(".")) for v in load_catalog().os_python.values())
    oldest = (major, minor)
    source = (ROOT / "vm_agent" / f"{module}.py").read_text()
    tree = ast.parse(source, feature_version=oldest)
    imported = {
        ((node.module or "") if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert (
        imported
        - sys.stdlib_module_names
        - {"__future__", "vm_agent", "run_contract", "google", "google_crc32c", "requests"}
        == set()
    )
    assert oldest == (3, 10)


def test_module_hook_uses_one_default_telemetry(monkeypatch):
    monkeypatch.setattr(telemetry, "_default", None)
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(Telemetry, "ship", lambda self, line, run: seen.append((line, run.run_id)))
    telemetry.ship("a", RunSpec("r1"))
    telemetry.ship("b", RunSpec("r1"))
    assert seen == [("a", "r1"), ("b", "r1")]
    assert telemetry.default() is telemetry.default()


def test_a_full_batch_goes_without_waiting_for_the_period(rig):
    run = RunSpec("exp-42")
    for i in range(telemetry.MAX_ENTRIES_PER_REQUEST):
        rig.telemetry.ship(f"line {i}", run)
    wait_for(lambda: rig.telemetry.counts.entries_sent, 30, "the batch")  # the period is an hour
    assert rig.telemetry.counts.entries_sent == telemetry.MAX_ENTRIES_PER_REQUEST


def test_close_gives_up_on_a_hanging_endpoint_and_says_so():
    with google_apis() as (api_url, received), metadata_server() as metadata:
        received.hold = threading.Event()
        warnings: list[str] = []
        shipper = Telemetry(
            env_for(api_url, metadata), warn=warnings.append, flush_every_s=0.01, credentials=sandbox_credentials()
        )
        shipper.ship("first", RunSpec("exp-42"))
        wait_for(lambda: received.hold is not None and shipper._lock.locked(), 30, "a request in flight")
        shipper.ship("second", RunSpec("exp-42"))
        closed = threading.Event()
        threading.Thread(target=lambda: (shipper.close(0.5), closed.set()), daemon=True).start()
        assert closed.wait(30), "close waited for the hanging endpoint"
        assert any("out of time at exit" in w for w in warnings)
        received.hold.set()


def test_without_a_project_nothing_is_sent_and_it_says_why(rig):
    warnings: list[str] = []
    env = {**rig.telemetry.env, "TPU_PLATFORM_PROJECT": ""}
    shipper = Telemetry(env, warn=warnings.append, flush_every_s=3600, credentials=sandbox_credentials())
    shipper.ship("hello", RunSpec("exp-42"))
    counts = shipper.close(5)
    assert counts.lost_entries == 1 and not rig.received.calls
    assert any("TPU_PLATFORM_PROJECT is not set" in w for w in warnings)


def test_the_longest_lines_in_the_largest_batches_stay_within_loggings_limits(rig):
    """entries:write takes 10 MB a request and 256 KB an entry (Cloud Logging quotas): lines are cut by
    characters and batches by count so that even 4-byte UTF-8 characters stay inside both; and one entry
    Logging still refuses costs only itself (`partialSuccess`, logging.v2 discovery document)."""
    run = RunSpec("exp-big")
    for _ in range(telemetry.MAX_ENTRIES_PER_REQUEST + 5):
        rig.telemetry.ship("\U0001f600" * (telemetry.MAX_LINE_CHARS + 100), run)  # 4 bytes each in UTF-8
    rig.telemetry.flush()
    bodies = rig.received.bodies(WRITE)
    assert [len(b["entries"]) for b in bodies] == [telemetry.MAX_ENTRIES_PER_REQUEST, 5]
    for body in bodies:
        assert body["partialSuccess"] is True
        assert len(json.dumps(body, ensure_ascii=False).encode()) < 10_000_000
        assert max(len(json.dumps(e, ensure_ascii=False).encode()) for e in body["entries"]) < 256_000
