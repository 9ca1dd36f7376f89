"""`tpu-runs report`: where a run's time went and what it cost, from the timeline its VM's agent keeps; without
a run id, every run of the VM the caller may read (her own; with `--stack-run`, the VM's whole folder), one
line each and their sum by category, for one UTC month with `--month`; `--history FILE` also writes their
preemptions and running hours (run_contract/timeline.py PreemptionHistory), the record the what-if reads.

The agent writes the run's events next to its state (run_contract/timeline.py RunEvents, at
`<vm>/runs/<runId>/timeline.json` in the status bucket); this measures them by category, adds what the stack
says the VM is (type, chips, zone, provisioning) and prices each category in chip-hours and list-price USD
with the catalog's price date (infra/goodput/pricing.py).

Billed time comes from the node's states where the guard keeps them (run_contract/timeline.py NodeStates: the
guard records them on its recovery checks, so only in a stack with `automation.recovery`; researchers may read
those of the self-service VMs, infra/researchers.py): each boot from the node's READY to the run's end, or to
the node leaving READY first. Without them it is the agent's view, from the VM's kernel boot, and the report
says so. The unattributed remainder is what no event explains. A VM's report with `--stack-run` and the node's
states adds `idle`: the node running with no run on it (between runs, after the last one until it stopped).

With `--team`, a team's runs on the GKE engine as Kueue saw them (below): each one's wait for admission and
its admitted time, priced for its slice pool; nothing of the program's own categories.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from infra import naming
from infra.config import TpuVmSettings
from infra.config.model import SlicePoolSettings, TeamSettings
from infra.gke.jobsets import TTL_SECONDS
from infra.gke.specs import shape_of
from infra.goodput.pricing import Priced, pool_price, price_timeline, priced
from run_contract.paths import (
    member_key,
    member_runs_prefix,
    node_states_name,
    runs_prefix,
    status_prefix,
    timeline_name,
)
from run_contract.timeline import (
    BY_KEY,
    KUEUE_WORKLOAD,
    KueueWait,
    Measured,
    NodeStates,
    PreemptionHistory,
    RunEvents,
    RunTimeline,
    TimelineError,
    covered,
    measure,
)
from tpu_runs import gke
from tpu_runs.gcp import CallError

Windows = list[tuple[float, float]]


def timeline_object(vm: str, run_id: str, who: str, stack_run: bool) -> str:
    """A researcher's run `<runId>` is `<member>/<runId>` on the VM; the stack's run goes by its own id."""
    return status_prefix(vm) + timeline_name(run_id if stack_run else f"{member_key(who)}/{run_id}")


def node_states(google: Any, stack: Any, vm: TpuVmSettings) -> NodeStates | None:
    """The VM's node's states from the guard's record (a multislice: its first slice, where worker 0 of the run
    is): its running windows and its waits; None when the guard keeps none (no recovery checks in the stack, or
    none yet), or when the caller may not read it (a stack deployed before researchers could)."""
    name = node_states_name(stack.cfg.stack, naming.node_ids(vm.name, vm.node_count)[0])
    try:
        raw = google.read(stack.status, name)
    except CallError as error:
        print(f"could not read the node's states ({error}); billed time is the agent's view", file=sys.stderr)
        return None
    if raw is None:
        return None
    try:
        return NodeStates.from_json(json.loads(raw))
    except (ValueError, TimelineError) as error:
        print(f"skipped gs://{stack.status}/{name}: not a node's states ({error}); billed time is the agent's view")
        return None


def run_timeline(vm: TpuVmSettings, events: RunEvents, found: Measured | None = None) -> RunTimeline:
    """The run's timeline on `vm`, from `found` (its events measured against the node's windows), or from its
    events alone."""
    found = found or measure(events.events, trusted=events.step_lines_trusted)
    counts = (found.preemptions, found.lost_without_notice, found.steps)
    return _on(vm, events.run_id, found.billed_s, found.seconds, counts, events.step_lines_trusted)


def measured(events: RunEvents, states: NodeStates | None, now: float) -> Measured:
    """The run's events measured against the node's windows and waits, when the guard keeps them."""
    if states is None:
        return measure(events.events, trusted=events.step_lines_trusted)
    return measure(events.events, states.up(now), states.waits(), events.step_lines_trusted)


def billed_from(found: Iterable[Measured]) -> str:
    """Where the billed seconds come from, in words."""
    runs = list(found)
    if runs and all(m.node_billed for m in runs):
        return "the node's states (the guard's record)"
    return (
        "the agent's view, from the VM's kernel boot (no record of the node's states for every boot: the guard "
        "keeps them on its recovery checks, in stacks with automation.recovery)"
    )


def month_bounds(month: str) -> tuple[float, float]:
    """A UTC month (YYYY-MM) as seconds since the epoch: its start, the next one's."""
    year, number = (int(part) for part in month.split("-"))
    start = datetime(year, number, 1, tzinfo=UTC)
    end = datetime(year + number // 12, number % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), end.timestamp()


def idle_seconds(windows: Windows, found: Iterable[Measured], month: str = "") -> float:
    """The node running with no run on it: its windows (within `month`) less every run's billed spans."""
    if month:
        low, high = month_bounds(month)
        windows = [(max(a, low), min(b, high)) for a, b in windows if min(b, high) > max(a, low)]
    return sum(b - a for a, b in windows) - covered(windows, [span for m in found for span in m.spans])


def _on(
    vm: TpuVmSettings,
    run_id: str,
    billed_s: float,
    measured: dict[str, float],
    counts: tuple[int, int, int],
    trusted: bool,
) -> RunTimeline:
    """A timeline on the stack's VM `vm`; `counts`: preemptions, losses without notice, steps."""
    preemptions, lost, steps = counts
    return RunTimeline.of(
        run_id=run_id,
        vm=vm.name,
        accelerator_type=vm.accelerator.name,
        chips=vm.accelerator.chips,
        provisioning=vm.provisioning,
        zone=vm.zone,
        billed_s=billed_s,
        measured=measured,
        preemptions=preemptions,
        lost_without_notice=lost,
        steps=steps,
        step_lines_trusted=trusted,
    )


def as_json(timeline: RunTimeline, priced: Priced) -> dict[str, Any]:
    return {"timeline": timeline.to_json(), "priced": priced.to_json(), "goodput": timeline.goodput}


def table(timeline: RunTimeline, priced: Priced, recorded: bool = True) -> str:
    """The report's table; `recorded` False for a run whose program's categories nobody recorded (GKE)."""
    p = priced.price
    per_hour = "no price" if p.per_chip_hour is None else f"${p.per_chip_hour:g}/chip-hour"
    lines = [
        f"run {timeline.run_id} on {timeline.vm}: {timeline.accelerator_type} ({timeline.chips} chips), "
        f"{timeline.provisioning}, {timeline.zone}",
        f"priced at {per_hour} in {p.region}: a list-price estimate, prices of {p.date} ({p.source})",
        *[f"  note: {note}" for note in p.notes],
        f"{'category':<16}{'seconds':>11}{'chip-hours':>12}{'USD':>10}  ",
    ]
    for line in priced.lines:
        if not BY_KEY[line.category].billed:  # the node's waits (the guard's record): it did not run, nor bill
            if line.seconds:
                lines.append(f"{line.category:<16}{line.seconds:>11.1f}  not billed: waiting, not running")
            continue
        usd = "" if line.usd is None else f"{line.usd:.4f}"
        mark = "  untrusted (the program's step lines)" if line.untrusted else ""
        lines.append(f"{line.category:<16}{line.seconds:>11.1f}{line.chip_hours:>12.4f}{usd:>10}{mark}")
    total = "" if priced.usd is None else f"{priced.usd:.4f}"
    lines.append(f"{'billed':<16}{timeline.billed_s:>11.1f}{priced.chip_hours:>12.4f}{total:>10}")
    share = timeline.seconds["unattributed"] / timeline.billed_s if timeline.billed_s else 0.0
    if not recorded:
        lines.append(f"goodput not recorded; {timeline.preemptions} eviction(s)")
        return "\n".join(lines)
    lines.append(
        f"goodput {timeline.goodput:.1%}; unattributed {share:.1%}; {timeline.steps} steps; "
        f"{timeline.preemptions} stop notice(s), {timeline.lost_without_notice} lost without notice"
    )
    return "\n".join(lines)


def started_month(events: RunEvents) -> str:
    """The UTC month (YYYY-MM) of the run's first event; "" for a record without one."""
    return time.strftime("%Y-%m", time.gmtime(events.events[0].at)) if events.events else ""


def total(vm: TpuVmSettings, runs: list[RunTimeline], what: str, idle: float = 0.0) -> RunTimeline:
    """The runs' seconds and counts summed, with the VM's `idle` seconds, as one timeline of the VM (`what`
    names them)."""
    measured = {key: sum(t.seconds[key] for t in runs) for key in BY_KEY if key != "unattributed"}
    measured["idle"] += idle
    counts = (sum(t.preemptions for t in runs), sum(t.lost_without_notice for t in runs), sum(t.steps for t in runs))
    trusted = all(t.step_lines_trusted for t in runs)
    return _on(vm, what, sum(t.billed_s for t in runs) + idle, measured, counts, trusted)


def write_history(args: argparse.Namespace, runs: list[RunTimeline], source: str) -> None:
    """With `--history FILE`: the runs' preemptions and running hours, the record `whatif --history` reads."""
    if args.history:
        args.history.write_text(json.dumps(PreemptionHistory.of(runs, source).to_json(), indent=1) + "\n")
        print(f"preemption record: {args.history} (python -m tools.offline whatif --history)", file=sys.stderr)


def vm_runs(
    google: Any, stack: Any, vm: TpuVmSettings, prefix: str, month: str, now: float
) -> tuple[list[Measured], list[RunTimeline], NodeStates | None]:
    """The timelines under `prefix` of the VM's folder (those that started in `month`, if given), each measured
    against the node's states until `now`, and the states (None when the guard keeps none)."""
    states = node_states(google, stack, vm)
    runs: list[RunTimeline] = []
    found: list[Measured] = []
    for item in google.list_objects(stack.status, prefix):
        if not item["name"].endswith("/timeline.json"):
            continue
        try:
            events = RunEvents.from_json(json.loads(google.read(stack.status, item["name"]) or b"null"))
        except (ValueError, TimelineError) as error:
            print(f"skipped gs://{stack.status}/{item['name']}: not a run timeline ({error})")
            continue
        if not month or started_month(events) == month:
            found.append(measured(events, states, now))
            runs.append(run_timeline(vm, events, found[-1]))
    return found, runs, states


def vm_total(
    vm: TpuVmSettings,
    runs: list[RunTimeline],
    found: list[Measured],
    states: NodeStates | None,
    month: str,
    whole: bool,
    now: float,
) -> RunTimeline:
    """The VM's runs summed; with `whole` (every run on the VM, its whole folder) and the node's states, its idle
    time too. A researcher sees only her runs, so idle time is not hers to know."""
    idle = idle_seconds(states.up(now), found, month) if states is not None and whole else 0.0
    return total(vm, runs, f"{len(runs)} run(s) on {vm.name}{' in ' + month if month else ''}", idle)


def report_vm(google: Any, stack: Any, args: argparse.Namespace, who: str) -> int:
    """Every readable run's timeline on the VM (in `args.month`, if given): a line each, and their sum."""
    vm = stack.vm(args.vm)
    prefix = runs_prefix(vm.name) if args.stack_run else member_runs_prefix(vm.name, who)
    now = time.time()
    found, runs, states = vm_runs(google, stack, vm, prefix, args.month, now)
    if not runs:
        scope = f"{vm.name}{' in ' + args.month if args.month else ''}"
        print(f"no run timelines{'' if args.stack_run else ' of yours'} on {scope} under gs://{stack.status}/{prefix}")
        return 1
    summed = vm_total(vm, runs, found, states, args.month, args.stack_run, now)
    priced = price_timeline(summed)
    source = billed_from(found)
    write_history(args, runs, summed.run_id)
    if args.json:
        each = [{"runId": t.run_id, **as_json(t, price_timeline(t))} for t in runs]
        print(json.dumps({"runs": each, "total": as_json(summed, priced), "billedFrom": source}, indent=1))
        return 0
    for t in runs:
        usd = price_timeline(t).usd
        cost = "no price" if usd is None else f"{usd:.2f} USD"
        print(f"{t.run_id:<48} {t.billed_s / 3600:>8.2f} h  goodput {t.goodput:>6.1%}  {cost}")
    print(table(summed, priced))
    print(f"billed time from {source}{'' if states is not None or not args.stack_run else '; idle time needs them'}")
    return 0


def report(google: Any, stack: Any, args: argparse.Namespace, who: str) -> int:
    """Print the run's report (a table, or `--json`); 1 when the VM's agent has kept no timeline for it."""
    if getattr(args, "team", None):
        return report_team(google, stack, args, gke.team_of(stack, args.team))
    if getattr(args, "whole_stack", False):
        return report_stack(google, stack, args)
    if not args.run_id:
        return report_vm(google, stack, args, who)
    vm = stack.vm(args.vm)
    name = timeline_object(vm.name, args.run_id, who, args.stack_run)
    raw = google.read(stack.status, name)
    if raw is None:
        where = f"gs://{stack.status}/{name}"
        print(f"no timeline at {where}: the run has not started on {vm.name}, or its agent predates timelines")
        return 1
    states = node_states(google, stack, vm)
    try:
        events = RunEvents.from_json(json.loads(raw))
        found = measured(events, states, time.time())
        timeline = run_timeline(vm, events, found)
    except (ValueError, TimelineError) as error:
        print(f"gs://{stack.status}/{name} is not a run timeline: {error}")
        return 1
    priced = price_timeline(timeline)
    write_history(args, [timeline], f"run {timeline.run_id} on {vm.name}")
    if args.json:
        print(json.dumps({**as_json(timeline, priced), "billedFrom": billed_from([found])}, indent=1))
    else:
        print(f"{table(timeline, priced)}\nbilled time from {billed_from([found])}")
    return 0


# ------------------------------------------------------------------------------------ a team's runs on GKE
# No agent runs beside a GKE run's program, and a pod's containers share one identity: a record written from
# inside the pod is the run's own word, under a prefix the run can write (run_contract/paths.py gives a
# pod its team's). What the platform knows there is the control plane's: Kueue's Workload (KueueWait).
GKE_NOT_RECORDED = (
    "a GKE run keeps no timeline of its own: no agent runs beside its program, and any writer in its pod has "
    "the pod's one identity, so the run could write the record; its admitted time is unattributed"
)


def pool_of(stack: Any, jobset: dict[str, Any]) -> SlicePoolSettings | None:
    """The stack's slice pool whose nodes the JobSet's pods select (the first, where pools share a shape)."""
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    selector = spec.get("nodeSelector") or {}
    pools = stack.cfg.gke.slice_pools if stack.cfg.gke else ()
    return next((p for p in pools if shape_of(p).node_labels == selector), None)


def team_timeline(pool: SlicePoolSettings, jobset: dict[str, Any], wait: KueueWait, now: float) -> RunTimeline:
    """A GKE run's timeline from its Workload: its queue wait, its admitted time billed (the slices' chips),
    nothing attributed; its evictions as stop notices (Kueue deletes the pods, each with its grace period)."""
    slices = int(jobset["spec"]["replicatedJobs"][0].get("replicas", 1))
    return RunTimeline.of(
        run_id=jobset["metadata"]["name"],
        vm=pool.name,
        accelerator_type=pool.accelerator.name,
        chips=pool.accelerator.chips * slices,
        provisioning=pool.provisioning,
        zone=pool.zone,
        billed_s=wait.admitted_s(now),
        measured={"queue": wait.queue_s(now)},
        preemptions=wait.evictions,
    )


def team_timelines(
    google: Any, stack: Any, team: TeamSettings, refused: str, month: str, run_id: str = ""
) -> list[tuple[RunTimeline, Priced]]:
    """The team's runs (or the one named `run_id`) that Kueue has queued, started in `month` if given, each
    timed from its Workload and priced for its slice pool; what cannot be is said and skipped."""
    base = gke._cluster(google, stack)
    now = time.time()
    found: list[tuple[RunTimeline, Priced]] = []
    for jobset, workload in gke.team_runs(google, base, team, refused):
        name = jobset["metadata"]["name"]
        if run_id and name != run_id:
            continue
        if workload is None:
            print(f"skipped {name}: Kueue has not queued it yet")
            continue
        pool = pool_of(stack, jobset)
        try:
            wait = KueueWait.of(workload)
            if pool is None:
                raise TimelineError("its pods select no slice pool of the stack")
            timeline = team_timeline(pool, jobset, wait, now)
        except TimelineError as error:
            print(f"skipped {name}: {error}")
            continue
        if month and time.strftime("%Y-%m", time.gmtime(wait.created)) != month:
            continue
        found.append((timeline, priced(timeline.seconds, timeline.chips, pool_price(pool))))
    return found


def report_team(google: Any, stack: Any, args: argparse.Namespace, team: TeamSettings) -> int:
    """The team's runs (or one) as Kueue saw them: a table each, or `--json`; 1 when there is none."""
    found = team_timelines(google, stack, team, gke._refused(stack, team), args.month, args.run_id)
    if not found:
        print(f"no runs of team {team.name}{' named ' + args.run_id if args.run_id else ''} in Kueue")
        return 1
    if args.json:
        each = [{"runId": t.run_id, **as_json(t, p)} for t, p in found]
        print(json.dumps({"runs": each, "measuredBy": KUEUE_WORKLOAD, "notRecorded": GKE_NOT_RECORDED}, indent=1))
        return 0
    for timeline, cost in found:
        print(table(timeline, cost, recorded=False))
    print(f"from Kueue's Workloads ({KUEUE_WORKLOAD}); {GKE_NOT_RECORDED}")
    return 0


# ------------------------------------------------------------------------------------ an operator's report
# The stack names no operator, so the plan grants this to nobody: infra/access/researcher_calls.py
# OPERATOR_REPORT_CALLS and infra/gke/teams.py OPERATOR_REPORT_RULES say what it asks, docs/goodput.md which roles
# hold that.
OPERATOR_REFUSED = (
    "an operator's report lists every team's JobSets and Kueue Workloads: bind a ClusterRole with "
    'infra/gke/teams.py OPERATOR_REPORT_RULES to you in the cluster (docs/goodput.md, "An operator\'s report")'
)


# A Workload goes with its JobSet: Kueue makes the JobSet the Workload's controlling owner
# (kubernetes-sigs/kueue pkg/controller/jobframework/reconciler.go, ConstructWorkload's SetControllerReference,
# the reconciler JobSet's integration uses: pkg/controller/jobs/jobset/jobset_controller.go; commit ff69552e79ad),
# and drops its finalizer once the Workload is finished (same file, Reconcile). JobSet deletes a finished
# JobSet after its TTL with foreground propagation (kubernetes-sigs/jobset pkg/controllers/ttl_after_finished.go,
# deleteJobSet; commit 08dfbdfd6827), so the garbage collector deletes the Workload with the JobSet.
def gke_coverage(now: float, month: str) -> dict[str, Any]:
    """What the teams' rows can count: the cluster keeps a JobSet (and Kueue's Workload, which it owns) until
    TTL_SECONDS after it finishes, so a run that finished before then is in no row and no total."""
    since = now - TTL_SECONDS
    held = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    gone = f"runs that finished before {held} are gone from the cluster and counted nowhere"
    if month and month_bounds(month)[1] <= since:
        gone += f": {month}'s team rows hold only its runs still running"
    return {
        "finishedSince": held,
        "note": (
            f"the teams' rows count only runs still running or finished since {held} (a finished JobSet is deleted "
            f"after {TTL_SECONDS // 3600} h, its Workload with it); {gone}, so the total's GKE part is a lower bound"
        ),
    }


def _usd(costs: Iterable[float | None]) -> float | None:
    """A sum of USD figures; None when any has no price."""
    known = list(costs)
    return None if any(c is None for c in known) else sum(c or 0.0 for c in known)


def report_stack(google: Any, stack: Any, args: argparse.Namespace) -> int:
    """An operator's report of the whole stack: each TPU VM's runs (its whole folder, as `--stack-run`) with its
    idle time, and each GKE team's runs as Kueue saw them; a line each and the stack's total, for one UTC month
    with `--month`. 1 when there is nothing to report."""
    month, now = args.month, time.time()
    vms: list[dict[str, Any]] = []
    for vm in stack.cfg.tpu_vms:
        found, runs, states = vm_runs(google, stack, vm, runs_prefix(vm.name), month, now)
        summed = vm_total(vm, runs, found, states, month, True, now)
        if runs or summed.billed_s:
            cost = price_timeline(summed)
            each = [{"runId": t.run_id, **as_json(t, price_timeline(t))} for t in runs]
            vms.append({"vm": vm.name, "runs": each, **as_json(summed, cost)})
            vms[-1]["billedFrom"] = billed_from(found) if found else "the node's states (the guard's record)"
    teams: list[dict[str, Any]] = []
    for team in stack.cfg.gke.teams if stack.cfg.gke else ():
        each = team_timelines(google, stack, team, OPERATOR_REFUSED, month)
        if each:
            teams.append(
                {
                    "team": team.name,
                    "runs": [{"runId": t.run_id, **as_json(t, p)} for t, p in each],
                    "billedSeconds": sum(t.billed_s for t, _ in each),
                    "queueSeconds": sum(t.seconds["queue"] for t, _ in each),
                    "evictions": sum(t.preemptions for t, _ in each),
                    "chipHours": sum(p.chip_hours for _, p in each),
                    "usd": _usd(p.usd for _, p in each),
                }
            )
    scope = f"stack {stack.cfg.stack}{' in ' + month if month else ''}"
    coverage = gke_coverage(now, month) if stack.cfg.gke and stack.cfg.gke.teams else None
    if not vms and not teams:
        print(f"no runs on {scope}: no VM's run timelines under gs://{stack.status}/, no team's runs in Kueue")
        if coverage:
            print(coverage["note"])
        return 1
    total_s = sum(v["timeline"]["billedSeconds"] for v in vms) + sum(t["billedSeconds"] for t in teams)
    chip_hours = sum(v["priced"]["chipHours"] for v in vms) + sum(t["chipHours"] for t in teams)
    costs = {**{f"vm {v['vm']}": v["priced"]["usd"] for v in vms}, **{f"team {t['team']}": t["usd"] for t in teams}}
    unpriced = [name for name, cost in costs.items() if cost is None]
    usd = sum(cost for cost in costs.values() if cost is not None)  # the priced ones; `unpriced` names the rest
    overall = {"billedSeconds": total_s, "chipHours": chip_hours, "usd": usd, "unpriced": unpriced}
    if args.json:
        print(
            json.dumps(
                {
                    "stack": stack.cfg.stack,
                    "month": month or None,
                    "vms": vms,
                    "teams": teams,
                    "gkeCoverage": coverage,
                    "total": overall,
                },
                indent=1,
            )
        )
        return 0
    print(f"an operator's report of {scope}: list-price estimates (each VM's and pool's price and its date: --json)")
    print(f"{'':<28}{'runs':>6}{'billed h':>11}{'idle h':>9}{'goodput':>9}{'chip-hours':>12}{'USD':>12}")

    def money(value: float | None) -> str:
        return "no price" if value is None else f"{value:.2f}"

    for v in vms:
        line = v["timeline"]
        print(
            f"{'vm ' + v['vm']:<28}{len(v['runs']):>6}{line['billedSeconds'] / 3600:>11.2f}"
            f"{line['seconds']['idle'] / 3600:>9.2f}{v['goodput']:>9.1%}{v['priced']['chipHours']:>12.2f}"
            f"{money(v['priced']['usd']):>12}"
        )
    for t in teams:
        print(
            f"{'team ' + t['team']:<28}{len(t['runs']):>6}{t['billedSeconds'] / 3600:>11.2f}{'':>9}{'':>9}"
            f"{t['chipHours']:>12.2f}{money(t['usd']):>12}"
        )
    print(f"{'total':<28}{'':>6}{total_s / 3600:>11.2f}{'':>9}{'':>9}{chip_hours:>12.2f}{money(usd):>12}")
    if unpriced:
        print(f"the total's USD leaves out what has no price in the catalog: {', '.join(unpriced)}")
    if vms:
        print("a VM's billed time runs from the node's states where the guard keeps them, else the agent's view")
    if teams:
        print(f"a team's runs: from Kueue's Workloads ({KUEUE_WORKLOAD}); no goodput: {GKE_NOT_RECORDED}")
    if coverage:
        print(coverage["note"])
    return 0
