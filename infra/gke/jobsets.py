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

A multislice run (`slices` > 1) needs what joins the slices over the data-center network, in every pod:
MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID, MEGASCALE_COORDINATOR_ADDRESS and MEGASCALE_PORT (the names JAX's
BaseTpuCluster reads, jax/_src/clusters/cloud_tpu_cluster.py, and Ray's get_tpu_coordinator_env_vars sets,
ray-project/ray python/ray/util/tpu.py, with port 8081). The JobSet sets them itself, as xpk's Pathways
template does (src/xpk/templates/pathways_workload_create.yaml.j2: MEGASCALE_SLICE_ID from the pod's
`jobset.sigs.k8s.io/job-index` label through the downward API), rather than trusting GKE to: the slice
count is the replicas, and the coordinator is slice 0's worker 0 under JobSet's stable host name
`<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`, the subdomain being the JobSet's name (JobSet
API, `Network`: enableDNSHostnames, subdomain "Defaults to <jobSet.name>"), the names GKE lists in
TPU_WORKER_HOSTNAMES. GKE runs multislice on multi-host TPU slice node pools only (GKE, "Deploy TPU Multislice
in GKE", "Multislice availability in GKE"), so more slices of a single-host pool are refused. `multislice_problems`
checks these shapes on any JobSet (the validator runs it: infra/gke/validation.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import naming
from infra.catalog import load_catalog
from infra.config.model import TeamSettings
from infra.gke.crds import JOBSET_API
from infra.gke.quota import QUEUE_LABEL, TPU_RESOURCE
from infra.gke.specs import SliceShape
from infra.startup import Artifact, render_pod_fetch
from run_contract import names
from run_contract.spec import FolderSource, RunSpec

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

# Kubernetes' downward API reads a pod's own label (JobSet sets job-index on each pod of a replicated job's Job).
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
MEGASCALE_PORT = 8081


def worker_host(jobset: str, slice_index: int, worker: int) -> str:
    """A pod's stable host name in its JobSet (JobSet's default network: the JobSet's name as subdomain)."""
    return f"{jobset}-{REPLICATED_JOB}-{slice_index}-{worker}.{jobset}"


def multislice_env(jobset: str, slices: int) -> list[dict[str, Any]]:
    """What a multislice run's pods need to join their slices; nothing for one slice."""
    if slices <= 1:
        return []
    return [
        {"name": names.MEGASCALE_NUM_SLICES_ENV, "value": str(slices)},
        {
            "name": names.MEGASCALE_SLICE_ID_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}},
        },
        {"name": names.MEGASCALE_COORDINATOR_ENV, "value": worker_host(jobset, 0, 0)},
        {"name": names.MEGASCALE_PORT_ENV, "value": str(MEGASCALE_PORT)},
    ]


def multislice_problems(jobset: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, what) for each TPU container whose multislice variables disagree with its replicated job: the
    slice count its replicas, the slice id its Job's index, the coordinator slice 0's worker 0; none for one
    slice."""
    name = str((jobset.get("metadata") or {}).get("name"))
    spec: Mapping[str, Any] = jobset.get("spec") or {}
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    found: list[tuple[str, str]] = []
    for i, replicated in enumerate(spec.get("replicatedJobs") or ()):
        slices = int(replicated.get("replicas", 1))
        job: Any = (replicated.get("template") or {}).get("spec") or {}
        containers: list[Any] = ((job.get("template") or {}).get("spec") or {}).get("containers") or []
        for container in containers:
            if TPU_RESOURCE not in ((container.get("resources") or {}).get("limits") or {}):
                continue
            where = f"spec.replicatedJobs[{i}] container {container.get('name')}"
            env = {e.get("name"): e for e in container.get("env") or ()}
            if slices <= 1:
                if names.MEGASCALE_NUM_SLICES_ENV in env and env[names.MEGASCALE_NUM_SLICES_ENV].get("value") != "1":
                    found.append((where, f"one slice, but {names.MEGASCALE_NUM_SLICES_ENV} says otherwise"))
                continue
            host = f"{name}-{replicated.get('name')}-0-0.{subdomain}"
            wanted = {
                names.MEGASCALE_NUM_SLICES_ENV: {"value": str(slices)},
                names.MEGASCALE_SLICE_ID_ENV: {
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_LABEL}']"}}
                },
                names.MEGASCALE_COORDINATOR_ENV: {"value": host},
            }
            for variable, value in wanted.items():
                have = {k: v for k, v in env.get(variable, {}).items() if k != "name"}
                if have != value:
                    found.append((where, f"{slices} slices need {variable} = {value}; it has {have or 'none'}"))
            if not str(env.get(names.MEGASCALE_PORT_ENV, {}).get("value", "")).isdigit():
                found.append((where, f"{slices} slices need {names.MEGASCALE_PORT_ENV}, a port number"))
    return found


def _fails_job_on_78(container: str) -> dict[str, Any]:
    return {
        "action": "FailJob",
        "onExitCodes": {"containerName": container, "operator": "In", "values": [names.EXIT_CONFIG]},
    }


# Job level: the failures that end a Job with reason PodFailurePolicy, each with its own message.
POD_FAILURE_RULES: list[dict[str, Any]] = [
    _fails_job_on_78(CONTAINER),
    {"action": "FailJob", "onPodConditions": [{"type": DISRUPTION, "status": "True"}]},
]
# A folder source's fetch step exits 78 when an archive does not match its digest (infra/startup.py
# render_pod_fetch): the run cannot succeed. A rule's exit codes are looked up in the init containers' statuses
# too, and its containerName may name an init container (batch/v1 PodFailurePolicyOnExitCodesRequirement).
# A read that may heal exits 75 after the step's own retries: no rule names it, so, as for the program's own 75,
# the pod (failed with its init container under restartPolicy Never: Kubernetes, "Init Containers") counts
# against backoffLimit 0, the Job fails with BackoffLimitExceeded and the JobSet restarts the run, counted
# (Kubernetes, "Jobs", Pod failure policy: a failed pod no rule matches counts towards backoffLimit).
FETCH_CONTAINER = "fetch-source"
FETCH_FAILURE_RULE = _fails_job_on_78(FETCH_CONTAINER)
# The folder source's pod: one emptyDir both containers mount, the fetch step read-write, the program read-only
# (as on a VM its unpacked folder is root's, read-only to the run).
SOURCE_VOLUME = "source"
SOURCE_ROOT = "/tpu-platform"
SOURCE_FOLDER = "source"
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


def split_gs(uri: str) -> tuple[str, str]:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name


@dataclass(frozen=True)
class FolderRun:
    """What runs a folder source on the GKE engine: the stack's pinned public image (gke.folderImage) and the
    runner's archive (vm_agent/ and run_contract/, infra/tpu/metadata.py agent_package), which the fetch step
    takes from the artifacts bucket by digest before the folder's."""

    image: str
    runner: Artifact

    def container(self, source: FolderSource) -> dict[str, Any]:
        """The fetch step: the runner and the folder's archive into the pod's emptyDir, each checked against its
        digest, or exit 78 before anything of them runs."""
        bucket, name = split_gs(source.uri)
        script = render_pod_fetch(
            self.runner,
            Artifact(bucket, name, source.sha256),
            SOURCE_ROOT,
            SOURCE_FOLDER,
            load_catalog().agent_python_floor,
        )
        return {
            "name": FETCH_CONTAINER,
            "image": self.image,
            "command": ["bash", "-c", script],
            "volumeMounts": [{"name": SOURCE_VOLUME, "mountPath": SOURCE_ROOT}],
            "securityContext": {"allowPrivilegeEscalation": False},
        }


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
    fetch: FolderRun | None = None,
    source: FolderSource | None = None,
) -> dict[str, Any]:
    vms = shape.vms_per_slice
    if slices > 1 and vms == 1:
        raise ValueError(
            f"{slices} slices of a single-host pool ({shape.chips_per_vm} chips on one VM): GKE joins slices of "
            "multi-host pools only; ask for one slice, or use a multi-host pool"
        )
    env = [*env, *multislice_env(name, slices)]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        **({"command": list(command)} if command else {}),  # none: the image's own entrypoint
        **({"env": env} if env else {}),
        "resources": {"limits": {TPU_RESOURCE: shape.chips_per_vm}},
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    folder: dict[str, Any] = {}
    rules = POD_FAILURE_RULES
    if fetch is not None and source is not None:
        container.update(
            workingDir=f"{SOURCE_ROOT}/{SOURCE_FOLDER}",
            volumeMounts=[{"name": SOURCE_VOLUME, "mountPath": SOURCE_ROOT, "readOnly": True}],
        )
        folder = {
            "initContainers": [fetch.container(source)],
            "volumes": [{"name": SOURCE_VOLUME, "emptyDir": {}}],
        }
        rules = [*POD_FAILURE_RULES, FETCH_FAILURE_RULE]
    pod = {
        "serviceAccountName": naming.TEAM_SERVICE_ACCOUNT,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "priorityClassName": priority,
        "nodeSelector": shape.node_labels,
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        **folder,
        "containers": [container],
    }
    job = {
        "parallelism": vms,
        "completions": vms,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": rules},
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
    folder: FolderRun | None = None,
) -> dict[str, Any]:
    """A researcher's run as their team's JobSet, named by its run id: an image source pinned by digest, or a
    folder source in `folder`'s image, fetched and checked by digest before the program runs in it."""
    source = spec.source
    if isinstance(source, FolderSource):
        if folder is None:
            raise ValueError(f"run {spec.run_id}: a folder source needs the stack's gke.folderImage")
        image = folder.image
    elif not source.by_digest:
        raise ValueError(f"run {spec.run_id}: the GKE engine runs an image pinned by digest")
    else:
        image = source.image
    return team_jobset(
        team,
        shape,
        spec.run_id,
        image=image,
        command=spec.command,
        slices=slices,
        priority=priority,
        max_restarts=MAX_RESTARTS,
        env=run_env(spec, team, checkpoints, models),
        labels={RUN_LABEL: spec.run_id},
        annotations={REQUESTER_ANNOTATION: spec.requester},
        fetch=folder if isinstance(source, FolderSource) else None,
        source=source if isinstance(source, FolderSource) else None,
    )
