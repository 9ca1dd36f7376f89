"""A researcher's run or stop request (`tpu-runs` -> the VM's agent): its object name, its fields, its parse.

A run request is `<vm>/requests/<member key>/<UTC yyyymmddThhmmssZ>-<runId>.json` in the run-status bucket
(run_contract.paths), a JSON object with REQUEST_FIELDS; a stop request is `...-stop-<runId>.json` holding
`{"stop": "<runId>"}`. The member whose folder it is asks (IAM lets only them create objects there); its
run is theirs: `<member key>/<runId>`, its state under their runs folder, its checkpoints and model under
`RunPlaces`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from run_contract.names import MEMBER_ADDRESS_RULE, REQUEST_RUN_ID, REQUEST_RUN_ID_RULE, RESEARCHER
from run_contract.paths import member_key
from run_contract.spec import Allowed, FolderSource, Form, RunSpec, SpecError, parse_run_spec

REQUEST_NAME = re.compile(
    r"(?P<member>[^/]+)/(?P<ts>[0-9]{8}T[0-9]{6}Z)-(?P<stop>stop-)?(?P<run>[a-z0-9-]{1,40})\.json"
)


# A request is a run spec (run_contract.spec parses it, as it parses the stack's) with fewer fields:
# where the run keeps its checkpoints and model, and whether it ends in COMPLETE, are the platform's
# to say (the agent sets them from agent.env), not the researcher's.
REQUEST_FIELDS = ("runId", "source", "command", "env", "python", "requester")


REQUEST_FORM = Form(
    REQUEST_FIELDS,
    REQUEST_RUN_ID,
    REQUEST_RUN_ID_RULE,
    RESEARCHER,
    f"a researcher's user:EMAIL or group:EMAIL, {MEMBER_ADDRESS_RULE}",
    noun="fields",
)


def parse_request(data: Any, name: str, allowed: Allowed, places: RunPlaces, member: str) -> RunSpec:
    """The run `member`'s request asks for, or a SpecError with every problem: the shared parser's with a
    request's form (its fields, a researcher's run id and requester; unknown keys, reserved
    TPU_PLATFORM_* names, `python` with an image, a source outside the stack's artifacts bucket or
    registry, ...) and a request's own rules (the object named by its digest, an image by digest only, the
    requester the folder's member). Its run id is the member's: `<member key>/<runId>`."""
    where = f"request {name}"
    if not isinstance(data, dict):
        raise SpecError(where, [f"a run request is a JSON object, not {type(data).__name__}"])
    problems: list[str] = []
    spec: RunSpec | None = None
    try:
        spec = parse_run_spec(json.dumps(data), allowed, where, REQUEST_FORM)
    except SpecError as error:
        problems += error.problems
    if spec is not None:
        source = spec.source
        if isinstance(source, FolderSource):
            expected = f"{allowed.artifacts.rstrip('/')}/sources/{source.sha256}.tar.gz"
            if source.uri != expected:
                problems.append(f"source.uri {source.uri!r}: must be the stack's artifacts bucket object {expected}")
        elif not source.by_digest:
            problems.append(f"source.image {source.image!r}: a request's image must be pinned by digest (@sha256:...)")
        if spec.requester != member:
            problems.append(
                f"requester {spec.requester!r}: the request is in the folder of {member}, who alone may write there"
            )
    if problems or spec is None:
        raise SpecError(where, problems, spec.run_id if spec is not None else "")
    run_id = f"{member_key(member)}/{spec.run_id}"
    return replace(spec, run_id=run_id, requester=member, **places.of(run_id))


@dataclass(frozen=True)
class RunPlaces:
    """Where a self-service run keeps its checkpoints and model: `<bucket>/<workload>/<vm>/<member>/<runId>`
    (its run id is `<member>/<runId>`), inside the VM's own prefix `<workload>/<vm>/` that the self-service
    VM's account may write (infra/researchers.py), beside but never under the stack run's; `tpu-runs
    fetch` finds the model there (tpu_runs/cli.py model_prefix). "" where the workload may not write that
    bucket."""

    checkpoints: str  # gs://<checkpoints-bucket> or ""
    models: str  # gs://<models-bucket> or ""
    workload: str
    vm: str

    def of(self, run_id: str) -> dict[str, str]:
        def under(bucket: str) -> str:
            return f"{bucket.rstrip('/')}/{self.workload}/{self.vm}/{run_id}" if bucket and self.workload else ""

        return {"checkpoint_dir": under(self.checkpoints), "model_dir": under(self.models)}
