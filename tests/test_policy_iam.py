"""The pack's IAM rules: roles judged by the permissions Google's role data gives them, and each named
exception matched precisely (a near miss on member, role, level, target or condition is refused)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from infra.access import iamdata
from policy import policies
from policy.exceptions import DEPLOYER_ROLE_MAY_HOLD
from policy.permissions import DENIED_PERMISSIONS

ROOT = Path(__file__).resolve().parents[1]
OPTS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
ADMIN, DEV, PROD = "acme-ml-admin", "acme-ml-sandbox", "acme-ml-production"
DEPLOYER = f"serviceAccount:tpu-deployer-dev@{ADMIN}.iam.gserviceaccount.com"
PREVIEWER = f"tpu-platform-ci-previewer@{ADMIN}.iam.gserviceaccount.com"
POOL = "principalSet://iam.googleapis.com/projects/135002360446/locations/global/workloadIdentityPools/github"
DEPLOYER_ROLE = f"projects/{DEV}/roles/tpuPlatformDeployerDev"
LIMITED = (
    "api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
    ".hasOnly(['roles/logging.logWriter', 'roles/monitoring.metricWriter',"
    f" 'projects/{DEV}/roles/tpuPlatformGuardDev'])"
)

PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
ACCOUNT_MEMBER = "gcp:serviceaccount/iAMMember:IAMMember"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"


def resource(resource_type: str, props: dict, name: str) -> PolicyResource:
    return PolicyResource(resource_type, props, f"urn:{name}", name, OPTS, None, None, [], {})


def judged(resources: list[PolicyResource]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(mandatory, advisory) messages by resource name, from the two stack rules."""
    found: tuple[dict[str, list[str]], dict[str, list[str]]] = ({}, {})
    for rule, bucket in ((policies.no_dangerous_grants, found[0]), (policies.grants_judged, found[1])):
        rule(StackValidationArgs(resources), lambda m, urn=None, b=bucket: b.setdefault(str(urn)[4:], []).append(m))
    return found


def violations(resources: list[PolicyResource]) -> dict[str, list[str]]:
    return judged(resources)[0]


def project_grant(
    role: str, member: str | None = DEPLOYER, project: str = DEV, name: str = "g", **extra
) -> PolicyResource:
    return resource(PROJECT_MEMBER, {"project": project, "role": role, "member": member, **extra}, name)


def account_grant(role: str, member: str | None, account: str, name: str = "g") -> PolicyResource:
    email = account if "@" in account else f"{account}@{DEV}.iam.gserviceaccount.com"
    props = {"serviceAccountId": f"projects/{DEV}/serviceAccounts/{email}", "role": role, "member": member}
    return resource(ACCOUNT_MEMBER, props, name)


def own_violations(role: PolicyResource) -> list[str]:
    """What the custom-role rule says of one declared role."""
    found: list[str] = []
    args = ResourceValidationArgs(role.resource_type, role.props, role.urn, role.name, OPTS, None)
    policies.custom_roles_no_dangerous_permissions(args, lambda message, urn=None: found.append(message))
    return found


def custom_role(role_id: str, permissions: list[str], project: str = DEV, name: str = "role") -> PolicyResource:
    return resource(CUSTOM_ROLE, {"project": project, "roleId": role_id, "permissions": permissions}, name)


# --- the deny-list and Google's data


@pytest.mark.parametrize("pattern", sorted(DENIED_PERMISSIONS))
def test_every_deny_listed_permission_exists_in_googles_role_data(pattern):
    every = set().union(*iamdata.roles().values())
    assert any(fnmatchcase(p, pattern) for p in every), f"{pattern} matches no permission Google publishes"


def test_the_pack_reads_roles_through_the_permission_model_and_nothing_else_of_infra(tmp_path):
    code = (
        "import json, sys\n"
        "from policy import policies\n"
        "assert policies.denied(policies.role_permissions('roles/iam.serviceAccountUser', {}))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'infra' or m.startswith('infra.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    imported = set(json.loads(out.stdout))
    assert "infra.access.iamdata" in imported
    assert {m for m in imported if not m.startswith("infra.access")} <= {"infra", "infra.naming"}


# --- predefined roles, judged by their permissions


@pytest.mark.parametrize(
    ("role", "permission"),
    [
        ("roles/iam.serviceAccountTokenCreator", "iam.serviceAccounts.getAccessToken"),
        ("roles/resourcemanager.projectIamAdmin", "resourcemanager.projects.setIamPolicy"),
        ("roles/cloudbuild.builds.editor", "cloudbuild.builds.create"),
        ("roles/iam.serviceAccountKeyAdmin", "iam.serviceAccountKeys.create"),
        ("roles/iam.roleAdmin", "iam.roles.update"),
        ("roles/storage.admin", "storage.buckets.setIamPolicy"),
        ("roles/orgpolicy.policyAdmin", "orgpolicy.policy.set"),
        ("roles/compute.instanceAdmin.v1", "compute.instances.setServiceAccount"),
        ("roles/owner", "iam.serviceAccounts.actAs"),
        ("roles/editor", "iam.serviceAccounts.actAs"),
    ],
)
def test_a_predefined_role_is_judged_by_its_permissions(role, permission):
    found = violations([project_grant(role, member="user:a@acme.example")])
    assert len(found["g"]) == 1 and permission in found["g"][0]


@pytest.mark.parametrize(
    "role",
    [
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
        "roles/viewer",
        "roles/billing.costsManager",
        "roles/iam.securityReviewer",
    ],
)
def test_a_predefined_role_without_dangerous_permissions_passes(role):
    assert judged([project_grant(role, member="user:a@acme.example")]) == ({}, {})


LEVELS = [
    ("gcp:projects/iAMMember:IAMMember", {"project": DEV, "member": "user:a@acme.example"}),
    ("gcp:projects/iAMBinding:IAMBinding", {"project": DEV, "members": ["user:a@acme.example"]}),
    ("gcp:folder/iAMMember:IAMMember", {"folder": "folders/1234", "member": "user:a@acme.example"}),
    ("gcp:folder/iAMBinding:IAMBinding", {"folder": "folders/1234", "members": ["user:a@acme.example"]}),
    ("gcp:organizations/iAMMember:IAMMember", {"orgId": "5678", "member": "user:a@acme.example"}),
    ("gcp:organizations/iAMBinding:IAMBinding", {"orgId": "5678", "members": ["user:a@acme.example"]}),
    (
        "gcp:serviceaccount/iAMMember:IAMMember",
        {
            "serviceAccountId": f"projects/{DEV}/serviceAccounts/tpu-mnist-dev@{DEV}.iam.gserviceaccount.com",
            "member": "user:a@acme.example",
        },
    ),
    (
        "gcp:serviceaccount/iAMBinding:IAMBinding",
        {
            "serviceAccountId": f"projects/{DEV}/serviceAccounts/tpu-mnist-dev@{DEV}.iam.gserviceaccount.com",
            "members": ["user:a@acme.example"],
        },
    ),
    ("gcp:billing/accountIamMember:AccountIamMember", {"billingAccountId": "01A2B3", "member": "user:a@acme.example"}),
]
POLICY_LEVELS = [
    ("gcp:projects/iAMPolicy:IAMPolicy", {"project": DEV}),
    ("gcp:folder/iAMPolicy:IAMPolicy", {"folder": "folders/1234"}),
    ("gcp:organizations/iAMPolicy:IAMPolicy", {"orgId": "5678"}),
    ("gcp:serviceaccount/iAMPolicy:IAMPolicy", {"serviceAccountId": f"projects/{DEV}/serviceAccounts/x@y.com"}),
    ("gcp:billing/accountIamPolicy:AccountIamPolicy", {"billingAccountId": "01A2B3"}),
]


@pytest.mark.parametrize(("resource_type", "props"), LEVELS)
def test_every_level_is_judged(resource_type, props):
    good = resource(resource_type, {**props, "role": "roles/logging.logWriter"}, "g")
    bad = resource(resource_type, {**props, "role": "roles/iam.serviceAccountTokenCreator"}, "g")
    assert judged([good]) == ({}, {})
    assert "iam.serviceAccounts.signJwt" in violations([bad])["g"][0]


@pytest.mark.parametrize(("resource_type", "props"), POLICY_LEVELS)
def test_every_authoritative_policy_is_judged_binding_by_binding(resource_type, props):
    def policy(*roles: str) -> PolicyResource:
        bindings = [{"role": r, "members": ["user:a@acme.example"]} for r in roles]
        return resource(resource_type, {**props, "policyData": json.dumps({"bindings": bindings})}, "g")

    assert judged([policy("roles/logging.logWriter")]) == ({}, {})
    found = violations([policy("roles/logging.logWriter", "roles/owner")])
    assert len(found["g"]) == 1 and "roles/owner" in found["g"][0]


# --- custom roles


def test_a_custom_role_holding_act_as_is_reported_and_so_is_its_grant():
    role = custom_role("tpuPlatformRunner", ["tpu.nodes.get", "iam.serviceAccounts.actAs"])
    grant = project_grant(f"projects/{DEV}/roles/tpuPlatformRunner", member="user:a@acme.example")
    own = own_violations(role)
    assert len(own) == 1 and "iam.serviceAccounts.actAs" in own[0]
    assert "iam.serviceAccounts.actAs" in violations([role, grant])["g"][0]


def test_a_read_only_custom_role_passes():
    role = custom_role("tpuPlatformPreviewerDev", ["tpu.nodes.get", "tpu.nodes.list", "storage.buckets.get"])
    grant = project_grant(f"projects/{DEV}/roles/tpuPlatformPreviewerDev", member=f"serviceAccount:{PREVIEWER}")
    own = own_violations(role)
    assert own == [] and judged([role, grant]) == ({}, {})


def test_an_organisation_custom_role_is_resolved_too():
    keys = ["iam.serviceAccountKeys.create"]
    role = resource(
        "gcp:organizations/iAMCustomRole:IAMCustomRole",
        {"orgId": "5678", "roleId": "keyMaker", "permissions": keys},
        "role",
    )
    grant = resource(
        "gcp:organizations/iAMMember:IAMMember",
        {"orgId": "5678", "role": "organizations/5678/roles/keyMaker", "member": "user:a@acme.example"},
        "g",
    )
    assert "iam.serviceAccountKeys.create" in own_violations(role)[0]
    assert "iam.serviceAccountKeys.create" in violations([role, grant])["g"][0]


def test_roles_the_pack_cannot_expand_are_advisory_cannot_tell():
    undeclared = project_grant(f"projects/{DEV}/roles/somebodyElses", member="user:a@acme.example", name="custom")
    unknown = project_grant("roles/bigquery.dataViewer", member="user:a@acme.example", name="predefined")
    mandatory, advisory = judged([undeclared, unknown])
    assert mandatory == {}
    assert "not in this stack's custom roles" in advisory["custom"][0]
    assert "not in Google's role data" in advisory["predefined"][0]


# --- the bootstrap's exceptions: a dev environment as the new bootstrap declares it

DEPLOYER_PERMISSIONS = [
    *sorted(DEPLOYER_ROLE_MAY_HOLD),
    "iam.roles.delete",
    "iam.serviceAccounts.create",
    "iam.serviceAccounts.update",
    "iam.serviceAccounts.delete",
    "iam.serviceAccounts.getIamPolicy",
    "tpu.nodes.create",
    "storage.buckets.create",
]


def bootstrap_dev(**replace: PolicyResource) -> list[PolicyResource]:
    declared = {
        "deployer-role": custom_role("tpuPlatformDeployerDev", DEPLOYER_PERMISSIONS, name="deployer-role"),
        "deployer-grant": project_grant(DEPLOYER_ROLE, name="deployer-grant"),
        "deployer-iam-admin": project_grant(
            "roles/resourcemanager.projectIamAdmin",
            name="deployer-iam-admin",
            condition={"title": "platform roles only", "expression": LIMITED},
        ),
        "deployer-federated": account_grant(
            "roles/iam.workloadIdentityUser",
            f"{POOL}/attribute.environment/dev",
            f"tpu-deployer-dev@{ADMIN}.iam.gserviceaccount.com",
            name="deployer-federated",
        ),
        "previewer-role": custom_role("tpuPlatformPreviewerDev", ["tpu.nodes.get"], name="previewer-role"),
        "previewer-grant": project_grant(
            f"projects/{DEV}/roles/tpuPlatformPreviewerDev",
            member=f"serviceAccount:{PREVIEWER}",
            name="previewer-grant",
        ),
        "previewer-federated": account_grant(
            "roles/iam.workloadIdentityUser",
            f"{POOL}/attribute.repository/acme/tpu-platform",
            PREVIEWER,
            name="previewer-federated",
        ),
        "deployer-billing": resource(
            "gcp:billing/accountIamMember:AccountIamMember",
            {"billingAccountId": "01A2B3", "role": "roles/billing.costsManager", "member": DEPLOYER},
            "deployer-billing",
        ),
    }
    return list({**declared, **replace}.values())


def test_the_bootstrap_shape_passes_with_no_advisory_either():
    assert judged(bootstrap_dev()) == ({}, {})


NEAR_MISSES = {
    "deployer granted roles/owner": (
        "deployer-grant",
        project_grant("roles/owner", name="deployer-grant"),
        "iam.serviceAccounts.actAs",
    ),
    "projectIamAdmin without condition": (
        "deployer-iam-admin",
        project_grant("roles/resourcemanager.projectIamAdmin", name="deployer-iam-admin"),
        "no IAM condition",
    ),
    "projectIamAdmin under another condition": (
        "deployer-iam-admin",
        project_grant(
            "roles/resourcemanager.projectIamAdmin",
            name="deployer-iam-admin",
            condition={"title": "t", "expression": "request.time < timestamp('2030-01-01T00:00:00Z')"},
        ),
        "is not exactly",
    ),
    "projectIamAdmin allowed to grant token creation": (
        "deployer-iam-admin",
        project_grant(
            "roles/resourcemanager.projectIamAdmin",
            name="deployer-iam-admin",
            condition={
                "title": "t",
                "expression": LIMITED.replace("roles/logging.logWriter", "roles/iam.serviceAccountTokenCreator"),
            },
        ),
        "roles/iam.serviceAccountTokenCreator holds",
    ),
    "projectIamAdmin allowed to grant the deployer role": (
        "deployer-iam-admin",
        project_grant(
            "roles/resourcemanager.projectIamAdmin",
            name="deployer-iam-admin",
            condition={"title": "t", "expression": LIMITED.replace("roles/logging.logWriter", DEPLOYER_ROLE)},
        ),
        "the deployer's own role",
    ),
    "projectIamAdmin on another environment's project": (
        "deployer-iam-admin",
        project_grant(
            "roles/resourcemanager.projectIamAdmin",
            project=PROD,
            name="deployer-iam-admin",
            condition={"title": "t", "expression": LIMITED.replace(DEV, PROD)},
        ),
        "not the project of environment 'dev'",
    ),
    "deployer role granted to someone else": (
        "deployer-grant",
        project_grant(DEPLOYER_ROLE, member="user:a@acme.example", name="deployer-grant"),
        "storage.buckets.setIamPolicy",
    ),
    "deployer role granted to another environment's deployer": (
        "deployer-grant",
        project_grant(DEPLOYER_ROLE, member=DEPLOYER.replace("-dev@", "-prod@"), name="deployer-grant"),
        "another environment's deployer role",
    ),
    "federation for every identity of the pool": (
        "deployer-federated",
        account_grant(
            "roles/iam.workloadIdentityUser",
            f"{POOL}/*",
            f"tpu-deployer-dev@{ADMIN}.iam.gserviceaccount.com",
            name="deployer-federated",
        ),
        "iam.serviceAccounts.getAccessToken",
    ),
    "federation from another pool": (
        "deployer-federated",
        account_grant(
            "roles/iam.workloadIdentityUser",
            f"{POOL.replace('/github', '/gitlab')}/attribute.x/y",
            f"tpu-deployer-dev@{ADMIN}.iam.gserviceaccount.com",
            name="deployer-federated",
        ),
        "iam.serviceAccounts.getAccessToken",
    ),
    "federation onto a workload account": (
        "deployer-federated",
        account_grant(
            "roles/iam.workloadIdentityUser",
            f"{POOL}/attribute.environment/dev",
            "tpu-mnist-dev",
            name="deployer-federated",
        ),
        "iam.serviceAccounts.getAccessToken",
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_near_miss_on_a_bootstrap_exception_is_a_violation(case):
    name, replacement, words = NEAR_MISSES[case]
    found = violations(bootstrap_dev(**{name: replacement}))
    assert list(found) == [name] and len(found[name]) == 1 and words in found[name][0], found


def test_the_deployer_role_may_hold_its_allowance_and_nothing_more_of_the_deny_list():
    def role_violations(permissions: list[str]) -> list[str]:
        return own_violations(custom_role("tpuPlatformDeployerDev", permissions))

    assert role_violations(DEPLOYER_PERMISSIONS) == []
    for extra in (
        "resourcemanager.projects.setIamPolicy",
        "iam.serviceAccounts.actAs",
        "iam.serviceAccounts.getAccessToken",
        "iam.serviceAccountKeys.create",
    ):
        (message,) = role_violations([*DEPLOYER_PERMISSIONS, extra])
        assert extra in message
        grant = violations(
            bootstrap_dev(
                **{
                    "deployer-role": custom_role(
                        "tpuPlatformDeployerDev", [*DEPLOYER_PERMISSIONS, extra], name="deployer-role"
                    )
                }
            )
        )
        assert list(grant) == ["deployer-grant"] and extra in grant["deployer-grant"][0]


# --- the platform stacks' act-as exceptions

WORKLOAD = "tpu-mnist-dev"
GUARD = f"serviceAccount:tpu-guard-dev@{DEV}.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    ("grant", "words"),
    [
        (account_grant("roles/iam.serviceAccountUser", DEPLOYER, WORKLOAD), None),
        (account_grant("roles/iam.serviceAccountUser", DEPLOYER, "tpu-guard-invoker-dev"), None),
        (account_grant("roles/iam.serviceAccountUser", GUARD, WORKLOAD), None),
        # right member, wrong role
        (account_grant("roles/iam.serviceAccountTokenCreator", DEPLOYER, WORKLOAD), "getAccessToken"),
        # right member and role, another environment's account
        (account_grant("roles/iam.serviceAccountUser", DEPLOYER, "tpu-mnist-prod"), "actAs"),
        # the deployer acting as itself
        (
            account_grant(
                "roles/iam.serviceAccountUser", DEPLOYER, f"tpu-deployer-dev@{ADMIN}.iam.gserviceaccount.com"
            ),
            "actAs",
        ),
        # the guard acting as a platform account rather than a workload's, or in another project
        (account_grant("roles/iam.serviceAccountUser", GUARD, "tpu-scheduler-dev"), "actAs"),
        (account_grant("roles/iam.serviceAccountUser", GUARD, f"{WORKLOAD}@{PROD}.iam.gserviceaccount.com"), "actAs"),
        # right member and role at the wrong level: every account of the project
        (project_grant("roles/iam.serviceAccountUser"), "actAs"),
        (project_grant("roles/iam.serviceAccountUser", member=GUARD), "actAs"),
    ],
)
def test_act_as_exceptions(grant, words):
    found = violations([grant])
    if words is None:
        assert found == {}
    else:
        assert len(found["g"]) == 1 and words in found["g"][0]


def test_a_member_a_preview_does_not_know_yet_is_cannot_tell_where_an_exception_may_apply():
    unknown_member = account_grant("roles/iam.serviceAccountUser", None, WORKLOAD)
    mandatory, advisory = judged([unknown_member])
    assert mandatory == {} and "may apply once the member" in advisory["g"][0]
    # No exception grants roles/owner, whoever the member turns out to be.
    mandatory, advisory = judged([project_grant("roles/owner", member=None)])
    assert "roles/owner" in mandatory["g"][0] and advisory == {}


def test_a_google_service_agent_may_hold_its_own_agent_role_only():
    from policy.exceptions import EXCEPTIONS
    from policy.stack_grants import Grant as PolicyGrant

    (agent,) = [e for e in EXCEPTIONS if e.name == "google-service-agent-own-role"]
    member = "serviceAccount:service-123@gcp-sa-eventarc.iam.gserviceaccount.com"
    own = PolicyGrant("project", "acme-ml-sandbox", "roles/eventarc.serviceAgent", member, None)
    assert agent.matches(own)
    other = PolicyGrant("project", "acme-ml-sandbox", "roles/run.serviceAgent", member, None)
    match = agent.matches(other)
    assert match is not None and agent.check is not None and agent.check(other, match, {})
    impostor = "serviceAccount:service-123@gcp-sa-eventarc.example.com"
    fake = PolicyGrant("project", "acme-ml-sandbox", "roles/eventarc.serviceAgent", impostor, None)
    assert not agent.matches(fake)


def test_the_bootstrap_plan_passes_the_pack():
    """The pack knows the bootstrap's shapes (named exceptions) and judges it like any stack."""
    from tests.test_bootstrap import plan
    from tools.offline.policy_check import check_policies

    assert [str(v) for v in check_policies(plan()) if v.enforcement == "mandatory"] == []


# --- privilege-escalation methods: refused for every member, the deployer included ------------------


def escalation_reports(resources: list[PolicyResource]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    policies.no_escalation_methods(
        StackValidationArgs(resources), lambda m, urn=None: found.setdefault(str(urn)[4:], []).append(m)
    )
    return found


def test_a_deployer_role_able_to_change_roles_is_refused_with_no_exemption():
    """UpdateIAMRole: a deployer holding iam.roles.update could widen a role it may grant, and grant it."""
    role = custom_role("tpuPlatformDeployerDev", ["tpu.nodes.create", "iam.roles.update"])
    reports = escalation_reports([role, project_grant(DEPLOYER_ROLE, name="deployer-grant")])
    assert list(reports) == ["deployer-grant"]
    assert "UpdateIAMRole" in reports["deployer-grant"][0] and DEPLOYER in reports["deployer-grant"][0]
    # Its own-role rule says so too: iam.roles.* is no longer among what a deployer role may hold.
    assert not {"iam.roles.create", "iam.roles.update", "iam.serviceAccounts.setIamPolicy"} & DEPLOYER_ROLE_MAY_HOLD
    assert any("iam.roles.update" in m for m in own_violations(role))


def test_methods_split_over_two_roles_of_one_member_are_found():
    """Act-as project-wide plus a TPU creator role: a TPU VM running as any account of the project."""
    reports = escalation_reports(
        [
            project_grant("roles/iam.serviceAccountUser", name="a"),
            project_grant("roles/tpu.admin", name="b"),
        ]
    )
    assert "CreateTpuVmWithAccount" in " ".join(m for ms in reports.values() for m in ms)


def test_a_conditional_grant_or_a_service_agent_is_not_counted():
    agent = "serviceAccount:service-123456789012@gcp-sa-eventarc.iam.gserviceaccount.com"
    assert escalation_reports([project_grant("roles/iam.roleAdmin", member=agent)]) == {}
    conditional = {"title": "t", "expression": "request.time < timestamp('2030-01-01T00:00:00Z')"}
    assert escalation_reports([project_grant("roles/iam.roleAdmin", condition=conditional)]) == {}
    assert escalation_reports([project_grant("roles/iam.roleAdmin")])  # unconditional: refused
