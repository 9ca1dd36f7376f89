"""Each team's place in the cluster (infra/gke/teams.py) under the Kubernetes side of the permission model
(infra/access/kubernetes.py): what a member, another team's member and the deployer can do, asked the way
an attacker would ask it; and the model itself on the cases Kubernetes' RBAC page spells out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infra import naming
from infra.access.kubernetes import Subject, allowed, escalations, grants, namespaces_running_code
from infra.gke import teams
from infra.gke.validation import platform_validator
from tests import gke_objects as g

DEPLOYER = "tpu-deployer-gke@acme-admin.iam.gserviceaccount.com"
OBJS = teams.admin_objects(g.TEAMS, DEPLOYER)
NAMESPACES = [t.namespace for t in g.TEAMS]
VISION_MEMBER = Subject("Group", "vision@example.com")
NLP_MEMBER = Subject("User", "ada@example.com")
THE_DEPLOYER = Subject("User", DEPLOYER)
STRANGER = Subject("User", "mallory@example.com")


def test_the_admin_phases_team_objects_pass_the_validator():
    report = platform_validator().check(OBJS)
    assert report.ok, report.findings
    kinds = [o["kind"] for o in OBJS]
    assert kinds.count("Namespace") == 2 and kinds.count("ServiceAccount") == 2
    assert kinds.count("ClusterRole") == kinds.count("ClusterRoleBinding") == 1


def test_a_member_runs_jobsets_in_the_teams_namespace_only():
    assert allowed(OBJS, VISION_MEMBER, "create", "jobsets", "jobset.x-k8s.io", "team-vision")
    assert allowed(OBJS, VISION_MEMBER, "delete", "jobsets", "jobset.x-k8s.io", "team-vision")
    assert allowed(OBJS, VISION_MEMBER, "list", "workloads", "kueue.x-k8s.io", "team-vision")
    # A run's output is read through the team's log view (tpu-runs logs --team), not its pods.
    assert not allowed(OBJS, VISION_MEMBER, "get", "pods/log", "", "team-vision")
    assert not allowed(OBJS, VISION_MEMBER, "list", "pods", "", "team-vision")
    assert not allowed(OBJS, VISION_MEMBER, "create", "pods", "", "team-vision")
    assert not allowed(OBJS, VISION_MEMBER, "create", "jobsets", "jobset.x-k8s.io", "team-nlp")
    assert not allowed(OBJS, VISION_MEMBER, "get", "pods", "", "team-nlp")
    assert not allowed(OBJS, NLP_MEMBER, "create", "jobsets", "jobset.x-k8s.io", "team-vision")
    assert not any(allowed(OBJS, STRANGER, "get", "jobsets", "jobset.x-k8s.io", ns) for ns in NAMESPACES)


@pytest.mark.parametrize(
    ("verb", "resource", "group"),
    [
        ("create", "pods", ""),  # code outside a JobSet, outside Kueue
        ("create", "pods/exec", ""),
        ("create", "jobs", "batch"),  # a Job Kueue would still queue, but not the team's to make
        ("get", "secrets", ""),
        ("create", "localqueues", "kueue.x-k8s.io"),  # a queue pointing at another team's ClusterQueue
        ("patch", "resourcequotas", ""),  # lifting its own priority ceiling
        ("update", "workloads", "kueue.x-k8s.io"),  # editing its own admission
        ("create", "rolebindings", "rbac.authorization.k8s.io"),
        ("patch", "namespaces", ""),  # dropping its namespace's labels: Kueue management, pod security
        ("create", "serviceaccounts", ""),
        ("create", "serviceaccounts/token", ""),
    ],
)
def test_a_member_cannot_reach_around_the_queue(verb, resource, group):
    assert not allowed(OBJS, VISION_MEMBER, verb, resource, group, "team-vision")


def test_members_run_code_as_their_namespaces_accounts_and_nowhere_else():
    """Whoever makes pods in a namespace acts as any of its service accounts: a member, in its own only."""
    assert namespaces_running_code(OBJS, VISION_MEMBER, NAMESPACES) == {"team-vision"}
    assert namespaces_running_code(OBJS, NLP_MEMBER, NAMESPACES) == {"team-nlp"}
    assert namespaces_running_code(OBJS, THE_DEPLOYER, NAMESPACES) == set()
    assert namespaces_running_code(OBJS, STRANGER, NAMESPACES) == set()


def test_the_deployer_can_apply_the_queues_phase_and_nothing_more():
    for resource in ("resourceflavors", "clusterqueues"):
        assert allowed(OBJS, THE_DEPLOYER, "patch", resource, "kueue.x-k8s.io")
    assert allowed(OBJS, THE_DEPLOYER, "create", "priorityclasses", "scheduling.k8s.io")
    for ns in NAMESPACES:
        assert allowed(OBJS, THE_DEPLOYER, "create", "localqueues", "kueue.x-k8s.io", ns)
        assert allowed(OBJS, THE_DEPLOYER, "patch", "resourcequotas", "", ns)
    assert not allowed(OBJS, THE_DEPLOYER, "create", "localqueues", "kueue.x-k8s.io", "kube-system")
    assert not allowed(OBJS, THE_DEPLOYER, "get", "secrets", "", "team-vision")
    assert not allowed(OBJS, THE_DEPLOYER, "create", "customresourcedefinitions", "apiextensions.k8s.io")
    assert not allowed(OBJS, THE_DEPLOYER, "create", "mutatingwebhookconfigurations", "admissionregistration.k8s.io")


@pytest.mark.parametrize("who", [THE_DEPLOYER, VISION_MEMBER, NLP_MEMBER], ids=["deployer", "vision", "nlp"])
def test_no_one_the_platform_binds_can_grant_itself_more(who):
    """No bind, escalate or impersonate, no `*`, no write to RBAC objects: a subject cannot widen itself."""
    assert grants(OBJS, who)
    assert escalations(OBJS, who) == []
    for verb in ("bind", "escalate", "impersonate"):
        for resource, group in (("clusterroles", "rbac.authorization.k8s.io"), ("users", ""), ("serviceaccounts", "")):
            assert not allowed(OBJS, who, verb, resource, group)
            assert not any(allowed(OBJS, who, verb, resource, group, ns) for ns in NAMESPACES)


def test_namespaces_are_managed_by_kueue_and_refuse_privileged_pods():
    for namespace in (o for o in OBJS if o["kind"] == "Namespace"):
        labels = namespace["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
        assert labels["tpu-platform/team"] in {t.name for t in g.TEAMS}


def test_groups_are_groups_and_people_are_users():
    assert teams.subject("group:vision@example.com")["kind"] == "Group"
    assert teams.subject("user:ada@example.com") == {
        "kind": "User",
        "apiGroup": "rbac.authorization.k8s.io",
        "name": "ada@example.com",
    }
    with pytest.raises(ValueError, match="user:, group: or serviceAccount:"):
        teams.subject("domain:example.com")


def test_without_a_deploy_account_no_deployer_rights_are_rendered():
    objs = teams.admin_objects(g.TEAMS, "")
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in objs)
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Role"} == {teams.RESEARCHER_ROLE}


def test_a_team_service_account_is_named_as_workload_identity_will_name_it():
    accounts = [o for o in OBJS if o["kind"] == "ServiceAccount"]
    assert {(a["metadata"]["namespace"], a["metadata"]["name"]) for a in accounts} == {
        (t.namespace, naming.TEAM_SERVICE_ACCOUNT) for t in g.TEAMS
    }


# --- the model on Kubernetes' own cases ("Using RBAC Authorization") -------------------------------------


def role(kind: str, name: str, rules: list[dict], namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": teams.RBAC_API, "kind": kind, "metadata": meta, "rules": rules}


def binding(kind: str, role_kind: str, name: str, who: Subject, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    subject = {"kind": who.kind, "name": who.name, **({"namespace": who.namespace} if who.namespace else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": name}, "subjects": [subject]}


def test_a_cluster_role_bound_in_a_namespace_grants_there_only():
    reader = role("ClusterRole", "secret-reader", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}])
    dave = Subject("User", "dave")
    objs = [reader, binding("RoleBinding", "ClusterRole", "secret-reader", dave, "development")]
    assert allowed(objs, dave, "get", "secrets", "", "development")
    assert not allowed(objs, dave, "get", "secrets", "", "production")
    objs.append(binding("ClusterRoleBinding", "ClusterRole", "secret-reader", dave))
    assert allowed(objs, dave, "get", "secrets", "", "production")


def test_wildcards_resource_names_and_service_accounts():
    everything = role("Role", "all", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], "ns")
    only_x = {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["x"], "verbs": ["get", "create"]}
    named = role("Role", "one", [only_x], "ns")
    robot = Subject("ServiceAccount", "robot", "ns")
    objs = [everything, named, binding("RoleBinding", "Role", "all", robot, "ns")]
    assert allowed(objs, robot, "delete", "anything", "example.com", "ns")
    assert escalations(objs, robot)  # `*` includes bind and escalate
    assert not allowed(objs, replace(robot, namespace="other"), "get", "pods", "", "ns")  # another namespace's robot
    alice = Subject("User", "alice")
    objs.append(binding("RoleBinding", "Role", "one", alice, "ns"))
    assert not allowed(objs, alice, "create", "configmaps", "", "ns")  # resourceNames never grants a create
    objs.append(binding("RoleBinding", "Role", "missing", alice, "ns"))
    assert grants(objs, alice) and all(g.via.endswith("/one") for g in grants(objs, alice))
