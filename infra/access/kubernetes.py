"""The permission model inside a GKE cluster: what Kubernetes RBAC objects let a subject do.

Plain data in (the Roles, ClusterRoles and bindings the platform renders, infra/gke/teams.py), answers
out, as Kubernetes' RBAC authorizer decides them (Kubernetes "Using RBAC Authorization"):
- a Role grants in its own namespace, through a RoleBinding there; a ClusterRole grants cluster-wide
  through a ClusterRoleBinding, or in one namespace through a RoleBinding that refers to it;
- a rule matches a request when its apiGroups, resources (`pods/log` for a subresource) and verbs each
  contain the request's or `*`; rules only add, nothing denies; `resourceNames` narrows a rule to named
  objects (so it never grants create or list);
- a subject is a User, a Group or a ServiceAccount (GKE: a Google account or service account is a User
  named by its email).
What RBAC alone does not say, and the model adds (Kubernetes "RBAC good practices"): `bind`, `escalate`
and `impersonate` let a subject grant itself more; and whoever can create a workload in a namespace
(a pod, or an object whose controller makes pods) runs code as any service account of that namespace.
GKE also authorizes through IAM (roles/container.*) before RBAC: the GCP side of the permission model
(infra/access/model.py) decides who holds those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]
ESCALATING_VERBS = frozenset({"bind", "escalate", "impersonate"})
# Objects whose controllers create pods from a template the creator writes (core workload kinds, and the
# JobSet the platform's teams submit), by (API group, resource).
POD_MAKERS = frozenset(
    {
        ("", "pods"),
        ("", "replicationcontrollers"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
        ("jobset.x-k8s.io", "jobsets"),
    }
)
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Subject:
    kind: str  # User | Group | ServiceAccount
    name: str
    namespace: str = ""  # a ServiceAccount's


@dataclass(frozen=True)
class Grant:
    """One rule a subject holds, and where: `namespace` None means every namespace and cluster-scoped kinds."""

    namespace: str | None
    rule: Mapping[str, Any]
    via: str  # the binding that grants it

    def matches(self, verb: str, group: str, resource: str, namespace: str | None) -> bool:
        rule = self.rule
        if self.namespace is not None and namespace != self.namespace:
            return False
        if rule.get("resourceNames"):
            return False  # only ever named objects: never a create, a list or a new object
        return (
            _has(rule.get("verbs"), verb)
            and _has(rule.get("apiGroups"), group)
            and _has(rule.get("resources"), resource)
        )


def _has(values: Sequence[str] | None, wanted: str) -> bool:
    return bool(values) and ("*" in values or wanted in values)  # type: ignore[operator]


def _binds(binding: Obj, who: Subject) -> bool:
    for s in binding.get("subjects") or ():
        if s.get("kind") != who.kind or s.get("name") != who.name:
            continue
        if who.kind == "ServiceAccount" and s.get("namespace", binding["metadata"].get("namespace")) != who.namespace:
            continue
        return True
    return False


def grants(objs: Iterable[Obj], who: Subject) -> list[Grant]:
    """Every rule `who` holds through the given objects."""
    objs = list(objs)
    roles = {
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
        for o in objs
        if o.get("kind") in ("Role", "ClusterRole")
    }
    found: list[Grant] = []
    for binding in objs:
        kind = binding.get("kind")
        if kind not in ("RoleBinding", "ClusterRoleBinding") or not _binds(binding, who):
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if kind == "RoleBinding" else None
        role_namespace = namespace if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], role_namespace, ref["name"]))
        if role is None:
            continue  # a binding to a role that does not exist grants nothing
        via = f"{kind}/{namespace + '/' if namespace else ''}{binding['metadata']['name']}"
        found += [Grant(namespace, rule, via) for rule in role.get("rules") or ()]
    return found


def allowed(
    objs: Iterable[Obj], who: Subject, verb: str, resource: str, group: str = "", namespace: str | None = None
) -> bool:
    """Whether RBAC lets `who` do `verb` on `resource` (in `namespace`; None: cluster-scoped)."""
    return any(g.matches(verb, group, resource, namespace) for g in grants(objs, who))


def escalations(objs: Iterable[Obj], who: Subject) -> list[str]:
    """The rules by which `who` could grant itself more: escalating verbs, or writing RBAC objects."""
    out = []
    for grant in grants(objs, who):
        verbs = set(grant.rule.get("verbs") or ())
        groups = set(grant.rule.get("apiGroups") or ())
        if verbs & ESCALATING_VERBS or "*" in verbs:
            out.append(f"{grant.via}: verbs {sorted(verbs)}")
        elif groups & {RBAC_GROUP, "*"} and verbs - {"get", "list", "watch"}:
            out.append(f"{grant.via}: writes RBAC objects")
    return out


def namespaces_running_code(objs: Iterable[Obj], who: Subject, namespaces: Iterable[str]) -> set[str]:
    """Of `namespaces`, those where `who` can make pods run, directly or through a controller: there it
    acts as any service account of the namespace."""
    objs = list(objs)
    return {
        ns
        for ns in namespaces
        if any(allowed(objs, who, "create", resource, group, ns) for group, resource in POD_MAKERS)
    }
