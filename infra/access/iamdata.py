"""Google's predefined roles and the permissions each REST method checks, read from `reference/gcp-iam/`.

The tables come from the public iam-dataset (see reference/gcp-iam/README.md). Where that dataset is
wrong or silent, `METHOD_FIXES` says what the method really checks and where Google says so.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "reference" / "gcp-iam"

# Methods the dataset lacks or gets wrong, with Google's own page for each.
METHOD_FIXES: dict[str, tuple[str, ...]] = {
    # Logging's access-control page: writing log entries needs logging.logEntries.create.
    # https://cloud.google.com/logging/docs/access-control
    "logging.entries.write": ("logging.logEntries.create",),
    # The dataset maps a provider's patch to the workforce-pool permissions; the roles data (and the
    # Workload Identity Pool Admin role) name the workload-pool ones.
    "iam.projects.locations.workloadIdentityPools.providers.patch": (
        "iam.googleapis.com/workloadIdentityPoolProviders.get",
        "iam.googleapis.com/workloadIdentityPoolProviders.update",
    ),
    "iam.projects.locations.workloadIdentityPools.patch": (
        "iam.googleapis.com/workloadIdentityPools.get",
        "iam.googleapis.com/workloadIdentityPools.update",
    ),
    # `gcloud beta services identity create` (services.generateServiceIdentity) needs
    # serviceusage.services.use on the project (Service Usage access-control page).
    "serviceusage.services.generateServiceIdentity": ("serviceusage.services.use",),
    # projects.serviceAccount.get returns (and creates) the Cloud Storage service agent; Cloud
    # Storage's IAM permissions page lists resourcemanager.projects.get for it.
    "storage.projects.serviceAccount.get": ("resourcemanager.projects.get",),
    # Logging's access-control page: reading log entries (entries.list) needs logging.logEntries.list
    # (roles/logging.viewer holds it); private logs, which tpu-workload is not, need privateLogEntries.
    # https://cloud.google.com/logging/docs/access-control
    "logging.entries.list": ("logging.logEntries.list",),
    # Cloud DNS, "Access control with IAM" (cloud.google.com/dns/docs/access-control): each method checks its
    # own permission; a private zone bound to a network also needs dns.networks.bindPrivateDNSZone; a change
    # needs the record sets' create, update and delete it makes.
    "dns.managedZones.create": ("dns.managedZones.create", "dns.networks.bindPrivateDNSZone"),
    "dns.managedZones.get": ("dns.managedZones.get",),
    "dns.managedZones.patch": ("dns.managedZones.update", "dns.networks.bindPrivateDNSZone"),
    "dns.managedZones.delete": ("dns.managedZones.delete",),
    "dns.changes.create": (
        "dns.changes.create",
        "dns.resourceRecordSets.create",
        "dns.resourceRecordSets.update",
        "dns.resourceRecordSets.delete",
    ),
    "dns.changes.get": ("dns.changes.get",),
    "dns.resourceRecordSets.list": ("dns.resourceRecordSets.list",),
    # Cloud Billing access control: changing a billing account's IAM needs billing.accounts.setIamPolicy.
    # https://cloud.google.com/billing/docs/how-to/billing-access
    "cloudbilling.billingAccounts.setIamPolicy": ("billing.accounts.setIamPolicy",),
    # A Kubernetes API request through a GKE cluster's DNS-based endpoint: IAM decides who may connect
    # before RBAC sees the request (GKE "About network isolation", DNS-based endpoint), with
    # container.clusters.connect, the permission roles/container.clusterViewer adds to get and list
    # (roles.json; a user's report of the DNS endpoint names the same permission).
    "container.dnsEndpoint.request": ("container.clusters.connect",),
}

# "Resource attributes for IAM Conditions" (cloud.google.com/iam/docs/conditions-resource-attributes):
# only these services recognise resource.name / resource.type / resource.service in a condition.
CONDITION_RESOURCE_SERVICES: frozenset[str] = frozenset(
    f"{s}.googleapis.com"
    for s in (
        *("apigee", "apihub", "backupdr", "bigquery", "bigqueryreservation", "bigtableadmin", "binaryauthorization"),
        *("ces", "clouddeploy", "cloudkms", "cloudresourcemanager", "compute", "container", "connectors"),
        *("dataform", "firestore", "iap", "integrations", "logging", "pubsublite", "secretmanager", "spanner"),
        *("sqladmin", "storage"),
    )
)

# Permission services whose API host differs from the permission prefix.
_PERMISSION_SERVICE_HOST = {"resourcemanager": "cloudresourcemanager", "billing": "cloudbilling"}


class UnknownMethodError(KeyError):
    pass


@cache
def roles() -> dict[str, frozenset[str]]:
    data = json.loads((DATA / "roles.json").read_text())
    return {name: frozenset(entry["permissions"]) for name, entry in data.items()}


@cache
def _methods() -> dict[str, tuple[str, ...]]:
    data = json.loads((DATA / "methods.json").read_text())
    return {name: tuple(_normalise(p) for p in perms) for name, perms in data.items()}


def _normalise(permission: str) -> str:
    # Google spells workload identity pool permissions with the host ("iam.googleapis.com/x.create",
    # as roles.json does); the methods table writes a dash there.
    return re.sub(r"^iam\.googleapis\.com-", "iam.googleapis.com/", permission)


def method_permissions(method: str, *, acls: bool = True, overwrite: bool = True) -> frozenset[str]:
    """What Google checks when `method` (e.g. `tpu.projects.locations.nodes.create`) is called.

    The table lists, for Cloud Storage reads and writes, the IAM-policy permissions that only
    `projection=full` or an ACL in the request needs (Cloud Storage, "IAM permissions for JSON API
    methods"); `acls=False` drops them from object calls and bucket listings, for code that never asks
    for ACLs (storage.v1: `projection` "Defaults to noAcl"). The same page lists
    `storage.objects.delete` for `objects.insert` "only if overwriting an existing object":
    `overwrite=False` drops it, for code that writes new objects only (`ifGenerationMatch=0`).
    """
    if method in METHOD_FIXES:
        return frozenset(METHOD_FIXES[method])
    known = _methods().get(method)
    if not known:  # absent, or [] which the dataset uses for "unknown"
        raise UnknownMethodError(f"no permission data for {method!r}: add it to METHOD_FIXES, with a source")
    if not acls and (method.startswith("storage.objects.") or method == "storage.buckets.list"):
        known = tuple(p for p in known if not p.endswith(("IamPolicy",))) or known
    if not overwrite and method == "storage.objects.insert":
        known = tuple(p for p in known if p != "storage.objects.delete")
    return frozenset(known)


def permissions_for(methods: tuple[str, ...]) -> tuple[str, ...]:
    """The permissions a custom role needs for code calling `methods`, in a stable order.

    Act-as is left out: it is checked on the attached account and granted there, never in a role."""
    needed = {p for m in methods for p in method_permissions(m, acls=False)}
    return tuple(sorted(needed - {"iam.serviceAccounts.actAs"}))


def role_permissions(role: str) -> frozenset[str]:
    try:
        return roles()[role]
    except KeyError:
        raise KeyError(f"{role!r} is not a predefined role in reference/gcp-iam/roles.json") from None


def service_of_permission(permission: str) -> str:
    """The API host a permission belongs to: `tpu.nodes.get` -> `tpu.googleapis.com`."""
    prefix = permission.split(".", 1)[0]
    return f"{_PERMISSION_SERVICE_HOST.get(prefix, prefix)}.googleapis.com"


# Verbs that look like reads but mint credentials.
TOKEN_VERBS = frozenset({"getAccessToken", "getOpenIdToken", "getIdToken"})
# Reaching a GKE control plane through its DNS endpoint: it grants nothing in the cluster, where IAM's own
# container.* permissions and RBAC decide each request, so a reader may hold it (a preview reads through it).
GATEWAYS = frozenset({"container.clusters.connect"})


def is_read(permission: str) -> bool:
    """Whether a permission only reads: a get, list or search, or a gateway that lets reads reach what
    decides them (never a write, a use, or a token)."""
    verb = permission.rsplit(".", 1)[-1]
    return permission in GATEWAYS or (verb.startswith(("get", "list", "search")) and verb not in TOKEN_VERBS)
