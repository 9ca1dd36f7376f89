"""Cost estimates against hand-computed figures, the budget comparison, and the plan's cost table."""

from __future__ import annotations

import pytest

from infra.config import parse_stack_config
from infra.cost import cost_table, estimate
from tests.support import plan, stack_config, with_object


def cost_of(raw, stack="dev"):
    return estimate(parse_stack_config(stack, raw))


def vms(*entries):
    def edit(vms):
        template = vms[0]
        vms[:] = [{**template, **{k: v for k, v in entry.items() if v is not None}} for entry in entries]
        for vm, entry in zip(vms, entries, strict=True):
            if entry.get("schedule") is None:
                vm.pop("schedule", None)

    return edit


def test_hand_computed_fleet():
    raw = with_object(stack_config(), "budget", lambda b: b.update(amount=100_000, failOverBudget=False))
    raw = with_object(raw, "tpuVms", vms(
        {"name": "spot-always", "provisioning": "spot"},                      # 4 chips × 0.34 × 720
        {"name": "on-demand-office", "provisioning": "on-demand",             # 4 × 1.125 × 257.14
         "schedule": {"start": "0 8 * * 1-5", "stop": "0 20 * * 1-5"}},
        {"name": "pod-preemptible", "provisioning": "preemptible", "acceleratorType": "v2-32", "onCompletion": "keep",
         "zone": "us-central1-a", "runtimeVersion": "tpu-vm-tf-2.14.1-pod"},  # 16 × 0.38 × 720
    ))  # fmt: skip
    cost = cost_of(raw)
    by_name = {v.name: v for v in cost.vms}
    assert by_name["spot-always"].monthly == pytest.approx(4 * 0.34 * 720)
    assert by_name["on-demand-office"].monthly == pytest.approx(4 * 1.125 * 257.14, abs=0.01)
    assert by_name["pod-preemptible"].monthly == pytest.approx(16 * 0.38 * 720)
    assert by_name["pod-preemptible"].on_demand_monthly == pytest.approx(16 * 1.50 * 720)
    assert cost.monthly_total == pytest.approx(979.2 + 1157.13 + 4377.6, abs=0.01)
    assert not cost.over_budget


def test_shipped_stacks():
    dev, prod = cost_of(stack_config("dev")), cost_of(stack_config("prod"), "prod")
    assert dev.monthly_total == pytest.approx(4 * 0.34 * 257.14, abs=0.01)  # spot v2-8, office hours
    # on-demand v5litepod-8 and spot v5litepod-4, always on
    assert prod.monthly_total == pytest.approx(8 * 1.20 * 720 + 4 * 0.213 * 720)
    assert dev.prices_date == "2026-10"


def test_over_budget_warns_by_default():
    raw = with_object(stack_config(), "budget", lambda b: b.update(amount=100, failOverBudget=False))
    result = plan(raw)
    assert any("exceeds the budget of 100.00 USD" in w for w in result.warnings)
    assert result.outputs["costEstimate"]["overBudget"] is True


def test_over_budget_fails_when_the_stack_says_so():
    raw = with_object(stack_config(), "budget", lambda b: b.update(amount=100))
    with pytest.raises(Exception, match=r"tpu-platform:budget.amount = 100: estimated TPU cost 349.71 USD/month"):
        plan(raw)


def test_budget_in_another_currency_is_not_compared():
    raw = with_object(stack_config(), "budget", lambda b: b.update(amount=1, currency="EUR"))
    cost = cost_of(raw)
    assert not cost.over_budget
    assert "not compared: prices are USD" in cost_table(cost.as_output())


def test_plan_prints_the_cost_table():
    table = cost_table(plan(stack_config()).outputs["costEstimate"])
    assert "Estimated TPU cost per month (prices of 2026-10" in table
    assert "mnist-v2-spot            v2-8               4 spot            0.340   257.1      349.71" in table
    assert "saving against on-demand: 807.42 USD/month (70%)" in table
    assert "budget: 500.00 USD/month; estimate is 70% of it" in table
