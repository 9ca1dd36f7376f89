"""The checkpoint interval model: Young's and Daly's forms against the exact minimiser, the regimes
(save on notice, Young/Daly, nothing lost), and the expected time of a job by category."""

from __future__ import annotations

import math

import pytest

from infra.goodput.interval import (
    HOUR,
    NO_EVENTS,
    NO_LOSSES,
    SAVE_ON_NOTICE,
    YOUNG_DALY,
    Losses,
    Phases,
    Rate,
    attempt,
    best_interval,
    billed_per_useful,
    daly,
    exact,
    expected,
    waste,
    young,
)
from run_contract.timeline import BY_KEY, PreemptionHistory

SPOT = Rate.every(4)
PHASES = Phases(queue_s=90, recovery_wait_s=600, boot_s=120, installs_s=60, restore_s=30, first_step_s=60)


@pytest.mark.parametrize(("save_s", "mean_h"), [(10, 24), (45, 2), (120, 8), (300, 2), (600, 1)])
def test_the_exact_interval_is_where_daly_s_expected_time_is_least(save_s, mean_h):
    mean = mean_h * HOUR
    best = exact(save_s, mean)

    def time_per_step(tau: float) -> float:  # Daly's (e^((τ+C)/M) − 1)/τ
        return math.expm1((tau + save_s) / mean) / tau

    assert time_per_step(best) < time_per_step(best * 0.99) and time_per_step(best) < time_per_step(best * 1.01)
    assert daly(save_s, mean) == pytest.approx(best, rel=2e-3)  # Daly's expansion, to its order
    # First order overshoots: by Daly's expansion, by about ⅔·√(C/2M) of the best.
    assert young(save_s, mean) / best - 1 == pytest.approx(2 / 3 * math.sqrt(save_s / (2 * mean)), rel=0.2)


def test_daly_beyond_its_range_is_the_mean():
    assert daly(5 * HOUR, 2 * HOUR) == 2 * HOUR


def test_a_save_longer_than_the_notice_loses_work_young_daly_applies():
    losses = Losses(SPOT, NO_EVENTS, notice_s=30, commit_s=60)
    best = best_interval(60, losses)
    assert best.regime == YOUNG_DALY and not losses.fits
    assert best.seconds == pytest.approx(exact(60, 4 * HOUR))
    assert "longer than the 30 s notice" in best.why


def test_a_save_within_the_notice_keeps_the_work_no_interval_is_best():
    losses = Losses(SPOT, NO_EVENTS, notice_s=30, commit_s=20)
    best = best_interval(20, losses)
    assert (best.seconds, best.regime) == (None, SAVE_ON_NOTICE)
    assert (
        billed_per_useful(600, 20, losses) > billed_per_useful(6000, 20, losses) > billed_per_useful(60000, 20, losses)
    )


def test_saved_preemptions_lengthen_the_interval_for_losses_without_notice():
    """The count of steps to the next checkpoint starts again at each resume (runlib's CheckpointTimer)."""
    losses = Losses(Rate.every(2), Rate.every(8), notice_s=30, commit_s=20)
    best = best_interval(20, losses, PHASES.restart_s)
    assert best.regime == SAVE_ON_NOTICE and best.seconds
    alone = exact(20, 8 * HOUR)
    assert alone < best.seconds < 1.1 * alone
    cost = [billed_per_useful(k * best.seconds, 20, losses, PHASES.restart_s) for k in (0.97, 1.0, 1.03)]
    assert cost[1] < cost[0] and cost[1] < cost[2]


def test_on_demand_with_nothing_taking_it_has_no_best():
    best = best_interval(30, Losses(NO_EVENTS, NO_EVENTS, 30, 30))
    assert (best.seconds, best.regime) == (None, NO_LOSSES)


def test_twice_or_half_the_best_wastes_a_quarter_more():
    losses = Losses(SPOT, NO_EVENTS, 30, 60)
    best = best_interval(60, losses).seconds
    assert best
    for k in (0.5, 2.0):
        assert waste(k * best, 60, losses) / waste(best, 60, losses) == pytest.approx(1.25, abs=0.02)


def test_an_attempt_s_parts_add_up_to_its_running_time():
    losses = Losses(Rate.every(2), Rate.every(8), 30, 20)
    a = attempt(900, 20, losses)
    rate = losses.losing_per_s + losses.saving_per_s
    saves_on_notice = losses.saving_per_s / rate * a.events * 20
    assert a.running - saves_on_notice == pytest.approx(-math.expm1(-rate * 920) / rate)  # E[min(X, τ + C)]


def test_with_nothing_taking_the_vm_a_job_is_its_phases_steps_and_saves():
    e = expected(10_000, 1000, 20, Losses(), PHASES)
    assert e.seconds == {
        **dict.fromkeys(BY_KEY, 0.0),
        "queue": 90,
        "boot": 120,
        "installs": 60,
        "firstStep": 60,
        "productive": 10_000,
        "checkpointSave": 10 * 20,
    }
    assert e.disruptions == 0 and e.wall_s == e.billed_s + 90
    assert expected(10_500, 1000, 20, Losses(), PHASES).seconds["checkpointSave"] == 11 * 20  # the last, short stretch


def test_a_long_job_costs_its_steady_state_per_step():
    losses = Losses(SPOT, Rate.every(24), 30, 60)
    e = expected(1000 * HOUR, 900, 60, losses, PHASES)
    steady = billed_per_useful(900, 60, losses, PHASES.restart_s)
    assert e.billed_per_useful == pytest.approx(steady, rel=1e-3)
    assert e.disruptions == pytest.approx(1000 * HOUR * steady * (1 / 4 + 1 / 24) / HOUR, rel=0.02)
    assert e.seconds["recoveryWait"] == pytest.approx(600 * e.disruptions, rel=1e-6)


def test_a_rate_from_a_record_and_from_none_seen():
    assert Rate.seen(4, 100, "preemptions").per_hour == 0.04
    none = Rate.seen(0, 100, "preemptions")
    assert none.per_hour == 0.03 and "at most 3 in that time (95%)" in none.source
    pre, lost = Rate.from_history(PreemptionHistory(6, 0, 300.0))
    assert (pre.per_hour, lost.per_hour) == (0.02, 0.01)
    with pytest.raises(ValueError, match="must be > 0"):
        Rate.every(0)
