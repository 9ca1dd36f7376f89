"""Which roles a stack grants, to whom, where; and what each role it grants can do.

A grant is one (member, role) pair at one level: project, folder, organisation, service account or
billing account, read from the provider's member, binding and policy resources alike. Values a
preview does not know yet are None: "cannot tell", never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from infra.access import iamdata

# The custom roles the bootstrap makes for each environment (a stack only names them): their permissions,
# as computed into bootstrap/access.json, so the pack judges a grant of one like any other.
ACCESS_FILE = Path(__file__).resolve().parents[1] / "bootstrap" / "access.json"

# resource type -> (level, the property naming the resource the grant is made on)
GRANT_TYPES: Mapping[str, tuple[str, str]] = {
    **{
        f"gcp:projects/{t}": ("project", "project")
        for t in ("iAMMember:IAMMember", "iAMBinding:IAMBinding", "iAMPolicy:IAMPolicy")
    },
    **{
        f"gcp:folder/{t}": ("folder", "folder")
        for t in ("iAMMember:IAMMember", "iAMBinding:IAMBinding", "iAMPolicy:IAMPolicy")
    },
    **{
        f"gcp:organizations/{t}": ("organization", "orgId")
        for t in ("iAMMember:IAMMember", "iAMBinding:IAMBinding", "iAMPolicy:IAMPolicy")
    },
    **{
        f"gcp:serviceaccount/{t}": ("service-account", "serviceAccountId")
        for t in ("iAMMember:IAMMember", "iAMBinding:IAMBinding", "iAMPolicy:IAMPolicy")
    },
    **{
        f"gcp:billing/{t}": ("billing-account", "billingAccountId")
        for t in (
            "accountIamMember:AccountIamMember",
            "accountIamBinding:AccountIamBinding",
            "accountIamPolicy:AccountIamPolicy",
        )
    },
}
PROJECT_CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
ORGANIZATION_CUSTOM_ROLE = "gcp:organizations/iAMCustomRole:IAMCustomRole"


@dataclass(frozen=True)
class Grant:
    level: str  # project | folder | organization | service-account | billing-account
    target: str | None  # project id, folder, organisation id, service account email, billing account id
    role: str | None
    member: str | None
    condition: Mapping[str, Any] | None


def _service_account_email(account_id: str | None) -> str | None:
    """`projects/P/serviceAccounts/EMAIL` (the provider's usual form) or a bare email -> EMAIL."""
    return account_id.rsplit("/serviceAccounts/", 1)[-1] if account_id else None


def grants_of(resource_type: str, props: Mapping[str, Any]) -> list[Grant]:
    """The grants one resource makes; [] for a resource that grants nothing."""
    if resource_type not in GRANT_TYPES:
        return []
    level, target_property = GRANT_TYPES[resource_type]
    target = props.get(target_property)
    if level == "service-account":
        target = _service_account_email(target)
    if resource_type.endswith("Policy"):
        data = props.get("policyData")
        if not data:
            return [Grant(level, target, None, None, None)]  # unknown policy: cannot tell
        bindings = json.loads(data).get("bindings") or []
    else:
        bindings = [props]
    grants: list[Grant] = []
    for binding in bindings:
        members = [binding["member"]] if "member" in binding else binding.get("members")
        for member in members if members is not None else [None]:
            grants.append(Grant(level, target, binding.get("role"), member, binding.get("condition")))
    return grants


def custom_role_name(resource_type: str, props: Mapping[str, Any]) -> str | None:
    """The name a grant uses for a declared custom role: projects/P/roles/ID or organizations/O/roles/ID."""
    if resource_type == PROJECT_CUSTOM_ROLE and props.get("project") and props.get("roleId"):
        return f"projects/{props['project']}/roles/{props['roleId']}"
    if resource_type == ORGANIZATION_CUSTOM_ROLE and props.get("orgId") and props.get("roleId"):
        return f"organizations/{props['orgId']}/roles/{props['roleId']}"
    return None


@cache
def bootstrap_roles() -> Mapping[str, frozenset[str]]:
    """`projects/P/roles/ID` -> permissions, for the custom roles the bootstrap makes."""
    access = json.loads(ACCESS_FILE.read_text()) if ACCESS_FILE.exists() else {}
    return {
        f"projects/{entry['project']}/roles/{role_id}": frozenset(role["permissions"])
        for entry in access.values()
        for role_id, role in entry.get("roles", {}).items()
    }


def custom_roles_declared(resources: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, frozenset[str]]:
    """Custom role name -> its permissions, for the custom roles a stack declares or the bootstrap makes."""
    roles: dict[str, frozenset[str]] = dict(bootstrap_roles())
    for resource_type, props in resources:
        if name := custom_role_name(resource_type, props):
            roles[name] = frozenset(props.get("permissions") or ())
    return roles


def role_permissions(role: str, custom_roles: Mapping[str, frozenset[str]]) -> frozenset[str] | None:
    """What `role` can do, or None when the pack cannot tell (a role neither Google's data nor the stack defines)."""
    if role.startswith("roles/"):
        return iamdata.roles().get(role)
    return custom_roles.get(role)
