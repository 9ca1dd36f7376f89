"""Cost estimates against hand-computed figures, the budget comparison, and the plan's cost table.

Prices by hand from skypilot-catalog catalogs/v7/gcp/vms.csv @6f65ab5 (the catalog's source): a type's
price divided by its chips. The month is Google's 730 hours.
"""

from __future__ import annotations

import dataclasses

import pytest

from infra.catalog import load_catalog
from infra.config import parse_stack_config
from infra.cost import cost_table, estimate
from tests.support import fixture_config, plan, with_object

OFFICE_HOURS = 12 * 5 * 730 / 168  # 08-20 on weekdays: 60 of the week's 168 hours, on a 730-hour month


def cost_of(raw, stack="scheduled"):
    cfg = parse_stack_config(stack, raw)
    return estimate(cfg.tpu_vms, cfg.budget)


def vms(*entries):
    def edit(vms):
        template = vms[0]
        vms[:] = [{**template, **{k: v for k, v in entry.items() if v is not None}} for entry in entries]
        for vm, entry in zip(vms, entries, strict=True):
            if entry.get("schedule") is None:
                vm.pop("schedule", None)

    return edit


def roomy(raw):
    raw = with_object(raw, "budget", lambda b: b.update(amount=1_000_000, failOverBudget=False))
    return with_object(raw, "automation", lambda a: a.update(recovery={"everyMinutes": 10}))


def test_a_scheduled_spot_vm_matches_a_hand_computation_on_the_730_hour_month():
    # tpu-v2-8 spot in us-central1: 1.35 USD/hour for 4 chips; office hours (Europe/Berlin).
    by_hand = 1.35 * OFFICE_HOURS
    scheduled = cost_of(fixture_config("scheduled"))
    assert scheduled.monthly_total == pytest.approx(by_hand, rel=0.01)
    assert scheduled.hours_in_month == 730 and scheduled.vms[0].hours_basis == "up to"


def test_hand_computed_fleet():
    raw = roomy(fixture_config("scheduled"))
    raw = with_object(
        raw,
        "tpuVms",
        vms(
            {"name": "spot-always", "provisioning": "spot", "onCompletion": "keep"},  # 1.35 × 730
            {
                "name": "on-demand-office",
                "provisioning": "on-demand",
                "onCompletion": "keep",  # 4.5 × office hours
                "schedule": {"start": "0 8 * * 1-5", "stop": "0 20 * * 1-5"},
            },
            {
                "name": "pod-preemptible",
                "provisioning": "preemptible",
                "acceleratorType": "v2-32",
                "onCompletion": "keep",
                "zone": "us-central1-a",
                "runtimeVersion": "tpu-vm-tf-2.14.1-pod",
            },  # 6.12 × 730
            {"name": "run-48h", "provisioning": "spot", "onCompletion": "stop", "maxRunHours": 48},  # 1.35 × 48
        ),
    )
    cost = cost_of(raw)
    by_name = {v.name: v for v in cost.vms}
    assert by_name["spot-always"].monthly == pytest.approx(1.35 * 730)
    assert by_name["on-demand-office"].monthly == pytest.approx(4.5 * OFFICE_HOURS, abs=0.05)
    assert by_name["pod-preemptible"].monthly == pytest.approx(6.12 * 730)
    assert by_name["pod-preemptible"].on_demand_monthly == pytest.approx(24.0 * 730)
    assert by_name["run-48h"].monthly == pytest.approx(1.35 * 48) and by_name["run-48h"].hours_basis == "maxRunHours"
    assert cost.monthly_total == pytest.approx(1.35 * 730 + 4.5 * OFFICE_HOURS + 6.12 * 730 + 1.35 * 48, abs=0.1)
    assert not cost.over_budget


def test_a_schedule_that_only_stops_is_priced_for_every_hour_it_may_run_and_says_so():
    """Who starts it again decides its hours: the estimate assumes at once after every stop (an upper
    bound, like a run with no maxRunHours), and the table marks the hours ≤ and says why."""
    raw = with_object(fixture_config(), "tpuVms", lambda vms: vms[0].update(schedule={"stop": "0 20 * * *"}))
    cost = cost_of(raw, "small")
    (vm,) = cost.vms
    assert (vm.hours_per_month, vm.hours_basis) == (730, "up to")
    assert vm.monthly == pytest.approx(4.5 * 730)  # tpu-v2-8 on-demand in us-central1, 4 chips
    table = cost_table(cost.as_output())
    assert "≤730.0" in table
    assert "its schedule only stops it; people start it: priced as if started again right after each stop" in table


def test_a_schedule_that_only_starts_a_vm_its_runs_stop_is_priced_as_the_run():
    raw = with_object(
        fixture_config(), "tpuVms", lambda vms: vms[0].update(schedule={"start": "0 22 * * *"}, onCompletion="stop")
    )
    (vm,) = cost_of(raw, "small").vms
    assert (vm.hours_per_month, vm.hours_basis) == (730, "up to")
    assert vm.notes == ["runs to completion with no maxRunHours: priced for every hour it may run"]


def test_each_region_is_priced_by_its_own_prices():
    subnets = {"us-central1": "10.30.0.0/20", "us-south1": "10.31.0.0/20"}
    raw = with_object(roomy(fixture_config("production")), "network", lambda n: n.update(subnets=subnets))
    raw = with_object(
        raw,
        "tpuVms",
        vms(
            {"name": "central", "zone": "us-central1-a", "onCompletion": "keep", "provisioning": "on-demand"},
            {"name": "south", "zone": "us-south1-a", "onCompletion": "keep", "provisioning": "on-demand"},
        ),
    )
    central, south = cost_of(raw, "production").vms
    assert (central.price_region, south.price_region) == ("us-central1", "us-south1")
    assert central.monthly == pytest.approx(9.6 * 730)  # tpu-v5litepod-8 us-central1
    assert south.monthly == pytest.approx(11.328 * 730)  # tpu-v5litepod-8 us-south1


def test_queued_multislice_reserved_and_flex_start_by_their_model():
    raw = roomy(fixture_config("production"))
    raw = with_object(
        raw,
        "tpuVms",
        vms(
            {
                "name": "two-slices",
                "acceleratorType": "v5litepod-16",
                "runtimeVersion": "tpu-vm-tf-2.15.0-pod-pjrt",
                "capacity": "queued",
                "nodeCount": 2,
                "provisioning": "spot",
                "onCompletion": "keep",
            },
            {
                "name": "reserved",
                "capacity": "queued",
                "provisioning": "reserved",
                "reservationName": "team-a",
                "onCompletion": "keep",
            },
            {
                "name": "flex",
                "capacity": "queued",
                "provisioning": "flex-start",
                "runDurationHours": 24,
                "onCompletion": "keep",
            },
        ),
    )
    two, reserved, flex = cost_of(raw, "production").vms
    assert (two.chips, two.slices) == (32, 2) and two.monthly == pytest.approx(2 * 5.5488 * 730)
    assert reserved.monthly == pytest.approx(9.6 * 730)
    assert "reserved priced at the on-demand list price" in reserved.notes[0]
    assert flex.monthly == pytest.approx(9.6 * 24) and flex.hours_basis == "flex-start run"


def test_a_region_without_a_price_is_left_out_and_said_so(monkeypatch):
    catalog = load_catalog()
    v5e = catalog.generations["v5e"]
    no_central = dataclasses.replace(v5e, prices=tuple(p for p in v5e.prices if p.region != "us-central1"))
    bare = dataclasses.replace(catalog, generations={**catalog.generations, "v5e": no_central})
    # The parsed VM carries its generation, prices included (the catalog its model reads the type from).
    monkeypatch.setattr("infra.config.model.load_catalog", lambda: bare)
    raw = with_object(fixture_config("production"), "tpuVms", lambda v: v.__delitem__(1))
    cost = cost_of(raw, "production")
    assert cost.unpriced == ["on-demand-v5e"] and cost.monthly_total == 0
    table = cost_table(cost.as_output())
    assert "no price for v5litepod-8 in us-central1 in the source: not in the total" in table
    assert "n/a" in table


def test_over_budget_warns_by_default():
    raw = with_object(fixture_config("scheduled"), "budget", lambda b: b.update(amount=100, failOverBudget=False))
    result = plan(raw, "scheduled")
    assert any("exceeds the budget of 100.00 USD" in w for w in result.warnings)
    assert result.outputs["costEstimate"]["overBudget"] is True


def test_over_budget_fails_when_the_stack_says_so():
    raw = with_object(fixture_config("scheduled"), "budget", lambda b: b.update(amount=100, failOverBudget=True))
    with pytest.raises(Exception, match=r"tpu-platform:budget.amount = 100: estimated TPU cost 351.96 USD/month"):
        plan(raw, "scheduled")


def test_budget_in_another_currency_is_not_compared():
    raw = with_object(fixture_config("scheduled"), "budget", lambda b: b.update(amount=1, currency="EUR"))
    cost = cost_of(raw)
    assert not cost.over_budget
    assert "not compared: prices are USD" in cost_table(cost.as_output())


def test_plan_prints_the_cost_table():
    table = cost_table(plan(fixture_config("scheduled"), "scheduled").outputs["costEstimate"])
    assert "Estimated TPU cost per month of 730 hours (prices of 2026-11" in table
    row = "office-v2                v2-8               4 spot        us-central1     0.3375    ≤260.7      351.96 [1]"
    assert row in table
    assert "[1] runs to completion with no maxRunHours: priced for every hour it may run" in table
    assert "budget: 500.00 USD/month; estimate is 70% of it" in table


def test_gke_slice_pools_by_their_model_for_all_their_slices():
    """v5e spot 0.3468 and v6e on-demand 2.70 per chip-hour in us-central1; flex-start at the list price, for
    every hour it may run; TPU7x has no price in the source: out of the total, and said so."""

    def pools(gke):
        gke["slicePools"] = [
            {
                "name": "v5e",
                "acceleratorType": "v5litepod-16",
                "zone": "us-central1-a",
                "provisioning": "spot",
                "slices": 2,
            },
            {"name": "flex", "acceleratorType": "v6e-16", "zone": "us-central1-b", "provisioning": "flex-start"},
            {"name": "iron", "acceleratorType": "tpu7x-16", "zone": "us-central1-c"},
        ]
        gke.pop("teams")  # the fixture's teams are guaranteed chips of its own pools

    cfg = parse_stack_config("gke", with_object(fixture_config("gke"), "gke", pools))
    assert cfg.gke is not None
    cost = estimate(cfg.tpu_vms, cfg.budget, cfg.gke.slice_pools)
    v5e, flex, iron = cost.pools
    assert (v5e.chips, v5e.slices, v5e.monthly) == (32, 2, round(32 * 0.3468 * 730, 2))
    assert (flex.monthly, flex.hours_basis) == (round(16 * 2.70 * 730, 2), "up to")
    assert any("flex-start priced at the on-demand list price" in n for n in flex.notes)
    assert (iron.priced, iron.monthly, cost.unpriced) == (False, 0.0, ["iron"])
    assert cost.monthly_total == round(v5e.monthly + flex.monthly, 2)
    assert cost.on_demand_total == round(32 * 1.20 * 730 + flex.monthly, 2)
    table = cost_table(cost.as_output())
    assert "GKE slice pool" in table and "  v5e                      v5litepod-16    2×16 spot" in table
    assert "not in the total (no price in the source): iron" in table


def test_a_stack_without_slice_pools_has_no_pools_in_its_cost_output():
    assert "pools" not in cost_of(fixture_config("scheduled")).as_output()
