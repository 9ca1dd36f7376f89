"""A run's timeline as the agent keeps it: its own events and the program's step lines, in the run contract's
record (run_contract/timeline.py RunEvents), written to `<status-dir>/runs/<runId>/timeline.json` beside
status.json, where only the agent writes (no run's credentials reach the status bucket's VM folders).

A run resumed later (on the next boot after a preemption, or after the stack's run on a shared VM) reads its
record back and goes on adding to it, so one record holds all of the run's time on the VM.

The agent's own events are written when they happen. Step lines are the program's: a self-service
program may print anything, as fast as it likes. So the events they make are written at most every
STEP_WRITE_S (and with the next event of the agent's), one `step` event is moved along rather than one
kept per line, and an attempt keeps at most MAX_LINE_EVENTS of them (restores and checkpoint saves);
past that, a flood of lines changes nothing that is stored. A request's record says its step lines are
untrusted, and which categories they decide.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from run_contract.paths import timeline_name
from run_contract.timeline import (
    BY_KEY,
    CHECKPOINT_MESSAGE,
    RESTORED_MESSAGE,
    Event,
    RunEvents,
    TimelineError,
    measure,
    step_line,
    step_seconds,
)

from vm_agent.gcs import Folder, StorageError

STEP_WRITE_S = 30.0
MAX_LINE_EVENTS = 2000  # an attempt's restores and checkpoint saves (a save every 5 minutes for a week)
Log = Callable[..., None]
Publish = Callable[[str, dict[str, float], bool], None]  # run id, seconds by category, step lines trusted


def boot_events(now: float | None = None, uptime: str = "/proc/uptime") -> list[Event]:
    """The VM's boot (its kernel's start: now less the uptime) and the agent's start, now."""
    at = time.time() if now is None else now
    events = []
    try:
        with open(uptime) as f:
            events.append(Event("boot", at - float(f.read().split()[0])))
    except (OSError, ValueError, IndexError):
        pass  # no uptime to read: this boot's window starts at the agent
    events.append(Event("agentStart", at))
    return events


def by_category(events: list[Event]) -> dict[str, float]:
    """Seconds by category the agent measures, and what its view of billed time leaves unattributed."""
    found = measure(events)
    seconds = dict(found.seconds)
    seconds["unattributed"] = max(0.0, found.billed_s - sum(v for k, v in seconds.items() if BY_KEY[k].billed))
    return seconds


class Recorder:
    """One run's events on this VM; `record` adds the agent's own, `line` reads a program's output line."""

    def __init__(
        self,
        run_id: str,
        vm: str,
        trusted: bool,
        status: Folder,
        log: Log,
        write: bool = True,
        publish: Publish | None = None,
    ):
        self.run_id, self.vm, self.trusted = run_id, vm, trusted
        self.status, self.log, self.write_enabled = status, log, write
        self.publish = publish  # where the run's time by category goes when it ends in a boot (Monitoring)
        self.events: list[Event] = []
        self.writes = 0
        self._lock = threading.Lock()
        self._first_step_seen = False
        self._step_index: int | None = None  # where the attempt's moving `step` event is
        self._line_events = 0
        self._written_at = 0.0
        if write:
            self.events = self._earlier()

    def _earlier(self) -> list[Event]:
        try:
            found = self.status.read_json(timeline_name(self.run_id))
        except (StorageError, OSError) as error:
            self.log(f"cannot read run {self.run_id}'s timeline ({error}); it starts anew", severity="WARNING")
            return []
        if not found:
            return []
        try:
            return list(RunEvents.from_json(found).events)
        except TimelineError as error:
            self.log(f"run {self.run_id}'s timeline is not a record ({error}); it starts anew", severity="WARNING")
            return []

    def record(self, kind: str, code: int | None = None) -> None:
        """One of the agent's own events, written at once; at the run's `end`, its time by category published
        (worker 0's, which keeps the run's record)."""
        with self._lock:
            if kind == "programStart":
                self._first_step_seen, self._step_index, self._line_events = False, None, 0
            self.events.append(Event(kind, time.time(), code=code))
            self._write()
            events = list(self.events)
        if kind == "end" and self.publish is not None and self.write_enabled:
            self.publish(self.run_id, by_category(events), self.trusted)

    def extend(self, events: list[Event]) -> None:
        with self._lock:
            self.events.extend(events)
            self._write()

    def line(self, text: str) -> int | None:
        """A program's output line: a step line adds an event (or moves the attempt's `step` along); its step."""
        found = step_line(text)
        if found is None:
            return None
        step, message, seconds = found["step"], found.get("message"), step_seconds(found.get("seconds"))
        with self._lock:
            now = time.time()
            if message in (RESTORED_MESSAGE, CHECKPOINT_MESSAGE):
                if self._line_events >= MAX_LINE_EVENTS:
                    return step
                self._line_events += 1
                kind = "restored" if message == RESTORED_MESSAGE else "checkpoint"
                self.events.append(Event(kind, now, step, seconds))  # a save's stall, a restore's time
            elif not self._first_step_seen:
                self._first_step_seen = True
                self.events.append(Event("firstStep", now, step))
            else:
                if self._step_index is not None:
                    del self.events[self._step_index]
                self.events.append(Event("step", now, step))
                self._step_index = len(self.events) - 1
            if now - self._written_at >= STEP_WRITE_S:
                self._write()
        return step

    def _write(self) -> None:
        if not self.write_enabled:
            return
        self._written_at = time.time()
        self.writes += 1
        record = RunEvents(self.run_id, self.vm, tuple(self.events), self.trusted).to_json()
        try:
            self.status.write_json(timeline_name(self.run_id), record)
        except (StorageError, OSError) as error:  # a lost timeline write must not stop the run
            self.log(f"could not write run {self.run_id}'s timeline: {error}", severity="WARNING", run=self.run_id)
