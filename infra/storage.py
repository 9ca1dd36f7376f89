"""Cloud Storage for data, checkpoints and models.

Secure and keep-by-default: uniform access, public access prevention enforced, versioning, optional
CMEK, and a bucket survives `pulumi destroy` (retain_on_delete) unless its stack lists it as
destroyable. Production buckets are also `protect`ed, so even a delete in the program is refused.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.apis import ProjectApis
from infra.buckets import lifecycle_rules, private_bucket
from infra.config import BUCKET_PURPOSES, BucketSettings, Env

# The data access audit config is part of the project's IAM policy (Resource Manager).
STORAGE_APIS = ("storage.googleapis.com", "cloudresourcemanager.googleapis.com")


class PlatformBuckets(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        settings: BucketSettings,
        apis: ProjectApis,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:storage:Buckets", name, None, opts)
        needs: list[pulumi.Resource] = apis.needs("storage")

        # With CMEK, the Cloud Storage service agent must be able to use the key before a bucket can
        # name it. The key lives in another project (a security team's), so that grant is the
        # bootstrap's (bootstrap/program.py), made before the first deploy: the deployer holds no
        # right on the key at all.
        # What another bucket of this stack must wait for.
        self.ready = needs
        self.encryption = (
            gcp.storage.BucketEncryptionArgs(default_kms_key_name=settings.kms_key_name)
            if settings.kms_key_name
            else None
        )
        self.buckets: dict[str, gcp.storage.Bucket] = {}
        for purpose in BUCKET_PURPOSES:
            destroyable = purpose in settings.destroyable
            self.buckets[purpose] = private_bucket(
                f"{name}-{purpose}",
                env,
                name=env.bucket_name(purpose),
                purpose=purpose,
                location=settings.location,
                storage_class=settings.storage_class,
                lifecycle_rules=lifecycle_rules(settings.noncurrent_versions_to_keep, settings.noncurrent_version_days),
                encryption=self.encryption,
                force_destroy=destroyable,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=needs,
                    retain_on_delete=not destroyable,
                    protect=env.production,
                ),
            )
        if settings.data_access_logs:
            # Who read or wrote which object: Data Access audit logs are off by default for Cloud Storage
            # (Cloud Audit Logs, "Data Access audit logs"). Part of the project's IAM policy, changed by
            # the provider with getIamPolicy/setIamPolicy like a grant.
            gcp.projects.IAMAuditConfig(
                f"{name}-data-access-logs",
                project=env.project,
                service="storage.googleapis.com",
                audit_log_configs=[
                    gcp.projects.IAMAuditConfigAuditLogConfigArgs(log_type="DATA_READ"),
                    gcp.projects.IAMAuditConfigAuditLogConfigArgs(log_type="DATA_WRITE"),
                ],
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("cloudresourcemanager")),
            )
        self.urls = {p: b.url for p, b in self.buckets.items()}
        self.register_outputs({"urls": self.urls})
