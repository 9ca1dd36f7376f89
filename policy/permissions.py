"""Which permissions the pack never lets pass.

What a role can do comes from the permission model, `infra.access` (Google's role data through
`infra.access.iamdata`), which needs nothing beyond the standard library: the pack runs from `policy/` in its
own virtualenv, with the repository root put on the path by `__main__.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

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


def why_denied(permission: str) -> str | None:
    """The reason `permission` is on the deny-list (its first matching entry), or None."""
    return next((why for pattern, why in DENIED_PERMISSIONS.items() if fnmatchcase(permission, pattern)), None)


def denied(permissions: Iterable[str]) -> dict[str, str]:
    """The deny-listed permissions among `permissions`, each with its reason."""
    found = {p: why_denied(p) for p in permissions}
    return {p: why for p, why in sorted(found.items()) if why}
