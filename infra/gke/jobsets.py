"""A team's JobSet on one pool shape, as the platform's rules want it. Pure: settings in, an object out.

The shape xpk's `workload create` renders (gke-tpu reference, "The JobSet"), less what this platform
refuses: one replicated job of `slices` replicas, each an Indexed Job of one pod per VM of the slice, each
pod asking `google.com/tpu` = the VM's chips, selecting the pool's node labels (`SliceShape.node_labels`)
and tolerating the TPU taint, placed one slice per node pool (JobSet's exclusive-topology annotation); the
team's LocalQueue named in Kueue's label; the team's service account; no privilege, no host network
(team namespaces refuse both: infra/gke/teams.py).

The run contract's exit codes (docs/run-contract.md, "Exit codes") hold in pods through two layers. Each
Job fails at its first failed pod (`backoffLimit: 0`); its `podFailurePolicy` fails it with the reason
`PodFailurePolicy` for exit 78 and for a pod lost with its node (the `DisruptionTarget` condition: spot
reclaim, eviction, a node drained), and the Job controller's message names which (kubernetes/kubernetes
pkg/controller/job/pod_failure_policy.go: "Container %s for pod %s/%s failed with exit code %v matching %v
rule at index %d", "Pod %s/%s has condition %v matching %v rule at index %d"). The JobSet's
`failurePolicy` rules, first match wins (JobSet "Failure Policy" page), then restart the whole JobSet
without counting a lost node, fail it at once for 78, and leave anything else (75 without a disruption,
a crash: `BackoffLimitExceeded`) to the default action, RestartJobSet, counted against `maxRestarts`, as
the VM agent counts retries (TPU_PLATFORM_MAX_RETRIES).

`run_jobset` renders a researcher's run spec (run_contract/spec.py) this way, with the contract's
environment: its checkpoint and model folders under the team's prefix (infra/naming.py team_prefix) and
the grace period. The worker's place in its slice is GKE's to say: it injects TPU_WORKER_ID and
TPU_WORKER_HOSTNAMES into an Indexed Job asking for google.com/tpu (gke-tpu reference, "The JobSet"),
which the contract reads (run_contract.names.worker_place) as JAX itself does; the JobSet spells neither
its pods' host names nor their index again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra import naming
from infra.config.model import TeamSettings
from infra.gke.crds import JOBSET_API
from infra.gke.quota import QUEUE_LABEL, TPU_RESOURCE
from infra.gke.specs import SliceShape
from run_contract import names
from run_contract.spec import ImageSource, RunSpec

EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
TTL_SECONDS = 43_200  # xpk's: a finished JobSet is deleted after 12 hours
CONTAINER = "main"
REPLICATED_JOB = "slice"
GRACE_SECONDS = 30  # the run contract's default (TPU_PLATFORM_GRACE_SECONDS)
MAX_RESTARTS = 3  # as the VM agent's TPU_PLATFORM_MAX_RETRIES (infra/tpu/metadata.py MAX_RETRIES)
RUN_LABEL = "tpu-platform/run"  # the run id, on the JobSet: `tpu-runs` finds a run's JobSet by it
REQUESTER_ANNOTATION = "tpu-platform/requester"  # an email is no label value
# The Job's failure reason when a podFailurePolicy FailJob rule matched (batch/v1 JobReasonPodFailurePolicy).
POD_FAILURE_POLICY = "PodFailurePolicy"
DISRUPTION = "DisruptionTarget"

# Job level: the failures that end a Job with reason PodFailurePolicy, each with its own message.
POD_FAILURE_RULES: list[dict[str, Any]] = [
    {
        "action": "FailJob",
        "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [names.EXIT_CONFIG]},
    },
    {"action": "FailJob", "onPodConditions": [{"type": DISRUPTION, "status": "True"}]},
]
# JobSet level: what each Job failure does to the run, first match wins; no match is RestartJobSet (counted).
JOBSET_FAILURE_RULES: list[dict[str, Any]] = [
    {
        "name": "node_lost",
        "action": "RestartJobSetAndIgnoreMaxRestarts",
        "onJobFailureReasons": [POD_FAILURE_POLICY],
        "onJobFailureMessagePatterns": [f".*has condition {DISRUPTION} matching FailJob rule.*"],
    },
    {"name": "run_cannot_succeed", "action": "FailJobSet", "onJobFailureReasons": [POD_FAILURE_POLICY]},
]


def team_jobset(
    team: TeamSettings,
    shape: SliceShape,
    name: str,
    *,
    image: str,
    command: Sequence[str],
    slices: int = 1,
    priority: str = "medium",
    queued: bool = True,
    max_restarts: int = 0,
    env: Sequence[dict[str, Any]] = (),
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    vms = shape.vms_per_slice
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        **({"command": list(command)} if command else {}),  # none: the image's own entrypoint
        **({"env": list(env)} if env else {}),
        "resources": {"limits": {TPU_RESOURCE: shape.chips_per_vm}},
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod = {
        "serviceAccountName": naming.TEAM_SERVICE_ACCOUNT,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "priorityClassName": priority,
        "nodeSelector": shape.node_labels,
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    job = {
        "parallelism": vms,
        "completions": vms,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": POD_FAILURE_RULES},
        "template": {"spec": pod},
    }
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": team.namespace,
            "labels": {**({QUEUE_LABEL: team.name} if queued else {}), **(labels or {})},
            "annotations": {**EXCLUSIVE_TOPOLOGY, **(annotations or {})},
        },
        "spec": {
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "failurePolicy": {"maxRestarts": max_restarts, "rules": JOBSET_FAILURE_RULES},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": slices, "template": {"spec": job}}],
        },
    }


def team_run_prefix(team: str, run_id: str) -> str:
    """A team's run's objects in the checkpoints or models bucket: `teams/<team>/<runId>/`."""
    return f"{naming.team_prefix(team)}{run_id}/"


def team_run_dir(bucket: str, team: str, run_id: str) -> str:
    """A team's run's folder in the checkpoints or models bucket: `gs://<bucket>/teams/<team>/<runId>/`."""
    return f"gs://{bucket}/{team_run_prefix(team, run_id)}"


def run_env(spec: RunSpec, team: TeamSettings, checkpoints: str, models: str) -> list[dict[str, Any]]:
    """The run contract's environment in each pod (docs/run-contract.md, "The environment"), then the spec's;
    the worker's place comes from GKE's injection."""
    contract = [
        (names.RUN_ID_ENV, spec.run_id),
        (names.DATA_ENV, spec.data),
        (names.CHECKPOINT_DIR_ENV, team_run_dir(checkpoints, team.name, spec.run_id)),
        (names.MODEL_DIR_ENV, team_run_dir(models, team.name, spec.run_id)),
        (names.GRACE_SECONDS_ENV, str(GRACE_SECONDS)),
    ]
    return [{"name": k, "value": v} for k, v in (*contract, *spec.env)]


def run_jobset(
    spec: RunSpec,
    team: TeamSettings,
    shape: SliceShape,
    *,
    checkpoints: str,
    models: str,
    slices: int = 1,
    priority: str = "medium",
) -> dict[str, Any]:
    """A researcher's run as their team's JobSet, named by its run id: an image source pinned by digest."""
    if not isinstance(spec.source, ImageSource) or not spec.source.by_digest:
        raise ValueError(f"run {spec.run_id}: the GKE engine runs an image pinned by digest")
    return team_jobset(
        team,
        shape,
        spec.run_id,
        image=spec.source.image,
        command=spec.command,
        slices=slices,
        priority=priority,
        max_restarts=MAX_RESTARTS,
        env=run_env(spec, team, checkpoints, models),
        labels={RUN_LABEL: spec.run_id},
        annotations={REQUESTER_ANNOTATION: spec.requester},
    )
