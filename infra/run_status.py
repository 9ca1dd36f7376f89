"""Which runs are complete, read from the run-status bucket while the program runs (an invoke).

Read by `pulumi preview` and `up` alike (the previewer and the deployer may list that bucket), so a
VM the guard deleted after its run completed is planned as absent, not as a node to re-create.
"""

from __future__ import annotations

from collections.abc import Mapping

import pulumi_gcp as gcp

from run_contract import completion_marker

MARKER = completion_marker.NAME


def marker_name(vm: str) -> str:
    return f"{vm}/{MARKER}"


def completed_runs(project: str, bucket: str, vms: Mapping[str, str]) -> set[str]:
    """The VMs (name -> current run id) whose completion marker names their current run.

    A marker of an earlier run id does not count: a new `run` declares the VM again; nor does content
    that is not a marker (run_contract/completion_marker.py). Before the first deploy there is no bucket, so
    nothing is complete."""
    if not vms:
        return set()
    # Asked first, not inferred from an error's text: listing the project's buckets by prefix answers
    # "does it exist yet" with an empty list (storage buckets.list), where listing a missing bucket's
    # objects fails.
    existing = gcp.storage.get_buckets(project=project, prefix=bucket).buckets
    if not any(b.name == bucket for b in existing):
        return set()
    listing = gcp.storage.get_bucket_objects(bucket=bucket, match_glob=f"*/{MARKER}")
    names = {obj.name for obj in listing.bucket_objects}
    done = set()
    for vm, run in vms.items():
        if marker_name(vm) not in names:
            continue
        content = gcp.storage.get_bucket_object_content(bucket=bucket, name=marker_name(vm)).content
        if completion_marker.run_of(content) == run:
            done.add(vm)
    return done
