"""Researchers' run and stop requests, taken in name order from the VM's folder of the status bucket.

`RequestSource` is a `RunSource` (docs/run-contract.md): `next(timeout_s)` lists
`gs://<status-bucket>/<vm>/requests/` through the Cloud Storage JSON API and returns the first request
it can take: a `RunSpec`, a `StopRequest`, or None when nothing new came within `timeout_s`.

Whose a request is: the folder it is in. Each researcher (an IAM member, `user:` or `group:`) may create
new objects only under `<vm>/requests/<member>/` (infra/researchers.py; `<member>` is
`sources.member_key`, e.g. `user-alice@acme.example`), so the folder, which IAM holds to that member,
says who asks; a `requester` in the request must agree with it. A request's run is that member's: its
id is `<member>/<runId>` (two researchers may both call a run `exp-1`), its state
`<vm>/runs/<member>/<runId>/status.json` (theirs to read, nobody's but the agent's to write), its
checkpoints and model `<bucket>/<workload>/<vm>/<member>/<runId>/` (`RunPlaces`: never the stack run's
`<workload>/<vm>/<run>/`, whose run id holds no '@'). A stop request in a member's folder names a run
of that member: it can stop no one else's.

Taking a request, so that a reboot never replays it: the agent first creates the run's state
("queued", with the request's object name) with `ifGenerationMatch=0`, which succeeds once per run id;
then it deletes the request (the bucket is versioned, so the request's bytes stay as a noncurrent
version for audit). A run id with a state already is never started again: after a crash between the
two steps the request is found taken and only deleted.

Refused, recorded as a failed run state with the reason (never a crash): a request on a VM whose
stack does not allow self-service (TPU_PLATFORM_SELF_SERVICE=0), a request not for this VM (an
object whose name is not `<vm>/requests/<member>/<UTC yyyymmddThhmmssZ>-[stop-]<runId>.json` for this
VM, or whose runId differs from its name's, or whose requester is not the folder's member), a malformed
one, a source outside the stack's artifacts bucket (`sources/<sha256>.tar.gz`) or Artifact Registry
repository (pinned by digest), a run id already used by that member. A refusal whose run id is unusable
or taken is recorded as `runs/<member>/refused-<request name>/` (or `runs/refused-…` without a member).

A request is parsed by the run contract (run_contract/request.py `parse_request`: the one run-spec parser
with a request's own rules on top) into its `RunSpec`; its checkpoint and model dirs are the platform's
(`RunPlaces`), never the researcher's.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from run_contract import lines
from run_contract.names import REQUEST_RUN_ID
from run_contract.paths import member_of_key, requests_prefix, runs_prefix, status_name, status_prefix
from run_contract.request import REQUEST_NAME, RunPlaces, parse_request
from run_contract.spec import Allowed, RunSpec, SpecError, StopRequest
from run_contract.status import RESUMABLE

from vm_agent.gcs import Folder, Storage, StorageError, split_gs, vm_credentials
from vm_agent.runner import utc_now
from vm_agent.settings import Settings


class RequestSource:
    """Run and stop requests for one VM, oldest first; see the module's docstring for what is refused."""

    def __init__(
        self,
        status_dir: str,
        artifacts: str,
        registry: str,
        *,
        self_service: bool,
        storage: Storage | None = None,
        places: RunPlaces | None = None,
        poll_s: float = 10.0,
        log: Callable[[str], None] | None = None,
        refusal: str = "",
    ):
        bucket, self.vm = split_gs(status_dir)
        if not self.vm or "/" in self.vm:
            raise ValueError(f"TPU_PLATFORM_STATUS_DIR {status_dir!r}: gs://<status-bucket>/<vm>")
        self.allowed = Allowed(artifacts.rstrip("/"), registry.rstrip("/"))
        self.places = places or RunPlaces("", "", "", self.vm)
        self.self_service = self_service
        self.refusal = refusal  # why every request here is refused, beyond self-service being off
        self.bucket = Folder(f"gs://{bucket}", storage)  # the whole status bucket: names are object names
        self.poll_s = poll_s
        self.prefix = requests_prefix(self.vm)
        self.log = log or (lambda line: lines.line(f"requests: {line}", sys.stderr))

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        environ: Mapping[str, str],
        log: Callable[[str], None] | None = None,
        credentials: Any = None,
    ) -> RequestSource:
        """From agent.env, as `Settings` parsed it (docs/run-contract.md); `environ` only for an emulator.
        `credentials`: the VM account's (vm_credentials) unless given, with an emulator too."""
        storage = Storage(credentials or vm_credentials(), environ)
        places = RunPlaces(settings.checkpoints, settings.models, settings.workload, split_gs(settings.status_dir)[1])
        refusal = ""
        if settings.worker_count > 1:
            # Every worker of a slice would have to run it; only worker 0 takes requests. Not built yet.
            refusal = (
                f"TPU VM {settings.vm} is a slice of {settings.worker_count} hosts: self-service runs are "
                "single-host only for now"
            )
        return cls(
            settings.status_dir,
            settings.artifacts,
            settings.registry,
            self_service=settings.self_service,
            storage=storage,
            places=places,
            # Where self-service is off the folder is read only to refuse what appears there.
            poll_s=min(10.0, settings.poll_s) if settings.self_service else settings.poll_s,
            log=log,
            refusal=refusal,
        )

    def next(self, timeout_s: float) -> RunSpec | StopRequest | None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = self._poll()
            except (StorageError, OSError, ValueError) as error:  # the network or the API: try again next time
                self.log(f"listing {self.prefix} failed: {error}")
                found = None
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(self.poll_s, left))

    def unfinished(self) -> list[RunSpec]:
        """Requests taken before a reboot whose runs have not ended (queued, or stopped by the VM's
        shutdown or preemption: their state says `queued`/`running`/`retry`), oldest first, to resume:
        their request objects are gone, and their states keep the request (`spec`)."""
        if not self.self_service or self.refusal:
            return []
        found: list[tuple[str, RunSpec]] = []
        for name in self.bucket.names(runs_prefix(self.vm)):
            if not name.endswith("/status.json"):
                continue
            state = self.bucket.read_json(name)
            request, data = state.get("request"), state.get("spec")
            if state.get("state") not in RESUMABLE or not isinstance(request, str) or not isinstance(data, dict):
                continue
            match = REQUEST_NAME.fullmatch(request[len(self.prefix) :]) if request.startswith(self.prefix) else None
            member = member_of_key(match["member"]) if match else None
            if member is None:
                self.log(f"not resuming {name}: its request {request} is in no member's folder")
                continue
            try:
                spec = parse_request(data, request, self.allowed, self.places, member)
            except SpecError as error:  # the stack changed meanwhile (another artifacts bucket, ...)
                self.log(f"not resuming {name}: {error}")
                continue
            found.append((request, replace(spec, request=request)))
        return [spec for _, spec in sorted(found, key=lambda pair: pair[0])]

    def state_name(self, run_id: str) -> str:
        return status_prefix(self.vm) + status_name(run_id)

    def _poll(self) -> RunSpec | StopRequest | None:
        for name in sorted(self.bucket.names(self.prefix)):
            taken = self._take(name)
            if taken is not None:
                return taken
        return None

    def _take(self, name: str) -> RunSpec | StopRequest | None:
        base = name[len(self.prefix) :]
        match = REQUEST_NAME.fullmatch(base)
        member = member_of_key(match["member"]) if match else None
        if match is None or member is None:
            return self._refuse(
                name,
                None,
                None,
                f"not a request for VM {self.vm}: the name must be "
                f"{self.prefix}<member>/<UTC yyyymmddThhmmssZ>-[stop-]<runId>.json, <member> "
                "as user-EMAIL or group-EMAIL",
            )
        owner = match["member"]
        raw = self.bucket.read(name)
        if raw is None:
            return None  # taken meanwhile
        try:
            data = json.loads(raw)
        except ValueError:
            return self._refuse(name, None, None, "not JSON", owner)
        if not self.self_service or self.refusal:
            run = None if match["stop"] or not isinstance(data, dict) else data.get("runId")
            off = f"TPU VM {self.vm} does not take self-service runs (its stack sets selfService: false)"
            why = self.refusal or off
            return self._refuse(name, f"{owner}/{run}" if run == match["run"] else None, data, why, owner)
        if match["stop"]:
            if not (isinstance(data, dict) and set(data) == {"stop"} and data["stop"] == match["run"]):
                return self._refuse(name, None, data, f'a stop request is {{"stop": "{match["run"]}"}}', owner)
            self.bucket.delete(name)
            self.log(f"stop {owner}/{match['run']} (requested by {name})")
            return StopRequest(f"{owner}/{match['run']}")  # only a run of the same member can have this id
        try:
            spec = parse_request(data, name, self.allowed, self.places, member)
            if spec.run_id != f"{owner}/{match['run']}":
                raise SpecError(
                    f"request {name}",
                    [f"runId {spec.run_id.split('/', 1)[1]!r} is not the one in the request's name ({match['run']!r})"],
                    spec.run_id,
                )
        except SpecError as error:
            run = data.get("runId") if isinstance(data, dict) else None
            key = f"{owner}/{run}" if isinstance(run, str) and REQUEST_RUN_ID.fullmatch(run) else None
            return self._refuse(name, key, data, "; ".join(error.problems), owner)
        spec = replace(spec, request=name)
        state = {
            "runId": spec.run_id,
            "state": "queued",
            "exitCode": None,
            "startedAt": None,
            "endedAt": None,
            "requester": spec.requester,
            "source": spec.source.describe(),
            "request": name,
            "queuedAt": utc_now(),
            "spec": data,  # the request itself: a reboot resumes the run from here (`unfinished`)
        }
        # Read first, then create with ifGenerationMatch=0: the read is what the sandbox can show (the
        # emulator ignores preconditions); the precondition closes the race on Cloud Storage, where a
        # create with ifGenerationMatch=0 fails with 412 if the object exists (docs: request preconditions).
        existing = self._state(spec.run_id)
        if existing or not self.bucket.create(self.state_name(spec.run_id), json.dumps(state).encode()):
            existing = existing or self._state(spec.run_id)
            if existing.get("request") == name:
                self.bucket.delete(name)  # taken before a restart: never replayed
                return None
            return self._refuse(name, None, data, f"run id {spec.run_id!r} was used before on {self.vm}", owner)
        self.bucket.delete(name)
        self.log(f"run {spec.run_id} from {spec.requester} (request {name})")
        return spec

    def _state(self, run_id: str) -> dict[str, Any]:
        return self.bucket.read_json(self.state_name(run_id))

    def _refuse(self, name: str, run_id: str | None, data: Any, reason: str, owner: str = "") -> None:
        """Record the refusal as a failed run state (in the folder of the member whose request it was, when
        its name says), then drop the request; never raises for the request."""
        base = name.rsplit("/", 1)[-1]
        base = base[: -len(".json")] if base.endswith(".json") else base
        requester = data.get("requester") if isinstance(data, dict) else None
        record = {
            "state": "failed",
            "exitCode": None,
            "startedAt": None,
            "endedAt": utc_now(),
            "reason": reason,
            "requester": requester if isinstance(requester, str) else None,
            "source": None,
            "request": name,
        }
        key = run_id if run_id and not self._state(run_id) else None
        written = key is not None and self.bucket.create(
            self.state_name(key), json.dumps({"runId": key, **record}).encode()
        )
        if not written:
            key = (f"{owner}/" if owner else "") + "refused-" + re.sub(r"[^a-z0-9-]", "-", base.lower())[:60]
            self.bucket.create(self.state_name(key), json.dumps({"runId": key, **record}).encode())
        self.bucket.delete(name)
        self.log(f"refused {name}: {reason}")
        return None
