"""How the platform makes a bucket, for every component that needs one: private and versioned, its old
versions and abandoned uploads expiring."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.config import Env

# Incomplete multipart uploads (an interrupted checkpoint write) cost money and are never read.
ABORT_UPLOADS_AFTER_DAYS = 1


def private_bucket(
    resource_name: str,
    env: Env,
    *,
    name: str,
    purpose: str,
    location: str,
    encryption: gcp.storage.BucketEncryptionArgs | None,
    opts: pulumi.ResourceOptions,
    storage_class: str | None = None,
    lifecycle_rules: list[gcp.storage.BucketLifecycleRuleArgs] | None = None,
    force_destroy: bool | None = None,
) -> gcp.storage.Bucket:
    """A bucket as the platform makes every one: uniform access, public access prevention enforced,
    versioned, in the stack's project, labelled with the stack's labels and its purpose."""
    return gcp.storage.Bucket(
        resource_name,
        name=name,
        project=env.project,
        location=location,
        storage_class=storage_class,
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        versioning=gcp.storage.BucketVersioningArgs(enabled=True),
        lifecycle_rules=lifecycle_rules,
        encryption=encryption,
        force_destroy=force_destroy,
        labels={**env.labels, "purpose": purpose},
        opts=opts,
    )


def lifecycle_rules(versions_to_keep: int, noncurrent_days: int) -> list[gcp.storage.BucketLifecycleRuleArgs]:
    delete = gcp.storage.BucketLifecycleRuleActionArgs(type="Delete")
    return [
        # Old versions of overwritten objects (checkpoints, `latest` pointers) expire...
        gcp.storage.BucketLifecycleRuleArgs(
            action=delete,
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                days_since_noncurrent_time=noncurrent_days, with_state="ARCHIVED"
            ),
        ),
        # ...and never pile up beyond a few per object.
        gcp.storage.BucketLifecycleRuleArgs(
            action=delete,
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                num_newer_versions=versions_to_keep, with_state="ARCHIVED"
            ),
        ),
        gcp.storage.BucketLifecycleRuleArgs(
            action=gcp.storage.BucketLifecycleRuleActionArgs(type="AbortIncompleteMultipartUpload"),
            condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=ABORT_UPLOADS_AFTER_DAYS),
        ),
    ]
