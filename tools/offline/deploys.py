"""The deploys a permission proof must cover: the first `up` on an empty project, and every later one.

The program reads the project while it runs (data sources: does the status bucket exist, which runs
are complete), so what it calls depends on what earlier deploys left behind. A later deploy finds
every bucket the first one declared or looked up, the objects it uploaded, and a completion marker of
an earlier run for each TPU VM: the VMs stay declared, and every lookup of a marker runs (listing the
bucket, then reading the marker). Needs are computed from both plans, never from one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from infra.config import parse_stack_config
from infra.run_status import marker_name
from run_contract import completion_marker
from tools.offline.mocks import CloudState
from tools.offline.runner import PlanResult

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


def plan_deploys(plan: Callable[[CloudState | None], PlanResult]) -> dict[str, PlanResult]:
    """`plan(state)` run for a first deploy (no state) and for a later one (what the first left)."""
    fresh = plan(None)
    return {"fresh": fresh, "later": plan(later_state(fresh, vm_names(fresh)))}
