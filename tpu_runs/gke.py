"""`tpu-runs` on the GKE engine (`--team`): a researcher's run as their team's JobSet, through the Kubernetes API.

The run spec is the one a VM takes (run_contract/request.py's form, parsed by run_contract/spec.py): an image
pinned by digest, or a folder uploaded under the team's sources (tpu_runs/cli.py) that runs in the stack's
gke.folderImage after a fetch step checks it and the runner by digest (infra/gke/jobsets.py FolderRun). It is rendered
by the platform's one JobSet renderer (infra/gke/jobsets.py run_jobset) for a slice pool of the stack, checked
by the platform's validator against the team's queues as the queues phase renders them (a run its queue
could never admit is refused before any call), then applied with the researcher's own Google login through
the cluster's DNS endpoint (server-side apply, field manager `tpu-runs`). Inside the cluster RBAC decides:
the team's Role (infra/gke/teams.py RESEARCHER_RULES) holds exactly what these commands ask.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra import naming
from infra.config.model import TeamSettings
from infra.config.workload_code import registry
from infra.gke import queues
from infra.gke.crds import JOBSET_API, KUEUE_API, VISIBILITY_API
from infra.gke.jobsets import REQUESTER_ANNOTATION, RUN_LABEL, FolderRun, run_jobset
from infra.gke.quota import QUEUE_LABEL
from infra.gke.specs import shape_of
from infra.gke.validation import platform_validator, validate_all
from infra.startup import Artifact
from infra.tpu.metadata import agent_package
from run_contract.request import REQUEST_FORM
from run_contract.spec import Allowed, FolderSource, SpecError, parse_run_spec
from tpu_runs.gcp import Google

FIELD_MANAGER = "tpu-runs"
JOBSETS = f"/apis/{JOBSET_API}/namespaces/{{ns}}/jobsets"
WORKLOADS = f"/apis/{KUEUE_API}/namespaces/{{ns}}/workloads"
# A LocalQueue's pending Workloads, in the order Kueue will try them (Kueue "Pending Workloads on-demand",
# Local Queue visibility): a PendingWorkloadsSummary whose items name each Workload and its 0-based
# positionInLocalQueue and positionInClusterQueue (kubernetes-sigs/kueue apis/visibility/v1beta2/types.go).
PENDING = f"/apis/{VISIBILITY_API}/namespaces/{{ns}}/localqueues/{{queue}}/pendingworkloads"
# Kueue labels each Workload with the UID of the job it queues (Kueue "Troubleshooting Jobs").
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def pod_label(key: str) -> str:
    """How a pod's label appears on its containers' log entries: `labels."k8s-pod/<key>"`, the key's dots as
    underscores (Cloud Logging's GKE queries, "User-defined Kubernetes labels"; apple/axlearn's
    axlearn/cloud/gcp/jobs/logs.py filters on `k8s-pod/jobset_sigs_k8s_io/job-index`)."""
    return f"k8s-pod/{key.replace('.', '_')}"


# JobSet labels each pod with its JobSet's name (the run id here) and its Job's index in the replicated job (the
# slice); the Job controller with the pod's completion index (its worker in the slice).
RUN_POD_LABEL = pod_label("jobset.sigs.k8s.io/jobset-name")
SLICE_POD_LABEL = pod_label("jobset.sigs.k8s.io/job-index")
WORKER_POD_LABEL = pod_label("batch.kubernetes.io/job-completion-index")


class TeamError(Exception):
    """A team command that cannot be made as asked (said in words, before any call)."""


def team_of(stack: Any, name: str) -> TeamSettings:
    gke = stack.cfg.gke
    teams = gke.teams if gke else ()
    for team in teams:
        if team.name == name:
            return team
    known = ", ".join(t.name for t in teams) or "none"
    raise TeamError(f"stack '{stack.cfg.stack}' has no GKE team {name!r} (it has: {known})")


def _refused(stack: Any, team: TeamSettings, then: str = "wait a minute for the cluster's RBAC to apply it") -> str:
    return (
        f"Members of team {team.name} are listed under tpu-platform:gke.teams in Pulumi.{stack.cfg.stack}.yaml; "
        f"ask its owners to add you, then {then}"
    )


def _cluster(google: Google, stack: Any) -> str:
    cfg = stack.cfg
    return google.kubernetes(cfg.project, cfg.gke.region, naming.gke_cluster(cfg.stack))


def _priority(team: TeamSettings, asked: str | None) -> str:
    names = queues.PRIORITY_NAMES
    if asked is None:  # medium, or the team's ceiling when that is lower
        return names[min(names.index("medium"), names.index(team.priority))]
    if asked not in names or names.index(asked) > names.index(team.priority):
        allowed = ", ".join(names[: names.index(team.priority) + 1])
        raise TeamError(f"--priority {asked!r}: team {team.name} may use {allowed}")
    return asked


def folder_image(stack: Any) -> str:
    """The pinned public image a team's folder source runs in; TeamError when the stack names none."""
    image = stack.cfg.gke.folder_image
    if not image:
        raise TeamError(
            f"stack '{stack.cfg.stack}' names no image for folder sources on the GKE engine: set "
            f"tpu-platform:gke.folderImage in Pulumi.{stack.cfg.stack}.yaml (a public image pinned by digest), "
            "or submit an --image"
        )
    return image


def runner(stack: Any) -> Artifact:
    """The runner a folder source's pods fetch: the VM agent's archive as `pulumi up` uploads it from the checkout
    (infra/tpu/metadata.py agent_package), which is this command's."""
    package = agent_package()
    return Artifact(stack.artifacts, package.object_name, package.sha256)


def check_runner(google: Google, stack: Any, team: TeamSettings) -> None:
    """TeamError unless the stack's artifacts bucket holds the runner this command names: a checkout the stack was
    never deployed from names another, which every pod's fetch step would fail to read. A team's members read
    every runner (infra/gke/team_access.py), so Cloud Storage answers 404 for a runner no deploy uploaded and 403
    only to someone the stack does not count in the team (an IAM condition that is false refuses the call)."""
    wanted = runner(stack)
    # IAM grants take effect within minutes (https://cloud.google.com/iam/docs/access-change-propagation).
    refused = _refused(stack, team, "wait a few minutes for its IAM grants to apply")
    if not google.exists(wanted.bucket, wanted.name, refused=refused):
        raise TeamError(
            f"stack '{stack.cfg.stack}' holds no runner {wanted.uri}: this tpu-runs's vm_agent/ and run_contract/ are "
            f"not what any pulumi up of the stack uploaded, so team {team.name}'s pods could not fetch it; run "
            "tpu-runs from the checkout the stack was deployed from"
        )


def render(stack: Any, team: TeamSettings, args: argparse.Namespace, request: Mapping[str, Any]) -> dict[str, Any]:
    """The run's JobSet, parsed, rendered and checked against the team's queues; TeamError if a cluster
    would refuse it or never admit it."""
    cfg = stack.cfg
    pools = {p.name: p for p in cfg.gke.slice_pools}
    mine = [pool for pool, _ in team.nominal_chips]
    pool_name = args.pool or (mine[0] if len(mine) == 1 else None)
    if pool_name not in pools:
        choices = ", ".join(pools) or "none"
        raise TeamError(f"--pool {pool_name or '(not given)'}: a slice pool of stack '{cfg.stack}' ({choices})")
    allowed = Allowed(
        f"gs://{stack.artifacts}", registry(cfg.region, cfg.project, naming.artifact_repository(cfg.stack))
    )
    try:
        spec = parse_run_spec(json.dumps(request), allowed, f"run {request.get('runId')}", REQUEST_FORM)
    except SpecError as error:
        raise TeamError(str(error)) from None
    folder = None
    if isinstance(spec.source, FolderSource):
        expected = f"gs://{stack.artifacts}/{naming.team_sources_prefix(team.name)}"
        if not spec.source.uri.startswith(expected):
            raise TeamError(f"run {spec.run_id}: a folder source of team {team.name} is an archive under {expected}")
        folder = FolderRun(folder_image(stack), runner(stack))
    shapes = {name: shape_of(pool) for name, pool in pools.items()}
    try:
        jobset = run_jobset(
            spec,
            team,
            shapes[pool_name],
            checkpoints=cfg.bucket_name("checkpoints"),
            models=cfg.bucket_name("models"),
            slices=args.slices,
            priority=_priority(team, args.priority),
            folder=folder,
        )
    except ValueError as error:
        raise TeamError(f"run {spec.run_id} of team {team.name} on pool {pool_name}: {error}") from None
    report = validate_all(
        platform_validator(), [*queues.queue_objects(cfg.gke.teams, shapes), jobset], list(shapes.values())
    )
    if not report.ok:
        problems = "; ".join(f.message for f in report.findings)
        raise TeamError(f"run {spec.run_id} of team {team.name} on pool {pool_name}: {problems}")
    return jobset


def submit(google: Google, stack: Any, team: TeamSettings, args: argparse.Namespace, request: dict[str, Any]) -> int:
    jobset = render(stack, team, args, request)
    base = _cluster(google, stack)
    google.apply(base, JOBSETS.format(ns=team.namespace), jobset, FIELD_MANAGER, _refused(stack, team))
    print(
        f"submitted run {request['runId']} to team {team.name}'s queue ({team.namespace}/{jobset['metadata']['name']})"
    )
    print(f"see it queue: tpu-runs list --stack {stack.cfg.stack} --team {team.name}")
    return 0


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return condition
    return None


def _true(obj: Mapping[str, Any], kind: str) -> bool:
    return (_condition(obj, kind) or {}).get("status") == "True"


def run_state(jobset: Mapping[str, Any], workload: Mapping[str, Any] | None) -> tuple[str, str]:
    """(state, why) of a run from its JobSet's conditions (JobSet: Completed, Failed, Suspended) and its Kueue
    Workload's (Kueue "Troubleshooting Jobs": QuotaReserved, Admitted, Evicted, Finished; the message of a
    QuotaReserved that is False says why it waits: quota, borrowing, priority)."""
    for kind, state in (("Completed", "finished"), ("Failed", "failed")):
        if _true(jobset, kind):
            return state, str((_condition(jobset, kind) or {}).get("message", ""))
    if workload is None:
        return "queued", "Kueue has not queued it yet"
    if _true(workload, "Evicted"):
        return "evicted", str((_condition(workload, "Evicted") or {}).get("message", ""))
    if _true(workload, "Admitted"):
        restarts = (jobset.get("status") or {}).get("restarts", 0)
        return "running", f"restarted {restarts} time(s)" if restarts else ""
    reserved = _condition(workload, "QuotaReserved") or {}
    return "pending", str(reserved.get("message", ""))


def _place(position: Any, where: str) -> str:
    """`#N in <where>` from a 0-based position; a position the answer lacks (or garbles) is said to be unknown."""
    if isinstance(position, int) and not isinstance(position, bool) and position >= 0:
        return f"#{position + 1} in {where}"
    return f"place in {where} unknown"


def queue_positions(summary: Mapping[str, Any] | None) -> dict[str, str]:
    """Each pending Workload's place, by its name, counted from 1: in the team's queue and the ClusterQueue's.
    Kueue always writes both (types.go, no `omitempty`), but the answer comes from whatever serves the path, a
    Kueue of another version or an aggregated API in front of it: a position it lacks reads as unknown, never
    as a traceback."""
    places: dict[str, str] = {}
    for item in (summary or {}).get("items") or ():
        name = (item.get("metadata") or {}).get("name") if isinstance(item, Mapping) else None
        if not name:
            continue
        local = _place(item.get("positionInLocalQueue"), "the team's queue")
        places[name] = f"{local}, {_place(item.get('positionInClusterQueue'), 'its ClusterQueue')}"
    return places


def team_runs(google: Google, base: str, team: TeamSettings, refused: str) -> list[tuple[dict, dict | None]]:
    """The team's runs (its JobSets that `tpu-runs` made), each with its Kueue Workload (None until Kueue
    queues it)."""
    jobsets = google.kube_list(base, JOBSETS.format(ns=team.namespace), f"team {team.name}'s runs", refused, RUN_LABEL)
    workloads = google.kube_list(
        base, WORKLOADS.format(ns=team.namespace), f"team {team.name}'s Kueue workloads", refused
    )
    by_job = {(w["metadata"].get("labels") or {}).get(JOB_UID_LABEL): w for w in workloads}
    return [(jobset, by_job.get(jobset["metadata"].get("uid"))) for jobset in jobsets]


def list_runs(google: Google, stack: Any, team: TeamSettings) -> int:
    """The team's runs (its JobSets that `tpu-runs` made), each with its Kueue state; a pending one with its
    place in the queue and why it waits."""
    base = _cluster(google, stack)
    refused = _refused(stack, team)
    runs = team_runs(google, base, team, refused)
    summary = google.kube_get(
        base, PENDING.format(ns=team.namespace, queue=team.name), f"team {team.name}'s queue in order", refused
    )
    places = queue_positions(summary)
    print(f"team {team.name} ({team.namespace}), queue {team.name}")
    if summary is None:
        print("  (queue positions unknown: the cluster does not serve Kueue's visibility API)")
    for jobset, workload in runs:
        meta = jobset["metadata"]
        state, why = run_state(jobset, workload)
        place = places.get(workload["metadata"]["name"], "") if state == "pending" and workload else ""
        why = "; ".join(filter(None, (place, why)))
        who = (meta.get("annotations") or {}).get(REQUESTER_ANNOTATION, "")
        queue = (meta.get("labels") or {}).get(QUEUE_LABEL, "")
        print(f"  {meta['name']:<32} {state:<9} {who:<30} {queue}" + (f"  ({why})" if why else ""))
    return 0


def stop(google: Google, stack: Any, team: TeamSettings, run_id: str) -> int:
    """Delete the run's JobSet: its pods get SIGTERM and their grace period to checkpoint (Kubernetes
    "Pod termination"), and Kueue frees its quota."""
    base = _cluster(google, stack)
    if not google.kube_delete(base, JOBSETS.format(ns=team.namespace), run_id, f"run {run_id}", _refused(stack, team)):
        raise TeamError(
            f"no run {run_id} in team {team.name} (tpu-runs list --stack {stack.cfg.stack} --team {team.name})"
        )
    print(f"stopping run {run_id} of team {team.name}: its pods get SIGTERM and their grace period to checkpoint")
    return 0


def worker_of(labels: Mapping[str, str]) -> str:
    """`<slice>/<worker>` of a container's log entry, from its pod's labels; "" when it carries none."""
    worker = labels.get(WORKER_POD_LABEL)
    return f"{labels.get(SLICE_POD_LABEL, '?')}/{worker}" if worker is not None else ""


@dataclass(frozen=True)
class LogSource:
    """Where `tpu-runs logs --team` reads a run's output, and how it learns the run has ended."""

    view: str
    filter: str
    refused: str
    ended: Callable[[], tuple[str, int] | None]  # None while the run goes on, else (what to say, exit code)


def refused_data(stack: Any, team: TeamSettings) -> str:
    """What a member refused the team's logs or results should do."""
    return (
        f"Members of team {team.name} read its runs' output and results; they are listed under "
        f"tpu-platform:gke.teams in Pulumi.{stack.cfg.stack}.yaml: ask its owners to add you, then wait a minute "
        "for IAM to apply it"
    )


def log_source(google: Google, stack: Any, team: TeamSettings, run_id: str) -> LogSource:
    """The run's containers' entries in the team's log view (infra/gke/team_access.py), which holds the team's
    namespace's container logs only; the run's end from its JobSet's conditions, looked up lazily (a plain
    `logs` makes no Kubernetes call)."""
    cfg = stack.cfg
    refused = refused_data(stack, team)

    def ended() -> tuple[str, int] | None:
        base = _cluster(google, stack)
        found = google.kube_list(
            base, JOBSETS.format(ns=team.namespace), f"run {run_id}", _refused(stack, team), f"{RUN_LABEL}={run_id}"
        )
        if not found:
            return f"run {run_id} is no longer in team {team.name}'s queue (stopped, or ended and expired)", 1
        state, why = run_state(found[0], None)
        if state in ("finished", "failed"):
            return f"run {run_id} {state}" + (f": {why}" if why else ""), 0 if state == "finished" else 1
        return None

    return LogSource(
        naming.team_log_view(cfg.project, cfg.stack, team.name), f'labels."{RUN_POD_LABEL}"="{run_id}"', refused, ended
    )
