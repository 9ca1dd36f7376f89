"""Project APIs. Every resource that needs an API depends on its `Service`, so the first
`pulumi up` on a fresh project succeeds in one pass.

Each component module declares the APIs it needs (`APIS`, or a function of its args where a
feature decides); `infra/platform.py` passes those of the components it declares to `required_apis`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pulumi
import pulumi_gcp as gcp


def required_apis(*needs: Iterable[str]) -> tuple[str, ...]:
    """The APIs a stack enables: every one a declared component needs, each once, in first-seen order."""
    return tuple(dict.fromkeys(api for apis in needs for api in apis))


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
            raise ValueError(f"APIs not enabled for this stack: {missing}; add them to the APIs its module declares")
        return [self.services[f"{a}.googleapis.com"] for a in apis]
