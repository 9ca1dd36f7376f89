"""Stack settings are parsed without Pulumi: every bad value gets one clear, complete message."""

from __future__ import annotations

import pytest

from infra.config import parse_stack_config
from infra.config.problems import ConfigError, Fix, item_key, item_keys
from infra.config.stackfile import ROOT
from tests.support import NS, fixture_config, replace_object, stack_config, with_object, with_scalar, workload_settings


def problems_of(raw: dict[str, str], stack: str = "small") -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack, raw)
    message = str(caught.value)
    assert message.startswith(f"stack '{stack}'")
    return message


def test_shipped_stacks_parse():
    dev = parse_stack_config("dev", stack_config("dev"))
    prod = parse_stack_config("prod", stack_config("prod"))
    assert set(dev.buckets.destroyable) == {"checkpoints", "models"}
    assert not dev.production and dev.buckets.kms_key_name is None
    assert prod.production and prod.buckets.kms_key_name and not prod.buckets.destroyable
    assert prod.budget.amount > dev.budget.amount
    assert dev.bucket_name("data") == "acme-ml-sandbox-dev-data"


def test_defaults_from_pulumi_yaml_apply():
    cfg = parse_stack_config("small", fixture_config("small"))
    assert cfg.name_prefix == "fixture-project"  # namePrefix default "" means the project id


def test_unknown_top_level_key_is_named():
    raw = with_scalar(fixture_config("small"), "tpu-platform:bucket", "oops")
    message = problems_of(raw)
    assert "tpu-platform:bucket = 'oops': unknown key" in message
    assert "tpu-platform:buckets" in message  # lists what is known


def test_unknown_nested_key_is_named():
    raw = with_object(fixture_config("small"), "buckets", lambda b: b.update(versionsToKeep=3))
    assert "tpu-platform:buckets.versionsToKeep = 3: unknown key" in problems_of(raw)


@pytest.mark.parametrize(
    ("percent", "expected"),
    [
        (0, "must be a number > 0 and <= 1000"),
        (-5, "must be a number > 0 and <= 1000"),
        (5000, "must be a number > 0 and <= 1000"),
        ("half", "must be a number"),
    ],
)
def test_bad_threshold(percent, expected):
    raw = with_object(fixture_config("small"), "budget", lambda b: b["thresholds"].append({"percent": percent}))
    message = problems_of(raw)
    assert f"tpu-platform:budget.thresholds[2].percent = {percent!r}: {expected}" in message


def test_duplicate_threshold():
    raw = with_object(fixture_config("small"), "budget", lambda b: b["thresholds"].append({"percent": 50}))
    assert "tpu-platform:budget.thresholds[2]" in problems_of(raw)


def test_unknown_spend_basis():
    raw = with_object(
        fixture_config("small"), "budget", lambda b: b["thresholds"].append({"percent": 70, "basis": "daily"})
    )
    assert "thresholds[2].basis = 'daily': must be one of current, forecasted" in problems_of(raw)


def test_bad_bucket_location():
    raw = with_object(fixture_config("small"), "buckets", lambda b: b.update(location="MARS-NORTH1"))
    message = problems_of(raw)
    assert "tpu-platform:buckets.location = 'MARS-NORTH1': must be one of" in message
    assert "US-CENTRAL1" in message


def test_disallowed_role_is_refused():
    raw = with_object(fixture_config("small"), "workloads", lambda w: w["mnist"].update(projectRoles=["roles/editor"]))
    message = problems_of(raw)
    assert "tpu-platform:workloads.mnist.projectRoles[0] = 'roles/editor': must be one of" in message
    assert "roles/logging.logWriter" in message
    assert "storage access is granted per bucket with bucketAccess" in message  # what to do instead


def test_bucket_access_levels_are_closed():
    raw = with_object(fixture_config("small"), "workloads", lambda w: w["mnist"].update(bucketAccess={"data": "admin"}))
    assert "workloads.mnist.bucketAccess.data = 'admin': must be one of none, read, write" in problems_of(raw)


def test_production_requires_cmek_and_nothing_destroyable():
    def weaken(buckets):
        del buckets["kmsKeyName"]
        buckets["destroyable"] = ["data"]

    message = problems_of(with_object(fixture_config("production"), "buckets", weaken), "production")
    assert "tpu-platform:buckets.kmsKeyName = (not set): required when production is true" in message
    assert "tpu-platform:buckets.destroyable = ['data']: must be empty when production is true" in message


def test_a_copied_stack_that_keeps_the_deployer_it_was_copied_from_is_one_error_on_deployer():
    """The bootstrap's deployer of `staging` is tpu-deployer-staging; a copy of dev that keeps dev's gets
    one error on the key (the policy pack would refuse each of its grants, never naming the key)."""
    copied = with_scalar(fixture_config("small"), "deployer", "tpu-deployer-dev@acme-ml-admin.iam.gserviceaccount.com")
    with pytest.raises(ConfigError) as caught:
        parse_stack_config("staging", copied)
    (problem,) = caught.value.problems
    assert str(problem).startswith(
        "tpu-platform:deployer = 'tpu-deployer-dev@acme-ml-admin.iam.gserviceaccount.com': is the deployer of "
        "stack 'dev' (a copied stack file?); the bootstrap's deployer of stack 'staging' is "
        "tpu-deployer-staging@acme-ml-admin.iam.gserviceaccount.com"
    )
    own = with_scalar(copied, "deployer", "tpu-deployer-staging@acme-ml-admin.iam.gserviceaccount.com")
    assert parse_stack_config("staging", own).deployer.startswith("tpu-deployer-staging@")
    # An account not named as the bootstrap names them is some other deployer of the team's: not judged here.
    other = with_scalar(copied, "deployer", "ci-deployer@acme-ml-admin.iam.gserviceaccount.com")
    assert parse_stack_config("staging", other).deployer.startswith("ci-deployer@")


VM = f"{NS}:tpuVms[small-v2]"


def test_a_misspelt_key_or_value_is_offered_the_nearest_valid_one():
    message = problems_of(Fix.of({f"{VM}.provisoning": "spot", f"{NS}:budget.amount": "lots"}).apply(fixture_config()))
    assert "tpu-platform:tpuVms[small-v2].provisoning = 'spot': unknown key; known keys: " in message
    assert "; remove provisoning and set provisioning: spot" in message
    assert "tpu-platform:budget.amount = 'lots': must be a number (finite), like 2.5" in message
    message = problems_of(Fix.of({f"{VM}.provisioning": "spto"}).apply(fixture_config()))
    assert "tpu-platform:tpuVms[small-v2].provisioning = 'spto': must be one of " in message
    assert message.endswith("; set provisioning: spot")
    v5e = {
        f"{VM}.zone": "us-central1-a",
        f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
        f"{NS}:workloads.mnist.frameworkVersion": "2.15.0",
    }
    message = problems_of(Fix.of({**v5e, f"{VM}.acceleratorType": "v5e-8"}).apply(fixture_config()))
    assert "tpu-platform:tpuVms[small-v2].acceleratorType = 'v5e-8': unknown TPU type" in message
    assert message.endswith("; set acceleratorType: v5litepod-8")


def test_cmek_key_must_share_the_bucket_location():
    key = "projects/k/locations/europe-west4/keyRings/r/cryptoKeys/c"
    raw = with_object(fixture_config("production"), "buckets", lambda b: b.update(kmsKeyName=key))
    assert "must be in the buckets' location us-central1, not europe-west4" in problems_of(raw, "production")


def test_missing_required_values():
    raw = with_scalar(with_scalar(fixture_config("small"), "billingAccount", None), "owner", None)
    message = problems_of(raw)
    assert "tpu-platform:billingAccount = (not set): required" in message
    assert "tpu-platform:owner = (not set): required" in message
    assert "2 invalid settings" in message


def test_wrong_types():
    raw = with_scalar(fixture_config("small"), "production", "yes")
    raw = with_object(raw, "budget", lambda b: b.update(emails="ops@acme.example"))
    message = problems_of(raw)
    assert "tpu-platform:production = 'yes': must be true or false" in message
    assert "tpu-platform:budget.emails = 'ops@acme.example': must be a list, not a string" in message


def test_too_many_budget_channels():
    emails = [f"u{i}@acme.example" for i in range(6)]
    raw = with_object(fixture_config("small"), "budget", lambda b: b.update(emails=emails))
    assert "must have at most 5 items" in problems_of(raw)


def test_object_setting_that_is_not_a_mapping():
    raw = with_scalar(fixture_config("small"), "budget", "300")
    assert "tpu-platform:budget = 300: must be a mapping, not int" in problems_of(raw)


def test_name_prefix_that_breaks_bucket_names():
    raw = with_scalar(fixture_config("small"), "namePrefix", "Acme_ML")
    message = problems_of(raw)
    assert "tpu-platform:namePrefix = 'Acme_ML': gives bucket name 'Acme_ML-small-data'" in message


def test_workload_name_breaking_naming_rules():
    raw = replace_object(fixture_config("small"), "workloads", {"Bad_Name": workload_settings(fixture_config("small"))})
    message = problems_of(replace_object(raw, "tpuVms", []))
    assert "tpu-platform:workloads.Bad_Name = 'Bad_Name': workload names need" in message


def test_bad_stack_name():
    assert "stack name = 'Production-EU-West'" in problems_of(fixture_config("small"), "Production-EU-West")


@pytest.mark.parametrize("stack", ["dev-", "a--b", "abcdefghijklm", "dev-team-x"])
def test_a_stack_name_the_bootstrap_refuses_is_refused_on_the_stack_name(stack):
    """`dev-` would end every derived account id in '-', `a--b` share `a-b`'s custom role ids, `dev-team-x`'s team
    log buckets start as `dev`'s: the bootstrap's rule and the reader's are one (naming.stack_problem)."""
    assert f"stack name = '{stack}'" in problems_of(fixture_config("small"), stack)


def test_every_problem_is_reported_at_once():
    raw = with_object(fixture_config("small"), "buckets", lambda b: b.update(location="MARS", storageClass="HOT"))
    raw = with_object(raw, "budget", lambda b: b.update(amount=-1))
    message = problems_of(raw)
    assert "3 invalid settings" in message


def test_an_empty_workload_of_a_vm_is_refused_not_a_crash():
    # Found by test_bad_input's fuzzing: '' passed the reader and crashed rendering the VM's metadata.
    raw = with_object(fixture_config("small"), "tpuVms", lambda vms: vms[0].update(workload=""))
    assert "tpu-platform:tpuVms[small-v2].workload = '': name one of the workloads" in problems_of(raw)


def test_a_list_item_is_keyed_by_its_name_unless_another_item_shares_it_or_it_is_not_plain():
    items = [{"name": "a"}, {"name": "b"}, {"name": "a"}, {"name": "has space"}, {}, "not a mapping"]
    keys = item_keys("tpu-platform:tpuVms", items)
    assert keys == [
        "tpu-platform:tpuVms[0]",
        "tpu-platform:tpuVms[b]",
        "tpu-platform:tpuVms[2]",
        "tpu-platform:tpuVms[3]",
        "tpu-platform:tpuVms[4]",
        "tpu-platform:tpuVms[5]",
    ]
    assert [item_key("tpu-platform:tpuVms", items, i) for i in range(len(items))] == keys


def test_a_program_is_one_of_the_examples_of_the_repository_being_read(tmp_path):
    """An installed `tpu-runs` reads a stack of the repository its stack file is in, not of the package it
    was installed from: the examples a `program` may name are that repository's, found when it is read."""
    import shutil

    from infra.config.workload_code import reading_repository

    theirs = tmp_path / "their-repository"
    shutil.copytree(ROOT / "workloads" / "tf_mnist", theirs / "workloads" / "their_mnist")
    raw = with_object(stack_config("dev"), "workloads", lambda w: w["mnist"].update(program="their_mnist"))
    with reading_repository(theirs):
        assert parse_stack_config("dev", raw).workloads[0].program == "their_mnist"
    with pytest.raises(ConfigError, match=r"workloads\.mnist\.program = 'their_mnist'"):
        parse_stack_config("dev", raw)


@pytest.mark.parametrize("every", [45, 2**70])
def test_a_recovery_interval_that_does_not_divide_the_hour_is_told_the_ones_that_do(every):
    # 2**70 once fell through to the catch-all "is not a value this setting takes".
    raw = with_object(fixture_config("small"), "automation", lambda a: a.update(recovery={"everyMinutes": every}))
    assert (
        f"{NS}:automation.recovery.everyMinutes = {every}: must be one of 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30"
        in problems_of(raw)
    )
