"""A TPU VM's life: scheduled stop and start, and what happens when its run is complete.

- Stops: Cloud Scheduler calls the TPU API's `nodes.stop` with OAuth as a scheduler account whose
  custom role holds exactly get and stop (both made by the bootstrap: `scheduler_identities`).
- Starts go through the TPU guard's `scheduled-start` function (OIDC), which starts a node only if
  its run is not complete: a finished run is never booted again by the next morning's schedule.
- A schedule may give only one side: a job is made for each side it gives (the reader refuses a
  start with nothing to stop the VM, rules.py).
- Run to completion: the workload writes `<vm>/COMPLETE` in the run-status bucket (its account may
  write only under its own VM's prefix); the guard, told by the object's finalize event, stops or
  deletes the node. The VM holds no TPU right at all (Cloud TPU ignores resource conditions, so a
  grant "on its own node" cannot be expressed: reference/gcp-iam/README.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import iam
from infra.access.identities import SCHEDULER_PERMISSIONS, scheduler_account, scheduler_role
from infra.apis import ProjectApis
from infra.buckets import private_bucket
from infra.config import Env, TpuVmSettings
from run_contract import paths

TPU_API = "https://tpu.googleapis.com/v2"
# The run-status bucket and its grants.
RUN_STATUS_APIS = ("storage.googleapis.com",)
# The scheduler account, its role and grants, and the jobs.
SCHEDULES_APIS = ("iam.googleapis.com", "cloudresourcemanager.googleapis.com", "cloudscheduler.googleapis.com")
# cloudscheduler.v1 Job.attemptDeadline: past it "the request is cancelled and the attempt is marked as a
# DEADLINE_EXCEEDED failure"; "For HTTP targets, the default is 3 minutes. The deadline must be in the
# interval [15 seconds, 30 minutes]."
HTTP_ATTEMPT_DEADLINE_S = (15, 30 * 60)


def attempt_deadline(timeout_s: int) -> str:
    """A job's attemptDeadline for a function that may run `timeout_s` seconds: as long as it may take, so
    Cloud Scheduler neither cancels a call still at work nor counts it failed."""
    low, high = HTTP_ATTEMPT_DEADLINE_S
    if not low <= timeout_s <= high:
        raise ValueError(f"a Cloud Scheduler HTTP job waits {low} s to {high} s, not {timeout_s} s")
    return f"{timeout_s}s"


def node_url(project: str, vm: TpuVmSettings) -> str:
    return f"{TPU_API}/{naming.node_path(project, vm.zone, vm.name)}"


@dataclass(frozen=True)
class StartTarget:
    """Where scheduled starts go: the guard's function, called with OIDC as its invoker account."""

    url: pulumi.Output[str]
    invoker_email: pulumi.Input[str]
    ready: list[pulumi.Resource]  # the invoker's run.invoker grants
    deadline: str  # the job's attemptDeadline: as long as the function may run


@dataclass(frozen=True)
class TpuSchedulesArgs:
    vms: tuple[TpuVmSettings, ...]  # the VMs with a schedule

    @property
    def stops(self) -> bool:
        """A schedule stops a VM: only then is the scheduler account (get and stop) used."""
        return any(vm.schedule and vm.schedule.stop for vm in self.vms)


class TpuSchedules(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: TpuSchedulesArgs,
        apis: ProjectApis,
        nodes: dict[str, pulumi.Resource],
        start: StartTarget | None,  # the guard's scheduled start: None when no schedule starts a VM
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:lifecycle:TpuSchedules", name, None, opts)
        scheduled = [vm for vm in args.vms if vm.schedule]
        account = scheduler_account(env.stack)
        self.email = account.email(env.project)
        ready: list[pulumi.Resource] = []
        if args.stops:
            ready.append(
                grants.project_role(
                    f"{name}-grant",
                    env.project,
                    scheduler_role(env.stack).name(env.project),
                    account.member(env.project),
                    parent=self,
                    depends_on=apis.needs("cloudresourcemanager"),
                    permissions=frozenset(SCHEDULER_PERMISSIONS),
                )
            )
        self.jobs: list[gcp.cloudscheduler.Job] = []
        for vm in scheduled:
            assert vm.schedule is not None
            if vm.name not in nodes:
                continue  # deleted once its run completed: nothing left to start or stop

            def job(
                action: str,
                cron: str,
                what: str,
                target: gcp.cloudscheduler.JobHttpTargetArgs,
                waits: list[pulumi.Resource],
                deadline: str | None = None,
                vm: TpuVmSettings = vm,
            ) -> gcp.cloudscheduler.Job:
                return gcp.cloudscheduler.Job(
                    f"{name}-{vm.name}-{action}",
                    name=naming.scheduler_job(vm.name, action),
                    project=env.project,
                    region=vm.region,
                    description=f"{what} ({env.stack})",
                    schedule=cron,
                    time_zone=vm.schedule.time_zone if vm.schedule else "Etc/UTC",
                    http_target=target,
                    retry_config=gcp.cloudscheduler.JobRetryConfigArgs(retry_count=3),
                    attempt_deadline=deadline,
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[*apis.needs("cloudscheduler"), nodes[vm.name], *waits]
                    ),
                )

            json_body = {"Content-Type": "application/json"}
            # Stop: the TPU API directly (cloudscheduler.v1 HttpTarget with an OAuth token).
            stop = gcp.cloudscheduler.JobHttpTargetArgs(
                uri=f"{node_url(env.project, vm)}:stop",
                http_method="POST",
                body=base64.b64encode(b"{}").decode(),
                headers=json_body,
                oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                    service_account_email=self.email, scope="https://www.googleapis.com/auth/cloud-platform"
                ),
            )
            if vm.schedule.stop:
                self.jobs.append(job("stop", vm.schedule.stop, f"Stop TPU VM {vm.name}", stop, ready))
            if not vm.schedule.start:
                continue
            assert start is not None, "a schedule that starts a VM needs the guard's scheduled start"
            # Start: through the guard, which refuses to boot a VM whose run is complete.
            begin = gcp.cloudscheduler.JobHttpTargetArgs(
                uri=start.url,
                http_method="POST",
                body=base64.b64encode(json.dumps({"node": vm.name}).encode()).decode(),
                headers=json_body,
                oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                    service_account_email=start.invoker_email, audience=start.url
                ),
            )
            what = f"Start TPU VM {vm.name} unless its run is complete"
            self.jobs.append(job("start", vm.schedule.start, what, begin, start.ready, start.deadline))
        self.register_outputs({"account": self.email})


def schedule_outputs(vms: Sequence[TpuVmSettings]) -> dict[str, dict[str, str]]:
    return {vm.name: {**vm.schedule.given, "timeZone": vm.schedule.time_zone} for vm in vms if vm.schedule}


@dataclass(frozen=True)
class RunStatusArgs:
    location: str  # the platform buckets' location
    writers: tuple[tuple[str, str], ...]  # (TPU VM, the workload it runs): who writes under which prefix


class RunStatus(pulumi.ComponentResource):
    """The run-status bucket: completion markers, and the guard's own records.

    Kept by `pulumi destroy` in every stack (a completed run must stay completed), versioned, private.
    Each workload account may read and write only under the prefixes of the VMs it runs on: Cloud
    Storage recognises `resource.name` in conditions (conditions-resource-attributes), and the object
    name is `projects/_/buckets/BUCKET/objects/NAME`. Listing is checked on the bucket, not the object,
    where the `objectListPrefix` API attribute limits it to the VM's own prefix: the VM's agent lists
    the run requests researchers leave under `<vm>/requests/` (vm_agent/run_requests.py).
    """

    def __init__(
        self,
        name: str,
        env: Env,
        args: RunStatusArgs,
        accounts: dict[str, str],  # workload -> its account's email
        encryption: gcp.storage.BucketEncryptionArgs | None,
        ready: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:lifecycle:RunStatus", name, None, opts)
        self.bucket_name = env.bucket_name("status")
        self.bucket = private_bucket(
            f"{name}-bucket",
            env,
            name=self.bucket_name,
            purpose="run-status",
            location=args.location,
            encryption=encryption,
            opts=pulumi.ResourceOptions(parent=self, depends_on=ready, retain_on_delete=True, protect=env.production),
        )
        self.grants: dict[str, pulumi.Resource] = {}
        for vm, workload in args.writers:
            # Listing its own prefix too: the agent lists <vm>/requests/ (vm_agent/run_requests.py).
            self.grants[vm] = grants.bucket_access(
                f"{name}-{vm}-writer",
                self.bucket_name,
                self.bucket.name,
                "write",
                iam.service_account_member(accounts[workload]),
                prefix=paths.status_prefix(vm),
                title=f"run-status-{vm}",
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({"bucket": self.bucket.name})
