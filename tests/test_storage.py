"""Buckets: private, versioned, encrypted where asked, and kept on destroy unless the stack says so."""

from __future__ import annotations

from tests.support import fixture_config, plan, with_object

BUCKET = "gcp:storage/bucket:Bucket"


def buckets(result):
    """The platform's data, checkpoints and models buckets."""
    return {r.inputs["labels"]["purpose"]: r for r in result.of_type(BUCKET) if r.name.startswith("buckets-")}


def test_every_bucket_is_private_and_versioned():
    for stack in ("scheduled", "production"):
        result = plan(fixture_config(stack), stack)
        for bucket in result.of_type(BUCKET):
            assert bucket.inputs["uniformBucketLevelAccess"] is True
            assert bucket.inputs["publicAccessPrevention"] == "enforced"
        for bucket in buckets(result).values():
            assert bucket.inputs["versioning"] == {"enabled": True}


def test_names_come_from_the_stable_prefix():
    names = {p: b.inputs["name"] for p, b in buckets(plan(fixture_config("scheduled"), "scheduled")).items()}
    assert names == {
        "data": "fixture-project-scheduled-data",
        "checkpoints": "fixture-project-scheduled-checkpoints",
        "models": "fixture-project-scheduled-models",
    }


def test_noncurrent_versions_expire_by_age_and_count():
    raw = with_object(
        fixture_config("scheduled"), "buckets", lambda b: b.update(noncurrentVersionDays=9, noncurrentVersionsToKeep=4)
    )
    rules = buckets(plan(raw, "scheduled"))["checkpoints"].inputs["lifecycleRules"]
    conditions = [r["condition"] for r in rules if r["action"]["type"] == "Delete"]
    assert {"daysSinceNoncurrentTime": 9, "withState": "ARCHIVED"} in conditions
    assert {"numNewerVersions": 4, "withState": "ARCHIVED"} in conditions
    assert any(r["action"]["type"] == "AbortIncompleteMultipartUpload" for r in rules)


def test_a_sandbox_keeps_data_but_may_destroy_scratch_buckets():
    by_purpose = buckets(plan(fixture_config("scheduled"), "scheduled"))
    data = by_purpose["data"]
    assert data.retain_on_delete and not data.inputs.get("forceDestroy")
    for scratch in ("checkpoints", "models"):
        assert by_purpose[scratch].inputs["forceDestroy"] is True
        assert not by_purpose[scratch].retain_on_delete


def test_buckets_are_kept_on_destroy_by_default():
    raw = with_object(fixture_config("scheduled"), "buckets", lambda b: b.pop("destroyable"))
    for bucket in plan(raw, "scheduled").of_type(BUCKET):
        if bucket.name == "guard-source":
            continue  # build input only, rebuilt from the repository: destroyable on purpose
        assert bucket.retain_on_delete and not bucket.inputs.get("forceDestroy")
        assert not bucket.protect


def test_production_buckets_are_protected_and_encrypted_with_cmek():
    result = plan(fixture_config("production"), "production")
    key = "projects/fixture-keys/locations/us-central1/keyRings/fixture/cryptoKeys/buckets"
    # The key lives in another project: its grant to this project's Cloud Storage agent is the
    # bootstrap's (tests/test_access.py), so the deployer holds no right on it.
    assert not result.of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")
    for bucket in buckets(result).values():
        assert bucket.protect and bucket.retain_on_delete
        assert bucket.inputs["encryption"] == {"defaultKmsKeyName": key}


def test_without_a_key_buckets_use_google_managed_keys():
    for bucket in plan(fixture_config("scheduled"), "scheduled").of_type(BUCKET):
        assert "encryption" not in bucket.inputs
