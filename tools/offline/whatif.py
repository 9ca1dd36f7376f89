"""`python -m tools.offline whatif`: before launch, what a job will cost and how long it will take on a
VM shape and provisioning model, and the checkpoint interval that wastes least (infra/goodput/whatif.py;
docs/goodput.md has the model). A table, or `--json`; `--simulate N` plays N such jobs out event by
event (tools/offline/simulation.py) beside the closed form.

`--stack S --vm V` takes the VM's type, zones, provisioning model, the guard's recovery settings, its
workload's checkpointEverySteps/Minutes and the declared stepSeconds, checkpointSeconds and
hoursBetweenPreemptions from the stack; flags given say otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.catalog import load_catalog
from infra.config import parse_stack_config
from infra.config.problems import ConfigError
from infra.config.stackfile import ROOT, StackFileError, read_stack_config, stack_of
from infra.goodput.interval import NO_EVENTS, Rate
from infra.goodput.pricing import price
from infra.goodput.whatif import ASSUMED, NOTICE_S, Capacity, Job, Outcome, WhatIf, WhatIfError, what_if
from run_contract.timeline import CATEGORIES, PreemptionHistory, TimelineError
from tools.offline.simulation import MONTH_S, Scenario, simulate


class UsageError(Exception):
    """Inputs missing or contradictory: the message says which flag to give."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    stack = parser.add_argument_group("from a stack (flags below override it)")
    stack.add_argument("--stack", help="read the VM and its workload from Pulumi.<stack>.yaml")
    stack.add_argument("--stack-file", type=Path, help="read this Pulumi.<stack>.yaml instead")
    stack.add_argument("--vm", help="the TPU VM's name in the stack")
    shape = parser.add_argument_group("the VM")
    shape.add_argument("--accelerator", help="TPU type, like v5litepod-8")
    shape.add_argument("--zone", action="append", help="zone (again for each fallback zone)")
    shape.add_argument("--provisioning", help="on-demand, spot, preemptible, reserved or flex-start")
    shape.add_argument("--slices", type=int, help="slices of a multislice (default 1)")
    job = parser.add_argument_group("the job")
    job.add_argument("--steps", type=int, required=True, help="training steps")
    job.add_argument("--step-seconds", type=float, help="seconds per step")
    job.add_argument("--save-seconds", type=float, help="seconds a checkpoint stalls training")
    job.add_argument("--commit-seconds", type=float, help="SIGTERM to a committed checkpoint (default: save)")
    job.add_argument("--restore-seconds", type=float, help="start to checkpoint restored (default: commit)")
    job.add_argument("--first-step-seconds", type=float, default=0.0, help="to the first step: compilation")
    job.add_argument("--checkpoint-every-steps", type=int, help="the job's interval in steps")
    job.add_argument("--checkpoint-every-minutes", type=float, help="… or in minutes, whichever comes first")
    events = parser.add_argument_group("what takes the VM away")
    rate = events.add_mutually_exclusive_group()
    rate.add_argument("--preemption-hours", type=float, help="mean running hours between preemptions")
    rate.add_argument(
        "--history",
        type=Path,
        help="a record of preemptions (JSON: preemptions, lostWithoutNotice, runningHours), as "
        "`tpu-runs report --history FILE` writes it",
    )
    events.add_argument(
        "--lost-without-notice-hours",
        type=float,
        help="mean running hours between losses without notice (a host lost, kill -9)",
    )
    events.add_argument("--notice-seconds", type=float, default=NOTICE_S, help=f"default {NOTICE_S:g}")
    guard = parser.add_argument_group("recovery")
    guard.add_argument("--recovery-every-minutes", type=int, help="the guard's schedule (default 10; 0: none)")
    guard.add_argument("--max-attempts", type=int, help="the guard's re-creations per 24 h (default 5)")
    guard.add_argument("--queue-seconds", type=float, default=0.0, help="the first start's wait for capacity")
    for name, value in ASSUMED.items():
        flag = name.removesuffix("_s")
        guard.add_argument(f"--{flag}-seconds", type=float, help=f"measured {flag} time (assumed {value:g})")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--simulate", type=int, metavar="N", default=0, help="also simulate N jobs (seeded)")
    out.add_argument("--seed", type=int, default=0)


@dataclass(frozen=True)
class _Stack:
    """What a stack says of a VM and its workload, for the flags it does not override."""

    values: dict[str, Any]
    notes: tuple[str, ...] = ()


def _from_stack(args: argparse.Namespace) -> _Stack:
    if not (args.stack or args.stack_file):
        if args.vm:
            raise UsageError("--vm needs --stack or --stack-file")
        return _Stack({})
    stack = stack_of(args.stack_file) if args.stack_file else args.stack
    cfg = parse_stack_config(stack, read_stack_config(stack, ROOT, args.stack_file))
    names = [vm.name for vm in cfg.tpu_vms]
    if not args.vm and len(names) != 1:
        raise UsageError(f"stack '{stack}' has TPU VMs {', '.join(names) or '(none)'}: pass --vm")
    vm = next((v for v in cfg.tpu_vms if v.name == (args.vm or names[0])), None)
    if vm is None:
        raise UsageError(f"stack '{stack}' has no TPU VM '{args.vm}'; its TPU VMs: {', '.join(names)}")
    workload = cfg.workload(vm.workload)
    values: dict[str, Any] = {
        "accelerator": vm.accelerator.name,
        "zone": list(vm.zones),
        "provisioning": vm.provisioning,
        "slices": vm.node_count,
        "recovery_every_minutes": cfg.automation.recovery.every_minutes or 0,
        "max_attempts": cfg.automation.recovery.max_attempts,
        "preemption_hours": vm.hours_between_preemptions,
        "step_seconds": workload.step_seconds,
        "save_seconds": workload.checkpoint_seconds,
    }
    notes: tuple[str, ...] = ()
    if workload.program:
        values |= {
            "checkpoint_every_steps": workload.checkpoint_every_steps,
            "checkpoint_every_minutes": workload.checkpoint_every_minutes,
        }
    else:
        notes = (f"workload '{workload.name}' has its own source: its checkpoint interval is in its command",)
    return _Stack({k: v for k, v in values.items() if v is not None}, notes)


def _inputs(args: argparse.Namespace) -> tuple[Job, Capacity, list[str]]:
    stack = _from_stack(args)

    def given(name: str, default: Any = None) -> Any:
        value = getattr(args, name)
        return value if value is not None else stack.values.get(name, default)

    missing = [
        f"--{n.replace('_', '-')}" for n in ("accelerator", "zone", "step_seconds", "save_seconds") if given(n) is None
    ]
    if missing:
        raise UsageError(f"give {', '.join(missing)} (or --stack and --vm, with the settings that declare them)")
    accelerator = load_catalog().accelerator(given("accelerator"))
    if isinstance(accelerator, str):
        raise UsageError(f"--accelerator {given('accelerator')}: {accelerator}")
    notes = list(stack.notes)
    commit = args.commit_seconds
    restore = args.restore_seconds
    if restore is None:
        restore = commit if commit is not None else given("save_seconds")
        notes.append(f"restore assumed as long as a commit: {restore:g} s (--restore-seconds)")
    job = Job(
        steps=args.steps,
        step_s=given("step_seconds"),
        save_s=given("save_seconds"),
        restore_s=restore,
        first_step_s=args.first_step_seconds,
        commit_s=commit,
        every_steps=given("checkpoint_every_steps"),
        every_minutes=given("checkpoint_every_minutes"),
    )
    preemptions, lost = NO_EVENTS, Rate.every(args.lost_without_notice_hours)
    if args.history:
        try:
            history = PreemptionHistory.from_json(json.loads(args.history.read_text()))
        except (OSError, ValueError, TimelineError) as error:
            raise UsageError(f"--history {args.history}: {error}") from error
        preemptions, seen_lost = Rate.from_history(history)
        if args.lost_without_notice_hours is None:
            lost = seen_lost
    elif given("preemption_hours") is not None:
        source = "given" if args.preemption_hours is not None else "the stack's hoursBetweenPreemptions"
        preemptions = Rate.every(given("preemption_hours"), source)
    measured = {k: getattr(args, f"{k.removesuffix('_s')}_seconds") for k in ASSUMED}
    recovery = given("recovery_every_minutes", 10)
    capacity = Capacity(
        accelerator=accelerator,
        provisioning=given("provisioning", "on-demand"),
        zones=tuple(given("zone")),
        slices=given("slices", 1),
        preemptions=preemptions,
        without_notice=lost,
        notice_s=args.notice_seconds,
        recovery_every_minutes=recovery or None,
        max_attempts=given("max_attempts", 5),
        queue_s=args.queue_seconds,
        measured=frozenset(k for k, v in measured.items() if v is not None),
        **{k: v for k, v in measured.items() if v is not None},
    )
    return job, capacity, notes


def simulated(w: WhatIf, outcome: Outcome, jobs: int, seed: int) -> dict[str, Any]:
    """`jobs` runs of the job at `outcome`'s interval, played out by the simulation (seeds seed, seed+1, …)."""
    c, j = w.capacity, w.job
    scenario = Scenario(
        interval_s=outcome.interval_s,
        save_s=j.save_s,
        losses=w.losses,
        phases=w.phases,
        recovery_every_s=(c.recovery_every_minutes or 0) * 60 or math.inf,
        delete_s=c.delete_s,
        create_s=c.create_s,
        max_attempts=c.max_attempts,
        preemptible=c.provisioning == "preemptible",
        work_s=j.work_s,
        horizon_s=max(MONTH_S, 20 * outcome.expectation.wall_s),
    )
    runs = [simulate(scenario, seed + i) for i in range(jobs)]
    done = [r for r in runs if r.finished_s is not None]
    return {
        "jobs": jobs,
        "finished": len(done),
        "horizonHours": scenario.horizon_s / 3600,
        "wallHours": statistics.fmean(r.finished_s or 0.0 for r in done) / 3600 if done else None,
        "billedHours": statistics.fmean(r.billed_s for r in done) / 3600 if done else None,
        "billedPerUseful": statistics.fmean(r.billed_per_useful for r in done) if done else None,
        "disruptions": statistics.fmean(r.preemptions + r.lost_without_notice for r in done) if done else None,
        "guardGaveUp": statistics.fmean(r.give_ups for r in runs),
    }


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}"


def table(w: WhatIf, notes: list[str], sims: dict[str, dict[str, Any]]) -> str:
    c, j, b = w.capacity, w.job, w.best
    region = sorted({z.rsplit("-", 1)[0] for z in c.zones})
    lines = [
        f"What-if: {c.accelerator.name} ({c.chips} chips), {c.provisioning} in {', '.join(region)}; "
        f"preemptions: {c.preemptions.source}; losses without notice: {c.without_notice.source}",
        f"Job: {j.steps:,} steps × {j.step_s:g} s = {j.work_s / 3600:,.1f} h of steps; a checkpoint stalls "
        f"{j.save_s:g} s and commits in {j.commit:g} s (notice {c.notice_s:g} s); restore {j.restore_s:g} s, "
        f"first step {j.first_step_s:g} s",
    ]
    if w.at_best:
        lines.append(
            f"Best interval: every {w.at_best.every_steps:,} steps ({w.at_best.interval_s:,.0f} s of steps), "
            f"{b.regime}: {b.why} (Young √(2CM) {b.young_s:,.0f} s, Daly {b.daly_s:,.0f} s)"
        )
    else:
        lines.append(f"Best interval: none, {b.regime}: {b.why}")
    columns = [(f"yours: every {o.every_steps:,} steps", o, "yours") for o in [w.yours] if o]
    columns += [(f"best: every {o.every_steps:,} steps", o, "best") for o in [w.at_best] if o]
    if not columns:
        lines.append("  (give --checkpoint-every-steps or --checkpoint-every-minutes to price your interval)")
        return "\n".join([*lines, *_footer(w, notes)])
    lines.append(f"  {'':<16}" + "".join(f" {title:>30}" for title, _, _ in columns))
    lines.append(f"  {'category':<16}" + f" {'hours':>8} {'chip-h':>9} {'USD':>11}" * len(columns))
    for category in CATEGORIES:
        cells = []
        for _, o, _ in columns:
            line = next(x for x in o.priced.lines if x.category == category.key)
            cells.append(f" {line.seconds / 3600:>8.2f} {line.chip_hours:>9.2f} {_money(line.usd):>11}")
        lines.append(f"  {category.key:<16}" + "".join(cells))

    def money(o: Outcome) -> str:
        return f" {o.expectation.billed_s / 3600:>8.2f} {o.priced.chip_hours:>9.2f} {_money(o.priced.usd):>11}"

    rows = [
        ("billed", money),
        ("time to finish", lambda o: f" {o.expectation.wall_s / 3600:>8.2f} {'h':<9} {'':>11}"),
        ("billed/useful", lambda o: f" {o.expectation.billed_per_useful:>8.4f} {'':>9} {'':>11}"),
        ("disruptions", lambda o: f" {o.expectation.disruptions:>8.2f} {'':>9} {'':>11}"),
    ]
    for name, cell in rows:
        lines.append(f"  {name:<16}" + "".join(cell(o) for _, o, _ in columns))
    for _, _, key in columns:
        if key in sims:
            s = sims[key]
            figures = (
                f"finished {s['finished']} of {s['jobs']}; time to finish {s['wallHours']:.2f} h, billed "
                f"{s['billedHours']:.2f} h, billed/useful {s['billedPerUseful']:.4f}, "
                f"disruptions {s['disruptions']:.2f}"
                if s["finished"]
                else f"none of {s['jobs']} finished within {s['horizonHours']:.0f} h"
            )
            lines.append(f"  simulated, {key}: {figures}; guard gave up {s['guardGaveUp']:.1f} ticks a job")
    return "\n".join(line.rstrip() for line in [*lines, *_footer(w, notes)])


def _footer(w: WhatIf, notes: list[str]) -> list[str]:
    at = price(w.capacity.accelerator, w.capacity.provisioning, w.capacity.zones)
    per = "no price" if at.per_chip_hour is None else f"{at.per_chip_hour:.4f} USD per chip-hour"
    lines = [f"Prices of {at.date} ({at.source}): {at.provisioning} in {at.region}, {per}."]
    lines += [f"  [{i}] {note}" for i, note in enumerate([*w.notes, *notes], 1)]
    return lines


def run(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, what to print)."""
    try:
        job, capacity, notes = _inputs(args)
        w = what_if(job, capacity)
    except (UsageError, WhatIfError, ConfigError, StackFileError) as error:
        return 2, f"error: {error}"
    sims = {}
    if args.simulate:
        for key, outcome in (("yours", w.yours), ("best", w.at_best)):
            if outcome:
                sims[key] = simulated(w, outcome, args.simulate, args.seed)
    if args.json:
        data = {**w.to_json(), "notes": [*w.notes, *notes]}
        if sims:
            data["simulated"] = sims
        return 0, json.dumps(data, indent=2, sort_keys=True)
    return 0, table(w, notes, sims)
