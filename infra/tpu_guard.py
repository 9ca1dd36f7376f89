"""The TPU guard: budget actions, preemption recovery, run completion and scheduled starts, as Cloud Run
functions (2nd gen) whose decisions are pure, tested Python in `functions/tpu_guard/`.

It is deployed in every stack that uses a feature needing it: a budget action, recovery, a VM with
`onCompletion: stop|delete`, or a schedule (starts go through it).

Identities (each grant has its evidence next to it):
- the guard account: a custom role with exactly the TPU permissions of the guard's calls; act-as on
  each workload account (a re-created node runs as it); the run-status bucket (completion markers,
  its recovery records); Eventarc's event receiver (Cloud Storage events) and `run.invoker` on the
  functions its triggers call;
- an invoker account for Cloud Scheduler: `run.invoker` on the recovery and scheduled-start services.
  A 2nd-gen function is served by the Cloud Run service of its name, and `roles/run.invoker` on that
  service authorises the call; `roles/cloudfunctions.invoker` does not (Cloud Scheduler's "Use
  authentication with HTTP targets"; the provider's `cloudfunctions2_function` scheduler example);
- a build account: functions build with it, not with the Compute default account that new projects
  use and that may lack `cloudbuild.builds.builder` (Cloud Run functions, "Configure the build
  service account"). Google's guide grants it Cloud Run Builder on the project, which reads every
  bucket and writes every repository of the project; here it holds what that role's parts are for, on
  their resources only, as the build-account guide lists them (Cloud Run functions, "Custom Service
  Account for Cloud Build"): write logs (project), read the source bucket, write the functions' own
  image repository (`buildConfig.dockerRepository`: "If specified by user, it is created and managed by
  user");
- the three accounts, the guard's role and every act-as (the deployer's on all three, the guard's on
  each workload account) are the bootstrap's to make (`guard_identities`, infra/access/accounts.py);
- Google's agents are the bootstrap's: it provisions Eventarc's service agent and grants it
  `roles/eventarc.serviceAgent` before any trigger exists ("Permission denied while using the
  Eventarc Service Agent"), and lets the Cloud Storage agent publish to Pub/Sub, which direct Cloud
  Storage events need (Eventarc, "Roles and permissions for Cloud Run functions targets"). Those
  roles hold act-as and token rights, so the deployer may not grant them (its condition lists only
  the plan's own roles, and the policy pack refuses such a list).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

import run_contract
from infra import grants, naming
from infra.access.identities import GUARD_PERMISSIONS, guard_accounts, guard_role
from infra.apis import ProjectApis
from infra.buckets import private_bucket
from infra.config import AutomationSettings, Env, TpuVmSettings
from infra.lifecycle import StartTarget, attempt_deadline
from infra.tpu import queued_api

SOURCE = Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"
# The guard's own files, and beside them the run contract's package (the completion marker's one schema):
# the function imports `run_contract` from its source root.
SOURCE_FILES = ("main.py", "decisions.py", "requirements.txt")


def source_files() -> dict[str, Path]:
    """The guard's source archive: its files, and run_contract/ as a package beside them."""
    files = {name: SOURCE / name for name in SOURCE_FILES}
    files.update({f"run_contract/{name}": run_contract.HOME / name for name in run_contract.files()})
    return files


# The build account's grants: Cloud Run Builder's parts, each on its resource (see the module docstring).
BUILD_LOGS_ROLE = "roles/logging.logWriter"
BUILD_IMAGES_ROLE = "roles/artifactregistry.writer"
EVENT_RECEIVER_ROLE = "roles/eventarc.eventReceiver"
INVOKER_ROLE = "roles/run.invoker"
# How long each function may run (Cloud Run's request timeout), and so how long the Cloud Scheduler job
# that calls it waits (attempt_deadline). Recovery waits up to 15 minutes on a delete (main.Tpu.wait), then
# creates: it gets the longest a Scheduler HTTP job can wait; a run cut short leaves its recorded spec,
# and the next run creates the node from it.
FUNCTION_TIMEOUT_S = 300
RECOVERY_TIMEOUT_S = 30 * 60


def source_digest() -> str:
    digest = hashlib.sha256()
    for name, path in source_files().items():
        digest.update(f"{name}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:16]


# Cloud Run functions (2nd gen): built by Cloud Build into Artifact Registry, served by Cloud Run,
# triggered through Eventarc; its accounts and grants (IAM, Resource Manager); its source bucket.
GUARD_APIS = (
    "cloudfunctions.googleapis.com",
    "run.googleapis.com",
    "cloudbuild.googleapis.com",
    "artifactregistry.googleapis.com",
    "eventarc.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "storage.googleapis.com",
)


@dataclass(frozen=True)
class TpuGuardArgs:
    automation: AutomationSettings
    vms: tuple[TpuVmSettings, ...]
    runs: tuple[tuple[str, str], ...]  # (TPU VM, its current run id: infra/tpu/metadata.py run_id)
    billing_account: str
    bucket_location: str  # the platform buckets' location: the source bucket's, and the status events'

    @property
    def self_stop(self) -> bool:
        return any(vm.on_completion != "keep" for vm in self.vms)

    @property
    def scheduled_starts(self) -> bool:
        """A schedule starts a VM (a schedule may only stop one: its stops go to the TPU API directly)."""
        return any(vm.schedule and vm.schedule.start for vm in self.vms)

    @property
    def needed(self) -> bool:
        """The guard serves budget actions, recovery, run completion and scheduled starts."""
        return bool(self.automation.enabled or self.self_stop or self.scheduled_starts)


def guard_apis(args: TpuGuardArgs) -> tuple[str, ...]:
    return (*GUARD_APIS, "cloudscheduler.googleapis.com") if args.automation.recovery.every_minutes else GUARD_APIS


def guard_vms(vms: tuple[TpuVmSettings, ...]) -> str:
    """Where each VM's TPUs are and what the guard does with them (TPU_VMS): decided here, never by a
    marker's content. A queued VM's TPUs are any of its node ids (`<vm>`, or a multislice's `<vm>-<i>`) in
    any of its zones (the request records the zone it got: infra/tpu/queued.py), so the guard finds them
    by listing those zones, and deletes them through their request (`queuedApi`: the API version it was
    made with). `onCompletion` stop or delete, with `maxRunHours`, is what completion and the periodic
    check do."""
    return json.dumps(
        {
            vm.name: {
                "nodes": naming.node_ids(vm.name, vm.node_count),
                "zones": list(vm.zones),
                "onCompletion": vm.on_completion,
            }
            | ({"maxRunHours": vm.max_run_hours} if vm.max_run_hours is not None else {})
            | ({"queuedApi": queued_api.api_version(vm.provisioning)} if vm.queued else {})
            for vm in vms
        },
        sort_keys=True,
    )


def current_runs(runs: tuple[tuple[str, str], ...]) -> str:
    """Each VM's run id now: a completion marker of an older run neither stops nor blocks a new one."""
    return json.dumps(dict(runs), sort_keys=True)


class TpuGuard(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: TpuGuardArgs,
        apis: ProjectApis,
        encryption: gcp.storage.BucketEncryptionArgs | None,
        storage_ready: list[pulumi.Resource],
        status_bucket: gcp.storage.Bucket,
        topic: gcp.pubsub.Topic | None,
        budget_name: pulumi.Output[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:automation:TpuGuard", name, None, opts)
        auto = args.automation
        region = env.region
        child = pulumi.ResourceOptions(parent=self)
        needs = apis.needs("cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc")
        crm = apis.needs("cloudresourcemanager")

        accounts = guard_accounts(env.stack)
        self.email = accounts["guard"].email(env.project)
        member = accounts["guard"].member(env.project)
        invoker_member = accounts["invoker"].member(env.project)
        builder_member = accounts["builder"].member(env.project)
        ready: list[pulumi.Resource] = [
            grants.project_role(
                f"{name}-tpu",
                env.project,
                guard_role(env.stack).name(env.project),
                member,
                parent=self,
                depends_on=crm,
                permissions=frozenset(GUARD_PERMISSIONS),
            ),
            grants.project_role(
                f"{name}-receiver", env.project, EVENT_RECEIVER_ROLE, member, parent=self, depends_on=crm
            ),
            grants.project_role(
                f"{name}-builder-logs",
                env.project,
                BUILD_LOGS_ROLE,
                builder_member,
                parent=self,
                depends_on=crm,
            ),
            # Completion markers to read, recovery records to keep: the status bucket only.
            gcp.storage.BucketIAMMember(
                f"{name}-status", bucket=status_bucket.name, role="roles/storage.objectUser", member=member, opts=child
            ),
        ]
        invoker_ready: list[pulumi.Resource] = []

        # Versioned (as every bucket), so the source of every deployed guard stays there to audit or roll
        # back to; in production kept on destroy like every bucket, elsewhere a build input `destroy` may empty.
        source_bucket = private_bucket(
            f"{name}-source",
            env,
            name=env.bucket_name("functions"),
            purpose="functions-source",
            location=args.bucket_location,
            encryption=encryption,
            force_destroy=not env.production,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=storage_ready, retain_on_delete=env.production, protect=env.production
            ),
        )
        archive = gcp.storage.BucketObject(
            f"{name}-archive",
            bucket=source_bucket.name,
            name=f"tpu-guard-{source_digest()}.zip",
            source=pulumi.AssetArchive({name: pulumi.FileAsset(str(path)) for name, path in source_files().items()}),
            opts=child,
        )
        ready.append(
            # The build reads its source as the build account.
            gcp.storage.BucketIAMMember(
                f"{name}-builder-source",
                bucket=source_bucket.name,
                role="roles/storage.objectViewer",
                member=builder_member,
                opts=child,
            )
        )
        images_id = naming.function_repository(env.stack)
        images = gcp.artifactregistry.Repository(
            f"{name}-images",
            project=env.project,
            location=region,
            repository_id=images_id,
            format="DOCKER",
            description=f"Images of the TPU guard's functions ({env.stack})",
            kms_key_name=encryption.default_kms_key_name if encryption else None,
            labels={**env.labels, "purpose": "functions-images"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("artifactregistry")),
        )
        images_path = f"projects/{env.project}/locations/{region}/repositories/{images_id}"
        ready.append(
            gcp.artifactregistry.RepositoryIamMember(
                f"{name}-builder-images",
                project=env.project,
                location=region,
                repository=images.repository_id,
                role=BUILD_IMAGES_ROLE,
                member=builder_member,
                opts=child,
            )
        )
        # The build runs as the build account, and triggers deliver as the guard, as soon as a function
        # exists: both wait until their fresh grants apply.
        granted = grants.propagation_wait(f"{name}-grants-applied", ready, parent=self)
        settings = {
            "PROJECT": env.project,
            "ENVIRONMENT": env.stack,
            "ZONES": ",".join(sorted({zone for vm in args.vms for zone in vm.zones})),  # fallbacks too
            "STATE_BUCKET": status_bucket.name,
            "STATUS_BUCKET": status_bucket.name,
            "TPU_VMS": guard_vms(args.vms),
            "CURRENT_RUNS": current_runs(args.runs),
        }

        def function(
            suffix: str,
            entry_point: str,
            extra: dict[str, pulumi.Input[str]],
            trigger=None,
            timeout: int = FUNCTION_TIMEOUT_S,
        ) -> gcp.cloudfunctionsv2.Function:
            return gcp.cloudfunctionsv2.Function(
                f"{name}-{suffix}",
                name=naming.function_name(suffix, env.stack),
                project=env.project,
                location=region,
                build_config=gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
                    runtime="python312",
                    entry_point=entry_point,
                    service_account=accounts["builder"].name(env.project),
                    docker_repository=images_path,
                    source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
                        storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                            bucket=source_bucket.name, object=archive.name
                        )
                    ),
                ),
                service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                    service_account_email=self.email,
                    environment_variables={**settings, **extra},
                    ingress_settings="ALLOW_INTERNAL_ONLY",
                    max_instance_count=1,  # one guard at a time: no two recoveries of one node
                    timeout_seconds=timeout,
                    available_memory="256M",
                ),
                event_trigger=trigger,
                labels=env.labels,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*needs, *ready, granted]),
            )

        def invoke_grant(suffix: str, fn: gcp.cloudfunctionsv2.Function, who: str) -> pulumi.Resource:
            return gcp.cloudrunv2.ServiceIamMember(
                f"{name}-{suffix}",
                project=env.project,
                location=region,
                name=fn.name,  # a 2nd-gen function is served by the Cloud Run service of its name
                role=INVOKER_ROLE,
                member=who,
                opts=child,
            )

        self.budget_function = None
        if auto.budget_action.action and topic is not None:
            self.budget_function = function(
                "budget-guard",
                "on_budget",
                {
                    "BUDGET_ACTION": auto.budget_action.action,
                    "BUDGET_AT_PERCENT": f"{auto.budget_action.at_percent:g}",
                    "DRY_RUN": "true" if auto.budget_action.dry_run else "false",
                    "BILLING_ACCOUNT": args.billing_account,
                    "BUDGET_ID": budget_name,  # the full name; the guard takes its last segment
                },
                gcp.cloudfunctionsv2.FunctionEventTriggerArgs(
                    trigger_region=region,
                    event_type="google.cloud.pubsub.topic.v1.messagePublished",
                    pubsub_topic=topic.id,
                    retry_policy="RETRY_POLICY_RETRY",
                    service_account_email=self.email,
                ),
            )
            invoke_grant("budget-invoker", self.budget_function, member)

        self.complete_function = None
        if args.self_stop:
            # Direct Cloud Storage events: the trigger's region is the bucket's location.
            self.complete_function = function(
                "complete",
                "on_complete",
                {},
                gcp.cloudfunctionsv2.FunctionEventTriggerArgs(
                    trigger_region=args.bucket_location.lower(),
                    event_type="google.cloud.storage.object.v1.finalized",
                    event_filters=[
                        gcp.cloudfunctionsv2.FunctionEventTriggerEventFilterArgs(
                            attribute="bucket", value=status_bucket.name
                        )
                    ],
                    retry_policy="RETRY_POLICY_RETRY",
                    service_account_email=self.email,
                ),
            )
            invoke_grant("complete-invoker", self.complete_function, member)

        self.recovery_function = None
        if auto.recovery.every_minutes:
            self.recovery_function = function(
                "recovery", "recover", {"MAX_ATTEMPTS": str(auto.recovery.max_attempts)}, timeout=RECOVERY_TIMEOUT_S
            )
            invoker_ready.append(invoke_grant("recovery-invoker", self.recovery_function, invoker_member))
            gcp.cloudscheduler.Job(
                f"{name}-recovery-schedule",
                name=naming.function_name("recovery", env.stack),  # the job that calls it: same name
                project=env.project,
                region=region,
                description=f"Re-create preempted spot TPUs of {env.stack}",
                schedule=f"*/{auto.recovery.every_minutes} * * * *",
                time_zone="Etc/UTC",
                attempt_deadline=attempt_deadline(RECOVERY_TIMEOUT_S),
                http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                    uri=self.recovery_function.url,
                    http_method="POST",
                    oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                        service_account_email=accounts["invoker"].email(env.project),
                        audience=self.recovery_function.url,
                    ),
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*apis.needs("cloudscheduler"), *invoker_ready]),
            )

        self.start: StartTarget | None = None
        if args.scheduled_starts:
            start_function = function("scheduled-start", "scheduled_start", {})
            invoker_ready.append(invoke_grant("start-invoker", start_function, invoker_member))
            self.start = StartTarget(
                start_function.url,
                accounts["invoker"].email(env.project),
                list(invoker_ready),
                attempt_deadline(FUNCTION_TIMEOUT_S),
            )
        self.register_outputs({"account": self.email})
