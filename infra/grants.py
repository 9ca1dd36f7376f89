"""The platform's grant helpers: one way to give an account a role, at each level.

- `act_as`: the deployer may attach one service account (to a TPU VM, a Scheduler job, a function);
  Google checks `iam.serviceAccounts.actAs` on the account itself, so the grant is made there, never
  on the project. Whatever attaches the account must depend on the grant (tests check the closure).
- `project_role`: a project-level role. Conditions on resource attributes are refused for services
  that ignore them (Google's "Resource attributes for IAM Conditions"): such a grant would silently
  apply to every resource of the service.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_gcp as gcp

from infra import iam
from infra.access import iamdata

SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"
_RESOURCE_ATTRIBUTE = re.compile(r"\bresource\.(name|type|service)\b")


class UnsupportedConditionError(ValueError):
    pass


def check_condition(
    role: str, permissions: frozenset[str], expression: str | None, on_service: str | None = None
) -> None:
    """Refuse a condition on resource attributes when a service the role covers does not support them.

    `on_service`: the grant is on one resource of that service (a bucket, say), where only that
    service's permissions take effect; None for a project-level grant.
    """
    if not expression or not _RESOURCE_ATTRIBUTE.search(expression):
        return
    services = {iamdata.service_of_permission(p) for p in permissions}
    if on_service is not None:
        services &= {on_service}
    unsupported = sorted(services - iamdata.CONDITION_RESOURCE_SERVICES)
    if unsupported:
        raise UnsupportedConditionError(
            f"{role}: a condition on resource attributes ({expression!r}) is ignored by {', '.join(unsupported)} "
            "(cloud.google.com/iam/docs/conditions-resource-attributes), so the grant would cover every resource "
            "of those services; scope it another way"
        )


def objects_under(bucket: str, prefix: str) -> str:
    """The condition "objects named `prefix`…" as Cloud Storage evaluates it on an object call: an object's
    name is `projects/_/buckets/BUCKET/objects/NAME` (conditions-resource-attributes)."""
    return f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}")'


def prefix_condition(bucket: str, prefix: str, title: str) -> gcp.storage.BucketIAMMemberConditionArgs:
    """Objects under `prefix` only, listing included.

    Cloud Storage checks object reads and writes on the object, whose name in a condition is
    `projects/_/buckets/BUCKET/objects/NAME` (resource.name; Cloud Storage supports resource attributes),
    and `objects.list` on the bucket, where only the `storage.googleapis.com/objectListPrefix` API
    attribute narrows it (IAM, "Attribute reference for IAM Conditions": API attributes).
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*/", prefix):
        raise ValueError(f"prefix {prefix!r}: lowercase letters, digits, '.', '_', '-' and '/', ending in '/'")
    return gcp.storage.BucketIAMMemberConditionArgs(
        title=title[:100],
        description=f"Only objects under {prefix}",
        expression=(
            f"{objects_under(bucket, prefix)} || "
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{prefix}")'
        ),
    )


def act_as(
    name: str, account: gcp.serviceaccount.Account, deployer: str, parent: pulumi.Resource
) -> gcp.serviceaccount.IAMMember:
    """The deployer may attach `account`; granted on that account only."""
    return gcp.serviceaccount.IAMMember(
        name,
        service_account_id=account.name,
        role=SERVICE_ACCOUNT_USER,
        member=iam.service_account_member(deployer),
        opts=pulumi.ResourceOptions(parent=parent),
    )


def project_role(
    name: str,
    project: str,
    role: str | pulumi.Output[str],
    member: pulumi.Input[str],
    *,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
    permissions: frozenset[str] | None = None,
    condition: gcp.projects.IAMMemberConditionArgs | None = None,
) -> gcp.projects.IAMMember:
    """`role` for `member` on `project`. Pass `permissions` for a custom role, so a condition can be checked."""
    if condition is not None:
        if not isinstance(condition.expression, str):
            raise TypeError(f"{name}: a condition's expression must be known at plan time, to be checked")
        held = permissions if permissions is not None else iamdata.role_permissions(str(role))
        check_condition(str(role), held, condition.expression)
    return gcp.projects.IAMMember(
        name,
        project=project,
        role=role,
        member=member,
        condition=condition,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on),
    )
