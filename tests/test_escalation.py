"""No identity can widen itself: every identity the bootstrap and the stacks create or grant, held
against the public privilege-escalation methods (reference/gcp-privesc/methods.json, compiled from public research).

An identity fails when it holds, on one project and with no IAM condition, every permission of one
method: itself, or through an account it may act as (act-as or a token right on that account: what
the account holds, it can use). Google's service agents are left out (Google grants their roles).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pytest

from infra.access.escalation import BECOME, escalations, is_service_agent, methods, reach
from infra.access.model import Declared, custom_roles, grants_to
from tests.support import shipped_deploys
from tests.test_access import EXAMPLES, STACKS, boot, example_bootstrap, example_deploys
from tools.offline.access import declared


def every_plan() -> list[list[Declared]]:
    plans = [declared(boot()), declared(example_bootstrap())]
    plans += [declared(d) for s in STACKS for d in shipped_deploys(s).values()]
    plans += [declared(d) for name in EXAMPLES for d in example_deploys(name).values()]
    return plans


def identities_and_rights(plans: Iterable[list[Declared]]):
    """(members, project permissions by (member, project), accounts each member can become)."""
    resources = [r for plan in plans for r in plan]
    roles = custom_roles(resources, "")
    members = sorted({str(r.inputs["member"]) for r in resources if r.inputs.get("member") and r.inputs.get("role")})
    by_project: dict[str, dict[str, frozenset[str]]] = {}
    becomes: dict[str, frozenset[str]] = {}
    for member in members:
        for grant in grants_to(member, resources, "", roles):
            if grant.condition:
                continue  # judged elsewhere: a condition narrows what it grants
            if grant.scope.startswith("projects/") and "/serviceAccounts/" not in grant.scope:
                project = by_project.setdefault(grant.scope, {})
                project[member] = project.get(member, frozenset()) | grant.permissions
            elif "/serviceAccounts/" in grant.scope and grant.permissions & BECOME:
                email = grant.scope.rsplit("/", 1)[1]
                becomes[member] = becomes.get(member, frozenset()) | {f"serviceAccount:{email}"}
    return members, by_project, becomes


def widening(plans: Iterable[list[Declared]]) -> dict[str, list[str]]:
    """Member -> 'method on project (through accounts)' for each method it could use."""
    members, by_project, becomes = identities_and_rights(plans)
    found: dict[str, list[str]] = {}
    for member in members:
        if is_service_agent(member):
            continue
        for project, permissions in sorted(by_project.items()):
            held, through = reach(member, permissions, becomes)
            for method in escalations(held):
                via = f" (through {', '.join(through)})" if through else ""
                found.setdefault(member, []).append(f"{method} on {project}{via}")
    return found


def test_every_method_names_real_permissions_and_its_source():
    from infra.access.escalation import DATA
    from infra.access.iamdata import roles

    real = {p for permissions in roles().values() for p in permissions}
    listed = json.loads((DATA / "methods.json").read_text())
    for method, entry in listed["methods"].items():
        assert set(entry["permissions"]) <= real, (method, sorted(set(entry["permissions"]) - real))
        assert entry["source"] in listed["sources"], method
    assert {"UpdateIAMRole", "SetServiceAccountIAMPolicy", "CreateServiceAccountKey", "SetProjectIAMPolicy"} <= set(
        methods()
    )


def test_no_identity_the_bootstrap_or_a_stack_creates_or_grants_can_widen_itself():
    plans = every_plan()
    members, _, _ = identities_and_rights(plans)
    # Every kind of identity is among those judged: CI, platform accounts, workloads, researchers, federation.
    for kind in ("tpu-deployer-prod", "ci-previewer", "tpu-guard-prod", "tpu-mnist-dev", "user:alice", "principalSet"):
        assert any(kind in m for m in members), kind
    assert widening(plans) == {}


def with_grant(plans: list[list[Declared]], *extra: Declared) -> list[list[Declared]]:
    return [*plans, list(extra)]


DEPLOYER = "serviceAccount:tpu-deployer-dev@acme-ml-admin.iam.gserviceaccount.com"
PROJECT = "acme-ml-sandbox"


def test_a_deployer_role_that_could_change_roles_is_caught():
    """Today's fix, undone: the deployer holding iam.roles.update on its project again."""
    old = {"project": PROJECT, "roleId": "oldDeployer", "permissions": ["iam.roles.update"]}
    role = Declared("gcp:projects/iAMCustomRole:IAMCustomRole", "old", old)
    grant = Declared(
        "gcp:projects/iAMMember:IAMMember",
        "old-grant",
        {"project": PROJECT, "role": f"projects/{PROJECT}/roles/oldDeployer", "member": DEPLOYER},
    )
    found = widening(with_grant([declared(boot())], role, grant))
    assert [entry.split(" (")[0] for entry in found[DEPLOYER]] == [f"UpdateIAMRole on projects/{PROJECT}"]
    # The workflows federated as the dev deployer become it, and so could use the method too.
    (federated,) = [m for m in found if m.startswith("principalSet:") and "/attribute.deploy/dev@" in m]
    assert "tpu-deployer-dev" in found[federated][0]
    assert set(found) == {DEPLOYER, federated}


def test_an_account_the_deployer_can_act_as_counts_as_its_own():
    """The guard's account, given key creation project-wide: the deployer, which acts as it, can too."""
    guard = f"serviceAccount:tpu-guard-dev@{PROJECT}.iam.gserviceaccount.com"
    keys = Declared(
        "gcp:projects/iAMMember:IAMMember",
        "keys",
        {"project": PROJECT, "role": "roles/iam.serviceAccountKeyAdmin", "member": guard},
    )
    found = widening(with_grant([declared(boot())], keys))
    assert [entry.split(" (")[0] for entry in found[guard]] == [f"CreateServiceAccountKey on projects/{PROJECT}"]
    assert any(entry.startswith("CreateServiceAccountKey") and "tpu-guard-dev" in entry for entry in found[DEPLOYER])


@pytest.mark.parametrize(
    "agent",
    [
        "serviceAccount:service-123456789012@gcp-sa-eventarc.iam.gserviceaccount.com",
        "serviceAccount:service-123456789012@gs-project-accounts.iam.gserviceaccount.com",
    ],
)
def test_only_googles_service_agents_are_left_out(agent):
    assert is_service_agent(agent)
    assert not is_service_agent("serviceAccount:123456789012-compute@developer.gserviceaccount.com")
    assert not is_service_agent(f"serviceAccount:tpu-guard-dev@{PROJECT}.iam.gserviceaccount.com")
