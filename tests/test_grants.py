"""The grant helpers: every condition on a bucket grant is checked against Cloud Storage's support for
conditions, in one place (`grants.checked_storage_condition`), whichever component makes the grant."""

from __future__ import annotations

import pytest

from infra import grants
from infra.access import iamdata
from infra.access.conditions import UnsupportedConditionError
from infra.config.stackfile import ROOT
from tests.iam_conditions import HOSTILE_NAMES, allows
from tools.offline.runner import plan_stack

BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
READER = "roles/storage.objectViewer"
# Between them: a VM's status folder and a researcher's folders (bucket_access, researchers), the
# guard's node states (researchers), packaged sources by name and by prefix (artifacts), a GKE team's
# results (infra/gke/team_access.py).
STACKS = ("self-service", "sources", "gke")


@pytest.fixture
def storage_cannot_evaluate_resource_names(monkeypatch):
    """The IAM Conditions data as it would read if Cloud Storage ignored resource attributes."""
    monkeypatch.setattr(iamdata, "CONDITION_RESOURCE_SERVICES", iamdata.CONDITION_RESOURCE_SERVICES - {grants.STORAGE})


def test_a_condition_cloud_storage_evaluates_is_returned_as_it_is():
    condition = grants.prefix_condition("b", "runs/", "runs")
    assert grants.checked_storage_condition(condition, READER, iamdata.role_permissions(READER)) is condition


def test_a_condition_cloud_storage_cannot_evaluate_is_refused(storage_cannot_evaluate_resource_names):
    condition = grants.object_condition("b", ["a.json"], "one", "One object")
    with pytest.raises(UnsupportedConditionError, match=r"roles/storage\.objectViewer: .*storage\.googleapis\.com"):
        grants.checked_storage_condition(condition, READER, iamdata.role_permissions(READER))


@pytest.mark.parametrize("stack", STACKS)
def test_every_bucket_grant_condition_is_checked(stack, monkeypatch):
    """Each condition the plan puts on a bucket grant went through the check, and so would be refused
    were it one Cloud Storage cannot evaluate: a component that built one and skipped the check, or
    checked it against another service's support, fails here."""
    checked: list[str] = []
    check = grants.checked_storage_condition

    def recording(condition, what, permissions):
        checked.append(condition.expression)
        return check(condition, what, permissions)

    monkeypatch.setattr(grants, "checked_storage_condition", recording)
    result = plan_stack(stack, ROOT / "tests" / "stacks" / f"Pulumi.{stack}.yaml")
    conditions = [
        r.inputs["condition"]["expression"] for r in result.of_type(BUCKET_GRANT) if r.inputs.get("condition")
    ]
    assert conditions
    assert sorted(conditions) == sorted(checked)


def test_a_stack_whose_bucket_conditions_cloud_storage_cannot_evaluate_is_refused(
    storage_cannot_evaluate_resource_names,
):
    with pytest.raises(UnsupportedConditionError, match=r"storage\.googleapis\.com"):
        plan_stack(STACKS[0], ROOT / "tests" / "stacks" / f"Pulumi.{STACKS[0]}.yaml")


# Values that end or change a CEL literal (tests/test_cel.py). A name the platform makes never holds them; a
# condition built from one names it and nothing more, or the builder refuses it before any grant.


def objects(bucket: str, name: str) -> str:
    return f"projects/_/buckets/{bucket}/objects/{name}"


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_object_name_is_read_as_that_name_and_no_other(hostile):
    name = f"sources/{hostile}.tar.gz"
    expression = str(grants.object_condition("b", [name, "runners/a.tar.gz"], "t", "d").expression)
    assert allows(expression, (objects("b", name), None))
    assert allows(expression, (objects("b", "runners/a.tar.gz"), None))
    assert not allows(expression, (objects("b", "sources/other.tar.gz"), None))
    assert not allows(expression, ("projects/_/buckets/b", "sources/"))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_prefix_read_by_name_reaches_only_its_folder(hostile):
    prefix = f"results/{hostile}/"
    expression = str(grants.reads_of("b", ["a.json"], [prefix], "t", "d").expression)
    assert allows(expression, (objects("b", f"{prefix}model.keras"), None))
    assert allows(expression, (objects("b", "a.json"), None))
    assert not allows(expression, (objects("b", "results/other/model.keras"), None))
    assert not allows(expression, ("projects/_/buckets/b", prefix))  # no listing


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_bucket_name_is_part_of_the_objects_name_only(hostile):
    expression = str(grants.objects_in_any(hostile, ["runs/"], "t", "d").expression)
    assert allows(expression, (objects(hostile, "runs/x"), None))
    assert allows(expression, ("projects/_/buckets/b", "runs/x"))
    assert not allows(expression, (objects(hostile, "other/x"), None))
    assert not allows(expression, (objects("b", "runs/x"), None))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_view_name_is_that_view_and_no_other(hostile):
    view = f"projects/p/locations/global/buckets/b/views/{hostile}"
    expression = str(grants.view_condition(view, "t", "d").expression)
    assert allows(expression, (view, None))
    assert not allows(expression, ("projects/p/locations/global/buckets/b/views/other", None))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_prefix_for_listing_is_refused_before_any_grant(hostile):
    """objects_in_any's pattern stays: quoting keeps a condition whole, the pattern keeps the grant to a folder
    (never empty, ending in '/') in the platform's names."""
    for build in (
        lambda: grants.prefix_condition("b", f"{hostile}/", "t"),
        lambda: grants.objects_in_any("b", [f"runs/{hostile}/"], "t", "d"),
    ):
        with pytest.raises(ValueError, match=r"^prefix .*: (lowercase )?letters, digits, .* ending in '/'$"):
            build()
