"""Each team's place in the cluster, as the admin phase installs it: its namespace, the Kubernetes service
account its jobs run as, and who may do what there (RBAC). Pure: settings in, Kubernetes objects out.

- Namespace: labelled with the team, which makes Kueue manage every job in it, queue label or not
  (infra/gke/controllers.py, MANAGED_JOBS), and enforcing the Pod Security Standard `baseline`
  (Kubernetes "Pod Security Admission": `pod-security.kubernetes.io/enforce`): no privileged container,
  no host network, PID or IPC, no hostPath volume. A team's program never reaches its node's identity or
  network; `restricted` is warned about, not enforced (TPU images run as root).
- ServiceAccount `tpu-workloads`: what the team's JobSets run as; with Workload Identity Federation for
  GKE it is the principal its bucket grants name (docs/design-gke.md, "Identities").
- Role and RoleBinding for the members: exactly what `tpu-runs --team` asks (tpu_runs/gke.py, proven by
  tests/test_tpu_runs_gke.py against the requests it makes): JobSets in the team's own namespace, applied
  server-side (patch, and create for a new one: k8s.io/apiserver pkg/endpoints/handlers/patch.go checks
  `create` when an apply creates its object), listed and deleted; Kueue's Workloads listed. No pods,
  secrets, exec, RBAC or quota objects: a member runs code only through JobSets, which Kueue admits
  against the team's quota. A run's output is read from Cloud Logging, through the team's log view
  (infra/gke/team_access.py), not from its pods.
- The deployer (CI's account, when the stack names one) gets exactly what the queues phase applies:
  ResourceFlavors, ClusterQueues and PriorityClasses cluster-wide (a ClusterRole and its binding), and
  LocalQueues and ResourceQuotas in the team namespaces (a Role and binding in each). Never `bind`,
  `escalate` or `impersonate`, nothing of RBAC, pods or secrets (infra/access/kubernetes.py proves it).
In GKE a Google account or service account is an RBAC `User` named by its email; a Google group is a
`Group` only with Google Groups for RBAC (the stack's `gke.rbacSecurityGroup`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra import naming
from infra.config.model import TeamSettings
from infra.gke.controllers import TEAM_NAMESPACE_LABEL
from infra.gke.queues import MANAGED_BY, TEAM_LABEL

RBAC_API = "rbac.authorization.k8s.io/v1"
RESEARCHER_ROLE = "tpu-platform:researcher"
DEPLOYER_ROLE = "tpu-platform:queues-deployer"
READ = ["get", "list", "watch"]
WRITE = [*READ, "create", "update", "patch", "delete"]
POD_SECURITY = {
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
}
# What `tpu-runs --team` asks, and nothing else (tests/test_tpu_runs_gke.py records its requests).
RUN_COMMAND_RULES = [
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "patch", "list", "delete"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
    # The team's queue in order (Kueue's visibility API; its own role for batch users,
    # config/components/rbac/pending_workloads_lq_viewer_role.yaml, grants get, list and watch).
    {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"], "verbs": ["get"]},
]
RESEARCHER_RULES = RUN_COMMAND_RULES
# What an operator's `tpu-runs report --all` asks in each team's namespace (tests/test_tpu_runs_gke.py records
# it). The stack names no operator, so the admin phase binds this to nobody: docs/goodput.md says how to.
OPERATOR_REPORT_RULES = [
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["list"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
]
DEPLOYER_CLUSTER_RULES = [
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors", "clusterqueues"], "verbs": WRITE},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": WRITE},
]
DEPLOYER_NAMESPACE_RULES = [
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": WRITE},
    {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": WRITE},
]

Obj = dict[str, Any]


def subject(member: str) -> Obj:
    """An IAM member (user:, group:, serviceAccount:) as the RBAC subject GKE matches it to."""
    kind, _, email = member.partition(":")
    if kind == "group":
        return {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": email}
    if kind in ("user", "serviceAccount"):
        return {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": email}
    raise ValueError(f"{member!r}: an IAM member user:, group: or serviceAccount:")


def _meta(name: str, team: str | None, namespace: str | None = None, labels: dict[str, str] | None = None) -> Obj:
    all_labels = {**MANAGED_BY, **({TEAM_LABEL: team} if team else {}), **(labels or {})}
    return {"name": name, **({"namespace": namespace} if namespace else {}), "labels": all_labels}


def team_objects(team: TeamSettings, deployer: str) -> list[Obj]:
    """A team's namespace, service account and RBAC; the deployer's rights there when it has an account."""
    ns = team.namespace
    objs: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": _meta(ns, team.name, labels={TEAM_NAMESPACE_LABEL: team.name, **POD_SECURITY}),
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(naming.TEAM_SERVICE_ACCOUNT, team.name, ns)},
        {
            "apiVersion": RBAC_API,
            "kind": "Role",
            "metadata": _meta(RESEARCHER_ROLE, team.name, ns),
            "rules": RESEARCHER_RULES,
        },
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": _meta(RESEARCHER_ROLE, team.name, ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": RESEARCHER_ROLE},
            "subjects": [subject(m) for m in team.members],
        },
    ]
    if deployer:
        objs += [
            {
                "apiVersion": RBAC_API,
                "kind": "Role",
                "metadata": _meta(DEPLOYER_ROLE, team.name, ns),
                "rules": DEPLOYER_NAMESPACE_RULES,
            },
            {
                "apiVersion": RBAC_API,
                "kind": "RoleBinding",
                "metadata": _meta(DEPLOYER_ROLE, team.name, ns),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DEPLOYER_ROLE},
                "subjects": [subject(f"serviceAccount:{deployer}")],
            },
        ]
    return objs


def admin_objects(teams: Sequence[TeamSettings], deployer: str) -> list[Obj]:
    """What the admin phase applies besides the controllers: the deployer's cluster-wide rights for the
    queues phase (when CI deploys), then each team's objects."""
    objs: list[Obj] = []
    if deployer and teams:
        objs += [
            {
                "apiVersion": RBAC_API,
                "kind": "ClusterRole",
                "metadata": _meta(DEPLOYER_ROLE, None),
                "rules": DEPLOYER_CLUSTER_RULES,
            },
            {
                "apiVersion": RBAC_API,
                "kind": "ClusterRoleBinding",
                "metadata": _meta(DEPLOYER_ROLE, None),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": DEPLOYER_ROLE},
                "subjects": [subject(f"serviceAccount:{deployer}")],
            },
        ]
    for team in teams:
        objs += team_objects(team, deployer)
    return objs
