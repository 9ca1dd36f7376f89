"""Before launch: what a job will cost and how long it will take on a VM shape and provisioning model,
and the checkpoint interval that wastes least. Pure: the model is `interval`, the prices `pricing`.

What the platform cannot know before a run is an input, and where it has no figure of its own the
answer says which figures are assumed: how long GCP takes to delete and create a node, and to boot it
and install the program. A run timeline measures them (recoveryWait, boot, installs); give yours.
The preemption rate is given, or comes from a stack's record of preemptions (`PreemptionHistory`,
which `tpu-runs report` will write from the stack's timelines).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from infra.catalog import PROVISIONING_MODELS, RECLAIMABLE, AcceleratorType
from infra.goodput.interval import (
    NO_EVENTS,
    PREEMPTIBLE_LIFE_HOURS,
    SPOT_NOTICE_S,
    Best,
    Expectation,
    Losses,
    Phases,
    Rate,
    best_interval,
    expected,
)
from infra.goodput.pricing import Priced, price, priced
from infra.tpu.metadata import GRACE_SECONDS

# The program has the spot notice, or the agent's grace period if shorter (it kills the run after it).
NOTICE_S = min(SPOT_NOTICE_S, float(GRACE_SECONDS))
# Seconds the platform has no measurement of yet: assumed, and said so in every answer.
ASSUMED = {"delete_s": 60.0, "create_s": 240.0, "boot_s": 120.0, "installs_s": 60.0}


@dataclass(frozen=True)
class Job:
    steps: int
    step_s: float  # one training step
    save_s: float  # a checkpoint stalls training this long
    restore_s: float  # the program's start to its checkpoint restored
    first_step_s: float = 0.0  # restored (or started) to the first step: compilation
    commit_s: float | None = None  # SIGTERM to a committed checkpoint; None: save_s (a synchronous save)
    every_steps: int | None = None  # the job's checkpoint interval, as runlib takes it: every N steps
    every_minutes: float | None = None  # … or every M minutes, whichever comes first

    @property
    def work_s(self) -> float:
        return self.steps * self.step_s

    @property
    def commit(self) -> float:
        return self.save_s if self.commit_s is None else self.commit_s

    @property
    def interval_s(self) -> float | None:
        """Seconds of steps between checkpoints: runlib saves after N steps or M minutes, the first."""
        bounds = [self.every_steps * self.step_s] if self.every_steps else []
        bounds += [self.every_minutes * 60] if self.every_minutes else []
        return min(bounds) if bounds else None

    def problems(self) -> list[str]:
        out = [] if self.steps >= 1 else [f"steps: {self.steps} must be ≥ 1"]
        out += [] if self.step_s > 0 else [f"step time: {self.step_s:g} s must be > 0"]
        for name, value in (
            ("save", self.save_s),
            ("restore", self.restore_s),
            ("first step", self.first_step_s),
            ("commit", self.commit),
        ):
            out += [] if value >= 0 else [f"{name} time: {value:g} s must be ≥ 0"]
        if self.commit < self.save_s:
            out.append(f"commit time {self.commit:g} s is shorter than the save's stall {self.save_s:g} s")
        if self.every_steps is not None and self.every_steps < 1:
            out.append(f"checkpoint every {self.every_steps} steps: must be ≥ 1")
        if self.every_minutes is not None and self.every_minutes <= 0:
            out.append(f"checkpoint every {self.every_minutes:g} minutes: must be > 0")
        return out


@dataclass(frozen=True)
class Capacity:
    accelerator: AcceleratorType
    provisioning: str
    zones: tuple[str, ...]
    slices: int = 1
    preemptions: Rate = NO_EVENTS  # with notice: spot and preemptible only
    without_notice: Rate = NO_EVENTS  # a host lost, kill -9: any provisioning model
    notice_s: float = NOTICE_S
    recovery_every_minutes: int | None = 10  # the guard's schedule; None: no recovery
    max_attempts: int = 5  # the guard's re-creations per node per 24 h window
    queue_s: float = 0.0  # the first start's wait for capacity (a queued request), not billed
    delete_s: float = ASSUMED["delete_s"]
    create_s: float = ASSUMED["create_s"]
    boot_s: float = ASSUMED["boot_s"]
    installs_s: float = ASSUMED["installs_s"]
    measured: frozenset[str] = frozenset()  # which of ASSUMED's figures are the user's own

    @property
    def chips(self) -> int:
        return self.accelerator.chips * self.slices

    @property
    def recovery_wait_s(self) -> float:
        """A preempted node waits for the guard's next tick (half its schedule on average), then the
        delete it waits for and the create (functions/tpu_guard/main.py `recover`)."""
        tick = (self.recovery_every_minutes or 0) * 60
        return tick / 2 + self.delete_s + self.create_s

    def problems(self) -> list[str]:
        out = []
        if self.provisioning not in PROVISIONING_MODELS:
            out.append(f"provisioning {self.provisioning!r}: one of {', '.join(PROVISIONING_MODELS)}")
        elif self.provisioning in RECLAIMABLE and not self.preemptions.per_hour:
            out.append(f"{self.provisioning} VMs are preempted: give the hours between preemptions or a record of them")
        elif self.provisioning not in RECLAIMABLE and self.preemptions.per_hour:
            out.append(f"{self.provisioning} VMs are not preempted: give their losses without notice instead")
        mean = self.preemptions.mean_hours
        if self.provisioning == "preemptible" and mean and mean > PREEMPTIBLE_LIFE_HOURS:
            out.append(
                f"a preemptible VM lives at most {PREEMPTIBLE_LIFE_HOURS:g} h: a preemption every {mean:g} h cannot be"
            )
        if self.slices < 1:
            out.append(f"slices: {self.slices} must be ≥ 1")
        return out


@dataclass(frozen=True)
class Outcome:
    """The expected run at one checkpoint interval."""

    interval_s: float
    every_steps: int  # the interval in whole steps
    expectation: Expectation
    priced: Priced

    def to_json(self) -> dict[str, Any]:
        e = self.expectation
        return {
            "intervalSeconds": self.interval_s,
            "everySteps": self.every_steps,
            "wallHours": e.wall_s / 3600,
            "billedHours": e.billed_s / 3600,
            "billedPerUseful": e.billed_per_useful,
            "disruptions": e.disruptions,
            **self.priced.to_json(),
        }


@dataclass(frozen=True)
class WhatIf:
    job: Job
    capacity: Capacity
    losses: Losses
    phases: Phases
    best: Best
    yours: Outcome | None  # at the job's own interval, when it has one
    at_best: Outcome | None  # at the best interval, when there is one
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        c, j = self.capacity, self.job
        return {
            "job": {
                "steps": j.steps,
                "stepSeconds": j.step_s,
                "saveSeconds": j.save_s,
                "commitSeconds": j.commit,
                "restoreSeconds": j.restore_s,
                "firstStepSeconds": j.first_step_s,
                "checkpointEverySteps": j.every_steps,
                "checkpointEveryMinutes": j.every_minutes,
                "intervalSeconds": j.interval_s,
                "workHours": j.work_s / 3600,
            },
            "capacity": {
                "acceleratorType": c.accelerator.name,
                "chips": c.chips,
                "provisioning": c.provisioning,
                "zones": list(c.zones),
                "preemptions": {"perHour": c.preemptions.per_hour, "source": c.preemptions.source},
                "lostWithoutNotice": {"perHour": c.without_notice.per_hour, "source": c.without_notice.source},
                "noticeSeconds": c.notice_s,
                "recoveryEveryMinutes": c.recovery_every_minutes,
                "recoveryWaitSeconds": c.recovery_wait_s,
                "maxAttempts": c.max_attempts,
            },
            "assumed": {k: getattr(c, k) for k in ASSUMED if k not in c.measured},
            "best": {
                "regime": self.best.regime,
                "why": self.best.why,
                "seconds": self.best.seconds,
                "everySteps": self.at_best.every_steps if self.at_best else None,
                "youngSeconds": self.best.young_s,
                "dalySeconds": self.best.daly_s,
            },
            "yours": self.yours.to_json() if self.yours else None,
            "atBest": self.at_best.to_json() if self.at_best else None,
            "notes": list(self.notes),
        }


class WhatIfError(ValueError):
    """Inputs the model cannot answer for: every problem, one per line."""


def what_if(job: Job, capacity: Capacity) -> WhatIf:
    problems = job.problems() + capacity.problems()
    if problems:
        raise WhatIfError("\n".join(problems))
    losses = Losses(capacity.preemptions, capacity.without_notice, capacity.notice_s, job.commit)
    phases = Phases(
        queue_s=capacity.queue_s,
        recovery_wait_s=capacity.recovery_wait_s,
        boot_s=capacity.boot_s,
        installs_s=capacity.installs_s,
        restore_s=job.restore_s,
        first_step_s=job.first_step_s,
    )
    best = best_interval(job.save_s, losses, phases.restart_s)
    at = price(capacity.accelerator, capacity.provisioning, capacity.zones)

    def outcome(interval_s: float) -> Outcome:
        e = expected(job.work_s, interval_s, job.save_s, losses, phases)
        return Outcome(interval_s, math.ceil(interval_s / job.step_s - 1e-9), e, priced(e.seconds, capacity.chips, at))

    yours = None if job.interval_s is None else outcome(job.interval_s)
    at_best = None if best.seconds is None else outcome(max(1, round(best.seconds / job.step_s)) * job.step_s)
    return WhatIf(job, capacity, losses, phases, best, yours, at_best, tuple(_notes(capacity, losses)))


def _notes(capacity: Capacity, losses: Losses) -> list[str]:
    notes = list(price(capacity.accelerator, capacity.provisioning, capacity.zones).notes)
    assumed = [k for k in ASSUMED if k not in capacity.measured]
    if assumed:
        figures = ", ".join(f"{k.removesuffix('_s')} {getattr(capacity, k):g} s" for k in assumed)
        notes.append(f"assumed, not measured: {figures} (a run timeline measures them)")
    per_day = (losses.losing_per_s + losses.saving_per_s) * 24 * 3600
    if capacity.recovery_every_minutes and per_day > capacity.max_attempts:
        notes.append(
            f"about {per_day:.3g} preemptions or losses a day of running, more than the guard's "
            f"{capacity.max_attempts} re-creations per 24 h window: after them it gives up until the window "
            "turns, a wait this estimate leaves out (the simulation counts it: --simulate)"
        )
    if capacity.provisioning in RECLAIMABLE and not capacity.recovery_every_minutes:
        notes.append("no automation.recovery: nothing re-creates a preempted node; the estimate assumes the guard does")
    if capacity.provisioning == "flex-start":
        notes.append("flex-start runs for its runDurationHours at most: a longer job needs another request")
    if capacity.accelerator.multi_host or capacity.slices > 1:
        notes.append("a slice stops as one: any host's notice or loss counts for the whole slice")
    return notes
