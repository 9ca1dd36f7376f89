"""The plan's warning when a workload's checkpoint interval is far from the one that wastes least on its
VM, from the declared stepSeconds, checkpointSeconds and hoursBetweenPreemptions (infra/config/rules.py)."""

from __future__ import annotations

import math

import pytest

from infra.config import parse_stack_config
from infra.goodput.interval import Losses, Rate, best_interval
from tests.support import fixture_config, with_object
from tests.test_config import problems_of

KEY = "tpu-platform:workloads.mnist.checkpointEverySteps"


def scheduled(workload: dict | None = None, vm: dict | None = None, stack: str = "scheduled") -> dict[str, str]:
    raw = with_object(fixture_config(stack), "workloads", lambda w: w["mnist"].update(workload or {}))
    return with_object(raw, "tpuVms", lambda vms: vms[0].update(vm or {}))


def warnings(workload: dict | None = None, vm: dict | None = None) -> list[str]:
    return [w for w in parse_stack_config("scheduled", scheduled(workload, vm)).warnings if KEY in w]


def test_nothing_is_said_without_the_steps_and_saves_seconds():
    assert warnings() == []
    assert warnings({"stepSeconds": 0.05}, {"hoursBetweenPreemptions": 4}) == []


def test_an_interval_far_below_the_best_is_warned_with_the_best_in_steps():
    (warning,) = warnings({"stepSeconds": 0.05, "checkpointSeconds": 60}, {"hoursBetweenPreemptions": 4})
    best = best_interval(60, Losses(Rate.every(4), notice_s=30, commit_s=60)).seconds
    assert best
    assert f"{KEY} = 200: on spot VM 'office-v2': checkpoints every 10 s of steps, 0.0078× the interval" in warning
    assert "a save takes 60 s to commit, longer than the 30 s notice" in warning
    steps, minutes = round(best / 0.05), math.ceil(best / 60)
    assert f"; set checkpointEverySteps: {steps} and set checkpointEveryMinutes: {minutes}" in warning


def test_an_interval_near_the_best_is_not_warned_and_the_minutes_cap_counts():
    near = {"stepSeconds": 2, "checkpointSeconds": 60, "checkpointEverySteps": 600, "checkpointEveryMinutes": 30}
    assert warnings(near, {"hoursBetweenPreemptions": 4}) == []  # 1200 s against a best of 1275 s
    (capped,) = warnings({**near, "checkpointEveryMinutes": 5}, {"hoursBetweenPreemptions": 4})
    assert "checkpoints every 300 s of steps (checkpointEveryMinutes caps it), 0.24×" in capped
    (far,) = warnings(
        {**near, "checkpointEverySteps": 6000, "checkpointEveryMinutes": 600}, {"hoursBetweenPreemptions": 4}
    )
    assert "checkpoints every 1.2e+04 s of steps, 9.4×" in far


def test_a_save_longer_than_the_notice_without_a_rate_asks_for_one():
    (warning,) = warnings({"stepSeconds": 0.05, "checkpointSeconds": 60})
    assert "a checkpoint commits in 60 s, longer than the 30 s notice, so a preemption loses the work" in warning
    assert "set tpuVms[].hoursBetweenPreemptions" in warning


def test_saves_on_notice_leave_only_their_cost_to_warn_about():
    (warning,) = warnings({"stepSeconds": 0.05, "checkpointSeconds": 20})
    assert "each stalling training 20 s: saves take 200% of it" in warning
    assert "within the 30 s notice, so a preemption's save on SIGTERM keeps its work" in warning
    assert warnings({"stepSeconds": 1, "checkpointSeconds": 5, "checkpointEverySteps": 600}) == []  # 5 s in 600


def test_an_on_demand_vm_is_never_preempted():
    (warning,) = warnings({"stepSeconds": 0.05, "checkpointSeconds": 20}, {"provisioning": "on-demand"})
    assert "on on-demand VM 'office-v2'" in warning
    assert "As nothing preempts on-demand VMs, periodic checkpoints only insure against losses" in warning


@pytest.mark.parametrize(
    ("vm", "message"),
    [
        (
            {"provisioning": "on-demand", "hoursBetweenPreemptions": 3},
            "tpuVms[office-v2].hoursBetweenPreemptions = 3: only spot and preemptible VMs are preempted, not on-demand",
        ),
        (
            {"provisioning": "preemptible", "hoursBetweenPreemptions": 30},
            "tpuVms[office-v2].hoursBetweenPreemptions = 30: a preemptible TPU lives at most 24 hours",
        ),
    ],
)
def test_a_preemption_rate_that_cannot_be_is_refused(vm, message):
    assert message in problems_of(scheduled(vm=vm), "scheduled")


def test_a_workload_with_its_own_source_takes_no_step_seconds():
    raw = with_object(
        fixture_config("scheduled"),
        "workloads",
        lambda w: w.update(
            own={"source": {"folder": "workloads/jax_mnist"}, "command": ["python", "x.py"], "stepSeconds": 1.0}
        ),
    )
    assert "workloads.own.stepSeconds = 1.0: only with program" in problems_of(raw, "scheduled")
