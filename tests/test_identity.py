"""Workload identities: one dedicated service account each, allow-listed roles only, no keys."""

from __future__ import annotations

from infra import iam
from tests.support import plan, stack_config, with_object, workload_settings

PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"


def test_one_service_account_per_workload():
    raw = stack_config()
    raw = with_object(raw, "workloads", lambda w: w.update(second=workload_settings(raw)))
    accounts = plan(raw).of_type("gcp:serviceaccount/account:Account")
    workloads = sorted(a.inputs["accountId"] for a in accounts if a.name.startswith("workload-"))
    assert workloads == ["tpu-mnist-dev", "tpu-second-dev"]


def test_project_roles_are_only_log_and_metric_writers():
    for stack in ("dev", "prod"):
        result = plan(stack_config(stack), stack)
        workload_grants = [m for m in result.of_type(PROJECT_MEMBER) if m.name.startswith("workload-")]
        roles = sorted(m.inputs["role"] for m in workload_grants)
        assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
        for grant in workload_grants + result.of_type(BUCKET_MEMBER):
            assert grant.inputs["role"] in iam.ALLOWED_PROJECT_ROLES | iam.ALLOWED_BUCKET_ROLES
            assert grant.inputs["member"].startswith("serviceAccount:tpu-")


def test_storage_access_is_granted_per_bucket():
    grants = {
        (g.inputs["bucket"].rsplit("-", 1)[-1], g.inputs["role"]) for g in plan(stack_config()).of_type(BUCKET_MEMBER)
    }
    assert grants == {
        ("data", "roles/storage.objectViewer"),
        ("checkpoints", "roles/storage.objectUser"),
        ("models", "roles/storage.objectUser"),
    }


def test_bucket_access_can_be_narrowed():
    raw = with_object(stack_config(), "workloads", lambda w: w["mnist"].update(bucketAccess={"models": "none"}))
    buckets = {g.inputs["bucket"] for g in plan(raw).of_type(BUCKET_MEMBER)}
    assert buckets == {"acme-ml-sandbox-dev-data", "acme-ml-sandbox-dev-checkpoints"}


def test_no_keys_and_no_default_compute_account():
    for stack in ("dev", "prod"):
        result = plan(stack_config(stack), stack)
        assert not result.of_type("gcp:serviceaccount/key:Key")
        for r in result.resources:
            assert "-compute@developer.gserviceaccount.com" not in repr(r.inputs)


def test_the_ci_deployer_may_use_each_workload_account_and_nothing_else():
    grants = plan(stack_config()).of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert [(g.inputs["role"], g.inputs["member"]) for g in grants] == [
        (
            "roles/iam.serviceAccountUser",
            "serviceAccount:tpu-deployer-dev@acme-ml-admin.iam.gserviceaccount.com",
        )
    ]
    assert (
        grants[0]
        .inputs["serviceAccountId"]
        .endswith("/serviceAccounts/tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com")
    )
