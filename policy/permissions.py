"""What a role can do, from Google's own role data, and which permissions the pack never lets pass.

Predefined roles expand through `reference/gcp-iam/roles.json` (Google's published role -> permissions
table, vendored at the repository root; see its README). The pack runs from `policy/` in its own
virtualenv, so the file is found relative to this one and nothing of `infra/` is imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path

ROLES_FILE = Path(__file__).resolve().parents[1] / "reference" / "gcp-iam" / "roles.json"
PRIVESC = Path(__file__).resolve().parents[1] / "reference" / "gcp-privesc"

# Permissions that let their holder become someone with more rights than it was given. Each holder of
# one of these must be a named exception (`exceptions.py`). Patterns are fnmatch-style over permission
# names (`service.resource.verb`).
DENIED_PERMISSIONS: Mapping[str, str] = {
    # Before `*.setIamPolicy` (which covers it), for its own reason: the policy that grants everything.
    "resourcemanager.projects.setIamPolicy": "rewrites the project's IAM policy: any role on every resource in it",
    # Rewrites who may do what on the resource: the holder can grant itself any role there.
    "*.setIamPolicy": "changes the resource's IAM policy, so its holder can grant itself any role there",
    # Attaching an account to a VM, job or function runs code with that account's rights.
    "iam.serviceAccounts.actAs": "runs resources as a service account, so its holder gains that account's rights",
    # Mint credentials of the account directly (the serviceAccountTokenCreator family).
    "iam.serviceAccounts.getAccessToken": "mints OAuth tokens of a service account: impersonation",
    "iam.serviceAccounts.getOpenIdToken": "mints ID tokens of a service account: impersonation",
    "iam.serviceAccounts.signBlob": "signs as a service account, enough to forge its credentials",
    "iam.serviceAccounts.signJwt": "signs JWTs as a service account, enough to forge its credentials",
    "iam.serviceAccounts.implicitDelegation": "impersonates through a chain of service accounts",
    # Long-lived secrets that outlive any revocation of the holder's own rights.
    "iam.serviceAccountKeys.create": "creates a long-lived key of a service account",
    "storage.hmacKeys.create": "creates a long-lived HMAC key of a service account",
    # Runs arbitrary build steps as the Cloud Build service account, whatever that account holds.
    "cloudbuild.builds.create": "runs build steps as the Cloud Build service account and its rights",
    # Widen a custom role that is already granted, with any permission (no right on it is needed).
    "iam.roles.create": "defines roles with any permission; with a grant right, any permission at all",
    "iam.roles.update": "adds any permission to a custom role that is already granted",
    "iam.roles.undelete": "brings back a deleted custom role, with whatever it held",
    # Lifts organisation constraints (keys, external IPs, domain-restricted sharing) for its scope.
    "orgpolicy.policy.set": "lifts organisation policy constraints",
    # Deployment Manager deploys as the Google APIs service agent, which holds Editor on the project.
    "deploymentmanager.deployments.create": "deploys as the Google APIs service agent (Editor on the project)",
    # Swaps a VM's identity for another account's.
    "compute.instances.setServiceAccount": "swaps a VM's service account for a more privileged one",
}


@cache
def predefined_roles() -> Mapping[str, frozenset[str]]:
    """Predefined role name -> permissions, as Google publishes them."""
    data = json.loads(ROLES_FILE.read_text())
    return {name: frozenset(entry["permissions"]) for name, entry in data.items()}


def why_denied(permission: str) -> str | None:
    """The reason `permission` is on the deny-list (its first matching entry), or None."""
    return next((why for pattern, why in DENIED_PERMISSIONS.items() if fnmatchcase(permission, pattern)), None)


def denied(permissions: Iterable[str]) -> dict[str, str]:
    """The deny-listed permissions among `permissions`, each with its reason."""
    found = {p: why_denied(p) for p in permissions}
    return {p: why for p, why in sorted(found.items()) if why}


# "Resource attributes for IAM Conditions" (cloud.google.com/iam/docs/conditions-resource-attributes):
# only these services recognise resource.name / resource.type / resource.service; the program's own
# list (infra/access/iamdata.py) is tested to be the same.
CONDITION_RESOURCE_SERVICES: frozenset[str] = frozenset(
    f"{s}.googleapis.com"
    for s in (
        "apigee",
        "apihub",
        "backupdr",
        "bigquery",
        "bigqueryreservation",
        "bigtableadmin",
        "binaryauthorization",
        "ces",
        "clouddeploy",
        "cloudkms",
        "cloudresourcemanager",
        "compute",
        "container",
        "connectors",
        "dataform",
        "firestore",
        "iap",
        "integrations",
        "logging",
        "pubsublite",
        "secretmanager",
        "spanner",
        "sqladmin",
        "storage",
    )
)
_PERMISSION_HOST = {"resourcemanager": "cloudresourcemanager", "billing": "cloudbilling"}


def services_ignoring_resource_conditions(permissions: Iterable[str]) -> list[str]:
    """The services among `permissions` whose checks ignore conditions on resource attributes."""
    hosts = {f"{_PERMISSION_HOST.get(p.split('.', 1)[0], p.split('.', 1)[0])}.googleapis.com" for p in permissions}
    return sorted(hosts - CONDITION_RESOURCE_SERVICES)


@cache
def escalation_methods() -> Mapping[str, frozenset[str]]:
    """Public privilege-escalation methods (reference/gcp-privesc/methods.json): name -> the permissions
    that, held together, make the holder another principal. Read here as the program's model reads it
    (infra/access/escalation.py; a test keeps the two equal)."""
    listed = json.loads((PRIVESC / "methods.json").read_text())["methods"]
    return {method: frozenset(entry["permissions"]) for method, entry in listed.items()}


def escalations(permissions: Iterable[str]) -> list[str]:
    """The escalation methods all of whose permissions are among `permissions`."""
    held = set(permissions)
    return sorted(method for method, needed in escalation_methods().items() if needed <= held)
