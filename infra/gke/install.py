"""The GKE engine's Kubernetes objects, declared in two phases run by two identities (docs/design-gke.md).

- Admin phase (`ClusterControllers`): JobSet and Kueue as released (CRDs, webhooks, cluster roles, their
  namespaces and controllers). Cluster-admin matters, applied by a cluster administrator.
- Queues phase (`TeamQueues`): flavors, team queues, local queues, priority classes, priority ceilings:
  objects of the CRDs the admin phase installed, applied by the environment's deployer.
The phases are separate runs because a CRD and its objects cannot be declared in one run of
pulumi-kubernetes' YAML v2 (pulumi/pulumi-kubernetes#3176: the objects' scope is looked up in the
cluster at preview, before the CRD exists), and because the deployer must not hold the rights the admin
phase takes.

Each phase hands its objects to one `kubernetes.yaml.v2.ConfigGroup(objs=...)`: the provider expands
them server-side (server-side apply, as `kubectl apply --server-side` in the controllers' install
guides). The queues phase checks its objects with the validator first: a bad object stops the run
before anything is registered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.gke.controllers import JOBSET, KUEUE, controller_objects, pinned_validator
from infra.gke.validation import validate_all


class ClusterControllers(pulumi.ComponentResource):
    """JobSet, then Kueue (its JobSet integration finds the JobSet CRD when it starts)."""

    def __init__(self, name: str, provider: k8s.Provider, opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-platform:gke:ClusterControllers", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.jobset = k8s.yaml.v2.ConfigGroup(f"{name}-jobset", objs=controller_objects(JOBSET), opts=child)
        self.kueue = k8s.yaml.v2.ConfigGroup(
            f"{name}-kueue",
            objs=controller_objects(KUEUE),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.jobset])),
        )
        self.register_outputs({})


class TeamQueues(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        provider: k8s.Provider,
        objs: Sequence[Mapping[str, Any]],
        pool_labels: Sequence[Mapping[str, str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        validate_all(pinned_validator(), objs, pool_labels).raise_if_any()  # before anything is registered
        super().__init__("tpu-platform:gke:TeamQueues", name, None, opts)
        self.objects = k8s.yaml.v2.ConfigGroup(
            f"{name}-objects", objs=[dict(o) for o in objs], opts=pulumi.ResourceOptions(parent=self, provider=provider)
        )
        self.register_outputs({})
