"""What one environment's CI identities must hold, computed from that environment's plan.

- The deployer: one custom role on the environment project with every permission the plan's create,
  read, update and delete calls check there, except setting the project's IAM policy, which it gets
  from `roles/resourcemanager.projectIamAdmin` only under a `modifiedGrantsByRole` condition listing
  the roles the plan grants (cloud.google.com/iam/docs/setting-limits-on-granting-roles); act-as on
  each attached account, granted by the plan on that account; budgets through
  `roles/billing.costsManager` on the billing account (billing-account roles cannot be custom at
  project level).
- The previewer: one custom role of the reads `pulumi preview --refresh` makes, and nothing else.
A permission needed anywhere else (another project, say a KMS key's) is an error: such grants are
the bootstrap's to make, on behalf of the plan, never rights of the deployer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.access import iamdata
from infra.access.model import DEPLOY, PREVIEW, SET_PROJECT_IAM, USE_QUOTA_PROJECT, Declared, needs_of

BILLING_DEPLOY_ROLE = "roles/billing.costsManager"
BILLING_PREVIEW_ROLE = "roles/billing.viewer"


class AccessError(ValueError):
    pass


# Google's agents that the plan's features need, with the role each needs, granted by the bootstrap
# (Eventarc, "Roles and permissions for Cloud Run functions targets"): Eventarc's agent for any
# event trigger; the Cloud Storage agent publishes direct Cloud Storage events to Pub/Sub.
EVENTARC_AGENT = {"agent": "eventarc.googleapis.com", "role": "roles/eventarc.serviceAgent"}
STORAGE_AGENT_PUBLISHER = {"agent": "storage.googleapis.com", "role": "roles/pubsub.publisher"}


def agent_grants(resources: Iterable[Declared]) -> list[dict[str, str]]:
    triggers = [
        r.inputs["eventTrigger"]
        for r in resources
        if r.type == "gcp:cloudfunctionsv2/function:Function" and r.inputs.get("eventTrigger")
    ]
    out = [EVENTARC_AGENT] if triggers else []
    if any(str(t.get("eventType", "")).startswith("google.cloud.storage.") for t in triggers):
        out.append(STORAGE_AGENT_PUBLISHER)
    return out


@dataclass(frozen=True)
class EnvironmentAccess:
    stack: str
    project: str
    deployer_permissions: tuple[str, ...]
    grantable_roles: tuple[str, ...]
    previewer_permissions: tuple[str, ...]
    billing_accounts: tuple[str, ...]
    agent_grants: tuple[dict[str, str], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "agentGrants": list(self.agent_grants),
            "project": self.project,
            "deployerPermissions": list(self.deployer_permissions),
            "grantableRoles": list(self.grantable_roles),
            "previewerPermissions": list(self.previewer_permissions),
            "billingAccounts": list(self.billing_accounts),
        }


def environment_access(
    stack: str,
    project: str,
    resources: Iterable[Declared],
    invokes: Iterable[tuple[str, Mapping[str, Any]]] = (),
    quota_project: str | None = None,
) -> EnvironmentAccess:
    resources, invokes = list(resources), list(invokes)
    deploy = needs_of(resources, project, DEPLOY, invokes=invokes, quota_project=quota_project)
    preview = needs_of(resources, project, PREVIEW, invokes=invokes, quota_project=quota_project)
    home = f"projects/{project}"
    billing: list[str] = []
    for scope, permissions in deploy.permissions.items():
        if scope == home:
            continue
        if scope.startswith("billingAccounts/"):
            lacking = set(permissions) - iamdata.role_permissions(BILLING_DEPLOY_ROLE)
            if lacking:
                raise AccessError(f"stack {stack!r}: {BILLING_DEPLOY_ROLE} lacks {sorted(lacking)} on {scope}")
            billing.append(scope.removeprefix("billingAccounts/"))
            continue
        first = sorted(permissions)[0]
        raise AccessError(
            f"stack {stack!r}: the plan needs {first} on {scope} ({permissions[first][0]}), outside its project "
            f"{project}; make that grant in the bootstrap instead"
        )
    reads = {p for p in preview.in_scope(home) if iamdata.is_read(p)} | (
        {USE_QUOTA_PROJECT} if quota_project == project else set()
    )
    return EnvironmentAccess(
        stack=stack,
        project=project,
        deployer_permissions=tuple(sorted(deploy.in_scope(home) - {SET_PROJECT_IAM})),
        grantable_roles=tuple(sorted(deploy.project_grants.get(project, set()))),
        previewer_permissions=tuple(sorted(reads)),
        billing_accounts=tuple(sorted(billing)),
        agent_grants=tuple(agent_grants(resources)),
    )
