"""Workload identities: one dedicated service account each, allow-listed roles only, no keys."""

from __future__ import annotations

import json

from infra.access import iam
from infra.config import parse_stack_config
from infra.platform import stack_identities
from tests.support import fixture_config, plan, with_object, workload_settings

PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"


def test_one_service_account_per_workload_named_for_the_bootstrap_to_make():
    raw = fixture_config("scheduled")
    raw = with_object(raw, "workloads", lambda w: w.update(second=workload_settings(raw)))
    identities = stack_identities(parse_stack_config("scheduled", raw))
    workloads = sorted(a.account_id for a in identities.accounts if a.display_name.startswith("TPU workload"))
    assert workloads == ["tpu-mnist-scheduled", "tpu-second-scheduled"]
    # The stack grants the account its roles and attaches it, and makes nothing of it.
    result = plan(raw, "scheduled")
    assert not result.of_type("gcp:serviceaccount/account:Account")
    members = {g.inputs["member"] for g in result.of_type(PROJECT_MEMBER) if g.name.startswith("workload-second")}
    assert members == {"serviceAccount:tpu-second-scheduled@fixture-project.iam.gserviceaccount.com"}


def test_project_roles_are_only_log_and_metric_writers():
    for stack in ("scheduled", "production"):
        result = plan(fixture_config(stack), stack)
        workload_grants = [m for m in result.of_type(PROJECT_MEMBER) if m.name.startswith("workload-")]
        roles = sorted(m.inputs["role"] for m in workload_grants)
        assert roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
        for grant in workload_grants + [g for g in result.of_type(BUCKET_MEMBER) if g.name.startswith("workload-")]:
            assert grant.inputs["role"] in iam.ALLOWED_PROJECT_ROLES | iam.ALLOWED_BUCKET_ROLES
            assert grant.inputs["member"].startswith("serviceAccount:tpu-")


def workload_bucket_grants(raw: dict[str, str]) -> list:
    return [g for g in plan(raw, "scheduled").of_type(BUCKET_MEMBER) if g.name.startswith("workload-")]


def test_storage_access_is_granted_per_bucket():
    grants = {
        (g.inputs["bucket"].rsplit("-", 1)[-1], g.inputs["role"])
        for g in workload_bucket_grants(fixture_config("scheduled"))
    }
    assert grants == {
        ("data", "roles/storage.objectViewer"),
        ("checkpoints", "roles/storage.objectUser"),
        ("models", "roles/storage.objectUser"),
    }


def test_bucket_access_can_be_narrowed():
    raw = with_object(
        fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(bucketAccess={"models": "none"})
    )
    buckets = {g.inputs["bucket"] for g in workload_bucket_grants(raw)}
    assert buckets == {"fixture-project-scheduled-data", "fixture-project-scheduled-checkpoints"}


def test_no_keys_and_no_default_compute_account():
    for stack in ("scheduled", "production"):
        result = plan(fixture_config(stack), stack)
        assert not result.of_type("gcp:serviceaccount/key:Key")
        for r in result.resources:
            assert "-compute@developer.gserviceaccount.com" not in repr(r.inputs)


def test_the_ci_deployer_may_attach_each_workload_account_it_attaches():
    """Act-as is granted by the bootstrap, on the account, to the deployer whose plans attach it."""
    from tools.offline.access import ACCESS_FILE

    entry = json.loads(ACCESS_FILE.read_text())["dev"]
    assert "tpu-mnist-dev" in entry["deployerActsAs"]
    assert ["tpu-guard-dev", "tpu-mnist-dev"] in entry["actsAs"]  # the guard re-creates its nodes
