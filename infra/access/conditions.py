"""IAM Conditions the platform may write: a condition on resource attributes is refused where a service
the role covers ignores it (Google's "Resource attributes for IAM Conditions"), since such a grant would
silently apply to every resource of the service."""

from __future__ import annotations

import re
from collections.abc import Iterable

from infra.access import iamdata

_RESOURCE_ATTRIBUTE = re.compile(r"\bresource\.(name|type|service)\b")


class UnsupportedConditionError(ValueError):
    pass


def names_resource_attributes(expression: str | None) -> bool:
    """Whether a condition's expression tests resource.name, resource.type or resource.service."""
    return expression is not None and _RESOURCE_ATTRIBUTE.search(expression) is not None


def services_ignoring_resource_attributes(permissions: Iterable[str]) -> list[str]:
    """The services among `permissions` whose checks ignore conditions on resource attributes."""
    return sorted({iamdata.service_of_permission(p) for p in permissions} - iamdata.CONDITION_RESOURCE_SERVICES)


def check_condition(
    role: str, permissions: frozenset[str], expression: str | None, on_service: str | None = None
) -> None:
    """Refuse a condition on resource attributes when a service the role covers does not support them.

    `on_service`: the grant is on one resource of that service (a bucket, say), where only that
    service's permissions take effect; None for a project-level grant.
    """
    if not names_resource_attributes(expression):
        return
    unsupported = services_ignoring_resource_attributes(permissions)
    if on_service is not None:
        unsupported = [service for service in unsupported if service == on_service]
    if unsupported:
        raise UnsupportedConditionError(
            f"{role}: a condition on resource attributes ({expression!r}) is ignored by {', '.join(unsupported)} "
            "(cloud.google.com/iam/docs/conditions-resource-attributes), so the grant would cover every resource "
            "of those services; scope it another way"
        )
