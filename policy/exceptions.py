"""The grants of deny-listed permissions the pack lets pass: each named, with its reason, matched precisely.

An exception matches a grant on its level AND member AND role AND target (and, where it says so, the
grant's IAM condition), so the deployer granted `roles/owner`, or `projectIamAdmin` without its
condition, is still a violation. Patterns are regular expressions over the member, the role and the
target of one grant, matched as one string in that order, so a later field can require the same
value as an earlier one (`(?P=env)`: the environment in the member's name).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from infra.access import iamdata

from .permissions import denied
from .stack_grants import Grant

PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
ENV = r"(?P<env>[a-z][a-z0-9-]{0,11})"  # a stack name: 1-12 lowercase letters, digits and '-'
SA = r"\.iam\.gserviceaccount\.com"
DEPLOYER = rf"serviceAccount:tpu-deployer-{ENV}@(?P<admin>{PROJECT_ID}){SA}"
DEPLOYER_ROLE_PREFIX = "tpuPlatformDeployer"
GITHUB_POOL = r"//iam\.googleapis\.com/projects/\d+/locations/global/workloadIdentityPools/github"

# What an environment's deployer role may hold of the deny-list: the IAM policies of the resources the
# plan grants on (buckets, Run services, functions, topics and subscriptions). Never a custom role or a
# service account's policy (the bootstrap makes accounts and roles: a deployer that could change a role
# it may grant, or set IAM on an account, could widen itself), the project's own policy, act-as, token
# minting, signing or keys: the project-level grants go through the conditional projectIamAdmin, and
# act-as is granted per account by the bootstrap.
DEPLOYER_ROLE_MAY_HOLD = frozenset(
    {
        "storage.buckets.setIamPolicy",
        "artifactregistry.repositories.setIamPolicy",
        "run.services.setIamPolicy",
        "cloudfunctions.functions.setIamPolicy",
        "pubsub.topics.setIamPolicy",
        "pubsub.subscriptions.setIamPolicy",
    }
)


def role_suffix(env: str) -> str:
    """The environment in a custom role id, as the program writes it: `eu-prod` -> `EuProd`."""
    return "".join(part.capitalize() for part in env.split("-"))


# The one condition under which a deployer may hold projectIamAdmin: it may add or remove grants of the
# listed roles only ("Set limits on granting roles", cloud.google.com/iam/docs/setting-limits-on-granting-roles).
MODIFIED_GRANTS_ONLY = re.compile(
    r"\s*api\.getAttribute\(\s*(['\"])iam\.googleapis\.com/modifiedGrantsByRole\1\s*,\s*\[\s*\]\s*\)"
    r"\s*\.hasOnly\(\s*\[(?P<roles>[^\]]*)\]\s*\)\s*"
)
QUOTED = re.compile(r"\s*(['\"])(?P<role>[^'\"]+)\1\s*")

Check = Callable[[Grant, "re.Match[str]", Mapping[str, frozenset[str]]], str | None]


def _grantable_role_problem(role: str, project: str) -> str | None:
    if role.startswith("roles/"):
        permissions = iamdata.roles().get(role)
        if permissions is None:
            return f"{role} is not in Google's role data, so the pack cannot tell what it grants"
        if found := denied(permissions):
            return f"{role} holds {', '.join(found)}"
        return None
    own_project = f"projects/{project}/roles/"
    if not role.startswith(own_project):
        return f"{role} is not a role of the environment project {project}"
    if role.removeprefix(own_project).startswith(DEPLOYER_ROLE_PREFIX):
        return f"{role} is the deployer's own role"
    return None  # the platform's custom roles, declared and judged in the environment's stack


def deployer_limited_project_iam_admin(
    grant: Grant, match: re.Match[str], custom_roles: Mapping[str, frozenset[str]]
) -> str | None:
    """projectIamAdmin only on the project holding this environment's deployer role, only for listed roles."""
    env, project = match["env"], match["project"]
    deployer_role = f"projects/{project}/roles/{DEPLOYER_ROLE_PREFIX}{role_suffix(env)}"
    if deployer_role not in custom_roles:
        return f"{project} is not the project of environment '{env}' (the stack declares no {deployer_role})"
    expression = (grant.condition or {}).get("expression")
    if not expression:
        return "it has no IAM condition; it needs one limiting modifiedGrantsByRole"
    limit = MODIFIED_GRANTS_ONLY.fullmatch(expression)
    if not limit:
        return (
            "its condition is not exactly api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
            f".hasOnly([...]): {expression!r}"
        )
    listed = [QUOTED.fullmatch(item) for item in limit["roles"].split(",") if item.strip()]
    if not all(listed):
        return f"its hasOnly list is not a list of quoted roles: {limit['roles']!r}"
    problems = [p for m in listed if m and (p := _grantable_role_problem(m["role"], project))]
    return f"its condition lets it grant {'; '.join(problems)}" if problems else None


def same_environment_role(grant: Grant, match: re.Match[str], custom_roles: Mapping[str, frozenset[str]]) -> str | None:
    if match["Env"] != role_suffix(match["env"]):
        return f"the role is another environment's deployer role, not {DEPLOYER_ROLE_PREFIX}{role_suffix(match['env'])}"
    return None


@dataclass(frozen=True)
class GrantException:
    name: str
    reason: str
    level: str
    member: str  # regular expressions, matched as member, role, target in that order
    role: str
    target: str
    may_hold: frozenset[str] | None = None  # deny-listed permissions let pass; None: whatever the role holds
    check: Check | None = None  # a further condition on the grant: its problem, or None

    def pattern(self) -> re.Pattern[str]:
        return re.compile("\n".join(f"(?:{field})" for field in (self.member, self.role, self.target)))

    def matches(self, grant: Grant) -> re.Match[str] | None:
        if grant.level != self.level or None in (grant.member, grant.role, grant.target):
            return None
        return self.pattern().fullmatch("\n".join((grant.member or "", grant.role or "", grant.target or "")))

    def could_match(self, grant: Grant) -> bool:
        """Whether the grant's known fields leave this exception possible (for values a preview does not know)."""
        return grant.level == self.level and (grant.role is None or bool(re.fullmatch(self.role, grant.role)))


EXCEPTIONS: tuple[GrantException, ...] = (
    GrantException(
        "deployer-environment-role",
        "each environment's deployer makes that environment's resources and their grants; its custom role holds "
        "no project IAM, custom-role, service-account IAM, act-as, token or key permission",
        level="project",
        member=DEPLOYER,
        role=rf"projects/(?P<project>{PROJECT_ID})/roles/{DEPLOYER_ROLE_PREFIX}(?P<Env>[A-Za-z0-9]+)",
        target=r"(?P=project)",
        may_hold=DEPLOYER_ROLE_MAY_HOLD,
        check=same_environment_role,
    ),
    GrantException(
        "deployer-limited-project-iam-admin",
        "the platform grants project roles (log and metric writers, its custom roles); the deployer may "
        "add or remove grants of exactly those roles on its own environment project",
        level="project",
        member=DEPLOYER,
        role=r"roles/resourcemanager\.projectIamAdmin",
        target=rf"(?P<project>{PROJECT_ID})",
        check=deployer_limited_project_iam_admin,
    ),
    GrantException(
        "ci-federation",
        "GitHub Actions reach the CI accounts only through the repository's workload identity pool; "
        "the pool's attribute condition and the principal set decide which workflows",
        level="service-account",
        member=rf"principalSet:{GITHUB_POOL}/attribute\.[a-z_]+/[^\s*]+|principal:{GITHUB_POOL}/subject/\S+",
        role=r"roles/iam\.workloadIdentityUser",
        target=rf"(?:tpu-deployer-[a-z][a-z0-9-]{{0,11}}|tpu-platform-ci-previewer)@{PROJECT_ID}{SA}",
    ),
    GrantException(
        "deployer-act-as-platform-account",
        "attaching an account to a TPU VM, Scheduler job or function needs actAs on that account "
        "(methods.json: tpu.projects.locations.nodes.create checks iam.serviceAccounts.actAs)",
        level="service-account",
        member=DEPLOYER,
        role=r"roles/iam\.serviceAccountUser",
        target=rf"tpu-(?!deployer-)[a-z0-9-]+-(?P=env)@{PROJECT_ID}{SA}",
    ),
    GrantException(
        "guard-act-as-workload-account",
        "the guard re-creates preempted TPU VMs, which run as their workload's account",
        level="service-account",
        member=rf"serviceAccount:tpu-guard-{ENV}@(?P<project>{PROJECT_ID}){SA}",
        role=r"roles/iam\.serviceAccountUser",
        target=rf"tpu-(?!guard-|scheduler-|deployer-)[a-z0-9-]+-(?P=env)@(?P=project){SA}",
    ),
    GrantException(
        "google-service-agent-own-role",
        "a Google service agent holding its own service's agent role, which Google grants it by default "
        "when the service is first used; the bootstrap grants it before the first trigger (Eventarc, "
        "'Roles and permissions for Cloud Run functions targets')",
        level="project",
        member=r"serviceAccount:service-\d+@gcp-sa-(?P<service>[a-z]+)\.iam\.gserviceaccount\.com",
        role=r"roles/(?P<role_service>[a-z]+)\.serviceAgent",
        target=rf"{PROJECT_ID}",
        check=lambda grant, match, _roles: (
            None if match["service"] == match["role_service"] else "a service agent holding another service's role"
        ),
    ),
)

# Custom roles whose own permission list may hold part of the deny-list: role name pattern -> what.
ROLE_EXCEPTIONS: Mapping[str, frozenset[str]] = {
    rf"projects/{PROJECT_ID}/roles/{DEPLOYER_ROLE_PREFIX}[A-Za-z0-9]+": DEPLOYER_ROLE_MAY_HOLD,
}
