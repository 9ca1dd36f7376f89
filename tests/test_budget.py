"""Budget alerts: thresholds from config, email channels, optional Pub/Sub topic for automation."""

from __future__ import annotations

from tests.support import fixture_config, plan, with_object
from tools.offline.mocks import project_number

BUDGET = "gcp:billing/budget:Budget"


def test_budget_amount_thresholds_and_scope(small_plan):
    (budget,) = small_plan.of_type(BUDGET)  # tests/stacks/Pulumi.small.yaml
    assert budget.inputs["billingAccount"] == "012345-6789AB-CDEF01"
    assert budget.inputs["amount"] == {"specifiedAmount": {"currencyCode": "USD", "units": "4000"}}
    assert budget.inputs["thresholdRules"] == [
        {"thresholdPercent": 0.5, "spendBasis": "CURRENT_SPEND"},
        {"thresholdPercent": 1.0, "spendBasis": "FORECASTED_SPEND"},
    ]
    assert budget.inputs["budgetFilter"]["projects"] == [f"projects/{project_number('fixture-project')}"]


def test_fractional_amount_uses_nanos(small_config):
    raw = with_object(small_config, "budget", lambda b: b.update(amount=999.5))
    (budget,) = plan(raw, "small").of_type(BUDGET)
    assert budget.inputs["amount"]["specifiedAmount"] == {"currencyCode": "USD", "units": "999", "nanos": 500000000}


def test_email_channels_feed_the_budget():
    result = plan(fixture_config("production"), "production")
    channels = result.of_type("gcp:monitoring/notificationChannel:NotificationChannel")
    assert sorted(c.inputs["labels"]["email_address"] for c in channels) == [
        "alerts@example.com",
        "finops@example.com",
    ]
    (budget,) = result.of_type(BUDGET)
    names = budget.inputs["allUpdatesRule"]["monitoringNotificationChannels"]
    assert len(names) == 2 and all(n.startswith("projects/fixture-production/notificationChannels/") for n in names)


def test_pubsub_topic_only_when_asked():
    assert not plan(fixture_config("scheduled"), "scheduled").of_type("gcp:pubsub/topic:Topic")
    result = plan(fixture_config("production"), "production")
    (topic,) = result.of_type("gcp:pubsub/topic:Topic")
    (budget,) = result.of_type(BUDGET)
    assert (
        budget.inputs["allUpdatesRule"]["pubsubTopic"] == f"projects/fixture-production/topics/{topic.inputs['name']}"
    )
    assert budget.inputs["allUpdatesRule"]["schemaVersion"] == "1.0"


def test_the_production_budget_topic_is_encrypted_with_the_stacks_key_in_its_region():
    from tests.support import fixture_config, plan

    (topic,) = plan(fixture_config("production"), "production").of_type("gcp:pubsub/topic:Topic")
    key = "projects/fixture-keys/locations/us-central1/keyRings/fixture/cryptoKeys/buckets"
    assert topic.inputs["kmsKeyName"] == key
    assert topic.inputs["messageStoragePolicy"] == {"allowedPersistenceRegions": ["us-central1"]}


def test_the_guards_source_is_versioned_and_kept_in_production():
    from tests.support import fixture_config, plan

    for stack, kept in (("production", True), ("scheduled", False)):
        (source,) = [
            b
            for b in plan(fixture_config(stack), stack).of_type("gcp:storage/bucket:Bucket")
            if b.name == "guard-source"
        ]
        assert source.inputs["versioning"] == {"enabled": True}
        assert (source.retain_on_delete, source.protect, source.inputs["forceDestroy"]) == (kept, kept, not kept)
