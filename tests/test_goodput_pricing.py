"""A timeline priced: chip-hours and list-price USD per category, by the cost table's own lookup."""

from __future__ import annotations

import pytest

from infra.catalog import load_catalog
from infra.config import parse_stack_config
from infra.cost import vm_cost
from infra.goodput.pricing import price, price_timeline, priced
from run_contract.timeline import RunTimeline
from tests.support import fixture_config

V5E = load_catalog().accelerator("v5litepod-8")


def a_timeline(provisioning: str = "spot", zone: str = "us-central1-a", trusted: bool = True) -> RunTimeline:
    return RunTimeline.of(
        run_id="r1",
        vm="v",
        accelerator_type="v5litepod-8",
        chips=8,
        provisioning=provisioning,
        zone=zone,
        billed_s=3600.0,
        measured={"queue": 900.0, "recoveryWait": 300.0, "boot": 100.0, "productive": 3000.0, "wastedProgress": 200.0},
        step_lines_trusted=trusted,
    )


def test_billed_categories_cost_chips_times_hours_times_the_catalogs_price():
    assert not isinstance(V5E, str)
    per = load_catalog().price_per_chip_hour(V5E, "spot", "us-central1")
    assert per
    out = price_timeline(a_timeline())
    lines = {line.category: line for line in out.lines}
    assert lines["productive"].chip_hours == pytest.approx(8 * 3000 / 3600)
    assert lines["productive"].usd == pytest.approx(8 * 3000 / 3600 * per)
    assert lines["queue"].chip_hours == lines["recoveryWait"].chip_hours == lines["queue"].usd == 0
    assert out.chip_hours == pytest.approx(8.0)  # the billed hour, every billed category included
    assert out.usd == pytest.approx(8 * per)
    assert (out.price.date, out.price.region) == (load_catalog().prices_date, "us-central1")


def test_reserved_and_flex_start_stay_list_price_estimates():
    assert not isinstance(V5E, str)
    for provisioning in ("reserved", "flex-start"):
        at = price(V5E, provisioning, ["us-central1-a"])
        assert at.list_price_estimate and at.per_chip_hour == price(V5E, "on-demand", ["us-central1-a"]).per_chip_hour
        assert f"{provisioning} priced at the on-demand list price" in at.notes[0]
    assert not price(V5E, "spot", ["us-central1-a"]).list_price_estimate


def test_the_price_is_the_cost_tables_for_the_same_vm():
    for stack in ("scheduled", "production"):
        for vm in parse_stack_config(stack, fixture_config(stack)).tpu_vms:
            assert price(vm.accelerator, vm.provisioning, vm.zones).per_chip_hour == vm_cost(vm).price_per_chip_hour


def test_no_price_in_the_region_prices_nothing_and_says_so():
    out = price_timeline(a_timeline(zone="asia-southeast1-b"))
    assert out.usd is None and all(line.usd is None for line in out.lines)
    assert out.price.notes == ("no price for v5litepod-8 in asia-southeast1 in the source",)


def test_untrusted_categories_are_marked_and_the_json_carries_them():
    out = price_timeline(a_timeline(trusted=False)).to_json()
    assert out["categories"]["productive"]["untrusted"] and not out["categories"]["boot"]["untrusted"]
    assert out["price"]["listPriceEstimate"] is False
    assert not isinstance(V5E, str)
    assert priced({}, 4, price(V5E, "spot", ["us-central1-a"])).chip_hours == 0
