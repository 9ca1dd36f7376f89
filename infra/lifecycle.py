"""Scheduled stop/start of TPU VMs (S15): Cloud Scheduler calls the TPU API with OAuth.

The calls run as a dedicated scheduler service account holding one custom role with exactly the
permissions stop/start need, so a leaked schedule can do nothing else.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from infra import iam
from infra.apis import ProjectApis
from infra.config import PlatformConfig, TpuVmSettings

SCHEDULER_PERMISSIONS = ("tpu.nodes.get", "tpu.nodes.start", "tpu.nodes.stop")
SELF_STOP_PERMISSIONS = ("tpu.nodes.get", "tpu.nodes.stop", "tpu.nodes.delete")
TPU_API = "https://tpu.googleapis.com/v2"


def node_url(project: str, vm: TpuVmSettings) -> str:
    return f"{TPU_API}/projects/{project}/locations/{vm.zone}/nodes/{vm.name}"


def custom_role_id(prefix: str, stack: str) -> str:
    """Custom role ids allow letters, digits, '_' and '.' only."""
    return prefix + "".join(part.capitalize() for part in stack.split("-"))


def custom_role(
    name: str, cfg: PlatformConfig, apis: ProjectApis, parent: pulumi.Resource, *,
    id_prefix: str, title: str, description: str, permissions: Sequence[str],
) -> gcp.projects.IAMCustomRole:  # fmt: skip
    """A project custom role holding exactly `permissions`: the platform's unit of least privilege."""
    return gcp.projects.IAMCustomRole(
        f"{name}-role",
        project=cfg.project,
        role_id=custom_role_id(id_prefix, cfg.stack),
        title=f"tpu-platform: {title} ({cfg.stack})",
        description=description,
        permissions=list(permissions),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=apis.needs("iam")),
    )


class TpuSchedules(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: PlatformConfig,
        apis: ProjectApis,
        nodes: dict[str, pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:lifecycle:TpuSchedules", name, None, opts)
        scheduled = [vm for vm in cfg.tpu_vms if vm.schedule]
        iam_api = pulumi.ResourceOptions(parent=self, depends_on=apis.needs("iam"))
        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=f"tpu-scheduler-{cfg.stack}",
            display_name=f"TPU stop/start schedules ({cfg.stack})",
            project=cfg.project,
            opts=iam_api,
        )
        self.role = custom_role(
            name, cfg, apis, self, id_prefix="tpuPlatformScheduler", title="TPU scheduler",
            description="Start, stop and read TPU nodes; nothing else.", permissions=SCHEDULER_PERMISSIONS,
        )  # fmt: skip
        grant = gcp.projects.IAMMember(
            f"{name}-grant",
            project=cfg.project,
            role=self.role.name,
            member=self.account.email.apply(iam.service_account_member),
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("cloudresourcemanager")),
        )
        self.jobs: list[gcp.cloudscheduler.Job] = []
        for vm in scheduled:
            assert vm.schedule is not None
            for action, cron in (("start", vm.schedule.start), ("stop", vm.schedule.stop)):
                self.jobs.append(
                    gcp.cloudscheduler.Job(
                        f"{name}-{vm.name}-{action}",
                        name=f"tpu-{vm.name}-{action}",
                        project=cfg.project,
                        region=vm.region,
                        description=f"{action.capitalize()} TPU VM {vm.name} ({cfg.stack})",
                        schedule=cron,
                        time_zone=vm.schedule.time_zone,
                        http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                            uri=f"{node_url(cfg.project, vm)}:{action}",
                            http_method="POST",
                            body=base64.b64encode(b"{}").decode(),
                            headers={"Content-Type": "application/json"},
                            oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                                service_account_email=self.account.email,
                                scope="https://www.googleapis.com/auth/cloud-platform",
                            ),
                        ),
                        retry_config=gcp.cloudscheduler.JobRetryConfigArgs(retry_count=3),
                        opts=pulumi.ResourceOptions(
                            parent=self, depends_on=[*apis.needs("cloudscheduler"), grant, nodes[vm.name]]
                        ),
                    )
                )
        self.register_outputs({"account": self.account.email})


def schedule_outputs(vms: Sequence[TpuVmSettings]) -> dict[str, dict[str, str]]:
    return {
        vm.name: {"start": vm.schedule.start, "stop": vm.schedule.stop, "timeZone": vm.schedule.time_zone}
        for vm in vms
        if vm.schedule
    }


class RunToCompletion(pulumi.ComponentResource):
    """Lets a workload stop or delete its own TPU when its run is complete (onCompletion).

    One custom role with stop/delete/get, granted to each such workload's account under an IAM
    condition naming its own node, so a workload cannot touch another TPU.
    """

    def __init__(
        self,
        name: str,
        cfg: PlatformConfig,
        apis: ProjectApis,
        accounts: dict[str, pulumi.Output[str]],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:lifecycle:RunToCompletion", name, None, opts)
        self.role = custom_role(
            name, cfg, apis, self, id_prefix="tpuPlatformSelfStop", title="stop or delete own TPU",
            description="Granted per TPU VM, conditioned on that node's name.", permissions=SELF_STOP_PERMISSIONS,
        )  # fmt: skip
        for vm in cfg.tpu_vms:
            if vm.on_completion == "keep":
                continue
            node = f"projects/{cfg.project}/locations/{vm.zone}/nodes/{vm.name}"
            gcp.projects.IAMMember(
                f"{name}-{vm.name}",
                project=cfg.project,
                role=self.role.name,
                member=accounts[vm.workload].apply(iam.service_account_member),
                condition=gcp.projects.IAMMemberConditionArgs(
                    title=f"only-{vm.name}"[:100],
                    description=f"{vm.on_completion} TPU VM {vm.name} when its run is complete",
                    expression=f'resource.name == "{node}"',
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("cloudresourcemanager")),
            )
        self.register_outputs({})
