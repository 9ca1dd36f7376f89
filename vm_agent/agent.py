"""The agent's loop: take desired runs from the sources, run one at a time, stop it cleanly for the next.

- Each source is waited on in its own thread (the metadata server holds a request until the value
  changes), so a change and the agent's own SIGTERM are acted on at once.
- A new desired run (another run id, or the same id with changed settings: another spec digest)
  first stops the current one: SIGTERM, the program checkpoints and exits 75, then the new one starts.
- A run already ended for this very spec (its status.json says finished or failed with the same
  digest, or `COMPLETE` names it) is not started again after a reboot; a finished stack run's
  `COMPLETE` is written again, so the guard stops or deletes this VM once more (as runlib's
  `announce` did in the start-up script).
- SIGTERM to the agent (shutdown, preemption) stops the run the same way and exits 0.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
from typing import Any, Callable, Union

from vm_agent import telemetry
from vm_agent.gcs import Folder, Storage, StorageError
from vm_agent.runner import COMPLETE, Run, completion_marker, status_name, utc_now
from vm_agent.settings import Settings
from vm_agent.sources import MetadataSource, RunSource, RunSpec, SpecError, StopRequest

Desired = Union[RunSpec, StopRequest, SpecError]


def log(message: str, severity: str = "INFO", **fields: Any) -> None:
    """One JSON line on stdout (the journal; Cloud Logging parses it)."""
    entry = {"severity": severity, "message": message, "component": "tpu-platform-agent", **fields}
    print(json.dumps(entry, default=str), flush=True)


class Agent:
    def __init__(
        self,
        settings: Settings,
        sources: list[RunSource],
        storage: Storage | None = None,
        poll_s: float = 60,
        ship: Callable[[str, RunSpec], None] = telemetry.ship,
    ):
        self.settings = settings
        self.sources = sources
        self.storage = storage or Storage()
        self.status = Folder(settings.status_dir, self.storage)
        self.poll_s = poll_s
        self.ship = ship
        self.current: Run | None = None
        self.stopping = threading.Event()
        self._desired: queue.Queue[Desired] = queue.Queue()

    def run(self) -> int:
        log(
            f"agent for {self.settings.stack}/{self.settings.vm} (worker {self.settings.worker_id} of "
            f"{self.settings.worker_count}) waiting for runs"
        )
        for number, source in enumerate(self.sources):
            threading.Thread(target=self._watch, args=(source,), name=f"source-{number}", daemon=True).start()
        while not self.stopping.is_set():
            try:
                desired = self._desired.get(timeout=0.2)
            except queue.Empty:
                continue
            self.handle(desired)
        if self.current is not None:
            self.current.stop("the agent is stopping (shutdown or preemption)")
        log("agent stopped")
        return 0

    def _watch(self, source: RunSource) -> None:
        while not self.stopping.is_set():
            try:
                desired = source.next(self.poll_s)
            except SpecError as error:
                self._desired.put(error)
                continue
            except Exception as error:
                log(f"{type(source).__name__} failed: {error!r}", severity="ERROR")
                self.stopping.wait(5)
                continue
            if desired is not None:
                self._desired.put(desired)

    def handle(self, desired: Desired) -> None:
        current = self.current
        if isinstance(desired, SpecError):
            log(str(desired), severity="ERROR", run=desired.run_id, problems=desired.problems)
            # Its state says why, unless that id is the run going on (which keeps going) or has a
            # state already (a finished run's record is not overwritten by a later bad spec).
            name = status_name(desired.run_id, self.settings.worker_id)
            running = current is not None and current.spec.run_id == desired.run_id
            if desired.run_id and not running and self._read(name) is None:
                record = {"runId": desired.run_id, "state": "failed", "exitCode": None, "startedAt": None,
                          "endedAt": utc_now(), "error": str(desired), "updatedAt": utc_now()}  # fmt: skip
                self._write(name, record)
            return
        if isinstance(desired, StopRequest):
            if current is not None and current.spec.run_id == desired.run_id:
                if not current.done():
                    current.stop("a stop was requested")
                self.current = None  # asked for again later, it starts again (and resumes)
            return
        if current is not None and current.spec.fingerprint == desired.fingerprint:
            return  # the same desired run: nothing changed
        if current is not None and not current.done():
            current.stop(f"the desired run changed to {desired.run_id}")
        if self._already_ended(desired):
            self.current = None
            return
        self.current = Run(desired, self.settings, self.status, self.storage, log, self.ship)
        log(f"starting run {desired.run_id}", run=desired.run_id, source=desired.source.describe())
        self.current.start()

    def _already_ended(self, spec: RunSpec) -> bool:
        """Ended before (a reboot, an agent restart): not started again for the same spec."""
        try:
            marker = self.status.read(COMPLETE) if spec.completion else None
            state = self.status.read(status_name(spec.run_id, 0))
        except StorageError as error:
            log(f"cannot read the run's state ({error}); starting it", severity="WARNING", run=spec.run_id)
            return False
        marked = _field(marker, "runId") == spec.run_id
        previous = _json(state)
        ended = previous.get("state") in ("finished", "failed") and previous.get("specSha256") == spec.fingerprint
        if not (marked or ended):
            return False
        finished = marked or previous.get("state") == "finished"
        log(f"run {spec.run_id} already {'finished' if finished else 'failed'}; not starting it again", run=spec.run_id)
        if finished and spec.completion and self.settings.worker_id == 0:
            # Told again: the marker's new generation makes the guard stop or delete this VM again.
            self._write(COMPLETE, _json(marker) or completion_marker(spec, None, {}))
        return True

    def _read(self, name: str) -> bytes | None:
        try:
            return self.status.read(name)
        except StorageError as error:
            log(f"cannot read {self.status.url}/{name}: {error}", severity="WARNING")
            return None

    def _write(self, name: str, record: Any) -> None:
        try:
            self.status.write(name, json.dumps(record, sort_keys=True).encode())
        except (StorageError, OSError) as error:
            log(f"could not write {self.status.url}/{name}: {error}", severity="WARNING")


def _json(data: bytes | None) -> dict:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _field(data: bytes | None, key: str) -> Any:
    return _json(data).get(key)


def main(environ: dict | None = None) -> int:
    import os

    from vm_agent.settings import SettingsError

    environ = dict(os.environ) if environ is None else environ
    try:
        settings = Settings.from_environ(environ)
    except SettingsError as error:
        log(f"FATAL: {error}", severity="CRITICAL")
        return 78  # a configuration error: systemd does not restart it (RestartPreventExitStatus)
    storage = Storage(environ=environ)
    sources: list[RunSource] = [MetadataSource(settings.metadata_url, settings.allowed, log=log)]
    if settings.self_service:
        log("TPU_PLATFORM_SELF_SERVICE=1, but this agent reads no request queue yet", severity="WARNING")
    agent = Agent(settings, sources, storage, poll_s=float(environ.get("TPU_PLATFORM_POLL_SECONDS", "") or 60))
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stopping.set())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
