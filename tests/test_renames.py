"""Child names come from identity, never list position; renames carry aliases, so no live resource is
replaced or deleted. The budget's e-mail channels were once named by position (`budget-email-<i>`); the
state such a version left is that plan with those names, and an upgrade from it must rename, not
replace."""

from __future__ import annotations

import copy
import json

from tests.support import fixture_config, plan, with_object
from tools.offline import diff
from tools.offline.render import to_json

CHANNEL = "gcp:monitoring/notificationChannel:NotificationChannel"
EMAILS = ["alerts@example.com", "finops@example.com"]


def two_addresses() -> dict[str, str]:
    return with_object(fixture_config("small"), "budget", lambda b: b.update(emails=EMAILS))


def changes(base: dict, head: dict) -> tuple[list[str], list[str], list[str], list[tuple[str, str]]]:
    before, after = diff._resources(base), diff._resources(head)
    renamed = diff._follow_renames(before, after)
    replaced = [c.urn for c in diff._changes(before, after) if c.replaced]
    return sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys()), replaced, renamed


def positional_state(head: dict) -> dict:
    """The state of a version that named each channel by its address's place in the list."""
    state = copy.deepcopy(head)
    for resource in state["resources"]:
        resource.pop("aliases", None)
        if resource["type"] == CHANNEL:
            resource["name"] = f"budget-email-{EMAILS.index(resource['inputs']['labels']['email_address'])}"
            resource["urn"] = resource["urn"].rsplit("::", 1)[0] + "::" + resource["name"]
    return state


def test_an_upgrade_from_positional_names_renames_the_channels_and_replaces_nothing():
    head = to_json(plan(two_addresses(), "small"))
    added, removed, replaced, renamed = changes(positional_state(head), head)
    assert (added, removed, replaced) == ([], [], [])
    assert sorted(old.rsplit("::", 1)[-1] for old, _ in renamed) == ["budget-email-0", "budget-email-1"]


def test_without_its_alias_a_rename_would_delete_and_create():
    head = to_json(plan(two_addresses(), "small"))
    base = positional_state(head)
    for resource in head["resources"]:
        resource.pop("aliases", None)
    added, removed, _, renamed = changes(base, head)
    channels = [urn for urn in added + removed if CHANNEL in urn]
    assert len(channels) == 4 and not renamed  # both channels deleted, both created


def test_removing_the_first_alert_email_deletes_only_its_channel():
    raw = two_addresses()
    before = plan(raw, "small").of_type(CHANNEL)
    after = plan(with_object(raw, "budget", lambda b: b["emails"].pop(0)), "small").of_type(CHANNEL)
    kept = {c.urn: c.inputs for c in after}
    assert len(before) == 2 and len(after) == 1
    # Found by its address: the order in which the engine receives registrations is not the list's.
    second_email = json.loads(raw["tpu-platform:budget"])["emails"][1]
    (second,) = [c for c in before if c.inputs["labels"]["email_address"] == second_email]
    assert kept == {second.urn: second.inputs}  # the second address's channel: same name, same inputs
