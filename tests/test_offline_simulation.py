"""The discrete-event simulation of a spot job: its bookkeeping, the guard's real give-ups, and (slow)
its best checkpoint interval against the closed form over a grid of save times and preemption rates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from infra.goodput.interval import NO_EVENTS, YOUNG_DALY, Losses, Phases, Rate, best_interval
from tools.offline.simulation import GRID, GRID_PHASES, MONTH_S, Scenario, compare, simulate

PHASES = Phases(queue_s=90, boot_s=120, installs_s=60, restore_s=30, first_step_s=60)


def scenario(**changes) -> Scenario:
    base = Scenario(interval_s=900, save_s=60, losses=Losses(Rate.every(4), NO_EVENTS, 30, 60), phases=PHASES)
    return replace(base, **changes)


def test_every_second_of_the_month_goes_to_one_category():
    for s in (scenario(), scenario(max_attempts=2), scenario(losses=Losses(Rate.every(1), Rate.every(5), 30, 20))):
        out = simulate(s, seed=7)
        assert sum(out.seconds.values()) == pytest.approx(MONTH_S)
        assert out.billed_s == pytest.approx(MONTH_S - out.seconds["queue"] - out.seconds["recoveryWait"])
        assert out.useful_s == pytest.approx(out.seconds["productive"])
        assert out.preemptions + out.lost_without_notice > 50


def test_a_seed_gives_the_same_month():
    assert simulate(scenario(), seed=3) == simulate(scenario(), seed=3)
    assert simulate(scenario(), seed=3) != simulate(scenario(), seed=4)


def test_with_nothing_taking_the_vm_a_job_is_its_phases_steps_and_saves():
    out = simulate(scenario(losses=Losses(), work_s=10_500.0), seed=0)
    assert out.finished_s == 90 + 120 + 60 + 60 + 10_500 + 12 * 60  # 11 whole stretches and the rest, each saved
    assert out.seconds["checkpointSave"] == 12 * 60 and out.useful_s == 10_500
    assert out.preemptions == 0 and out.seconds["wastedProgress"] == 0


def test_an_injected_preemption_takes_the_vm_then_and_the_guard_brings_it_back():
    """A job of 10,500 s of steps, preempted 1,000 s after its first READY; a save on notice commits in 20 s."""
    losses = Losses(NO_EVENTS, NO_EVENTS, 30, 20)
    out = simulate(scenario(save_s=20, losses=losses, work_s=10_500.0, preempted_after_s=(1000.0,)), seed=0)
    assert (out.preemptions, out.lost_without_notice, out.useful_s) == (1, 0, 10_500)
    # READY at 90; 240 s of restart, then 760 s of steps kept by the save on notice, committed at 1,110. The
    # guard's tick at 1,200 deletes (60 s) and creates (240 s): READY at 1,500; 270 s of restart, restore
    # included; the 9,740 s of steps left in 11 stretches, each saved.
    assert out.seconds["wastedProgress"] == 0 and out.seconds["recoveryWait"] == 1500 - 1110
    assert out.seconds["restore"] == 30 and out.seconds["checkpointSave"] == 20 + 11 * 20
    assert out.finished_s == 1500 + 270 + 9740 + 11 * 20


@pytest.mark.parametrize(
    ("interval_s", "save_s", "commit_s", "phases", "create_s", "preempted_after_s"),
    [  # a sandbox-sized run whose committed steps summed an ulp short of the job: it never finished
        (0.6715137367920163, 0.0067864115190876696, 0.6614034781424523, (4.489298226483888, 0.7495768111897567,
         0.004008955954045934, 0.18983870393308366), 0.43877307011993694, 8.126208038515227),
        # the save on notice kept the job's last steps, an ulp short of them: the next life trained "backwards"
        (0.5771355427409304, 0.036189222347614736, 0.25813126965115574, (7.471106306273173, 0.2687034452953446,
         0.42564697338840707, 0.949390621145361), 0.9983570741951342, 12.967288312199443),
    ],
)  # fmt: skip
def test_a_job_finishes_when_its_steps_add_up_to_it_in_floating_point(
    interval_s, save_s, commit_s, phases, create_s, preempted_after_s
):
    job = Scenario(
        interval_s=interval_s,
        save_s=save_s,
        losses=Losses(notice_s=30.0, commit_s=commit_s),
        phases=Phases(*(0.0, 0.0), *phases),
        recovery_every_s=1e-3,
        delete_s=0.0,
        create_s=create_s,
        work_s=10 * interval_s,
        preempted_after_s=(preempted_after_s,),
    )
    out = simulate(job, seed=0)
    assert out.finished_s is not None and out.useful_s == job.work_s
    assert out.preemptions == 1 and out.seconds["wastedProgress"] == 0
    assert out.seconds["productive"] == pytest.approx(job.work_s)


def test_a_save_within_the_notice_keeps_the_work():
    kept = simulate(scenario(save_s=20, losses=Losses(Rate.every(2), NO_EVENTS, 30, 20), max_attempts=100), seed=1)
    lost = simulate(scenario(save_s=40, losses=Losses(Rate.every(2), NO_EVENTS, 30, 40), max_attempts=100), seed=1)
    assert kept.preemptions > 200 and kept.seconds["wastedProgress"] < 900  # only the stretch the month's end cut
    assert lost.seconds["wastedProgress"] > 200 * 30  # each loses its stretch so far, and the notice


def test_the_guard_re_creates_a_node_at_most_max_attempts_a_window_then_waits():
    out = simulate(scenario(losses=Losses(Rate.every(0.5), NO_EVENTS, 30, 60), max_attempts=2), seed=2)
    assert out.give_ups > 0
    assert out.preemptions <= 2 * 31  # two re-creations per 24 h window, and the first start
    unlimited = simulate(scenario(losses=Losses(Rate.every(0.5), NO_EVENTS, 30, 60), max_attempts=100), seed=2)
    assert unlimited.give_ups == 0 and unlimited.preemptions > 10 * 30


def test_a_preemptible_vm_lives_at_most_a_day():
    out = simulate(scenario(losses=Losses(Rate.every(1e6), NO_EVENTS, 30, 60), preemptible=True), seed=0)
    assert 29 <= out.preemptions <= 31


def test_the_grid_is_where_young_daly_applies_and_one_cell_where_saves_on_notice_do():
    regimes = [best_interval(c.save_s, c.losses, GRID_PHASES.restart_s).regime for c in GRID]
    assert regimes.count(YOUNG_DALY) == len(GRID) - 1


@pytest.mark.slow
def test_the_simulated_best_interval_matches_the_closed_form_within_ten_percent():
    """Over the grid, a month of a spot job simulated with the guard's recovery (its schedule, delete,
    create and give-ups): the interval that wastes least by simulation is within 10% of the model's.
    The same fit tells a wrong formula from the right one: √(C·M), Young's without the 2, is 29% short
    and lands outside 10% in every cell. The billed-to-useful ratios are reported (benchmarks/
    goodput_model.py prints the table), not asserted."""
    for cell in GRID:
        row = compare(cell, events=800 if cell.lost_hours is None else 1200)
        ratio = row.simulated.best_s / row.model_s
        assert abs(ratio - 1) < 0.10, (cell, row.simulated, row.model_s)
        wrong = math.sqrt(cell.save_s * cell.losses.losing_per_s**-1)
        assert abs(row.simulated.best_s / wrong - 1) > 0.10, (cell, row.simulated.best_s, wrong)
        if cell.lost_hours is None:
            assert row.model_s == pytest.approx(row.daly_s, rel=5e-3)
