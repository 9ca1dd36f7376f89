"""The what-if before launch: expected cost and time of a job, the interval that wastes least, and
what it refuses or warns about."""

from __future__ import annotations

import json
import re

import pytest

from infra.catalog import load_catalog
from infra.goodput.interval import PREEMPTIBLE_LIFE_HOURS, SPOT_NOTICE_S, YOUNG_DALY, Rate
from infra.goodput.whatif import ASSUMED, NOTICE_S, Capacity, Job, WhatIfError, what_if
from infra.tpu.metadata import GRACE_SECONDS
from tools.standins.contracts import document

V5E = load_catalog().accelerator("v5litepod-8")
JOB = Job(
    steps=200_000, step_s=0.5, save_s=20, restore_s=40, first_step_s=90, commit_s=60, every_steps=2000, every_minutes=10
)


def spot(**changes) -> Capacity:
    assert not isinstance(V5E, str)
    return Capacity(
        **{
            "accelerator": V5E,
            "provisioning": "spot",
            "zones": ("us-central1-a",),
            "preemptions": Rate.every(6),
            **changes,
        }
    )


def test_the_notice_is_the_spot_vms_capped_by_the_agents_grace_period():
    doc = document("compute.v1")["schemas"]["Scheduling"]["properties"]["skipGuestOsShutdown"]["description"]
    found = re.search(r"and (\d+) seconds for Spot VMs", doc.replace("\n", " "))
    assert found and float(found[1]) == SPOT_NOTICE_S
    assert min(SPOT_NOTICE_S, GRACE_SECONDS) == NOTICE_S


def test_your_interval_and_the_best_priced_and_timed():
    w = what_if(JOB, spot())
    assert w.best.regime == YOUNG_DALY and w.at_best and w.yours and w.best.seconds
    assert w.yours.interval_s == 600  # 2000 steps are 1000 s: the 10 minutes come first
    assert w.at_best.every_steps == round(w.best.seconds / 0.5)
    assert w.at_best.expectation.billed_s < w.yours.expectation.billed_s
    e, p = w.yours.expectation, w.yours.priced
    assert p.chip_hours == pytest.approx(8 * e.billed_s / 3600)
    assert p.usd == pytest.approx(p.chip_hours * 0.3468)  # the catalog's spot v5e price in us-central1
    assert e.seconds["productive"] == JOB.work_s and e.wall_s > e.billed_s
    json.dumps(w.to_json())


def test_without_an_interval_only_the_best_is_given():
    w = what_if(Job(steps=1000, step_s=1, save_s=60, restore_s=60), spot())
    assert w.yours is None and w.at_best


def test_a_save_within_the_notice_has_no_best_and_prices_yours():
    w = what_if(Job(steps=1000, step_s=1, save_s=10, restore_s=60, every_steps=100), spot())
    assert w.at_best is None and w.yours and w.best.seconds is None
    assert w.to_json()["best"]["seconds"] is None


@pytest.mark.parametrize(
    ("job", "capacity", "message"),
    [
        (JOB, {"preemptions": Rate.every(None)}, "spot VMs are preempted: give the hours between preemptions"),
        (JOB, {"provisioning": "on-demand"}, "on-demand VMs are not preempted"),
        (
            JOB,
            {"provisioning": "preemptible", "preemptions": Rate.every(30)},
            f"a preemptible VM lives at most {PREEMPTIBLE_LIFE_HOURS:g} h",
        ),
        (
            Job(steps=0, step_s=0, save_s=60, restore_s=1, commit_s=30),
            {},
            "steps: 0 must be ≥ 1\nstep time: 0 s must be > 0\ncommit time 30 s is shorter than the save's stall 60 s",
        ),
    ],
)
def test_inputs_it_cannot_answer_for_are_refused_all_at_once(job, capacity, message):
    with pytest.raises(WhatIfError) as caught:
        what_if(job, spot(**capacity))
    assert message in str(caught.value)


def test_notes_say_what_is_assumed_and_when_the_guard_would_give_up():
    w = what_if(JOB, spot(preemptions=Rate.every(2), create_s=200.0, measured=frozenset({"create_s"})))
    assumed = next(n for n in w.notes if n.startswith("assumed"))
    assert "create" not in assumed and all(k.removesuffix("_s") in assumed for k in ASSUMED if k != "create_s")
    assert any("more than the guard's 5 re-creations per 24 h window" in n for n in w.notes)
    assert not any("re-creations" in n for n in what_if(JOB, spot(preemptions=Rate.every(12))).notes)


def test_reserved_is_a_list_price_estimate_and_said_so():
    w = what_if(JOB, spot(provisioning="reserved", preemptions=Rate.every(None)))
    assert w.yours and w.yours.priced.price.list_price_estimate
    assert any("reserved priced at the on-demand list price" in n for n in w.notes)
