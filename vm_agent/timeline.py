"""A run's timeline as the agent keeps it: its own events and the program's step lines, in the run contract's
record (run_contract/timeline.py RunEvents), written to `<status-dir>/runs/<runId>/timeline.json` beside
status.json, where only the agent writes (no run's credentials reach the status bucket's VM folders).

A run resumed on a later boot (a preemption, a reboot) reads its record back and goes on adding to it, so
one record holds every boot of the run. Step lines are written at most every STEP_WRITE_S (one `step`
event moved along, not one per line); every other event is written when it happens. A self-service
request's program is untrusted: its record says its step lines are, and which categories they decide.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from run_contract.paths import timeline_name
from run_contract.timeline import (
    CHECKPOINT_MESSAGE,
    RESTORED_MESSAGE,
    Event,
    RunEvents,
    TimelineError,
    step_line,
)

from vm_agent.gcs import Folder, StorageError

STEP_WRITE_S = 30.0
Log = Callable[..., None]


def boot_events(now: float | None = None, uptime: str = "/proc/uptime") -> list[Event]:
    """The VM's boot (its kernel's start: now less the uptime) and the agent's start, now."""
    at = time.time() if now is None else now
    events = []
    try:
        with open(uptime) as f:
            events.append(Event("boot", at - float(f.read().split()[0])))
    except (OSError, ValueError, IndexError):
        pass  # no /proc (not Linux): the boot's window starts at the agent
    events.append(Event("agentStart", at))
    return events


class Recorder:
    """One run's events on this VM; `record` adds one, `line` reads a program's output line."""

    def __init__(self, run_id: str, vm: str, trusted: bool, status: Folder, log: Log, write: bool = True):
        self.run_id, self.vm, self.trusted = run_id, vm, trusted
        self.status, self.log, self.write_enabled = status, log, write
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._first_step_seen = False
        self._step_index: int | None = None  # where the attempt's moving `step` event is
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

    def record(self, kind: str, step: int | None = None, seconds: float | None = None, code: int | None = None) -> None:
        with self._lock:
            if kind == "programStart":
                self._first_step_seen, self._step_index = False, None
            self.events.append(Event(kind, time.time(), step, seconds, code))
            self._write()

    def extend(self, events: list[Event]) -> None:
        with self._lock:
            self.events.extend(events)
            self._write()

    def line(self, text: str) -> None:
        """A program's output line: a step line adds an event (or moves the attempt's `step` along)."""
        found = step_line(text)
        if found is None:
            return
        step, message = found["step"], found.get("message")
        seconds = found.get("seconds")
        seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None
        if message == RESTORED_MESSAGE:
            self.record("restored", step=step)
        elif message == CHECKPOINT_MESSAGE:
            self.record("checkpoint", step=step, seconds=None if seconds is None else max(0.0, seconds))
        elif not self._first_step_seen:
            self._first_step_seen = True
            self.record("firstStep", step=step)
        else:
            with self._lock:
                if self._step_index is not None:
                    del self.events[self._step_index]
                self.events.append(Event("step", time.time(), step=step))
                self._step_index = len(self.events) - 1
                if time.time() - self._written_at >= STEP_WRITE_S:
                    self._write()

    def _write(self) -> None:
        if not self.write_enabled:
            return
        self._written_at = time.time()
        record = RunEvents(self.run_id, self.vm, tuple(self.events), self.trusted).to_json()
        try:
            self.status.write_json(timeline_name(self.run_id), record)
        except (StorageError, OSError) as error:  # a lost timeline write must not stop the run
            self.log(f"could not write run {self.run_id}'s timeline: {error}", severity="WARNING", run=self.run_id)
