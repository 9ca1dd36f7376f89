"""Which runs are complete, read from the run-status bucket while the program runs (an invoke).

Read by `pulumi preview` and `up` alike (the previewer and the deployer may list that bucket), so a
VM the guard deleted after its run completed is planned as absent, not as a node to re-create.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi_gcp as gcp

MARKER = "COMPLETE"


def marker_name(vm: str) -> str:
    return f"{vm}/{MARKER}"


def _bucket_missing(error: Exception) -> bool:
    # The provider reports a missing bucket as Google's 404 (storage objects.list: "notFound").
    text = str(error)
    return "404" in text and "bucket" in text.lower()


def completed_runs(bucket: str, vms: Sequence[str]) -> set[str]:
    """The names among `vms` whose completion marker exists. Before the first deploy there is no bucket."""
    if not vms:
        return set()
    try:
        listing = gcp.storage.get_bucket_objects(bucket=bucket, match_glob=f"*/{MARKER}")
    except Exception as error:  # the invoke's error type is the engine's; only a missing bucket is expected
        if _bucket_missing(error):
            return set()
        raise
    names = {obj.name for obj in listing.bucket_objects}
    return {vm for vm in vms if marker_name(vm) in names}
