"""A team's JobSet on one pool shape, as the platform's rules want it. Pure: settings in, an object out.

The shape xpk's `workload create` renders (gke-tpu reference, "The JobSet"), less what this platform
refuses: one replicated job of `slices` replicas, each an Indexed Job of one pod per VM of the slice, each
pod asking `google.com/tpu` = the VM's chips, selecting the pool's node labels (`SliceShape.node_labels`)
and tolerating the TPU taint, placed one slice per node pool (JobSet's exclusive-topology annotation); the
team's LocalQueue named in Kueue's label; the team's service account; no privilege, no host network
(team namespaces refuse both: infra/gke/teams.py). Part 3 (`tpu-runs` on GKE) builds on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra import naming
from infra.config.model import TeamSettings
from infra.gke.quota import QUEUE_LABEL, TPU_RESOURCE
from infra.gke.specs import SliceShape

EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
TTL_SECONDS = 43_200  # xpk's: a finished JobSet is deleted after 12 hours


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
) -> dict[str, Any]:
    vms = shape.vms_per_slice
    pod = {
        "serviceAccountName": naming.TEAM_SERVICE_ACCOUNT,
        "restartPolicy": "Never",
        "priorityClassName": priority,
        "nodeSelector": shape.node_labels,
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "main",
                "image": image,
                "command": list(command),
                "resources": {"limits": {TPU_RESOURCE: shape.chips_per_vm}},
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
    }
    job = {
        "parallelism": vms,
        "completions": vms,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": pod},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": team.namespace,
            "labels": {QUEUE_LABEL: team.name} if queued else {},
            "annotations": dict(EXCLUSIVE_TOPOLOGY),
        },
        "spec": {
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [{"name": "slice", "replicas": slices, "template": {"spec": job}}],
        },
    }
