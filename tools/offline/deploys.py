"""The deploys a permission proof must cover: the first `up` on an empty project, and every later one.

The program reads the project while it runs (data sources: does the status bucket exist, which runs
are complete), so what it calls depends on what earlier deploys left behind. A later deploy finds
every bucket the first one declared or looked up, the objects it uploaded, and a completion marker of
an earlier run for each TPU VM: the VMs stay declared, and every lookup of a marker runs (listing the
bucket, then reading the marker). Needs are computed from both plans, never from one.

The program runs once: the later deploy's plan is the first's registrations with the reads the later
state answers differently made again (`later_plan`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from infra.config import parse_stack_config
from infra.platform import runs_to_check
from infra.run_status import completed_runs, marker_name
from run_contract import completion_marker
from tools.offline.mocks import CloudState, GcpMocks, RecordingMonitor
from tools.offline.runner import PlanResult, run_program

DEPLOYS = ("fresh", "later")
EARLIER_RUN = "an-earlier-run"  # no current run id looks like this, so no VM is taken for complete
GET_BUCKETS = "gcp:storage/getBuckets:getBuckets"


def vm_names(result: PlanResult) -> list[str]:
    """The TPU VMs of a platform stack's plan (none for another program, such as the bootstrap)."""
    if not any(key.startswith("tpu-platform:") for key in result.config):
        return []
    return [vm.name for vm in parse_stack_config(result.stack, result.config).tpu_vms]


def later_state(fresh: PlanResult, vms: Iterable[str] = ()) -> CloudState:
    """What the project holds once `fresh` was applied (and the VMs ran for a while)."""
    state = CloudState()
    for bucket in fresh.of_type("gcp:storage/bucket:Bucket"):
        state.buckets.setdefault(bucket.inputs["name"], {})
    for obj in fresh.of_type("gcp:storage/bucketObject:BucketObject"):
        state.put(obj.inputs["bucket"], obj.inputs["name"])
    looked_up = [args.get("prefix", "") for token, args in fresh.invokes if token == GET_BUCKETS]
    marker = json.dumps(completion_marker.marker(EARLIER_RUN, "vm-agent", "2026-01-01T00:00:00Z"))
    for bucket in looked_up:  # the program asks for a bucket by its whole name
        for vm in vms:
            state.put(bucket, marker_name(vm), marker)
    return state


def later_plan(fresh: PlanResult) -> PlanResult:
    """The later deploy's plan, from the first's, without running the program again.

    The state changes only what the status bucket's reads answer (the mocks answer every other data
    source alike), and the program reads that bucket only in `completed_runs`. Run alone here, in the later
    state and with the arguments the first plan asked for the bucket with, it finds each VM's marker of an
    earlier run, so no run is complete: the later deploy declares what the first did, and makes these reads
    where the first only asked for the bucket. tests/test_access.py compares it with the whole program run
    in the later state."""
    asked = [i for i, (token, _) in enumerate(fresh.invokes) if token == GET_BUCKETS]
    if not asked:  # not the platform's program, or no VM is deleted once complete: no read depends on the state
        return replace(fresh, resources=list(fresh.resources), invokes=list(fresh.invokes))
    cfg = parse_stack_config(fresh.stack, fresh.config)
    runs = runs_to_check(cfg)
    mocks = GcpMocks(fresh.project, later_state(fresh, [vm.name for vm in cfg.tpu_vms]))
    ends: list[int] = []  # where each asking's reads end in mocks.invokes

    def reads() -> None:
        for i in asked:
            args = fresh.invokes[i][1]
            if complete := completed_runs(args["project"], args["prefix"], runs):
                raise AssertionError(f"{sorted(complete)} taken for complete from markers of {EARLIER_RUN}")
            ends.append(len(mocks.invokes))

    run_program(fresh.stack, fresh.config, reads, monitor=RecordingMonitor(mocks))
    invokes, start, previous = [], 0, 0
    for i, end in zip(asked, ends, strict=True):
        invokes += fresh.invokes[previous:i] + mocks.invokes[start:end]
        previous, start = i + 1, end
    invokes += fresh.invokes[previous:]
    return replace(fresh, resources=list(fresh.resources), invokes=invokes)


def plan_deploys(fresh: PlanResult) -> dict[str, PlanResult]:
    """`fresh`, a first deploy's plan, and the later deploy's (what the first left)."""
    return {"fresh": fresh, "later": later_plan(fresh)}
