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

Self-service requests (vm_agent/run_requests.py), beside the stack's run, where agent.env says
`TPU_PLATFORM_SELF_SERVICE=1` (elsewhere the request folder is still read, more slowly, so that a
request there is refused and recorded as failed rather than left waiting for ever):
- The stack's run comes first. It is the reviewed use of this capacity (a PR, a plan, a budget); a
  request is an experiment on capacity lent while the stack does not need it. So requests run, one
  at a time in the order they were taken (their object names' UTC stamps), only while the stack has
  no run going: none in metadata, or the stack's run has ended (finished, failed or stopped).
- A stack run that appears while a request runs stops that request cleanly (SIGTERM, checkpoint,
  exit 75); its state goes back to `queued` (with why) and it resumes first, from its checkpoint,
  once the stack's run has ended. Requests never preempt each other: a new one waits its turn.
- A stop request stops the named self-service run (or drops it from the queue, recorded `stopped`);
  it never touches the stack's run (whose id a request cannot even name: run_requests.py RUN_ID).
- The VM shutting down (or preempted) stops a request's run the same way and leaves it `queued`;
  the next boot resumes it first (its request object is gone; its state keeps the request: `spec`).
- A request's run writes no COMPLETE (the VM is shared capacity and stays up; its spec cannot ask
  for completion) and keeps its `request` in status.json (the researcher side reads it).
"""

from __future__ import annotations

import collections
import json
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from run_contract import completion_marker as marker_schema
from run_contract import lines
from run_contract.paths import status_name
from run_contract.spec import RunSpec, SpecError, StopRequest

from vm_agent import telemetry
from vm_agent import timeline as run_timeline
from vm_agent.firewall import Firewall, FirewallError
from vm_agent.gcs import Folder, Storage, StorageError, vm_credentials
from vm_agent.isolation import UID_FIRST, UID_LAST, Isolation
from vm_agent.metadata_proxy import MetadataProxy, tpu_environment
from vm_agent.run_requests import RequestSource
from vm_agent.runner import COMPLETE, Run, completion_marker, utc_now
from vm_agent.settings import Settings
from vm_agent.sources import MetadataSource, RunSource

Desired = RunSpec | StopRequest | SpecError
FROM_STACK, FROM_REQUESTS = "stack", "requests"


def log(message: str, severity: str = "INFO", **fields: Any) -> None:
    """One JSON line on stdout (the journal; Cloud Logging parses it)."""
    entry = {"severity": severity, "message": message, "component": "tpu-platform-agent", **fields}
    lines.line(json.dumps(entry, default=str))


class Agent:
    def __init__(
        self,
        settings: Settings,
        sources: list[RunSource],
        storage: Storage | None = None,
        ship: Callable[[str, RunSpec], None] = telemetry.ship,
        requests: RequestSource | None = None,
        isolation: Isolation | None = None,
    ):
        self.settings = settings
        self.isolation = isolation or Isolation.of(settings)
        self.sources = sources  # the stack's desired run (metadata)
        self.requests = requests  # researchers' run and stop requests
        self.storage = storage or Storage()
        self.status = Folder(settings.status_dir, self.storage)
        self.poll_s = settings.poll_s
        self.ship = ship
        self.current: Run | None = None
        self.stack_spec: RunSpec | None = None  # the stack's run while it is desired and has not ended
        self.pending: collections.deque[RunSpec] = collections.deque()  # taken requests, oldest first
        self.stopping = threading.Event()
        # The boot's and the agent's start, for the first run's timeline: the kernel's uptime under the VM's root
        # (`/proc/uptime` on a VM; the tests' sandbox VM keeps its own).
        self._opening = run_timeline.boot_events(uptime=str(settings.root / "proc" / "uptime"))
        self._desired: queue.Queue[tuple[str, Desired]] = queue.Queue()

    def run(self) -> int:
        log(
            f"agent for {self.settings.stack}/{self.settings.vm} (worker {self.settings.worker_id} of "
            f"{self.settings.worker_count}) waiting for runs"
        )
        watched: list[tuple[str, RunSource]] = [(FROM_STACK, source) for source in self.sources]
        if self.requests is not None:
            watched.append((FROM_REQUESTS, self.requests))
            try:
                self.pending.extend(self.requests.unfinished())  # taken before a reboot: resumed first
            except (StorageError, OSError, ValueError) as error:
                log(f"cannot read the request runs to resume: {error}", severity="WARNING")
            for spec in self.pending:
                log(f"request {spec.request} resumes after a restart", run=spec.run_id)
        for number, (origin, source) in enumerate(watched):
            threading.Thread(target=self._watch, args=(origin, source), name=f"source-{number}", daemon=True).start()
        while not self.stopping.is_set():
            try:
                origin, desired = self._desired.get(timeout=0.2)
            except queue.Empty:
                self.advance()
                continue
            if origin == FROM_REQUESTS:
                self.handle_request(desired)
            else:
                self.handle(desired)
            self.advance()
        if self._is_request(self.current) and self.current is not None and not self.current.done():
            # Its request object is gone: its state (queued again) is what the next boot resumes.
            self._preempt(self.current, "the agent is stopping (shutdown or preemption)")
        elif self.current is not None:
            self.current.stop("the agent is stopping (shutdown or preemption)")
        log("agent stopped")
        return 0

    def _watch(self, origin: str, source: RunSource) -> None:
        while not self.stopping.is_set():
            try:
                desired = source.next(self.poll_s)
            except SpecError as error:
                self._desired.put((origin, error))
                continue
            except Exception as error:
                log(f"{type(source).__name__} failed: {error!r}", severity="ERROR")
                self.stopping.wait(5)
                continue
            if desired is not None:
                self._desired.put((origin, desired))

    @staticmethod
    def _is_request(run: Run | None) -> bool:
        return run is not None and bool(run.spec.request)

    def handle(self, desired: Desired) -> None:
        """The stack's desired run changed (metadata)."""
        current = self.current
        if isinstance(desired, SpecError):
            log(str(desired), severity="ERROR", run=desired.run_id, problems=desired.problems)
            # Its state says why, unless that id is the run going on (which keeps going) or has a
            # state already (a finished run's record is not overwritten by a later bad spec).
            name = status_name(desired.run_id, self.settings.worker_id)
            running = current is not None and current.spec.run_id == desired.run_id
            if desired.run_id and not running and self._read(name) is None:
                record = {
                    "runId": desired.run_id,
                    "state": "failed",
                    "exitCode": None,
                    "startedAt": None,
                    "endedAt": utc_now(),
                    "error": str(desired),
                    "updatedAt": utc_now(),
                }
                self._write(name, record)
            return
        if isinstance(desired, StopRequest):
            if self.stack_spec is not None and self.stack_spec.run_id == desired.run_id:
                self.stack_spec = None
            if current is not None and not self._is_request(current) and current.spec.run_id == desired.run_id:
                if not current.done():
                    current.stop("a stop was requested")
                self.current = None  # asked for again later, it starts again (and resumes)
            return
        if current is not None and current.spec.fingerprint == desired.fingerprint:
            return  # the same desired run: nothing changed
        if current is not None and not current.done():
            if self._is_request(current):
                self._preempt(current, f"the stack's run {desired.run_id} comes first")
            else:
                current.stop(f"the desired run changed to {desired.run_id}")
        self.current = None
        self.stack_spec = None
        if self._already_ended(desired):
            return
        self.stack_spec = desired
        self._start(desired)

    def handle_request(self, desired: Desired) -> None:
        """A researcher's request, taken by the RequestSource (which refused and recorded the rest)."""
        if isinstance(desired, RunSpec):
            self.pending.append(desired)
            log(
                f"request {desired.request} queued ({len(self.pending)} waiting)",
                run=desired.run_id,
                requester=desired.requester,
            )
        elif isinstance(desired, StopRequest):
            current = self.current
            if self._is_request(current) and current is not None and current.spec.run_id == desired.run_id:
                if not current.done():
                    current.stop("its requester asked to stop it")
                return
            for spec in list(self.pending):
                if spec.run_id == desired.run_id:
                    self.pending.remove(spec)
                    self._write(
                        status_name(spec.run_id, self.settings.worker_id),
                        {
                            "runId": spec.run_id,
                            "state": "stopped",
                            "exitCode": None,
                            "startedAt": None,
                            "endedAt": utc_now(),
                            "requester": spec.requester,
                            "source": spec.source.describe(),
                            "request": spec.request,
                            "error": "stopped before it started",
                            "updatedAt": utc_now(),
                        },
                    )
                    log(f"request {spec.run_id} stopped before it started", run=spec.run_id)
                    return
            log(f"stop {desired.run_id}: no such self-service run going or waiting here", severity="WARNING")
        elif isinstance(desired, SpecError):  # RequestSource records its refusals itself; just in case
            log(str(desired), severity="ERROR", run=desired.run_id, problems=desired.problems)

    def advance(self) -> None:
        """When nothing runs: the next request, unless the stack's run is still going."""
        current = self.current
        if current is not None and not current.done():
            return
        if current is not None and current.spec is self.stack_spec:
            self.stack_spec = None  # the stack's run ended: the capacity is free for requests
        if self.stack_spec is not None or not self.pending or self.stopping.is_set():
            return
        self._start(self.pending.popleft())

    def _start(self, spec: RunSpec) -> None:
        opening, self._opening = self._opening, []
        self.current = Run(spec, self.settings, self.status, self.storage, log, self.ship, self.isolation, opening)
        log(f"starting run {spec.run_id}", run=spec.run_id, source=spec.source.describe(), requester=spec.requester)
        self.current.start()

    def _preempt(self, run: Run, reason: str) -> None:
        """Stop a request's run for the stack's; it waits at the head of the queue to resume."""
        run.stop(reason)
        if run.state == "finished" or run.state == "failed":
            return  # it ended by itself meanwhile
        run.requeue(f"{reason}; it resumes from its checkpoint")
        self.pending.appendleft(run.spec)

    def _already_ended(self, spec: RunSpec) -> bool:
        """Ended before (a reboot, an agent restart): not started again for the same spec."""
        try:
            marker = self.status.read_json(COMPLETE) if spec.completion else {}
            previous = self.status.read_json(status_name(spec.run_id, 0))
        except StorageError as error:
            log(f"cannot read the run's state ({error}); starting it", severity="WARNING", run=spec.run_id)
            return False
        # This run's marker, and a marker (run_contract/completion_marker.py): one of another shape is written anew.
        marked = marker_schema.problem(marker) is None and marker["runId"] == spec.run_id
        ended = previous.get("state") in ("finished", "failed") and previous.get("specSha256") == spec.fingerprint
        if not (marked or ended):
            return False
        finished = marked or previous.get("state") == "finished"
        log(f"run {spec.run_id} already {'finished' if finished else 'failed'}; not starting it again", run=spec.run_id)
        if finished and spec.completion and self.settings.worker_id == 0:
            # Told again: the marker's new generation makes the guard stop or delete this VM again.
            # Its own marker: the one there may be an earlier run's (the status folder is the VM's).
            self._write(COMPLETE, marker if marked else completion_marker(spec, None, {}))
        return True

    def _read(self, name: str) -> bytes | None:
        try:
            return self.status.read(name)
        except StorageError as error:
            log(f"cannot read {self.status.url}/{name}: {error}", severity="WARNING")
            return None

    def _write(self, name: str, record: Any) -> None:
        try:
            self.status.write_json(name, record)
        except (StorageError, OSError) as error:
            log(f"could not write {self.status.url}/{name}: {error}", severity="WARNING")


def main(environ: dict | None = None) -> int:
    import os

    from vm_agent.settings import SettingsError

    environ = dict(os.environ) if environ is None else environ
    try:
        settings = Settings.from_environ(environ)
    except SettingsError as error:
        log(f"FATAL: {error}", severity="CRITICAL")
        return 78  # a configuration error: systemd does not restart it (RestartPreventExitStatus)
    isolation = isolate_runs(settings)
    if isinstance(isolation, str):
        log(f"FATAL: {isolation}; no run starts unisolated", severity="CRITICAL")
        return 78
    try:
        storage = Storage(vm_credentials(), environ)  # the VM account's token, with an emulator too
    except ImportError as error:
        log(f"FATAL: {error}: the agent runs from its own environment (vm_agent/environment.py)", severity="CRITICAL")
        return 78
    log(f"objects through {storage.library}")
    sources: list[RunSource] = [MetadataSource(settings.metadata_url, settings.allowed, log=log)]
    requests = None
    if settings.status_dir.startswith("gs://") and settings.worker_id == 0:  # one taker per VM folder
        requests = RequestSource.from_settings(settings, environ, log=lambda line: log(line, component="requests"))
    elif settings.self_service:
        log("TPU_PLATFORM_SELF_SERVICE=1 needs a gs:// TPU_PLATFORM_STATUS_DIR: no requests read", severity="WARNING")
    agent = Agent(settings, sources, storage, requests=requests, isolation=isolation)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stopping.set())
    try:
        return agent.run()
    finally:
        telemetry.default().close()  # what the last run printed reaches Logging before the unit stops
        if isolation.proxy is not None:
            isolation.proxy.close()


def isolate_runs(settings: Settings) -> Isolation | str:
    """What keeps each run to itself (vm_agent/isolation.py), its own metadata server (vm_agent/metadata_proxy.py)
    and the firewall that sends it there (vm_agent/firewall.py); or why the agent cannot have them."""
    import socket
    import urllib.parse

    problem = Isolation.check()
    if problem:
        return problem
    proxy = MetadataProxy(settings.metadata_url, vm_credentials(), settings.sts_url, log)
    proxy.start()
    redirect = None
    if settings.metadata_redirect:
        where = urllib.parse.urlsplit(settings.metadata_url)
        try:
            address = socket.gethostbyname(where.hostname or "")
            firewall = Firewall(settings.iptables, log)
            firewall.apply(UID_FIRST, UID_LAST, address, where.port or 80, int(proxy.address.rsplit(":", 1)[1]))
            redirect = (firewall, address)
        except (OSError, FirewallError) as error:
            proxy.close()
            return f"the metadata server cannot be redirected for runs: {error}"
    else:
        log(
            "TPU_PLATFORM_METADATA_REDIRECT=0: runs that ignore GCE_METADATA_HOST reach the metadata server "
            "itself (only the tests' shared sandbox may run so)",
            severity="WARNING",
        )
    isolation = Isolation(
        settings.root, settings.uid_locks, settings.devices, proxy=proxy, tpu_env=tpu_environment(settings.metadata_url)
    )
    isolation.redirect = redirect  # containers of image runs: their network's redirect, made with the first one
    isolation.clean_up()
    return isolation


if __name__ == "__main__":
    sys.exit(main())
