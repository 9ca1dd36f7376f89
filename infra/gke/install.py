"""The GKE engine's Kubernetes objects, declared in two phases run by two identities (docs/design-gke.md).

- Admin phase (its own Pulumi project, gke-admin/, `infra/gke/admin.py`): `ClusterControllers`, JobSet and
  Kueue as released (CRDs, webhooks, cluster roles, their namespaces and controllers), and `TeamPlaces`,
  each team's namespace, service account and RBAC. Cluster-admin matters, applied by a cluster
  administrator.
- Queues phase (the environment's stack, `infra/platform.py`): `TeamQueues`, flavors, team queues, local
  queues, priority classes and priority ceilings: objects of the CRDs the admin phase installed, applied
  by the environment's deployer with the rights the admin phase gave it.
The phases are separate runs because a CRD and its objects cannot be declared in one run of
pulumi-kubernetes' YAML v2 (pulumi/pulumi-kubernetes#3176: the objects' scope is looked up in the
cluster at preview, before the CRD exists), and because the deployer must not hold the rights the admin
phase takes.

Each component hands its objects to one `kubernetes.yaml.v2.ConfigGroup(objs=...)`: the provider applies
them server-side (as `kubectl apply --server-side` in the controllers' install guides). The programs check
the team objects and the queues with the validator before they declare anything (a bad object is a
config error naming the stack), and take the controllers' objects only as the pinned bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

# GKE "Install kubectl and configure cluster access": kubectl and client libraries authenticate with the
# gke-gcloud-auth-plugin credential plugin (what `gcloud container clusters get-credentials` writes).
AUTH_PLUGIN = {
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "command": "gke-gcloud-auth-plugin",
    "provideClusterInfo": True,
    "installHint": "gcloud components install gke-gcloud-auth-plugin",
    "interactiveMode": "Never",
}

Obj = Mapping[str, Any]


def kubeconfig(endpoint: str, cluster: str) -> str:
    """A kubeconfig that reaches the cluster through its DNS endpoint (the only one: no IP endpoint) as the
    caller's Google identity. No cluster CA: the DNS endpoint presents a certificate clients trust (what
    `get-credentials --dns-endpoint` writes; the smoke test's dry run lists the check)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {"server": f"https://{endpoint}"}}],
            "users": [{"name": cluster, "user": {"exec": AUTH_PLUGIN}}],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
            "current-context": cluster,
        },
        sort_keys=True,
    )


def _reported(endpoint: str | None) -> str:
    if not endpoint:  # container.v1 DNSEndpointConfig.endpoint: "Always present"
        raise ValueError("the cluster reports no DNS endpoint: its control plane cannot be reached")
    return endpoint


def cluster_provider(
    name: str, endpoint: pulumi.Input[str | None], cluster: str, opts: pulumi.ResourceOptions | None = None
) -> k8s.Provider:
    return k8s.Provider(
        name,
        kubeconfig=pulumi.Output.from_input(endpoint).apply(lambda e: kubeconfig(_reported(e), cluster)),
        enable_server_side_apply=True,
        opts=opts,
    )


class ClusterControllers(pulumi.ComponentResource):
    """JobSet, then Kueue (its JobSet integration finds the JobSet CRD when it starts)."""

    def __init__(
        self,
        name: str,
        provider: k8s.Provider,
        jobset: Sequence[Obj],
        kueue: Sequence[Obj],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:gke:ClusterControllers", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.jobset = k8s.yaml.v2.ConfigGroup(f"{name}-jobset", objs=[dict(o) for o in jobset], opts=child)
        self.kueue = k8s.yaml.v2.ConfigGroup(
            f"{name}-kueue",
            objs=[dict(o) for o in kueue],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.jobset])),
        )
        self.register_outputs({})


class _Objects(pulumi.ComponentResource):
    """Objects the program rendered and checked (`validation.Report.raise_for`), handed over as one group."""

    TYPE = ""

    def __init__(
        self, name: str, provider: k8s.Provider, objs: Sequence[Obj], opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(self.TYPE, name, None, opts)
        self.objects = k8s.yaml.v2.ConfigGroup(
            f"{name}-objects", objs=[dict(o) for o in objs], opts=pulumi.ResourceOptions(parent=self, provider=provider)
        )
        self.register_outputs({})


class TeamPlaces(_Objects):
    """The admin phase: each team's namespace, service account and RBAC (infra/gke/teams.py)."""

    TYPE = "tpu-platform:gke:TeamPlaces"


class TeamQueues(_Objects):
    """The queues phase: Kueue's flavors and queues, priority classes and ceilings (infra/gke/queues.py)."""

    TYPE = "tpu-platform:gke:TeamQueues"
