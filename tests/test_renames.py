"""Child names come from identity, never list position; renames carry aliases, so no live resource is
replaced or deleted. The "before" plans are the shipped stacks' plans just before names changed
(tests/snapshots/*.before-renames.json, from `python -m tools.offline plan --json`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.support import plan, shipped_plan, stack_config, with_object
from tools.offline import diff
from tools.offline.policy_check import check_policies
from tools.offline.render import to_json

SNAPSHOTS = Path(__file__).parent / "snapshots"


def changes(base: dict, head: dict) -> tuple[list[str], list[str], list[str], list[tuple[str, str]]]:
    before, after = diff._resources(base), diff._resources(head)
    renamed = diff._follow_renames(before, after)
    replaced = [c.urn for c in diff._changes(before, after) if c.replaced]
    return sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys()), replaced, renamed


def current(stack: str) -> dict:
    result = shipped_plan(stack)
    return to_json(result, [v.as_dict() for v in check_policies(result)])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_shipped_stacks_lose_and_replace_nothing_across_the_renames(stack):
    base = json.loads((SNAPSHOTS / f"{stack}.before-renames.json").read_text())
    added, removed, replaced, renamed = changes(base, current(stack))
    # The guard's source archive is named by its content: a new guard version is a new object, by design.
    replaced = [urn for urn in replaced if not urn.endswith("::guard-archive")]
    # A VM's run-status grant gained "and list its own prefix" (its agent lists <vm>/requests/): a new
    # condition is a new binding, created before the old one is deleted, so the VM never lacks the right.
    replaced = [urn for urn in replaced if not ("RunStatus$" in urn and urn.endswith("-writer"))]
    # Only what the renames touched is judged here; features that came later add or drop resources
    # on purpose (and the golden plans show those).
    touched = [urn for urn in added + removed if "notificationChannel" in urn]
    assert (touched, replaced) == ([], [])
    assert renamed  # the channels did get new names


def test_without_its_alias_a_rename_would_delete_and_create():
    base = json.loads((SNAPSHOTS / "dev.before-renames.json").read_text())
    head = copy.deepcopy(current("dev"))
    for resource in head["resources"]:
        resource.pop("aliases", None)
    added, removed, _, renamed = changes(base, head)
    channels = [urn for urn in added + removed if "notificationChannel" in urn]
    assert len(channels) == 2 and not renamed  # one channel deleted, one created


def test_removing_the_first_alert_email_deletes_only_its_channel():
    raw = stack_config("prod")
    before = plan(raw, "prod").of_type("gcp:monitoring/notificationChannel:NotificationChannel")
    after = plan(with_object(raw, "budget", lambda b: b["emails"].pop(0)), "prod").of_type(
        "gcp:monitoring/notificationChannel:NotificationChannel"
    )
    kept = {c.urn: c.inputs for c in after}
    assert len(before) == 2 and len(after) == 1
    # Found by its address: the order in which the engine receives registrations is not the list's.
    second_email = json.loads(raw["tpu-platform:budget"])["emails"][1]
    (second,) = [c for c in before if c.inputs["labels"]["email_address"] == second_email]
    assert kept == {second.urn: second.inputs}  # the second address's channel: same name, same inputs
