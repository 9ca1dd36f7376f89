"""Budget actions and preemption recovery (S13, S14, S19): the TPU guard on Cloud Run functions.

Why functions rather than Cloud Workflows: the decisions (which node, when to give up, dry run)
are Python in `functions/tpu_guard/decisions.py`, tested offline on recorded node listings, and the
same file runs in the cloud. Nothing to operate: Eventarc delivers the budget's Pub/Sub messages,
Cloud Scheduler calls the recovery with an OIDC token.

Identity: one guard account with a custom role holding only the TPU permissions the guard uses, use
of each workload account (a re-created node runs as it), and write access to its own recovery
counters in the checkpoints bucket. The scheduler's invoker account may only invoke the recovery.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from infra import iam
from infra.apis import ProjectApis
from infra.config import PlatformConfig
from infra.lifecycle import custom_role
from infra.storage import PlatformBuckets

SOURCE = Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"
SOURCE_FILES = ("main.py", "decisions.py", "requirements.txt")
GUARD_PERMISSIONS = (
    "tpu.nodes.list",
    "tpu.nodes.get",  # on_complete: the node's state before acting (idempotent on redelivery)
    "tpu.nodes.start",  # scheduled_start: a schedule's start, unless the run is complete
    "tpu.nodes.stop",
    "tpu.nodes.delete",
    "tpu.nodes.create",
    "tpu.operations.get",
)


def source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        digest.update((SOURCE / name).read_bytes())
    return digest.hexdigest()[:16]


class TpuGuard(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: PlatformConfig,
        apis: ProjectApis,
        buckets: PlatformBuckets,
        workload_accounts: dict[str, gcp.serviceaccount.Account],
        topic: gcp.pubsub.Topic | None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:automation:TpuGuard", name, None, opts)
        auto = cfg.automation
        region = cfg.region
        child = pulumi.ResourceOptions(parent=self)
        needs = apis.needs("cloudfunctions", "run", "cloudbuild", "artifactregistry", "eventarc")

        self.account = gcp.serviceaccount.Account(
            f"{name}-sa",
            account_id=f"tpu-guard-{cfg.stack}",
            display_name=f"TPU guard: budget actions and preemption recovery ({cfg.stack})",
            project=cfg.project,
            opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("iam")),
        )
        member = self.account.email.apply(iam.service_account_member)
        self.role = custom_role(
            name, cfg, apis, self, id_prefix="tpuPlatformGuard", title="TPU guard",
            description="List, stop, delete and re-create TPU nodes; nothing else.", permissions=GUARD_PERMISSIONS,
        )  # fmt: skip
        grants: list[pulumi.Resource] = [
            gcp.projects.IAMMember(
                f"{name}-tpu",
                project=cfg.project,
                role=self.role.name,
                member=member,
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("cloudresourcemanager")),
            ),
            gcp.storage.BucketIAMMember(
                f"{name}-state",
                bucket=buckets.buckets["checkpoints"].name,
                role="roles/storage.objectUser",
                member=member,
                opts=child,
            ),
        ]
        for workload, account in workload_accounts.items():
            grants.append(
                gcp.serviceaccount.IAMMember(
                    f"{name}-act-as-{workload}",
                    service_account_id=account.name,
                    role="roles/iam.serviceAccountUser",
                    member=member,
                    opts=child,
                )
            )

        source_bucket = gcp.storage.Bucket(
            f"{name}-source",
            name=f"{cfg.name_prefix}-{cfg.stack}-functions",
            project=cfg.project,
            location=cfg.buckets.location,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            encryption=buckets.encryption,
            force_destroy=True,  # build input only: rebuilt from the repository on every change
            labels={**cfg.labels, "purpose": "functions-source"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=buckets.ready),
        )
        archive = gcp.storage.BucketObject(
            f"{name}-archive",
            bucket=source_bucket.name,
            name=f"tpu-guard-{source_digest()}.zip",
            source=pulumi.AssetArchive({f: pulumi.FileAsset(str(SOURCE / f)) for f in SOURCE_FILES}),
            opts=child,
        )
        settings = {
            "PROJECT": cfg.project,
            "ENVIRONMENT": cfg.stack,
            "ZONES": ",".join(sorted({vm.zone for vm in cfg.tpu_vms})),
            "STATE_BUCKET": cfg.bucket_name("checkpoints"),
        }

        def function(
            suffix: str, entry_point: str, extra: dict[str, str], trigger=None
        ) -> gcp.cloudfunctionsv2.Function:
            return gcp.cloudfunctionsv2.Function(
                f"{name}-{suffix}",
                name=f"tpu-{suffix}-{cfg.stack}",
                project=cfg.project,
                location=region,
                build_config=gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
                    runtime="python312",
                    entry_point=entry_point,
                    source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
                        storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                            bucket=source_bucket.name, object=archive.name
                        )
                    ),
                ),
                service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                    service_account_email=self.account.email,
                    environment_variables={**settings, **extra},
                    ingress_settings="ALLOW_INTERNAL_ONLY",
                    max_instance_count=1,  # one guard at a time: no two recoveries of one node
                    timeout_seconds=1800 if suffix == "recovery" else 300,
                    available_memory="256M",
                ),
                event_trigger=trigger,
                labels=cfg.labels,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*needs, *grants]),
            )

        self.budget_function = None
        if auto.budget_action and topic is not None:
            self.budget_function = function(
                "budget-guard",
                "on_budget",
                {
                    "BUDGET_ACTION": auto.budget_action,
                    "BUDGET_AT_PERCENT": f"{auto.budget_at_percent:g}",
                    "DRY_RUN": "true" if auto.dry_run else "false",
                },
                gcp.cloudfunctionsv2.FunctionEventTriggerArgs(
                    trigger_region=region,
                    event_type="google.cloud.pubsub.topic.v1.messagePublished",
                    pubsub_topic=topic.id,
                    retry_policy="RETRY_POLICY_RETRY",
                    service_account_email=self.account.email,
                ),
            )
            gcp.cloudrunv2.ServiceIamMember(
                f"{name}-budget-invoker",
                project=cfg.project,
                location=region,
                name=self.budget_function.name,  # a 2nd-gen function runs as the Run service of its name
                role="roles/run.invoker",
                member=member,
                opts=child,
            )

        self.recovery_function = None
        if auto.recovery_every_minutes:
            self.recovery_function = function("recovery", "recover", {"MAX_ATTEMPTS": str(auto.recovery_max_attempts)})
            invoker = gcp.serviceaccount.Account(
                f"{name}-invoker",
                account_id=f"tpu-guard-invoker-{cfg.stack}",
                display_name=f"Invokes the TPU recovery ({cfg.stack})",
                project=cfg.project,
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("iam")),
            )
            invoke = gcp.cloudfunctionsv2.FunctionIamMember(
                f"{name}-recovery-invoker",
                project=cfg.project,
                location=region,
                cloud_function=self.recovery_function.name,
                role="roles/cloudfunctions.invoker",
                member=invoker.email.apply(iam.service_account_member),
                opts=child,
            )
            gcp.cloudscheduler.Job(
                f"{name}-recovery-schedule",
                name=f"tpu-recovery-{cfg.stack}",
                project=cfg.project,
                region=region,
                description=f"Re-create preempted spot TPUs of {cfg.stack}",
                schedule=f"*/{auto.recovery_every_minutes} * * * *",
                time_zone="Etc/UTC",
                http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                    uri=self.recovery_function.url,
                    http_method="POST",
                    oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                        service_account_email=invoker.email, audience=self.recovery_function.url
                    ),
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*apis.needs("cloudscheduler"), invoke]),
            )
        self.register_outputs({})
