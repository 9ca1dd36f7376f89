"""The run timeline: where one run's time went, by category, as a small versioned JSON record.

Part of the run contract (run_contract/): standard library only, Python 3.8. The VM agent records a run's
events (`RunEvents`, below) and writes them next to the run's status.json; `measure` makes seconds by
category of them; `tpu-runs report` and the what-if (infra/goodput/) read the record and keep the model.

The categories are the platform's own: what the TPU API, the guard and the agent can tell apart, plus
what a program's step lines say. Each maps to one type of Google's ml-goodput-measurement, pinned
below, so that a timeline reads like that library's breakdown (CATEGORIES is the mapping table;
docs/goodput.md prints it with the reasons). Step lines come from the program: a self-service
program's are untrusted (it may print anything), and the categories that depend on them say so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from run_contract.names import EXIT_RETRY

SCHEMA = "tpu-platform/run-timeline"
VERSION = 1

# ml-goodput-measurement, release 0.2.3 (pyproject.toml `version = "0.2.3"`), commit
# 57092cfcf1c9c0a2ef9e5c2311734fabb8b38152 of github.com/AI-Hypercomputer/ml-goodput-measurement:
# `class BadputType(enum.Enum)` and `class GoodputType(enum.Enum)` in
# ml_goodput_measurement/src/goodput_utils.py, names and values as defined there.
GOODPUT_MEASUREMENT = "ml-goodput-measurement 0.2.3 (57092cfcf1c9c0a2ef9e5c2311734fabb8b38152)"
BADPUT_TYPES = {
    "TPU_INITIALIZATION": 1,
    "TRAINING_PREP": 2,
    "PROGRAM_STARTUP": 3,
    "DATA_LOADING_SYNC": 4,
    "DATA_LOADING_ASYNC": 5,
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME": 6,
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME": 7,
    "WASTED_PROGRESS_FROM_DISRUPTION": 8,
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION": 9,
    "CUSTOM_BADPUT_EVENTS": 10,
    "OTHER": 11,
    "ELASTIC_SLICE_DOWN": 12,
    "ELASTIC_SCALE_UP": 13,
    "ELASTIC_REINITIALIZATION": 14,
}
GOODPUT_TYPES = {"TOTAL": 1}  # "Productive time is not broken down by activities yet."

# Who measures a category. A program's step lines are the program's word; the rest is the platform's.
TPU_API, GUARD, AGENT, STEP_LINES, REMAINDER = "TPU API", "guard", "agent", "step lines", "remainder"
KUEUE = "Kueue"  # a GKE run's Workload: the control plane's word, as the TPU API's is on VMs


@dataclass(frozen=True)
class Category:
    key: str  # its key in a timeline's `seconds`
    what: str  # the platform's events it runs between
    measured_by: str  # TPU_API (KUEUE on GKE), GUARD, AGENT, STEP_LINES or REMAINDER
    library: str  # "BadputType.X" or "GoodputType.TOTAL"; "" when the library does not count the time
    billed: bool  # the node runs (and bills) through it
    note: str = ""  # where the library counts it differently

    @property
    def from_step_lines(self) -> bool:
        """Whether a program's own lines decide it (the remainder too: what they claim, it loses)."""
        return self.measured_by in (STEP_LINES, REMAINDER)


RECOVERY = "BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
BEFORE_PROGRAM = "the library's job starts with the program: it counts this only after a disruption"
CATEGORIES: tuple[Category, ...] = (
    Category(
        "queue",
        "the node provisioning: from its creation (Node.createTime) or its start to READY; on GKE, the run's "
        "Kueue Workload from its creation to its admission",
        TPU_API,
        "",
        False,
        "before the job: not in the library's job time; not billed",
    ),
    Category(
        "recoveryWait",
        "node PREEMPTED or lost to READY again: the guard's next check, delete, create",
        GUARD,
        RECOVERY,
        False,
        "not billed: the node does not run",
    ),
    Category(
        "boot",
        "READY to the agent's start: the guest OS and the start-up script",
        AGENT,
        RECOVERY,
        True,
        BEFORE_PROGRAM,
    ),
    Category(
        "installs",
        "the agent's start to the program's: fetch and verify the source, venv, image pull",
        AGENT,
        RECOVERY,
        True,
        BEFORE_PROGRAM,
    ),
    Category(
        "restore",
        "restoring the checkpoint: the seconds the program's restore line reports (else its start to that line)",
        STEP_LINES,
        "BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
        True,
    ),
    Category(
        "firstStep",
        "the program's start to its first step line (or first save past where it started), less the restore: "
        "imports, device and data set-up, compilation",
        STEP_LINES,
        "BadputType.PROGRAM_STARTUP",
        True,
        "the library splits TPU_INITIALIZATION and TRAINING_PREP out when the program records them",
    ),
    Category(
        "productive",
        "steps kept: from the first step to the last committed checkpoint or the end",
        STEP_LINES,
        "GoodputType.TOTAL",
        True,
        "input waits inside a step count here",
    ),
    Category(
        "checkpointSave",
        "training stalled by a save, periodic or on SIGTERM",
        STEP_LINES,
        "BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
        True,
    ),
    Category(
        "wastedProgress",
        "steps after the last committed checkpoint, lost to a preemption or a lost host",
        STEP_LINES,
        "BadputType.WASTED_PROGRESS_FROM_DISRUPTION",
        True,
    ),
    Category(
        "idle",
        "the VM up with no run: after a run ends until stop or delete, between runs",
        AGENT,
        "",
        True,
        "after the job: the library's job has ended; billed all the same",
    ),
    Category("unattributed", "billed time no event above explains", REMAINDER, "BadputType.OTHER", True),
)
BY_KEY = {c.key: c for c in CATEGORIES}
# The library's types no category maps to, and why the platform records none of that time.
UNMAPPED = {
    "TPU_INITIALIZATION": "inside firstStep: the agent sees the first step line, not the program's phases",
    "TRAINING_PREP": "inside firstStep, as TPU_INITIALIZATION",
    "DATA_LOADING_SYNC": "inside productive: step lines carry no input wait",
    "DATA_LOADING_ASYNC": "overlaps training: not badput in the library either",
    "CUSTOM_BADPUT_EVENTS": "the run contract has no custom events",
    "ELASTIC_SLICE_DOWN": "no elastic slices here",
    "ELASTIC_SCALE_UP": "no elastic slices here",
    "ELASTIC_REINITIALIZATION": "no elastic slices here",
}
# Measured time may exceed the billed time by clock skew between the agent and the TPU API: this much.
SKEW_S, SKEW_SHARE = 5.0, 0.001


class TimelineError(ValueError):
    """A timeline that is not a valid record of this version: every problem, one per line."""


@dataclass(frozen=True)
class RunTimeline:
    """One run on one VM: seconds per category (all of them), and the billed seconds they add up to.

    `billed_s` comes from the node's state transitions (running from READY until preempted, stopped or
    deleted), not from the agent's start; `unattributed` is what the other billed categories leave.
    """

    run_id: str
    vm: str
    accelerator_type: str
    chips: int
    provisioning: str
    zone: str
    billed_s: float
    seconds: dict[str, float]
    preemptions: int = 0  # stop notices: SIGTERM at a preemption (to this host or, on a slice, another)
    lost_without_notice: int = 0  # runs cut off with no stop recorded (a host lost, kill -9)
    steps: int = 0  # productive steps, from the step lines
    step_lines_trusted: bool = True  # False for a self-service program's lines

    @classmethod
    def of(
        cls,
        *,
        run_id: str,
        vm: str,
        accelerator_type: str,
        chips: int,
        provisioning: str,
        zone: str,
        billed_s: float,
        measured: Mapping[str, float],
        preemptions: int = 0,
        lost_without_notice: int = 0,
        steps: int = 0,
        step_lines_trusted: bool = True,
    ) -> RunTimeline:
        """The record from measured seconds (any categories but `unattributed`; missing ones are 0).

        The remainder is computed. Measured billed time above the billed seconds (beyond clock skew)
        means overlapping intervals, a bug of whoever measured them: TimelineError."""
        problems = [f"seconds.{k}: not a category to measure" for k in measured if k not in BY_KEY]
        if "unattributed" in measured:
            problems.append(
                f"seconds.unattributed: computed from the others, not measured ({measured['unattributed']})"
            )
        seconds = {c.key: float(measured.get(c.key, 0.0)) for c in CATEGORIES}
        attributed = sum(seconds[c.key] for c in CATEGORIES if c.billed)
        if attributed > billed_s + max(SKEW_S, SKEW_SHARE * billed_s):
            problems.append(f"billed categories add up to {attributed:g} s, more than the {billed_s:g} s billed")
        if problems:
            raise TimelineError("\n".join(problems))
        seconds["unattributed"] = max(0.0, billed_s - attributed)
        timeline = cls(
            run_id=run_id,
            vm=vm,
            accelerator_type=accelerator_type,
            chips=chips,
            provisioning=provisioning,
            zone=zone,
            billed_s=float(billed_s),
            seconds=seconds,
            preemptions=preemptions,
            lost_without_notice=lost_without_notice,
            steps=steps,
            step_lines_trusted=step_lines_trusted,
        )
        timeline.check()
        return timeline

    def check(self) -> None:
        problems = []
        for name, value in (
            ("chips", self.chips),
            ("preemptions", self.preemptions),
            ("lostWithoutNotice", self.lost_without_notice),
            ("steps", self.steps),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{name}: {value!r} is not a whole number ≥ 0")
        for name, value in (
            ("runId", self.run_id),
            ("vm", self.vm),
            ("acceleratorType", self.accelerator_type),
            ("provisioning", self.provisioning),
            ("zone", self.zone),
        ):
            if not isinstance(value, str) or not value:
                problems.append(f"{name}: {value!r} is not a non-empty string")
        if not _seconds(self.billed_s):
            problems.append(f"billedSeconds: {self.billed_s!r} is not a finite number of seconds ≥ 0")
        if set(self.seconds) != set(BY_KEY):
            missing, extra = sorted(set(BY_KEY) - set(self.seconds)), sorted(set(self.seconds) - set(BY_KEY))
            problems.append(f"seconds: needs every category; missing {missing}, not categories {extra}")
        problems += [
            f"seconds.{k}: {v!r} is not a finite number ≥ 0" for k, v in self.seconds.items() if not _seconds(v)
        ]
        if not isinstance(self.step_lines_trusted, bool):
            problems.append(f"stepLinesTrusted: {self.step_lines_trusted!r} is not true or false")
        if problems:
            raise TimelineError("\n".join(problems))

    @property
    def untrusted(self) -> tuple[str, ...]:
        """The categories a self-service program's step lines decide; none when its lines are trusted."""
        return untrusted_categories(self.step_lines_trusted)

    @property
    def goodput(self) -> float:
        """Productive share of the billed time."""
        return self.seconds["productive"] / self.billed_s if self.billed_s else 0.0

    def library_breakdown(self) -> dict[str, float]:
        """Seconds per ml-goodput-measurement type (`GoodputType.TOTAL`, `BadputType.…`), as mapped."""
        out: dict[str, float] = {}
        for c in CATEGORIES:
            if c.library:
                out[c.library] = out.get(c.library, 0.0) + self.seconds[c.key]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "runId": self.run_id,
            "vm": self.vm,
            "acceleratorType": self.accelerator_type,
            "chips": self.chips,
            "provisioning": self.provisioning,
            "zone": self.zone,
            "billedSeconds": self.billed_s,
            "seconds": {c.key: self.seconds[c.key] for c in CATEGORIES},
            "preemptions": self.preemptions,
            "lostWithoutNotice": self.lost_without_notice,
            "steps": self.steps,
            "stepLinesTrusted": self.step_lines_trusted,
            "untrusted": list(self.untrusted),
            "goodputMeasurement": GOODPUT_MEASUREMENT,
        }

    @classmethod
    def from_json(cls, data: Any) -> RunTimeline:
        """A record read back; anything that is not version 1 of this schema raises TimelineError."""
        _header(data, "a timeline", SCHEMA, VERSION)
        known = {
            "schema",
            "version",
            "untrusted",
            "goodputMeasurement",
            "lostWithoutNotice",
            "steps",
            "preemptions",
            "runId",
            "vm",
            "acceleratorType",
            "chips",
            "provisioning",
            "zone",
            "billedSeconds",
            "seconds",
            "stepLinesTrusted",
        }
        unknown = sorted(set(data) - known)
        missing = sorted(
            k
            for k in ("runId", "vm", "acceleratorType", "chips", "provisioning", "zone", "billedSeconds", "seconds")
            if k not in data
        )
        if unknown or missing:
            raise TimelineError(f"unknown keys {unknown}, missing keys {missing}")
        seconds = data["seconds"]
        if not isinstance(seconds, dict):
            raise TimelineError(f"seconds: {seconds!r} is not an object")
        timeline = cls(
            run_id=data["runId"],
            vm=data["vm"],
            accelerator_type=data["acceleratorType"],
            chips=data["chips"],
            provisioning=data["provisioning"],
            zone=data["zone"],
            billed_s=data["billedSeconds"],
            seconds=dict(seconds),
            preemptions=data.get("preemptions", 0),
            lost_without_notice=data.get("lostWithoutNotice", 0),
            steps=data.get("steps", 0),
            step_lines_trusted=data.get("stepLinesTrusted", True),
        )
        timeline.check()
        billed = sum(timeline.seconds[c.key] for c in CATEGORIES if c.billed)
        if abs(billed - timeline.billed_s) > max(SKEW_S, SKEW_SHARE * timeline.billed_s):
            raise TimelineError(f"billed categories add up to {billed:g} s, not the {timeline.billed_s:g} s billed")
        return timeline


def _header(data: Any, what: str, schema: str, version: int) -> None:
    """A record of `schema` at `version`, or TimelineError."""
    if not isinstance(data, dict):
        raise TimelineError(f"{what} is a JSON object, not {type(data).__name__}")
    if data.get("schema") != schema:
        raise TimelineError(f"schema: {data.get('schema')!r} is not {schema!r}")
    if data.get("version") != version:
        raise TimelineError(f"version: {data.get('version')!r}; this reader knows version {version}")


def untrusted_categories(step_lines_trusted: bool) -> tuple[str, ...]:
    """The categories a self-service program's step lines decide; none when its lines are trusted."""
    return () if step_lines_trusted else tuple(c.key for c in CATEGORIES if c.from_step_lines)


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class PreemptionHistory:
    """Disruptions seen over hours of running: what the what-if's rate comes from when a stack has a
    record (`tpu-runs report` will write it from the stack's timelines; `of` does the sum)."""

    preemptions: int
    lost_without_notice: int
    running_hours: float
    source: str = ""  # what the counts cover, in words (VMs, months)

    @classmethod
    def of(cls, timelines: Iterable[RunTimeline], source: str = "") -> PreemptionHistory:
        runs = list(timelines)
        return cls(
            preemptions=sum(t.preemptions for t in runs),
            lost_without_notice=sum(t.lost_without_notice for t in runs),
            running_hours=sum(t.billed_s for t in runs) / 3600,
            source=source or f"{len(runs)} run timeline(s)",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "preemptions": self.preemptions,
            "lostWithoutNotice": self.lost_without_notice,
            "runningHours": self.running_hours,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Any) -> PreemptionHistory:
        problems = []
        if not isinstance(data, dict):
            raise TimelineError(f"a preemption history is a JSON object, not {type(data).__name__}")
        unknown = sorted(set(data) - {"preemptions", "lostWithoutNotice", "runningHours", "source"})
        if unknown:
            problems.append(f"unknown keys {unknown}")
        counts: dict[str, int] = {}
        for key in ("preemptions", "lostWithoutNotice"):
            value = data.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{key}: {value!r} is not a whole number ≥ 0")
            counts[key] = value
        hours: float | None = data.get("runningHours")
        if not _seconds(hours) or not hours:
            problems.append(f"runningHours: {hours!r} is not a number of hours > 0")
        if problems:
            raise TimelineError("\n".join(problems))
        return cls(counts["preemptions"], counts["lostWithoutNotice"], float(hours or 0), str(data.get("source", "")))


# ------------------------------------------------------------------------------------ the agent's events
# What the agent writes while a run goes on: `<vm>/runs/<runId>/timeline.json` in the run-status bucket
# (run_contract/paths.py `timeline_name`), next to status.json, where no run's credentials reach. It holds
# the events as they happened, across the VM's boots (a preempted run resumes on the next one); `measure`
# turns them into seconds by category, and the reader adds what the VM is (type, chips, zone, provisioning:
# the stack knows them) to make a RunTimeline to price.
EVENTS_SCHEMA = "tpu-platform/run-events"
EVENTS_VERSION = 1
EVENT_KINDS = (
    "boot",  # the VM's kernel started (the agent's start less the uptime); billed time in this record starts here
    "agentStart",  # the agent's process started (the start-up script has run)
    "prepare",  # the run's source fetch, verification and installs begin
    "programStart",  # the program's process was started (an attempt; retries start it again)
    "restored",  # a step line: the program restored its checkpoint at `step`, in `seconds` when it says so
    "firstStep",  # the first step line of an attempt
    "step",  # the last step line so far of an attempt (one event, moved along: not one per line)
    "checkpoint",  # a step line: a checkpoint committed at `step`, training stalled `seconds`
    "sigterm",  # the agent asked the program to stop (a preemption, a shutdown, a changed or stopped run)
    "exit",  # the program's process ended, with `code`
    "end",  # the run ended in this boot (its state: finished, failed, stopped, or queued again)
)
# Step lines: JSON objects the program prints, one a line. Any with an integer `step` is a step line; these
# messages say more (runlib's and the examples' words).
RESTORED_MESSAGE = "resumed from checkpoint"
CHECKPOINT_MESSAGE = "checkpoint saved"
STEP_LINE_KINDS = ("restored", "firstStep", "step", "checkpoint")
# A step line is a few fields; a longer line is never parsed (the agent reads every line a program prints, and a
# hostile one may print megabytes in one): the bound at which the agent's telemetry too stops reading a line as
# JSON (vm_agent/telemetry.py MAX_LINE_CHARS).
MAX_STEP_LINE_CHARS = 16 * 1024


@dataclass(frozen=True)
class Event:
    kind: str
    at: float  # seconds since the epoch, the agent's clock
    step: int | None = None
    seconds: float | None = None  # a checkpoint's stall, or a restore's time, as the program reports it
    code: int | None = None  # the exit's code

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "at": self.at}
        for key, value in (("step", self.step), ("seconds", self.seconds), ("code", self.code)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Event:
        if not isinstance(data, dict) or set(data) - {"kind", "at", "step", "seconds", "code"}:
            raise TimelineError(f"an event is an object of kind, at, step, seconds, code: not {data!r}")
        kind, at = data.get("kind"), data.get("at")
        if kind not in EVENT_KINDS:
            raise TimelineError(f"event kind {kind!r} is not one of {', '.join(EVENT_KINDS)}")
        if not _seconds(at):
            raise TimelineError(f"event {kind}: at {at!r} is not a time in seconds")
        step, seconds, code = data.get("step"), data.get("seconds"), data.get("code")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TimelineError(f"event {kind}: step {step!r} is not an integer")
        if seconds is not None and not _seconds(seconds):
            raise TimelineError(f"event {kind}: seconds {seconds!r} is not a number of seconds ≥ 0")
        if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
            raise TimelineError(f"event {kind}: code {code!r} is not an integer")
        return cls(kind, float(at or 0), step, None if seconds is None else float(seconds), code)


def step_line(line: str) -> dict[str, Any] | None:
    """The JSON object of a step line, or None when the line is not one (or names no step)."""
    if len(line) > MAX_STEP_LINE_CHARS or not line.startswith("{") or '"step"' not in line:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict) or isinstance(value.get("step"), bool) or not isinstance(value.get("step"), int):
        return None
    return value


def step_seconds(value: Any) -> float | None:
    """A step line's `seconds` as an event keeps it: a number, at least 0 (a negative one is 0), that reads back
    as one; None for anything else (a string, JSON's 1e999 read as infinity, an integer past a float's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = max(0.0, float(value))
    except OverflowError:
        return None
    return seconds if _seconds(seconds) else None


@dataclass(frozen=True)
class RunEvents:
    """One run's events on one VM, as the agent records them; `measure` makes seconds of them."""

    run_id: str
    vm: str
    events: tuple[Event, ...]
    step_lines_trusted: bool = True  # False for a self-service request's program

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": EVENTS_SCHEMA,
            "version": EVENTS_VERSION,
            "runId": self.run_id,
            "vm": self.vm,
            "stepLinesTrusted": self.step_lines_trusted,
            "untrusted": list(untrusted_categories(self.step_lines_trusted)),
            "events": [event.to_json() for event in self.events],
        }

    @classmethod
    def from_json(cls, data: Any) -> RunEvents:
        _header(data, "a run's events", EVENTS_SCHEMA, EVENTS_VERSION)
        unknown = sorted(set(data) - {"schema", "version", "runId", "vm", "stepLinesTrusted", "untrusted", "events"})
        if unknown:
            raise TimelineError(f"unknown keys {unknown}")
        run_id, vm = data.get("runId"), data.get("vm")
        trusted, events = data.get("stepLinesTrusted"), data.get("events")
        if not isinstance(run_id, str) or not run_id or not isinstance(vm, str) or not vm:
            raise TimelineError(f"runId {run_id!r} and vm {vm!r} must be non-empty strings")
        if not isinstance(trusted, bool) or not isinstance(events, list):
            raise TimelineError("stepLinesTrusted is true or false, and events a list")
        return cls(run_id, vm, tuple(Event.from_json(e) for e in events), trusted)


@dataclass(frozen=True)
class Measured:
    """What a run's events say: seconds by category (unattributed left to RunTimeline.of), the billed window."""

    seconds: dict[str, float]
    billed_s: float
    preemptions: int
    lost_without_notice: int
    steps: int
    spans: tuple[tuple[float, float], ...] = ()  # the billed window of each boot, as (start, end)
    node_billed: bool = False  # every boot's window came from the node's states, none from the agent alone


def measure(
    events: Iterable[Event],
    up: Iterable[tuple[float, float]] = (),
    waits: Iterable[tuple[str, float, float]] = (),
    trusted: bool = True,
) -> Measured:
    """Seconds by category from a run's events, boot by boot (each `boot` or `agentStart` opens one, and so
    does whatever follows an `end`).

    In one boot: READY to `agentStart` is boot; `prepare` (the boot's first: from `agentStart`) to the
    next `programStart` installs. In an attempt (see _attempt): the restore's own seconds restore; its start
    to its first progress, less those, firstStep; checkpoint stalls (the program's `seconds`)
    checkpointSave; an attempt that did not exit 0 loses the steps after its last committed checkpoint (to
    its last step line) as wastedProgress, none when that checkpoint holds its last step; the rest of first
    progress to its last step line (or a save after it) is productive. Each attempt stopped on notice counts
    once: the agent sent it SIGTERM, or it exited EXIT_RETRY (on a slice, the host told may be another: the
    program's processes stop together, and this record is worker 0's). A SIGTERM with no program running
    counts too. An untrusted (self-service) program's exit code is its own word: with `trusted` False only
    the agent's SIGTERMs count, or a program could fill the stack's preemption record (the what-if's rate)
    by exiting EXIT_RETRY.

    The billed window of a boot runs from the node's READY to the boot's last event, or to the node leaving
    READY when that comes first (a preemption): `up` holds the node's running windows (NodeStates.up), and
    a boot's is the one it overlaps most; the kernel's start, when earlier than the READY the guard saw,
    starts it (the node ran). A boot that no window overlaps (no record of the node's states) falls back
    to the agent's view: from `boot` (else the boot's first event). A run that starts after another run's
    `end` in the same boot starts at its first event: the time before was the other run's or idle.

    `waits` (NodeStates.waits) are the node's waits before its windows: one that ends where a boot's window
    starts, and that boot opens the run's time on the VM, is the run's: `queue` (the node provisioning) to the
    boot's billed start, and `recoveryWait` (a disruption to READY again) when the run ran on an earlier boot.
    A boot that ends with no `end` lost its run without notice (a host lost, kill -9).
    """
    seconds = {c.key: 0.0 for c in CATEGORIES if c.key != "unattributed"}
    windows = list(up)
    billed = 0.0
    spans: list[tuple[float, float]] = []
    from_node = True
    preemptions = lost = steps = 0
    node_waits = list(waits)
    for number, life in enumerate(_boots(list(events))):  # as recorded: a boot's clock may differ from the last's
        start, end = life[0].at, life[-1].at
        window = max(windows, key=lambda w: min(end, w[1]) - max(start, w[0]), default=None)
        if window is not None and min(end, window[1]) >= max(start, window[0]):
            if life[0].kind in ("boot", "agentStart"):  # the node's READY started this boot's time
                start = min(start, window[0])
                for kind, since, ready in node_waits:
                    if ready == window[0] and (kind == "queue" or number > 0):
                        seconds[kind] += max(0.0, start - since)
            end = min(end, window[1])
        else:
            from_node = False
        spans.append((start, end))
        billed += max(0.0, end - start)
        first = {e.kind: e for e in reversed(life)}  # each kind's first event in this boot
        if "agentStart" in first and life[0].kind in ("boot", "agentStart"):
            seconds["boot"] += max(0.0, first["agentStart"].at - start)
        prepare = None
        # The agent's set-up for the run, from its start, is the first prepare's (installs: "the agent's start
        # to the program's").
        setup = first.get("agentStart") if life[0].kind in ("boot", "agentStart") else None
        attempt: list[Event] = []
        for event in life:
            if event.kind == "prepare":
                prepare, setup = setup or event, None
            elif event.kind == "programStart":
                if prepare is not None:
                    seconds["installs"] += event.at - prepare.at
                    prepare = None
                attempt = [event]
            elif attempt:
                attempt.append(event)
                if event.kind == "exit":
                    steps = max(steps, _attempt(attempt, seconds))
                    preemptions += _noticed(attempt, trusted)
                    attempt = []
            elif event.kind == "sigterm":
                preemptions += 1
        if attempt:  # no exit seen: the boot ended under the program
            steps = max(steps, _attempt(attempt, seconds))
            preemptions += _noticed(attempt, trusted)
        if life[-1].kind != "end":
            lost += 1
    return Measured(seconds, billed, preemptions, lost, steps, tuple(spans), from_node and bool(spans))


def _boots(events: list[Event]) -> list[list[Event]]:
    """The record cut where the run's time on the VM starts again: at a boot, an agent's start, or whatever
    follows its `end` (a request resumed after the stack's run: the time between was that run's)."""
    lives: list[list[Event]] = []
    for event in events:
        last = lives[-1][-1].kind if lives else ""
        opens = event.kind == "boot" or (event.kind == "agentStart" and last != "boot") or last == "end"
        if opens or not lives:
            lives.append([])
        lives[-1].append(event)
    return lives


def _noticed(attempt: list[Event], trusted: bool) -> int:
    """1 when the attempt was stopped on notice: SIGTERM from this agent, or EXIT_RETRY from a trusted
    program (a peer's notice)."""
    exit_ = next((e for e in attempt if e.kind == "exit"), None)
    retried = trusted and exit_ is not None and exit_.code == EXIT_RETRY
    return int(any(e.kind == "sigterm" for e in attempt) or retried)


def _attempt(attempt: list[Event], seconds: dict[str, float]) -> int:
    """One program attempt's seconds into `seconds`; the last step it reached.

    Training starts at the attempt's first progress: its first step line, or a save of a step past the one it
    started from, when the save began (a program may save before it prints a step: runlib prints every 50
    steps and saves every `checkpointEverySteps`). The restore takes the seconds its line reports, at most
    the time to that line; the rest of the start to the first progress is firstStep (the program's start-up).
    """
    start = attempt[0]
    restored = next((e for e in attempt if e.kind == "restored"), None)
    exit_ = next((e for e in attempt if e.kind == "exit"), None)
    base = restored.step if restored is not None and restored.step is not None else 0
    progress = [
        e
        for e in attempt
        if e.kind in ("step", "firstStep") or (e.kind == "checkpoint" and e.step is not None and e.step > base)
    ]
    restore = 0.0
    if restored is not None:
        to_line = restored.at - start.at
        restore = to_line if restored.seconds is None else min(restored.seconds, to_line)
        seconds["restore"] += restore
    if not progress:
        if restored is not None:  # started and restored, never stepped: the start-up is the program's all the same
            seconds["firstStep"] += restored.at - start.at - restore
        return 0
    began = min(e.at - (e.seconds or 0.0) if e.kind == "checkpoint" else e.at for e in progress)
    began = max(began, restored.at if restored is not None else start.at)
    last_step = max(progress, key=lambda e: (e.at, e.step or 0))
    seconds["firstStep"] += max(0.0, began - start.at - restore)
    # Training ends at its last step line, or at a save reported after it (runlib saves on notice, then says so).
    # A save before training began (of the step it started from) is part of the start-up.
    saves = [e for e in attempt if e.kind == "checkpoint" and e.at >= began]
    end = max([last_step.at] + [e.at for e in saves])
    stalled = min(sum(e.seconds or 0.0 for e in saves), end - began)
    wasted = 0.0
    if exit_ is None or exit_.code != 0:  # the steps after the last committed checkpoint are lost
        kept = saves[-1] if saves else None
        if kept is None or kept.step is None or last_step.step is None or kept.step < last_step.step:
            wasted = max(0.0, last_step.at - (kept.at if kept else began))
    seconds["checkpointSave"] += stalled
    seconds["wastedProgress"] += wasted
    seconds["productive"] += max(0.0, end - began - stalled - wasted)
    return max(e.step or 0 for e in progress)


# ------------------------------------------------------------------------------------ the node's states
# Billed time is the node's, not the agent's: the TPU API's Node.state (tpu.v2 discovery document, Node.state)
# says when the node runs. The guard (functions/tpu_guard/) lists the stack's nodes on every check and keeps
# each node's changes of state, with when it saw them, at `_tpu-guard/<environment>/nodes/<node>.json` in the
# status bucket (run_contract/paths.py node_states_name), a prefix no run writes. A preempted node's state
# "changes from READY to PREEMPTED" (tpu/docs/preemptible, "Detecting if a TPU has been preempted"); a
# stopped one goes STOPPING then STOPPED; a deleted one DELETING, then it is no longer listed (NOT_LISTED here).
# The node runs from READY, and through the states a running node passes without stopping; any other state
# (CREATING: the `queue` category; PREEMPTED, STOPPING, STOPPED, DELETING, TERMINATED) and no node at all
# count as not running, so not billed.
NODE_STATES_SCHEMA = "tpu-platform/node-states"
NODE_STATES_VERSION = 1
UP_STATES = ("READY", "RESTARTING", "REIMAGING", "REPAIRING")
# Between two windows, the node provisioning (created, or a stopped one started) is the `queue` category; a stretch
# that a disruption opened (the node PREEMPTED, or TERMINATED, "the TPU has been terminated") is `recoveryWait`
# to READY again, through the guard's delete and create. A node's CREATING is when the API says it was created
# (Node.createTime, which the guard passes to `observe`), not when a check first saw it.
PROVISIONING_STATES = ("CREATING", "STARTING")
DISRUPTED_STATES = ("PREEMPTED", "TERMINATED")
NOT_LISTED = "NOT_LISTED"  # not one of the API's states: no zone lists the node
MAX_TRANSITIONS = 2000  # the oldest go first: a node re-created every hour for twelve weeks fits


@dataclass(frozen=True)
class NodeStates:
    """One node's changes of state as the guard saw them: (state, when), oldest first."""

    node: str
    transitions: tuple[tuple[str, float], ...] = ()

    def observe(self, state: str, at: float, created: float | None = None) -> NodeStates | None:
        """The record with `state` seen at `at`, or None when it holds nothing new.

        `created` is the node's Node.createTime. A node created since the last change seen (re-created by the
        guard after a preemption, by a deploy, or new while CREATING at its first sight) was CREATING from
        then. A node already past CREATING at its first sight says nothing of its READY: no guess."""
        found = self.transitions
        if created is not None and created <= at and (found[-1][1] < created if found else state == "CREATING"):
            found = (*found, ("CREATING", created))
        if found and found[-1][0] == state:
            return None if found is self.transitions else NodeStates(self.node, found[-MAX_TRANSITIONS:])
        return NodeStates(self.node, (*found, (state, at))[-MAX_TRANSITIONS:])

    def up(self, now: float) -> list[tuple[float, float]]:
        """The windows in which the node ran: from each change into a running state to the next change out of
        one (`now` for a node still running)."""
        windows: list[tuple[float, float]] = []
        start: float | None = None
        for state, at in self.transitions:
            if state in UP_STATES and start is None:
                start = at
            elif state not in UP_STATES and start is not None:
                windows.append((start, at))
                start = None
        if start is not None:
            windows.append((start, max(start, now)))
        return windows

    def waits(self) -> list[tuple[str, float, float]]:
        """The node's waits before each window it ran in, as (category, since, READY): `recoveryWait` from a
        disruption, else `queue` from the stretch's first provisioning state; none when neither was seen (a
        stopped node started with no STARTING seen)."""
        out: list[tuple[str, float, float]] = []
        running = False
        down: tuple[str, float] | None = None  # the state that ended the last window (or began the record)
        provisioning: float | None = None
        for state, at in self.transitions:
            if state in UP_STATES:
                if not running and down is not None and down[0] in DISRUPTED_STATES:
                    out.append(("recoveryWait", down[1], at))
                elif not running and provisioning is not None:
                    out.append(("queue", provisioning, at))
                running, down, provisioning = True, None, None
                continue
            if running or down is None:
                down = (state, at)
            running = False
            if state in PROVISIONING_STATES and provisioning is None:
                provisioning = at
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": NODE_STATES_SCHEMA,
            "version": NODE_STATES_VERSION,
            "node": self.node,
            "transitions": [{"state": state, "at": at} for state, at in self.transitions],
        }

    @classmethod
    def from_json(cls, data: Any) -> NodeStates:
        _header(data, "a node's states", NODE_STATES_SCHEMA, NODE_STATES_VERSION)
        node, transitions = data.get("node"), data.get("transitions")
        if set(data) - {"schema", "version", "node", "transitions"}:
            raise TimelineError(f"unknown keys {sorted(set(data) - {'schema', 'version', 'node', 'transitions'})}")
        if not isinstance(node, str) or not node or not isinstance(transitions, list):
            raise TimelineError(f"node {node!r} is a non-empty string and transitions a list")
        out = []
        for item in transitions:
            if not isinstance(item, dict) or set(item) != {"state", "at"}:
                raise TimelineError(f"a transition is an object of state and at: not {item!r}")
            if not isinstance(item["state"], str) or not item["state"] or not _seconds(item["at"]):
                raise TimelineError(f"a transition's state is a string and at a time in seconds: not {item!r}")
            out.append((item["state"], float(item["at"])))
        return cls(node, tuple(out))


def covered(windows: Iterable[tuple[float, float]], spans: Iterable[tuple[float, float]]) -> float:
    """Seconds of `windows` that some span covers (spans may overlap one another; each counts once)."""
    merged: list[list[float]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(max(0.0, min(end, m_end) - max(start, m_start)) for start, end in windows for m_start, m_end in merged)


# ------------------------------------------------------------------------------------ a GKE run in Kueue
# On GKE no agent runs beside the program, and every container of a pod holds the pod's one identity: what
# the platform knows of a run without the run's word is the control plane's. Kueue's Workload for the run's
# JobSet (kubernetes-sigs/kueue apis/kueue/v1beta2/workload_types.go at v0.17.8, the release the GKE
# engine installs) has metav1.Conditions, each with the lastTransitionTime of its
# latest change: QuotaReserved ("has reserved quota a ClusterQueue"), Admitted ("has reserved quota and all
# the admissionChecks defined in the ClusterQueue are satisfied": a ProvisioningRequest's capacity, for
# one), Finished, Evicted; `status.accumulatedPastExecutionTimeSeconds`, "the total time ... the workload
# spent in Admitted state, in the previous Admit - Evict cycles"; `status.schedulingStats.evictions`, a count
# by reason. Kueue writes the status; a run cannot (the team's Role grants no write to Workloads).
KUEUE_WORKLOAD = "kueue.x-k8s.io/v1beta2 Workload (Kueue v0.17.8)"


@dataclass(frozen=True)
class KueueWait:
    """A GKE run's time in Kueue, from its Workload: waiting for admission, and admitted (the time it held its
    slices' quota: its pods ran, or were being scheduled, on nodes it alone held)."""

    created: float
    admitted: float | None  # the current admission, when Admitted is True
    finished: float | None  # when Finished is True
    admitted_before_s: float  # admitted time of earlier admissions, each ended by an eviction
    evictions: int

    @classmethod
    def of(cls, workload: Mapping[str, Any]) -> KueueWait:
        """The Workload's times, or TimelineError naming what is missing or not a time."""
        meta, status = workload.get("metadata") or {}, workload.get("status") or {}
        created = _k8s_time(meta.get("creationTimestamp"), "metadata.creationTimestamp")
        conditions = {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, dict)}

        def since(kind: str) -> float | None:
            condition = conditions.get(kind) or {}
            if condition.get("status") != "True":
                return None
            return _k8s_time(condition.get("lastTransitionTime"), f"status.conditions[{kind}].lastTransitionTime")

        before = status.get("accumulatedPastExecutionTimeSeconds") or 0
        if not _seconds(before):
            raise TimelineError(f"status.accumulatedPastExecutionTimeSeconds: {before!r} is not seconds")
        stats = (status.get("schedulingStats") or {}).get("evictions") or ()
        counted = sum(e.get("count") or 0 for e in stats if isinstance(e, dict) and isinstance(e.get("count"), int))
        evictions = max(counted, 1 if since("Evicted") is not None or before else 0)
        return cls(created, since("Admitted"), since("Finished"), float(before), evictions)

    def queue_s(self, now: float) -> float:
        """Seconds from its creation not admitted, to its current admission (or its end, or now)."""
        until = self.admitted if self.admitted is not None else (self.finished or now)
        return max(0.0, until - self.created - self.admitted_before_s)

    def admitted_s(self, now: float) -> float:
        """Seconds admitted: earlier admissions, and the current one to the run's end (or now)."""
        current = 0.0 if self.admitted is None else max(0.0, (self.finished or now) - self.admitted)
        return self.admitted_before_s + current


def _k8s_time(value: Any, where: str) -> float:
    """A Kubernetes metav1.Time (RFC 3339 in UTC, "2026-11-20T08:00:00Z") as seconds since the epoch."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TimelineError(f"{where}: {value!r} is not a time") from None
