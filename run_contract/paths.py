"""Where the run contract's objects live: sources in the artifacts bucket; per VM, in the run-status bucket,
the completion marker, the run states and the researchers' requests; per researcher (member), their own
folders. A member key holds '@' (an email) and no stack run id does, so a researcher's prefixes never meet
the stack run's."""

from __future__ import annotations

import hashlib
import re

from run_contract.names import MEMBER_ADDRESS, RESEARCHER

SOURCES_PREFIX = "sources/"  # in the artifacts bucket: `sources/<sha256>.tar.gz`, named by content
# The runner (the VM agent and the run contract, infra/tpu/metadata.py agent_package): `runners/<sha256>.tar.gz`, a
# prefix only `pulumi up` writes (researchers upload under `sources/`), so the readers of every runner a
# queued or restarted run still pins are granted the prefix, not the current deploy's object alone.
RUNNERS_PREFIX = "runners/"
MEMBER_KEY = re.compile(rf"(user|group)-({MEMBER_ADDRESS})")


def source_object(sha256: str, prefix: str = SOURCES_PREFIX) -> str:
    """A packaged source folder in the artifacts bucket, named by its content: under `sources/`, the runner under
    `runners/`, a GKE team's folder sources under the team's own prefix (infra/naming.py team_sources_prefix)."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"{prefix}{sha256}.tar.gz"


def status_prefix(vm: str) -> str:
    """A VM's folder in the run-status bucket; its completion marker is `<prefix>COMPLETE`."""
    return f"{vm}/"


def requests_prefix(vm: str) -> str:
    """Where researchers' run and stop requests for one VM wait for its agent."""
    return f"{status_prefix(vm)}requests/"


def runs_prefix(vm: str) -> str:
    """Where the agent writes `<runId>/status.json` for each run of one VM."""
    return f"{status_prefix(vm)}runs/"


def status_name(run_id: str, worker_id: int = 0) -> str:
    """A run's state under its VM's folder: worker 0 keeps the run's; another worker of a slice its own."""
    leaf = "status.json" if worker_id == 0 else f"status-worker-{worker_id}.json"
    return f"runs/{run_id}/{leaf}"


def timeline_name(run_id: str) -> str:
    """A run's events (run_contract/timeline.py RunEvents), next to its state: written by worker 0's agent."""
    return f"runs/{run_id}/timeline.json"


def member_key(member: str) -> str:
    """`user:alice@acme.example` -> `user-alice@acme.example`: the path part of a researcher's folders."""
    if not RESEARCHER.fullmatch(member):
        raise ValueError(f"not a researcher member: {member!r}")
    return member.replace(":", "-", 1)


def member_of_key(key: str) -> str | None:
    """The member a folder's name stands for, or None when it names none."""
    match = MEMBER_KEY.fullmatch(key)
    return f"{match[1]}:{match[2]}" if match else None


def member_requests_prefix(vm: str, member: str) -> str:
    """Where `member` puts run and stop requests for `vm` (their own grant: new objects here only)."""
    return f"{requests_prefix(vm)}{member_key(member)}/"


def member_runs_prefix(vm: str, member: str) -> str:
    """Where the agent writes the states of `member`'s runs on `vm` (theirs to read, nobody's to write)."""
    return f"{runs_prefix(vm)}{member_key(member)}/"


def vm_objects_prefix(workload: str, vm: str) -> str:
    """A VM's objects in the checkpoints and models buckets: its stack run's and its researchers' runs'."""
    return f"{workload}/{vm}/"


def member_objects_prefix(workload: str, vm: str, member: str) -> str:
    """`member`'s runs on `vm` in the checkpoints and models buckets: `<prefix><runId>/` each."""
    return f"{vm_objects_prefix(workload, vm)}{member_key(member)}/"


def researcher_log(member: str) -> str:
    """The log a researcher's runs' output goes to, and the id of the log view that shows only it: letters,
    digits, '-' (a log id may not hold '@'; a view id is at most 100 characters)."""
    return "tpu-runs-" + hashlib.sha256(member.encode()).hexdigest()[:16]


def guard_prefix(environment: str) -> str:
    """The guard's own records in the run-status bucket (its recovery counts, the nodes' states): no VM's
    folder, so no agent or run writes there."""
    return f"_tpu-guard/{environment}/"


def node_states_name(environment: str, node: str) -> str:
    """A node's changes of state as the guard saw them (run_contract/timeline.py NodeStates)."""
    return f"{guard_prefix(environment)}nodes/{node}.json"
