"""Checkpoint intervals: the one that wastes least, and where a job's time is expected to go.

Standard library only, like the timeline it fills in. The model (docs/goodput.md derives it): a job
needs W seconds of steps on a VM that random events take away, a Poisson process on the VM's running
time. A checkpoint every τ seconds of steps stalls training for C seconds. An event is either

- a preemption with notice: SIGTERM, then the grace period. When the program can commit a checkpoint
  within the notice (commit ≤ notice), nothing is lost but that save; otherwise the work since the last
  committed checkpoint is lost, as it is for
- a loss without notice: a host gone, kill -9, a save on notice that did not fit.

Each event costs the guard's recovery (waiting for its next check, delete, create: not billed) and a
restart (boot, installs, restore, compilation: billed, and itself interruptible). Only losses make the
interval matter, so the interval that wastes least is Young/Daly's for the losses' rate:

    τ* = M·(1 + W₀(−e^(−1−C/M)))  ≈ √(2·C·M)              (Young 1974)
                                  ≈ √(2CM)·(1 + ⅓√(C/2M) + C/18M) − C   (Daly 2006)

with M the mean running time between losses: the exact minimiser of Daly's expected time
(e^((τ+C)/M) − 1)/τ per second of steps, which both approximations expand. With no losses (every
preemption saved on notice, none lost without notice) no interval is best: each checkpoint only costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from run_contract.timeline import BY_KEY, PreemptionHistory

HOUR = 3600.0
# A spot VM's notice: "120 seconds between GCE ACPI G2 Soft Off and ACPI G3 Mechanical Off for Standard
# VMs and 30 seconds for Spot VMs" (compute.v1 discovery document, Scheduling.skipGuestOsShutdown).
SPOT_NOTICE_S = 30.0
PREEMPTIBLE_LIFE_HOURS = 24.0  # cloud.google.com/tpu/docs/preemptible: preemptible TPUs stop within 24 h


@dataclass(frozen=True)
class Rate:
    """Events per hour of a VM's running time, and where the figure comes from."""

    per_hour: float
    source: str

    @classmethod
    def every(cls, hours: float | None, source: str = "given") -> Rate:
        """One event every `hours` of running on average; None: no such events."""
        if hours is None:
            return cls(0.0, "none")
        if not hours > 0:
            raise ValueError(f"hours between events must be > 0, not {hours!r}")
        return cls(1 / hours, f"one every {hours:g} h ({source})")

    @classmethod
    def seen(cls, count: int, hours: float, what: str) -> Rate:
        """The rate `count` events in `hours` of running suggest: their mean, or with none seen the
        rule of three's bound (fewer than 3 in `hours` at 95%), never zero from a short record."""
        if count:
            return cls(count / hours, f"{count} {what} in {hours:g} running hours")
        return cls(3 / hours, f"no {what} in {hours:g} running hours: at most 3 in that time (95%)")

    @classmethod
    def from_history(cls, history: PreemptionHistory) -> tuple[Rate, Rate]:
        """(preemptions, losses without notice) from a stack's record of them."""
        hours = history.running_hours
        return cls.seen(history.preemptions, hours, "preemptions"), cls.seen(
            history.lost_without_notice, hours, "losses without notice"
        )

    @property
    def mean_hours(self) -> float | None:
        return 1 / self.per_hour if self.per_hour else None


NO_EVENTS = Rate(0.0, "none")


@dataclass(frozen=True)
class Losses:
    """What takes a VM away, and whether a save on notice keeps the work."""

    preemptions: Rate = NO_EVENTS  # with notice: SIGTERM and the grace period
    without_notice: Rate = NO_EVENTS  # a host lost, kill -9
    notice_s: float = 0.0  # SIGTERM to the kill: the spot notice, capped by the agent's grace period
    commit_s: float = 0.0  # SIGTERM to a committed checkpoint

    @property
    def fits(self) -> bool:
        """A save on notice commits before the VM goes."""
        return self.commit_s <= self.notice_s

    @property
    def losing_per_s(self) -> float:
        """Events that lose the work since the last committed checkpoint, per second of running."""
        return (self.without_notice.per_hour + (0.0 if self.fits else self.preemptions.per_hour)) / HOUR

    @property
    def saving_per_s(self) -> float:
        """Preemptions whose save on notice keeps the work, per second of running."""
        return (self.preemptions.per_hour if self.fits else 0.0) / HOUR


@dataclass(frozen=True)
class Best:
    """The interval of steps (in seconds) that wastes least; None where no interval is best."""

    seconds: float | None  # the exact minimiser
    young_s: float | None
    daly_s: float | None
    regime: str  # SAVE_ON_NOTICE, YOUNG_DALY or NO_LOSSES
    why: str


SAVE_ON_NOTICE, YOUNG_DALY, NO_LOSSES = "save on notice", "Young/Daly", "no losses"


def young(save_s: float, mean_s: float) -> float:
    """Young (1974), "A first order approximation to the optimum checkpoint interval", CACM 17(9)."""
    return math.sqrt(2 * save_s * mean_s)


def daly(save_s: float, mean_s: float) -> float:
    """Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart dumps",
    Future Generation Computer Systems 22(3): for C < 2M, else M."""
    if save_s >= 2 * mean_s:
        return mean_s
    ratio = save_s / (2 * mean_s)
    return young(save_s, mean_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - save_s


def exact(save_s: float, mean_s: float) -> float:
    """The τ that minimises (e^((τ+C)/M) − 1)/τ: x = τ/M solves (1 − x)·e^(x + C/M) = 1 on (0, 1),
    i.e. x = 1 + W₀(−e^(−1−C/M)), found by bisection (the left side falls from e^(C/M) to 0)."""
    c = save_s / mean_s
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = (low + high) / 2
        if (1 - mid) * math.exp(mid + c) > 1:
            low = mid
        else:
            high = mid
    return (low + high) / 2 * mean_s


def _why(losses: Losses, mean_s: float | None) -> tuple[str, str]:
    pre, lost = losses.preemptions, losses.without_notice
    saved = (
        f"a save commits in {losses.commit_s:g} s, within the {losses.notice_s:g} s notice, so preemptions "
        f"({pre.source}) lose no work"
    )
    if mean_s is None:
        if pre.per_hour:
            return SAVE_ON_NOTICE, (
                f"{saved}; with no losses without notice given, no interval is best: a periodic checkpoint "
                "only insures against a loss without notice"
            )
        return NO_LOSSES, "nothing takes the VM away: no interval is best"
    if pre.per_hour and losses.fits:
        return SAVE_ON_NOTICE, (
            f"{saved}; the interval insures against losses without notice ({lost.source}): Young/Daly for "
            "those, lengthened because the count of steps to the next checkpoint starts again at each resume"
        )
    parts = []
    if pre.per_hour:
        parts.append(
            f"a save takes {losses.commit_s:g} s to commit, longer than the {losses.notice_s:g} s notice, so a "
            f"preemption ({pre.source}) loses the work since the last committed checkpoint"
        )
    if lost.per_hour:
        parts.append(f"losses without notice ({lost.source}) lose it too")
    return YOUNG_DALY, "; ".join(parts) + f": Young/Daly for one loss every {mean_s / HOUR:.3g} h of running"


@dataclass(frozen=True)
class Attempt:
    """Expected seconds of one try at a stretch of τ seconds of steps and its save, from a committed
    checkpoint until the save commits, a saved preemption, or a loss (each a chance ∝ its rate)."""

    productive: float  # steps kept: the whole stretch, or up to a saved preemption
    checkpoint_save: float  # the periodic save, and the save on notice
    wasted: float  # steps lost (and the notice a save that did not fit spent)
    events: float  # the chance the try ends in a preemption or a loss

    @property
    def running(self) -> float:
        return self.productive + self.checkpoint_save + self.wasted


def attempt(interval_s: float, save_s: float, losses: Losses) -> Attempt:
    """With events at rate λ = λ_loss + λ_saved and X the running time to the next one, a try runs
    min(X, τ + C): it completes with chance q = e^(−λ(τ+C)); a saved preemption keeps min(X, τ) of steps
    (the program's count of steps to its next checkpoint starts again at the resume); a loss keeps none."""
    lose, save = losses.losing_per_s, losses.saving_per_s
    rate, tau, length = lose + save, interval_s, interval_s + save_s
    if rate == 0:
        return Attempt(tau, save_s, 0.0, 0.0)
    q = math.exp(-rate * length)
    ended = -math.expm1(-rate * length)  # 1 − q

    def mean_up_to(t: float) -> float:
        """∫₀ᵗ x·λe^(−λx) dx."""
        y = rate * t
        return (-math.expm1(-y) - y * math.exp(-y)) / rate

    saved_steps = mean_up_to(tau) + tau * (math.exp(-rate * tau) - q)  # ∫₀ᴸ min(x, τ)·λe^(−λx) dx
    saved_stall = math.exp(-rate * tau) * mean_up_to(save_s)  # ∫_τ^L (x − τ)·λe^(−λx) dx
    unfit = 0.0 if losses.fits else losses.preemptions.per_hour / HOUR
    return Attempt(
        productive=q * tau + save / rate * saved_steps,
        checkpoint_save=q * save_s + save / rate * (saved_stall + ended * losses.commit_s),
        wasted=lose / rate * mean_up_to(length) + unfit / rate * ended * losses.notice_s,
        events=ended,
    )


def _restart(restart_s: float, rate: float) -> float:
    """Expected running time to get one restart of `restart_s` through, the interrupted tries included:
    (e^(λR) − 1)/λ."""
    return restart_s if rate == 0 else math.expm1(rate * restart_s) / rate


def billed_per_useful(interval_s: float, save_s: float, losses: Losses, restart_s: float = 0.0) -> float:
    """Billed seconds per second of steps kept, in a long run at `interval_s` (the recovery wait
    between a VM's loss and its next READY is not billed)."""
    a = attempt(interval_s, save_s, losses)
    return (a.running + a.events * _restart(restart_s, losses.losing_per_s + losses.saving_per_s)) / a.productive


def waste(interval_s: float, save_s: float, losses: Losses) -> float:
    """Seconds of saves and lost work per second of steps kept, in a long run at `interval_s`
    (restarts left out: they cost about the same at any interval)."""
    return billed_per_useful(interval_s, save_s, losses) - 1


def best_interval(save_s: float, losses: Losses, restart_s: float = 0.0) -> Best:
    """The interval that wastes least. With losses only, `exact`: Daly's model solved. With saved
    preemptions besides, the minimum of `billed_per_useful`, found numerically (from `exact` for the
    losses alone, within a factor e³ either way): each saved preemption starts the count to the next
    checkpoint again, so stretches run shorter than τ and the best τ is longer."""
    rate = losses.losing_per_s
    if not rate:
        regime, why = _why(losses, None)
        return Best(None, None, None, regime, why)
    mean = 1 / rate
    regime, why = _why(losses, mean)
    best = exact(save_s, mean)
    if losses.saving_per_s:

        def cost(log_tau: float) -> float:
            return billed_per_useful(math.exp(log_tau), save_s, losses, restart_s)

        best = math.exp(_minimum(cost, math.log(best) - 3, math.log(best) + 3))
    return Best(best, young(save_s, mean), daly(save_s, mean), regime, why)


def _minimum(f: Callable[[float], float], low: float, high: float) -> float:
    """Where a unimodal `f` is least on [low, high], by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(100):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if f(a) < f(b):
            high = b
        else:
            low = a
    return (low + high) / 2


@dataclass(frozen=True)
class Phases:
    """How long the steps around training take (seconds; means)."""

    queue_s: float = 0.0  # the first start: request to READY (not billed)
    recovery_wait_s: float = 0.0  # after an event: the guard's next check, delete, create (not billed)
    boot_s: float = 0.0  # READY to the agent's start
    installs_s: float = 0.0  # the agent's start to the program's
    restore_s: float = 0.0  # the program's start to its checkpoint restored (not on a first start)
    first_step_s: float = 0.0  # to the first step: compilation

    @property
    def restart_s(self) -> float:
        return self.boot_s + self.installs_s + self.restore_s + self.first_step_s


@dataclass(frozen=True)
class Expectation:
    seconds: dict[str, float]  # expected seconds per timeline category
    disruptions: float  # expected events (preemptions and losses), those during restarts included

    @property
    def billed_s(self) -> float:
        return sum(s for key, s in self.seconds.items() if BY_KEY[key].billed)

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def billed_per_useful(self) -> float:
        return self.billed_s / self.seconds["productive"]


def expected(work_s: float, interval_s: float, save_s: float, losses: Losses, phases: Phases) -> Expectation:
    """Expected seconds per category for `work_s` of steps checkpointed every `interval_s` of them.

    The job is tries (`attempt`) until their kept steps add up to the work: by Wald's identity the
    expected count of tries is the work over a try's expected steps, for the whole stretches and then
    the last, shorter one. Every event is followed by the recovery wait and a restart, which an event
    may interrupt in turn (then the wait and the restart again)."""
    if work_s <= 0 or interval_s <= 0:
        raise ValueError(f"work and interval must be > 0 seconds (work {work_s!r}, interval {interval_s!r})")
    stretches = math.floor(work_s / interval_s * (1 + 1e-12))
    rest = max(0.0, work_s - stretches * interval_s)
    tries = [(stretches * interval_s, attempt(interval_s, save_s, losses))] if stretches else []
    tries += [(rest, attempt(rest, save_s, losses))] if rest else []
    saves = wasted = events = 0.0
    for work, a in tries:
        count = work / a.productive
        saves, wasted, events = saves + count * a.checkpoint_save, wasted + count * a.wasted, events + count * a.events
    p, rate = phases, losses.losing_per_s + losses.saving_per_s
    first = p.boot_s + p.installs_s + p.first_step_s
    restart_tries = math.expm1(rate * p.restart_s)  # events that interrupt one restart
    first_tries = math.expm1(rate * first)
    interrupted = events * (_restart(p.restart_s, rate) - p.restart_s) + (_restart(first, rate) - first)
    seconds = dict.fromkeys(BY_KEY, 0.0)
    seconds.update(
        queue=p.queue_s,
        recoveryWait=p.recovery_wait_s * (events * (1 + restart_tries) + first_tries),
        boot=p.boot_s * (events + 1) + interrupted,  # an interrupted restart is recovery time lost
        installs=p.installs_s * (events + 1),
        restore=p.restore_s * events,
        firstStep=p.first_step_s * (events + 1),
        productive=work_s,
        checkpointSave=saves,
        wastedProgress=wasted,
    )
    return Expectation(seconds, events * (1 + restart_tries) + first_tries)
