"""Logs and training metrics of a run, shipped from the TPU VM with the VM's own account.

The runner calls `ship(line, run)` for every line the program prints. Each line becomes one Cloud
Logging entry in `projects/<P>/logs/tpu-workload` (a researcher's request run: in that researcher's own
log, `tpu-runs-<digest of the member>`, the one their log view shows): a JSON object line as `jsonPayload` (its
`severity` or `level` mapped to Logging's severity), any other line as `textPayload`; labelled
runId/vm/worker/stack. A JSON line that carries `step` and any of `loss`, `steps_per_s`,
`examples_per_s` also becomes Cloud Monitoring custom metrics
`custom.googleapis.com/tpu_platform/<name>` (labels run_id/vm/worker), and scalar summaries in a
TensorBoard event file in the run's model dir (`<model-dir>/tensorboard/`, see vm_agent/tensorboard.py).
When a run ends in a boot, its time by goodput category so far becomes `.../run_seconds` (labels category and
untrusted besides). Every metric is declared once, in run_contract/metrics.py.

Shipping never blocks or kills the run: `ship` only parses and puts on a bounded queue (a full queue
drops the line and counts it), a background thread batches and sends, a failed request is dropped
with a counted warning on stderr, and `close` (also at exit) sends what is left within a time limit.

Runs in the agent's own environment (vm_agent/environment.py): requests go through google-auth's
`AuthorizedSession`, with the VM account's credentials (vm_agent/gcs.py vm_credentials), the agent's one
token source; the event files through the agent's Cloud Storage client (vm_agent/gcs.py Storage). Not through
google-cloud-logging and google-cloud-monitoring: measured, they would grow the agent's wheelhouse from 12.75
to 34.46 MiB (grpcio for each Python), its first boot's install by 3.6 s and each start by about 0.7 s, for two
REST methods (docs/performance.md).

Where Google says so:
- Writing: `POST https://logging.googleapis.com/v2/entries:write` (logging.v2 discovery document,
  method logging.entries.write) and `POST https://monitoring.googleapis.com/v3/projects/P/timeSeries`
  (monitoring.v3, monitoring.projects.timeSeries.create); both request bodies are checked against
  those documents in the tests.
- The monitored resource is `generic_node` (labels location, namespace, node_id) for logs and metrics
  alike. `tpu_worker` is the resource of Cloud TPU's own system metrics and is not among the resource
  types Cloud Monitoring accepts for user-defined metrics (monitoring/custom-metrics/creating-metrics,
  "Choosing a monitored resource type"); `gce_instance` needs a Compute Engine instance id, and a TPU
  VM is not listed as a Compute Engine instance of the project. `generic_node` is what Google's own
  OpenTelemetry exporters fall back to for a host that no specific type fits, for metrics and logs
  (GoogleCloudPlatform/opentelemetry-operations-go, internal/resourcemapping/resourcemapping.go:
  location = zone, namespace, node_id = host).
- One point per time series per request, and at most one point per series every 10 s: "Rate at which
  data can be written to a single time series: one point each 10 seconds" (cloud.google.com/monitoring/
  quotas#custom_metrics_quotas, quoted in GoogleCloudPlatform/opentelemetry-operations-java's
  exporter README; newer quota pages say 5 s, which 10 s also keeps). CreateTimeSeriesRequest: "Adds
  at most one data point to each of several time series ... The maximum number of TimeSeries objects
  per Create request is 200" (monitoring.v3 discovery document).
- A metric descriptor is created by the first write of a custom metric (Cloud Monitoring,
  "Auto-creation of metric descriptors"), with that write's labels, kind and value type: each point is
  written with those of its metric's declaration (run_contract/metrics.py), so the descriptor is that one.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from run_contract import lines, metrics
from run_contract.names import RESEARCHER
from run_contract.paths import researcher_log
from run_contract.timeline import untrusted_categories

from vm_agent.gcs import Storage, metadata_url, vm_credentials
from vm_agent.tensorboard import EventLog

LOG_ID = "tpu-workload"
METRIC_PREFIX = metrics.PREFIX
METRICS = tuple(metric.name for metric in metrics.TRAINING)
# The REST methods this module calls; infra/access/identities.py WORKLOAD_METHODS grants them (tested).
METHODS = ("logging.entries.write", "monitoring.projects.timeSeries.create")

LOGGING_URL = "https://logging.googleapis.com"
MONITORING_URL = "https://monitoring.googleapis.com"
# Endpoints overridable for tests and sandboxes; production uses Google's hosts.
LOGGING_ENV = "TPU_PLATFORM_LOGGING_URL"
MONITORING_ENV = "TPU_PLATFORM_MONITORING_URL"

SAMPLE_EVERY_S = 10.0  # per time series: Monitoring refuses faster writes (module docstring)
MAX_SERIES_PER_REQUEST = 200  # CreateTimeSeriesRequest's limit
# Bounds in bytes, whatever the lines hold: a line is cut at 16 Ki characters (at most 64 KiB of UTF-8,
# under Logging's 256 KB per entry), and 100 of them stay under entries:write's 10 MB per request.
MAX_ENTRIES_PER_REQUEST = 100
MAX_LINE_CHARS = 16 * 1024
QUEUE_SIZE = 10_000
FLUSH_EVERY_S = 5.0
REQUEST_TIMEOUT_S = 10.0
# At exit: the agent's unit has TimeoutStopSec = grace + 10 s, most of it spent waiting for the run.
CLOSE_TIMEOUT_S = 5.0

# Logging's LogSeverity names (logging.v2 discovery document, LogEntry.severity), and the names
# Python's logging and common JSON loggers print.
SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY")
_SEVERITY_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL", "TRACE": "DEBUG", "ERR": "ERROR", "INFORMATION": "INFO"}


class Run(Protocol):
    """What telemetry reads of a run: its id and where its model goes ("" when it has no model dir); and,
    when it has them, `request` and `requester` (a researcher's run: run_contract/spec.py RunSpec)."""

    @property
    def run_id(self) -> str: ...

    @property
    def model_dir(self) -> str: ...


@dataclass(frozen=True)
class Origin:
    """Where the lines come from: read once from the agent's environment (agent.env)."""

    project: str
    stack: str
    vm: str
    worker: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Origin:
        return cls(
            project=env.get("TPU_PLATFORM_PROJECT", ""),
            stack=env.get("TPU_PLATFORM_STACK", ""),
            vm=env.get("TPU_PLATFORM_VM", ""),
            worker=env.get("TPU_PLATFORM_WORKER_ID", "0") or "0",
        )


def severity_of(value: object) -> str:
    """Logging's severity for a JSON line's `severity`/`level` value; DEFAULT for anything else."""
    if isinstance(value, str):
        name = value.strip().upper()
        name = _SEVERITY_ALIASES.get(name, name)
        if name in SEVERITIES:
            return name
    if isinstance(value, int) and not isinstance(value, bool):  # Python logging's numeric levels
        for level, name in ((50, "CRITICAL"), (40, "ERROR"), (30, "WARNING"), (20, "INFO"), (10, "DEBUG")):
            if value >= level:
                return name
    return "DEFAULT"


def rfc3339(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, tz=timezone.utc)  # datetime.UTC is 3.11+; the VM may have 3.10
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(line: str) -> dict[str, Any] | None:
    """A JSON object line as a dict; None for any other line. Python's `NaN`/`Infinity`/`-Infinity`, which JSON
    has not, stay strings: a request body holds JSON only (requests refuses to send them as numbers)."""
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text, parse_constant=str)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def training_values(payload: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, {metric: value}) of a line with `step` and any of METRICS as finite numbers; else None."""
    step = payload.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    values = {
        name: float(payload[name])
        for name in METRICS
        if isinstance(payload.get(name), (int, float))
        and not isinstance(payload[name], bool)
        and float(payload[name]) == float(payload[name])  # not NaN
        and abs(float(payload[name])) != float("inf")
    }
    return (step, values) if values else None


def log_entry(line: str, run_id: str, origin: Origin, now: float, log_id: str = LOG_ID) -> dict[str, Any]:
    """One LogEntry (logging.v2) for one printed line; in `log_id` when it is not the stack's log (a
    researcher's own log, which their log view shows: infra/researchers.py)."""
    text = line.rstrip("\r\n")
    entry: dict[str, Any] = {
        "timestamp": rfc3339(now),
        "labels": {"runId": run_id, "vm": origin.vm, "worker": origin.worker, "stack": origin.stack},
    }
    if log_id != LOG_ID:
        entry["logName"] = f"projects/{origin.project}/logs/{log_id}"
    payload = parse(text) if len(text) <= MAX_LINE_CHARS else None
    if payload is not None:
        entry["severity"] = severity_of(payload.get("severity", payload.get("level")))
        entry["jsonPayload"] = payload
    else:
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" ... [cut: {len(text) - MAX_LINE_CHARS} more characters]"
        entry["severity"] = "DEFAULT"
        entry["textPayload"] = text
    return entry


def resource(origin: Origin, zone: str) -> dict[str, Any]:
    """The monitored resource of every entry and point: generic_node (module docstring says why)."""
    return {
        "type": "generic_node",
        "labels": {"project_id": origin.project, "location": zone, "namespace": origin.stack, "node_id": origin.vm},
    }


Labels = tuple[tuple[str, str], ...]  # a metric's labels besides the run's (run_id, vm, worker)


def time_series(
    name: str, value: float, run_id: str, origin: Origin, zone: str, now: float, labels: Labels = ()
) -> dict[str, Any]:
    """One TimeSeries (monitoring.v3) with one point of the declared metric `name` (a GAUGE of DOUBLE)."""
    return {
        "metric": {
            "type": METRIC_PREFIX + name,
            "labels": {"run_id": run_id, "vm": origin.vm, "worker": origin.worker, **dict(labels)},
        },
        "resource": resource(origin, zone),
        "metricKind": "GAUGE",
        "valueType": "DOUBLE",
        "points": [{"interval": {"endTime": rfc3339(now)}, "value": {"doubleValue": value}}],
    }


def run_seconds_points(seconds: Mapping[str, float], trusted: bool) -> list[tuple[Labels, float]]:
    """A run's time by category (run_contract/timeline.py `measure`, and `unattributed`) as run_seconds points:
    (labels, seconds) for each category the agent measures."""
    untrusted = set(untrusted_categories(trusted))
    return [
        ((("category", key), ("untrusted", "true" if key in untrusted else "false")), float(seconds[key]))
        for key in metrics.AGENT_CATEGORIES
        if key in seconds
    ]


def tensorboard_dir(model_dir: str, worker: str) -> str:
    """`<model-dir>/tensorboard` for worker 0; other workers of a slice in `worker-<n>/` below it, so
    TensorBoard shows them as runs of their own instead of mixing their points into one curve."""
    base = model_dir.rstrip("/") + "/tensorboard"
    return base if worker in ("", "0") else f"{base}/worker-{worker}"


class Sampler:
    """At most one point per time series every SAMPLE_EVERY_S: the latest value waits for its turn."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S):
        self.every_s = every_s
        self.sent_at: dict[tuple[str, str, Labels], float] = {}  # (metric, run id, labels) -> last write
        self.pending: dict[tuple[str, str, Labels], float] = {}  # latest value not yet written

    def offer(self, metric: str, run_id: str, value: float, labels: Labels = ()) -> None:
        self.pending[(metric, run_id, labels)] = value

    def due(self, now: float) -> list[tuple[str, str, Labels, float]]:
        """The series whose turn it is, each with its latest value; they count as written at `now`."""
        out = []
        for key, value in list(self.pending.items()):
            if now - self.sent_at.get(key, float("-inf")) >= self.every_s:
                out.append((*key, value))
                self.sent_at[key] = now
                del self.pending[key]
        return out


@dataclass
class Counts:
    lines: int = 0
    dropped_lines: int = 0  # queue full
    entries_sent: int = 0
    points_sent: int = 0
    failed_requests: int = 0
    lost_entries: int = 0  # in a failed request
    lost_points: int = 0


class Telemetry:
    """Batches a run's lines into Logging entries and Monitoring points, sent by one background thread."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] | None = None,
        flush_every_s: float = FLUSH_EVERY_S,
        queue_size: int = QUEUE_SIZE,
        sample_every_s: float = SAMPLE_EVERY_S,
        credentials: Any = None,
    ):
        """`credentials`: google-auth credentials to send with (the VM account's, vm_credentials, unless given)."""
        env = os.environ if env is None else env
        self.env = env
        self.origin = Origin.from_env(env)
        self.logging_url = env.get(LOGGING_ENV) or LOGGING_URL
        self.monitoring_url = env.get(MONITORING_ENV) or MONITORING_URL
        self.metadata_url = metadata_url(env)
        self._given_credentials = credentials
        self.clock = clock
        self.flush_every_s = flush_every_s
        self.counts = Counts()
        self._warn = warn or (lambda message: lines.line(f"telemetry: {message}", sys.stderr))
        self._queue: queue.Queue[tuple[dict[str, Any], tuple[str, str, int, dict[str, float]] | None]] = queue.Queue(
            queue_size
        )
        self._sampler = Sampler(sample_every_s)
        self._sampler_lock = threading.Lock()  # run_seconds offers from a run's thread
        self._event_logs: dict[str, EventLog] = {}  # run id -> its TensorBoard event file
        self._session: Any = None  # google-auth's AuthorizedSession, made at the first request
        self._storage: Storage | None = None  # for the event files, made at the first gs:// one
        self._zone: str | None = None
        self._lock = threading.Lock()  # one flush at a time
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a full batch is waiting: send before the period is up
        self._thread: threading.Thread | None = None
        self._warned_drop_at = 0

    # --- the hook ---------------------------------------------------------------------------

    def ship(self, line: str, run: Run) -> None:
        """Queue one printed line; never raises, never waits."""
        try:
            now = self.clock()
            self.counts.lines += 1
            requester = getattr(run, "requester", "") or ""
            requested = getattr(run, "request", "") and RESEARCHER.fullmatch(requester)
            mine = researcher_log(requester) if requested else LOG_ID
            entry = log_entry(line, run.run_id, self.origin, now, mine)
            training = None
            payload = entry.get("jsonPayload")
            if payload is not None and (values := training_values(payload)):
                training = (run.run_id, getattr(run, "model_dir", "") or "", values[0], values[1])
            self._start()
            self._queue.put_nowait((entry, training))
            if self._queue.qsize() >= MAX_ENTRIES_PER_REQUEST:
                self._wake.set()
        except queue.Full:
            self.counts.dropped_lines += 1
            # One warning per power of two dropped: says it is happening without flooding stderr.
            if self.counts.dropped_lines >= 2 * self._warned_drop_at or self._warned_drop_at == 0:
                self._warned_drop_at = self.counts.dropped_lines
                self._warn(f"queue full: {self.counts.dropped_lines} lines dropped so far (not sent to Logging)")
        except Exception as error:  # a bug here must not take the run down with it
            self._warn(f"could not ship a line: {error!r}")

    def run_seconds(self, run_id: str, seconds: Mapping[str, float], trusted: bool) -> None:
        """A run's time by category so far (when it ends in a boot), sent with the next flush; never raises."""
        try:
            with self._sampler_lock:
                for labels, value in run_seconds_points(seconds, trusted):
                    self._sampler.offer(metrics.RUN_SECONDS.name, run_id, value, labels)
            self._start()
            self._wake.set()
        except Exception as error:  # a bug here must not take the run down with it
            self._warn(f"could not record run {run_id}'s time by category: {error!r}")

    # --- sending ----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
                    self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_every_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.flush()

    def flush(self, deadline: float | None = None) -> None:
        """Send everything queued (and the metric points whose turn it is); never raises. With a
        `deadline` (time.monotonic()), gives up waiting for a flush in progress when it passes."""
        wait = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._lock.acquire(timeout=wait):
            self._warn("out of time at exit: a request in flight did not finish; the rest is not sent")
            return
        try:
            self._flush(deadline)
        except Exception as error:
            self._warn(f"flush failed: {error!r}")
        finally:
            self._lock.release()

    def _flush(self, deadline: float | None) -> None:
        entries: list[dict[str, Any]] = []
        while True:
            try:
                entry, training = self._queue.get_nowait()
            except queue.Empty:
                break
            entries.append(entry)
            if training is not None:
                run_id, model_dir, step, values = training
                with self._sampler_lock:
                    for name, value in values.items():
                        self._sampler.offer(name, run_id, value)
                try:
                    self._event_log(run_id, model_dir, step, values)
                except OSError as error:  # a model dir we cannot write: the logs and metrics still go
                    self._warn(f"TensorBoard event file for {run_id} not written: {error}")
        for start in range(0, len(entries), MAX_ENTRIES_PER_REQUEST):
            if deadline is not None and time.monotonic() > deadline:
                self.counts.lost_entries += len(entries) - start
                self._warn(f"out of time at exit: {len(entries) - start} log entries not sent")
                break
            self._write_entries(entries[start : start + MAX_ENTRIES_PER_REQUEST])
        with self._sampler_lock:
            points = self._sampler.due(self.clock())
        for start in range(0, len(points), MAX_SERIES_PER_REQUEST):
            self._write_points(points[start : start + MAX_SERIES_PER_REQUEST])
        for log in self._event_logs.values():
            log.sync()

    def _event_log(self, run_id: str, model_dir: str, step: int, values: dict[str, float]) -> None:
        if not model_dir:
            return
        log = self._event_logs.get(run_id)
        if log is None:
            log = self._event_logs[run_id] = EventLog(
                tensorboard_dir(model_dir, self.origin.worker),
                f"{self.origin.vm or 'vm'}-w{self.origin.worker}",
                storage=self._event_storage,
                warn=self._warn,
                clock=self.clock,
            )
        log.scalars(step, values)

    def _write_entries(self, entries: list[dict[str, Any]]) -> None:
        body = {
            "logName": f"projects/{self.origin.project}/logs/{LOG_ID}",
            "resource": resource(self.origin, self._location()),
            "entries": entries,
            # One refused entry (too large, a bad field) costs only itself, not the batch (logging.v2
            # discovery document, WriteLogEntriesRequest.partialSuccess).
            "partialSuccess": True,
        }
        if self._post(f"{self.logging_url.rstrip('/')}/v2/entries:write", body, "entries:write"):
            self.counts.entries_sent += len(entries)
        else:
            self.counts.lost_entries += len(entries)

    def _write_points(self, points: list[tuple[str, str, Labels, float]]) -> None:
        now, zone = self.clock(), self._location()
        body = {
            "timeSeries": [
                time_series(name, value, run, self.origin, zone, now, labels) for name, run, labels, value in points
            ]
        }
        url = f"{self.monitoring_url.rstrip('/')}/v3/projects/{self.origin.project}/timeSeries"
        if self._post(url, body, "timeSeries.create"):
            self.counts.points_sent += len(points)
        else:
            self.counts.lost_points += len(points)

    def _credentials(self) -> Any:
        return self._given_credentials if self._given_credentials is not None else vm_credentials()

    def _event_storage(self) -> Storage:
        if self._storage is None:
            self._storage = Storage(self._credentials(), self.env)
        return self._storage

    def _post(self, url: str, body: dict[str, Any], what: str) -> bool:
        if not self.origin.project:  # agent.env without TPU_PLATFORM_PROJECT: every request would fail
            self._failed(f"{what} not sent: TPU_PLATFORM_PROJECT is not set")
            return False
        from google.auth import exceptions
        from requests import RequestException

        try:
            if self._session is None:
                from google.auth.transport.requests import AuthorizedSession

                self._session = AuthorizedSession(self._credentials())
            response = self._session.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
        except (RequestException, exceptions.GoogleAuthError) as error:  # timeouts, no token
            self._failed(f"{what} failed: {error}")
            return False
        if response.status_code >= 400:
            self._failed(f"{what} answered {response.status_code}: {response.text[:300]}")
            return False
        return True

    def _failed(self, message: str) -> None:
        self.counts.failed_requests += 1
        self._warn(f"{message} (dropped; {self.counts.failed_requests} failed requests so far)")

    # --- the metadata server: the VM's zone ---------------------------------------------------

    def _metadata(self, path: str) -> bytes:
        request = urllib.request.Request(f"{self.metadata_url}/{path}", headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.read()

    def _location(self) -> str:
        """The VM's zone (`instance/zone` is `projects/<number>/zones/<zone>`); "global" if unknown."""
        if self._zone is None:
            try:
                self._zone = self._metadata("instance/zone").decode().rsplit("/", 1)[-1] or "global"
            except (OSError, ValueError) as error:
                self._warn(f"zone unknown ({error}); logging with location global")
                self._zone = "global"
        return self._zone

    # --- the end ----------------------------------------------------------------------------

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> Counts:
        """Stop the thread and send what is left, giving up after `timeout_s`; returns the counts."""
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.flush(deadline)
        for log in self._event_logs.values():
            log.close()
        return self.counts


_default: Telemetry | None = None
_default_lock = threading.Lock()


def default() -> Telemetry:
    """The agent's one Telemetry, from its environment; closed (flushed) at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Telemetry()
            atexit.register(_default.close)
        return _default


def ship(line: str, run: Run) -> None:
    """The runner's hook: one line the run printed."""
    default().ship(line, run)


def run_seconds(run_id: str, seconds: Mapping[str, float], trusted: bool) -> None:
    """The timeline's hook (vm_agent/timeline.py): a run's time by category when it ends in a boot."""
    default().run_seconds(run_id, seconds, trusted)
