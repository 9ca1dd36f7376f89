"""IAM Conditions evaluated with a real CEL implementation (cel-python), as IAM evaluates them.

Cloud Storage gives a condition `resource.name` (`projects/_/buckets/B/objects/NAME`) for object reads
and writes, and the `storage.googleapis.com/objectListPrefix` API attribute for `objects.list`, which
is checked on the bucket (IAM, "Attribute reference for IAM Conditions"). The requests below are those
runlib makes: get and write its own objects, list its own prefix.
"""

from __future__ import annotations

import pytest

from tests.iam_conditions import allows
from tests.support import fixture_config, plan, with_object, workload_settings

CHECKPOINTS = "fixture-project-small-checkpoints"


def evaluate(expression: str, *, object_name: str | None = None, list_prefix: str | None = None) -> bool:
    """One request as IAM sees it: an object call names the object; a list call names the bucket."""
    bucket = f"projects/_/buckets/{CHECKPOINTS}"
    resource = f"{bucket}/objects/{object_name}" if object_name is not None else bucket
    return allows(expression, (resource, list_prefix))


def checkpoint_conditions() -> dict[str, str]:
    raw = fixture_config("small")
    raw = with_object(raw, "workloads", lambda w: w.update(other=workload_settings(raw)))
    grants = plan(raw, "small").of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    return {
        g.inputs["member"].split(":")[1].split("@")[0]: g.inputs["condition"]["expression"]
        for g in grants
        if g.inputs["bucket"] == CHECKPOINTS
    }


def test_each_workload_reads_and_writes_only_its_own_checkpoints():
    conditions = checkpoint_conditions()
    assert set(conditions) == {"tpu-mnist-small", "tpu-other-small"}
    mnist = conditions["tpu-mnist-small"]
    assert evaluate(mnist, object_name="mnist/small-v2/run-1/ckpt-0000000100/state.npz")
    assert not evaluate(mnist, object_name="other/vm/run-1/ckpt-0000000100/state.npz")
    assert not evaluate(mnist, object_name="mnist-evil/vm/x")  # a sibling prefix, not its own
    assert not evaluate(conditions["tpu-other-small"], object_name="mnist/small-v2/run-1/COMPLETE")


@pytest.mark.parametrize(
    ("prefix", "allowed"),
    [
        ("mnist/small-v2/run-1/ckpt-", True),  # runlib lists its own checkpoints
        ("mnist/", True),
        ("other/", False),
        ("", False),  # the whole bucket
        ("mnis", False),
    ],
)
def test_a_workload_lists_its_own_prefix_only(prefix, allowed):
    assert evaluate(checkpoint_conditions()["tpu-mnist-small"], list_prefix=prefix) is allowed


def test_a_list_without_a_prefix_attribute_is_refused():
    assert not evaluate(checkpoint_conditions()["tpu-mnist-small"])
