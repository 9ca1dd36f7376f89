"""Project APIs (S2). Every resource that needs an API depends on its `Service`, so the first
`pulumi up` on a fresh project succeeds in one pass."""

from __future__ import annotations

from collections.abc import Iterable

import pulumi
import pulumi_gcp as gcp

from infra import artifacts
from infra.config import PlatformConfig

# The TPU guard's serverless stack (see infra/automation.py).
AUTOMATION_APIS = (
    "cloudfunctions.googleapis.com",
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "eventarc.googleapis.com",
)

BASE_APIS = (
    "cloudresourcemanager.googleapis.com",  # project IAM grants
    "iam.googleapis.com",
    "storage.googleapis.com",
    "compute.googleapis.com",
    "tpu.googleapis.com",
    "billingbudgets.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
)


def guard_needed(cfg: PlatformConfig) -> bool:
    """The TPU guard serves budget actions, recovery, run completion and scheduled starts."""
    return bool(cfg.automation.enabled or cfg.has_self_stop or cfg.has_schedules)


def required_apis(cfg: PlatformConfig) -> tuple[str, ...]:
    apis: list[str] = list(BASE_APIS)
    if cfg.budget.pubsub_topic:
        apis.append("pubsub.googleapis.com")
    if cfg.has_schedules or cfg.automation.recovery_every_minutes:
        apis.append("cloudscheduler.googleapis.com")
    if guard_needed(cfg):
        apis += list(AUTOMATION_APIS)
    apis += artifacts.REQUIRED_APIS
    return tuple(dict.fromkeys(apis))


class ProjectApis(pulumi.ComponentResource):
    def __init__(self, name: str, project: str, apis: Iterable[str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("tpu-platform:project:Apis", name, None, opts)
        # disable_on_destroy=False: turning an API off breaks anything else in the project using it.
        self.services = {
            api: gcp.projects.Service(
                f"{name}-{api.split('.')[0]}",
                project=project,
                service=api,
                disable_on_destroy=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for api in apis
        }
        self.register_outputs({"enabled": sorted(self.services)})

    def needs(self, *apis: str) -> list[pulumi.Resource]:
        """The Service resources to depend on; fails loudly if a component needs an API nobody enabled."""
        missing = [a for a in apis if f"{a}.googleapis.com" not in self.services]
        if missing:
            raise ValueError(f"APIs not enabled for this stack: {missing}; add them to required_apis")
        return [self.services[f"{a}.googleapis.com"] for a in apis]
