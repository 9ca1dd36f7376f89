"""The service accounts and custom roles a stack uses, which the bootstrap makes: never the deployer.

Why the bootstrap: an identity that can create or change a custom role can put any permission into a
role it may already grant (a `modifiedGrantsByRole` condition checks role names, not what they
hold), and one that can set IAM on service accounts can make itself token creator on any account of
the project, the Compute default account included; IAM Conditions cannot narrow either
(`iam.googleapis.com` supports no resource attributes: reference/gcp-iam/README.md). So each
component declares here what it needs, as data; `infra/platform.py` collects the stack's
(`StackIdentities`); `tools/offline/access.py` writes them into `bootstrap/access.json`; the bootstrap
creates them and grants act-as on them. The stack only refers to them by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra import naming

SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"  # act-as, granted on the account itself


@dataclass(frozen=True)
class AccountSpec:
    account_id: str
    display_name: str
    description: str | None = None

    def email(self, project: str) -> str:
        return f"{self.account_id}@{project}.iam.gserviceaccount.com"

    def member(self, project: str) -> str:
        return f"serviceAccount:{self.email(project)}"

    def name(self, project: str) -> str:
        """The account's resource name, as attachments and IAM members of an account take it."""
        return f"projects/{project}/serviceAccounts/{self.email(project)}"


@dataclass(frozen=True)
class RoleSpec:
    role_id: str
    title: str
    description: str
    permissions: tuple[str, ...]

    @classmethod
    def of(cls, kind: str, stack: str, title: str, description: str, permissions: Iterable[str]) -> RoleSpec:
        """A stack's custom role holding exactly `permissions`: the platform's unit of least privilege."""
        return cls(
            naming.custom_role_id(kind, stack), f"tpu-platform: {title} ({stack})", description, tuple(permissions)
        )

    def name(self, project: str) -> str:
        return f"projects/{project}/roles/{self.role_id}"


@dataclass(frozen=True)
class StackIdentities:
    """What a stack needs made for it. `acts_as`: (account, account it may attach at run time), for the
    attachments no plan shows (the guard re-creates nodes as their workload's account)."""

    accounts: tuple[AccountSpec, ...] = ()
    roles: tuple[RoleSpec, ...] = ()
    acts_as: tuple[tuple[str, str], ...] = field(default=())

    def __add__(self, other: StackIdentities) -> StackIdentities:
        return StackIdentities(self.accounts + other.accounts, self.roles + other.roles, self.acts_as + other.acts_as)

    def as_json(self) -> dict[str, Any]:
        return {
            "accounts": {
                a.account_id: {"displayName": a.display_name}
                | ({"description": a.description} if a.description else {})
                for a in sorted(self.accounts, key=lambda a: a.account_id)
            },
            "roles": {
                r.role_id: {"title": r.title, "description": r.description, "permissions": sorted(r.permissions)}
                for r in sorted(self.roles, key=lambda r: r.role_id)
            },
            "actsAs": sorted([actor, target] for actor, target in set(self.acts_as)),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StackIdentities:
        return cls(
            tuple(AccountSpec(k, v["displayName"], v.get("description")) for k, v in data.get("accounts", {}).items()),
            tuple(
                RoleSpec(k, v["title"], v["description"], tuple(v["permissions"]))
                for k, v in data.get("roles", {}).items()
            ),
            tuple((actor, target) for actor, target in data.get("actsAs", [])),
        )
