"""A discrete-event simulation of a job on a spot TPU: preemptions, the guard's recovery, checkpoints.

It checks the closed forms of infra/goodput/interval.py by another route: it plays the job out event
by event and adds up where the time went, by the timeline's categories. Three actors interrupt each
other, as on GCP:

- GCE takes the VM after a random running time: a preemption with notice (SIGTERM, then the grace
  period) or a loss without notice; a preemptible VM at 24 h at the latest. A run to replay gives its
  preemptions' times instead (`Scenario.preempted_after_s`).
- The guard looks on its Cloud Scheduler tick (`automation.recovery.everyMinutes`) and decides with
  its own code (functions/tpu_guard/decisions.py: `recovery_state`, `recovery_actions`), so its
  window and `maxAttempts` give-ups are the real ones; a re-creation is a delete it waits for, then a
  create until the node is READY (main.py `recover`).
- The VM boots, installs, restores, compiles, then trains in stretches of τ seconds of steps each
  closed by a save that stalls training; on SIGTERM the program saves, and keeps the work if the
  save commits within the notice.

Why simpy (a development dependency): those three are processes that interrupt one another; simpy's
processes and `Process.interrupt` say that directly, in plain Python with no dependencies of its own,
where a hand-made event queue would be one more thing to test. Randomness: one stream of running
times between events, drawn in order, so runs that differ only in their interval see the same
events (common random numbers) and their difference is the interval's.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from infra.goodput.interval import (
    HOUR,
    PREEMPTIBLE_LIFE_HOURS,
    Losses,
    Phases,
    Rate,
    best_interval,
    billed_per_useful,
)
from run_contract.timeline import BY_KEY

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "functions" / "tpu_guard"))
from decisions import RecoveryState, recovery_actions, recovery_state

MONTH_S = 30 * 24 * HOUR
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
ENVIRONMENT, NODE = "sim", "projects/p/locations/us-central1-a/nodes/job"
RESTARTING, TRAINING = "restarting", "training"  # phases whose time is split when they end


@dataclass(frozen=True)
class Scenario:
    interval_s: float  # seconds of steps between checkpoints
    save_s: float  # a checkpoint stalls training this long
    losses: Losses
    phases: Phases  # its recovery_wait_s is not read: the guard below makes the wait
    recovery_every_s: float = 600.0  # the guard's tick; inf: no recovery
    delete_s: float = 60.0  # the guard waits for the delete
    create_s: float = 240.0  # create until READY
    max_attempts: int = 5  # re-creations per node per window, then the guard gives up until it turns
    window_s: float = 24 * HOUR
    preemptible: bool = False
    work_s: float = math.inf  # the job's steps, in seconds; inf: it runs until the horizon
    horizon_s: float = MONTH_S
    # Injected preemptions (a run to replay): the n-th incarnation is taken with notice after this many seconds
    # from its READY; the incarnations after them meet the rates' random events.
    preempted_after_s: tuple[float, ...] = ()

    @property
    def mean_recovery_wait_s(self) -> float:
        """The closed form's recovery wait: half a tick on average, then delete and create."""
        return self.recovery_every_s / 2 + self.delete_s + self.create_s


@dataclass
class Outcome:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BY_KEY, 0.0))
    useful_s: float = 0.0  # committed steps, in seconds
    finished_s: float | None = None  # when the job's last checkpoint committed
    preemptions: int = 0
    lost_without_notice: int = 0
    give_ups: int = 0  # guard ticks that gave up on the node

    @property
    def billed_s(self) -> float:
        return sum(s for key, s in self.seconds.items() if BY_KEY[key].billed)

    @property
    def billed_per_useful(self) -> float:
        return self.billed_s / self.useful_s if self.useful_s else math.inf


class _Run:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.s = scenario
        self.env = simpy.Environment()
        self.draws = random.Random(seed)
        self.out = Outcome()
        # Where time is going: a category, RESTARTING (the restart below), TRAINING, or None (nowhere).
        self.phase: str | None = "queue"
        self.since = 0.0
        self.restart: tuple[tuple[str, float], ...] = ()  # this incarnation's restart: (category, seconds)
        self.guard_state: bytes | None = None  # the guard's state object, as its bucket would hold it
        self.incarnations = 0

    def begin(self, phase: str | None) -> None:
        """Close the current phase's time into its category, and begin `phase`."""
        if self.phase not in (None, RESTARTING, TRAINING):
            self.out.seconds[self.phase] += self.env.now - self.since
        self.phase, self.since = phase, self.env.now

    def _running_time(self, per_hour: float) -> float:
        u = self.draws.random()  # drawn whatever the rate, so every run takes the same numbers in order
        return -math.log(1.0 - u) * HOUR / per_hour if per_hour else math.inf

    def start(self) -> Generator[Any, Any, None]:
        yield self.env.timeout(self.s.phases.queue_s)
        self.env.process(self.vm())

    def vm(self) -> Generator[Any, Any, None]:
        """One incarnation of the node, from READY until the job ends or the node is taken."""
        me = self.env.active_process
        assert me is not None  # this generator runs as a process
        self.incarnations += 1
        self.env.process(self.reclaim(me))
        p, s = self.s.phases, self.s
        try:
            restore = p.restore_s if self.out.useful_s else 0.0  # a first start has nothing to restore
            self.restart = (
                ("boot", p.boot_s),
                ("installs", p.installs_s),
                ("restore", restore),
                ("firstStep", p.first_step_s),
            )
            self.begin(RESTARTING)
            yield self.env.timeout(sum(seconds for _, seconds in self.restart))
            self._restarted(math.inf)
            self.begin(TRAINING)
            # Training is deterministic between events: one timeout to the job's end (or past the
            # horizon); an interrupt's time says how many stretches and saves it got through.
            left = s.work_s - self.out.useful_s
            stretches = math.ceil(left / s.interval_s - 1e-12) if math.isfinite(left) else math.inf
            yield self.env.timeout(min(left + stretches * s.save_s, s.horizon_s - self.env.now + 1))
            self._train(self.env.now - self.since)
            if self.out.useful_s >= s.work_s:
                self.begin(None)
                self.out.finished_s = self.env.now  # onCompletion delete: the node (and its bill) ends here
        except simpy.Interrupt as stop:
            yield from self._taken(str(stop.cause))

    def _restarted(self, elapsed: float) -> None:
        """Credit the restart's phases that `elapsed` seconds of it got through, in order."""
        for category, seconds in self.restart:
            self.out.seconds[category] += min(seconds, max(0.0, elapsed))
            elapsed -= seconds

    def _credit(self, work: float) -> float:
        """Count `work` seconds of steps as committed; return them. The job's last piece ends it exactly:
        useful + (work_s - useful) can fall an ulp short of work_s, and the job would never finish."""
        if math.isclose(self.out.useful_s + work, self.s.work_s, rel_tol=1e-12):
            work = self.s.work_s - self.out.useful_s
            self.out.useful_s = self.s.work_s
        else:
            self.out.useful_s += work
        self.out.seconds["productive"] += work
        return work

    def _train(self, elapsed: float) -> tuple[float, float]:
        """Credit the stretches and saves that `elapsed` seconds of training completed; return the
        time into the stretch it was in and that stretch's length of steps."""
        s = self.s
        per, left = s.interval_s + s.save_s, s.work_s - self.out.useful_s
        done = math.floor(elapsed / per)
        if math.isfinite(left):  # the job's last stretch is the rest of its steps: shorter
            stretches = math.ceil(left / s.interval_s - 1e-12)
            last = left - (stretches - 1) * s.interval_s
            done = stretches if elapsed >= (stretches - 1) * per + last + s.save_s - 1e-9 else min(done, stretches - 1)
        work = self._credit(min(done * s.interval_s, left))
        self.out.seconds["checkpointSave"] += done * s.save_s
        self.since += work + done * s.save_s
        return self.env.now - self.since, min(s.interval_s, s.work_s - self.out.useful_s)

    def _taken(self, kind: str) -> Generator[Any, Any, None]:
        losses = self.s.losses
        if self.phase == TRAINING:
            into, length = self._train(self.env.now - self.since)
            if kind == "notice" and losses.fits:  # the save on SIGTERM keeps the stretch so far
                kept = self._credit(min(into, length))
                self.out.seconds["checkpointSave"] += into - kept
                self.phase, self.since = "checkpointSave", self.env.now
                yield self.env.timeout(losses.commit_s)
            else:
                self.out.seconds["wastedProgress"] += into
                self.phase, self.since = "wastedProgress", self.env.now
                if kind == "notice":  # it tries to save, and is killed at the end of the notice
                    yield self.env.timeout(losses.notice_s)
        else:  # a restart cut short: all of it is recovery time lost, as the closed form counts it
            self.out.seconds["boot"] += self.env.now - self.since
            self.phase = None
        self.begin("recoveryWait")
        self.env.process(self.guard())

    def reclaim(self, vm: simpy.Process) -> Generator[Any, Any, None]:
        losses = self.s.losses
        notice = self._running_time(losses.preemptions.per_hour)
        lost = self._running_time(losses.without_notice.per_hour)
        if self.s.preemptible:
            notice = min(notice, PREEMPTIBLE_LIFE_HOURS * HOUR)
        if self.incarnations <= len(self.s.preempted_after_s):  # drawn all the same: the stream stays in step
            notice, lost = self.s.preempted_after_s[self.incarnations - 1], math.inf
        wait = min(notice, lost)
        if math.isinf(wait):
            return
        yield self.env.timeout(wait)
        if vm.is_alive:
            kind = "notice" if notice <= lost else "lost"
            self.out.preemptions += kind == "notice"
            self.out.lost_without_notice += kind == "lost"
            vm.interrupt(kind)

    def guard(self) -> Generator[Any, Any, None]:
        """The guard's ticks until it re-creates the node (decisions.py decides; main.py acts)."""
        node = {
            "name": NODE,
            "state": "PREEMPTED",
            "schedulingConfig": {"spot": True},
            "labels": {"environment": ENVIRONMENT, "managed-by": "pulumi"},
        }
        every = self.s.recovery_every_s
        if math.isinf(every):  # no recovery: the node stays preempted
            return
        while True:
            yield self.env.timeout((math.floor(self.env.now / every) + 1) * every - self.env.now)
            now = EPOCH + timedelta(seconds=self.env.now)
            state = recovery_state(self.guard_state, now, timedelta(seconds=self.s.window_s))
            (action,) = recovery_actions([node], environment=ENVIRONMENT, state=state, max_attempts=self.s.max_attempts)
            if action.kind == "give-up":  # the same answer every tick until the window turns: skip to it
                turns = (datetime.fromisoformat(state.window_start) - EPOCH).total_seconds() + self.s.window_s
                last = max(self.env.now, (math.ceil(turns / every) - 1) * every)
                self.out.give_ups += 1 + round((last - self.env.now) / every)
                yield self.env.timeout(last - self.env.now)
                continue
            assert action.kind == "recreate", action
            attempts = {**state.attempts, NODE: state.attempts.get(NODE, 0) + 1}
            self.guard_state = RecoveryState(state.window_start, attempts, {}).to_json()
            yield self.env.timeout(self.s.delete_s + self.s.create_s)  # it waits for the delete, then creates
            self.env.process(self.vm())
            return

    def run(self) -> Outcome:
        self.env.process(self.start())
        self.env.run(until=self.s.horizon_s)
        if self.phase == TRAINING:  # the horizon cut training: its last stretch is not committed
            into, _ = self._train(self.env.now - self.since)
            self.out.seconds["wastedProgress"] += into
        elif self.phase == RESTARTING:
            self._restarted(self.env.now - self.since)
        self.begin(None)
        return self.out


def simulate(scenario: Scenario, seed: int) -> Outcome:
    return _Run(scenario, seed).run()


def total(outcomes: Sequence[Outcome]) -> Outcome:
    out = Outcome()
    for o in outcomes:
        for key, seconds in o.seconds.items():
            out.seconds[key] += seconds
        out.useful_s += o.useful_s
        out.preemptions += o.preemptions
        out.lost_without_notice += o.lost_without_notice
        out.give_ups += o.give_ups
    return out


@dataclass(frozen=True)
class Curve:
    """Billed seconds per useful second at each interval, over the same months, and its minimum."""

    intervals_s: tuple[float, ...]
    billed_per_useful: tuple[float, ...]
    best_s: float  # the vertex of a parabola in log(interval) fitted to the points
    months: int
    events: int  # events that lost work at the middle interval


def simulated_best(scenario: Scenario, intervals_s: Sequence[float], events: int, seed: int = 0) -> Curve:
    """The interval that wastes least by simulation, from `intervals_s` spread around a guess. The
    middle interval runs months (seeds seed, seed+1, …) until it has seen `events` that lose work;
    every interval then runs those same months. The best is the vertex of a least-squares parabola
    in log(interval) through the billed-per-useful points: the curve is flat at its minimum, so one
    point's noise would move a plain argmin far more than it moves the fit."""
    if not scenario.losses.losing_per_s:
        raise ValueError("nothing loses work: no interval is best")

    def month(interval_s: float, m: int) -> Outcome:
        return simulate(replace(scenario, interval_s=interval_s), seed + m)

    def losses(outcomes: Sequence[Outcome]) -> int:
        """The events that lose work: the ones that make the interval matter."""
        unfit = 0 if scenario.losses.fits else sum(o.preemptions for o in outcomes)
        return unfit + sum(o.lost_without_notice for o in outcomes)

    middle = intervals_s[len(intervals_s) // 2]
    runs: list[Outcome] = []
    while losses(runs) < events:
        runs.append(month(middle, len(runs)))
    ratios = [
        total(runs if t == middle else [month(t, m) for m in range(len(runs))]).billed_per_useful for t in intervals_s
    ]
    c2, c1, _ = np.polyfit(np.log(intervals_s), ratios, 2)
    if c2 <= 0:
        raise ValueError(f"the simulated curve has no minimum inside {intervals_s[0]:g}…{intervals_s[-1]:g} s")
    return Curve(tuple(intervals_s), tuple(ratios), float(math.exp(-c1 / (2 * c2))), len(runs), losses(runs))


def around(center_s: float, spread: float = 2.0, points: int = 9) -> tuple[float, ...]:
    """`points` intervals spaced evenly in log from center/spread to center·spread."""
    return tuple(center_s * spread ** (2 * i / (points - 1) - 1) for i in range(points))


# The grid the simulation checks the closed form over (benchmarks/goodput_model.py prints it): saves
# longer than the 30 s notice, so every preemption loses work (Young/Daly), and one cell where
# preemptions are saved on notice and losses without notice set the interval.
GRID_PHASES = Phases(boot_s=120.0, installs_s=60.0, restore_s=30.0, first_step_s=60.0)


@dataclass(frozen=True)
class Cell:
    save_s: float
    preemption_hours: float
    lost_hours: float | None = None  # losses without notice
    notice_s: float = 30.0

    @property
    def losses(self) -> Losses:
        return Losses(Rate.every(self.preemption_hours), Rate.every(self.lost_hours), self.notice_s, self.save_s)


GRID = (*(Cell(save, hours) for save in (45.0, 120.0, 300.0) for hours in (2.0, 8.0, 24.0)), Cell(20.0, 2.0, 8.0))


@dataclass(frozen=True)
class Row:
    cell: Cell
    model_s: float  # the model's best interval (Daly's exact minimiser when every event loses work)
    young_s: float
    daly_s: float
    simulated: Curve
    model_billed_per_useful: float  # at the model's best, in a long run
    simulated_billed_per_useful: float  # the simulated months at the model's best


def compare(cell: Cell, events: int, seed: int = 0) -> Row:
    """The simulated best interval of a month of a spot job against the model's, and their ratios of
    billed to useful time at the model's best (reported, not asserted: restarts and the guard's waits
    are where the two may part)."""
    losses = cell.losses
    best = best_interval(cell.save_s, losses, GRID_PHASES.restart_s)
    assert best.seconds and best.young_s and best.daly_s, cell
    scenario = Scenario(best.seconds, cell.save_s, losses, GRID_PHASES)
    intervals = around(best.seconds)
    curve = simulated_best(scenario, intervals, events, seed)
    return Row(
        cell,
        best.seconds,
        best.young_s,
        best.daly_s,
        curve,
        billed_per_useful(best.seconds, cell.save_s, losses, GRID_PHASES.restart_s),
        curve.billed_per_useful[len(intervals) // 2],
    )
