"""Small GKE fixtures: pool shapes, two teams, and a TPU JobSet written out in full.

The JobSet is the shape xpk's `workload create` renders (gke-tpu reference, "The JobSet"): one
replicated job of `slices` replicas, each an Indexed Job of one pod per VM, `google.com/tpu` = chips per
VM, node selectors of the pool's labels, exclusive placement per node pool. Every field the JobSet
webhook would default (failure rule names) is written out, since a schema check sees objects before
webhooks do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.gke import queues


@dataclass(frozen=True)
class Shape:
    accelerator: str
    topology: str
    chips_per_vm: int
    vms_per_slice: int
    slices: int
    provisioning: str


V5E_16_SPOT = Shape("tpu-v5-lite-podslice", "4x4", 4, 4, 1, "spot")
V6E_16_FLEX = Shape("tpu-v6e-slice", "4x4", 4, 4, 2, "flex-start")
TPU7X_8 = Shape("tpu7x", "2x2x2", 4, 2, 1, "on-demand")
SHAPES = (V5E_16_SPOT, V6E_16_FLEX, TPU7X_8)

VISION = queues.Team(
    name="vision",
    members=("group:vision@example.com",),
    namespace="team-vision",
    nominal_chips={queues.flavor_name(V5E_16_SPOT): 16, queues.flavor_name(TPU7X_8): 8},
    borrowing_limit=16,
    priority="high",
)
NLP = queues.Team(
    name="nlp",
    members=("user:ada@example.com",),
    namespace="team-nlp",
    nominal_chips={queues.flavor_name(V6E_16_FLEX): 32},
    borrowing_limit=None,
    priority="medium",
)
TEAMS = (VISION, NLP)


def queue_objects() -> list[dict[str, Any]]:
    return queues.queue_objects(TEAMS, SHAPES)


def pool_labels() -> list[dict[str, str]]:
    return [queues.node_labels(s) for s in SHAPES]


def jobset(
    name: str = "train-1",
    team: queues.Team = VISION,
    shape: Shape = V5E_16_SPOT,
    slices: int = 1,
    priority: str = "medium",
) -> dict[str, Any]:
    vms = shape.vms_per_slice
    pod = {
        "restartPolicy": "Never",
        "priorityClassName": priority,
        "nodeSelector": queues.node_labels(shape),
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 30,
        "containers": [
            {
                "name": "train",
                "image": "us-docker.pkg.dev/acme/train@sha256:" + "0" * 64,
                "command": ["python", "train.py"],
                "resources": {"limits": {"google.com/tpu": shape.chips_per_vm}},
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": team.namespace,
            "labels": {"kueue.x-k8s.io/queue-name": team.name},
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"},
        },
        "spec": {
            "ttlSecondsAfterFinished": 43200,
            "failurePolicy": {
                "maxRestarts": 3,
                "rules": [{"name": "user-error", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}],
            },
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": slices,
                    "template": {
                        "spec": {
                            "parallelism": vms,
                            "completions": vms,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": pod},
                        }
                    },
                }
            ],
        },
    }
