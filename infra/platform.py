"""The whole environment, built from one validated `PlatformConfig`."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.apis import ProjectApis, required_apis
from infra.budget import BudgetAlerts
from infra.config import PlatformConfig
from infra.identity import WorkloadIdentity
from infra.storage import PlatformBuckets


def build_platform(cfg: PlatformConfig) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs."""
    apis = ProjectApis("apis", cfg.project, required_apis(cfg))
    buckets = PlatformBuckets("buckets", cfg, apis)
    identities = {w.name: WorkloadIdentity(f"workload-{w.name}", cfg, w, buckets.buckets, apis) for w in cfg.workloads}
    budget = BudgetAlerts("budget", cfg, apis)

    return {
        "project": cfg.project,
        "environment": cfg.environment,
        "enabledApis": sorted(apis.services),
        "bucketUrls": buckets.urls,
        "serviceAccounts": {name: identity.email for name, identity in identities.items()},
        "budgetName": budget.budget.name,
        "budgetAlertTopic": budget.topic.id if budget.topic else None,
    }


def export_all(outputs: dict[str, Any]) -> None:
    for key, value in outputs.items():
        pulumi.export(key, value)
