"""The slice pools' node pools against what `xpk==1.16.0 cluster create --dry-run` runs, for six shapes.

tests/xpk/ holds xpk's output, recorded offline by tests/xpk/record.sh (the exact commands are in
tests/xpk/COMMANDS.txt). Each of our node pools is written as the gcloud flags it amounts to, and every
flag xpk passes must be ours with the same value, or be listed in ON_PURPOSE with why we differ (and the
difference must really be there, so a stale entry fails too).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from infra.catalog.gke import GkeAcceleratorType, load_gke_catalog
from infra.config.model import SlicePoolSettings
from infra.gke import specs

XPK = Path(__file__).parent / "xpk"
LABELS = {"environment": "dev", "owner": "ml", "managed-by": "pulumi"}


def pool(accelerator: str, zone: str, provisioning: str, slices: int = 1, reservation: str = "") -> SlicePoolSettings:
    gke = load_gke_catalog().accelerator(accelerator)
    assert isinstance(gke, GkeAcceleratorType), gke
    made = SlicePoolSettings(name="golden", accelerator=gke, zone=zone, provisioning=provisioning, slices=slices)
    return made.model_copy(update={"reservation_name": reservation})


# fixture -> the slice pool that asks for the same slices
SHAPES = {
    "v5e-16-spot": pool("v5litepod-16", "us-central1-a", "spot"),
    "v5p-16-reservation": pool("v5p-16", "us-east5-a", "reserved", reservation="ml-research-v5p"),
    "v6e-16-flex": pool("v6e-16", "us-central1-b", "flex-start"),
    "v4-8-spot": pool("v4-8", "us-central2-b", "spot"),
    "tpu7x-16-on-demand": pool("tpu7x-16", "us-central1-c", "on-demand"),
    "v5e-16-two-slices": pool("v5litepod-16", "us-central1-a", "on-demand", slices=2),
}
# Flags where the platform differs from xpk, and why. `None`: we do not pass the flag.
ON_PURPOSE: dict[str, str] = {
    "--cluster": "our cluster is tpu-<stack>; xpk's is its --cluster",
    "--project": "the stack's project",
    "--node-version": "no pinned version: the cluster's release channel sets it (xpk's dry run prints 0)",
    "--scopes": "cloud-platform only, with a least-privilege node account: IAM decides (xpk adds storage-full, "
    "gke-default, which only subtract)",
    "--accelerator-network-profile": "not set: TPU jobs here use the node's one NIC (xpk's v6e multi-networking)",
    "--node-labels": "not set: only the multi-networking DRA driver label xpk sets with that profile",
    "--tpu-topology": "also on TPU7x, beside the workload policy: GKE stores the topology on such a pool "
    "(vllm-project/ci-infra#547), so leaving it out would diff and replace the pool",
    "--placement-policy": "our policy is named per pool, tpu-<stack>-<pool>-slice, not per shape",
}
# Flags only we pass, and why.
OURS_ONLY: dict[str, str] = {
    "--service-account": "the platform's node account, never the Compute Engine default",
    "--workload-metadata": "Workload Identity on the nodes: pods never see the node's account",
    "--labels": "the stack's labels, for cost reports",
    "--maintenance-exclusion-until-end-of-support": "TPU pools are not upgraded under running jobs",
    "--min-nodes": "flex-start's lower bound, stated",
    "--enable-autoupgrade": "on a release channel node auto-upgrade is always on; stated",
    "--enable-autorepair": "stated (xpk relies on the default)",
}


def xpk_node_pools(fixture: str) -> list[dict[str, str | bool]]:
    """The flags of each `gcloud beta container node-pools create` xpk would run."""
    commands = re.findall(
        r"we are executing (gcloud beta container node-pools create .*)$",
        (XPK / f"{fixture}.txt").read_text(),
        flags=re.M,
    )
    return [_flags(shlex.split(c)[5:]) for c in commands]


def _flags(words: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {"name": words[0]}
    rest = words[1:]
    while rest:
        word = rest.pop(0)
        if "=" in word:
            key, value = word.split("=", 1)
            out[key] = value
        elif rest and not rest[0].startswith("--"):
            out[word] = rest.pop(0)
        else:
            out[word] = True
    return out


def as_gcloud(args: dict[str, Any]) -> dict[str, str | bool]:
    """Our node pool's arguments as the gcloud flags that ask for the same."""
    config = args["node_config"]
    flags: dict[str, str | bool] = {
        "name": args["name"],
        "--location": args["location"],
        "--node-locations": ",".join(args["node_locations"]),
        "--machine-type": config["machine_type"],
        "--host-maintenance-interval": config["host_maintenance_policy"]["maintenance_interval"],
        "--num-nodes": str(args.get("node_count", args.get("initial_node_count"))),
        "--service-account": "<the node account>",
        "--workload-metadata": config["workload_metadata_config"]["mode"],
        "--labels": ",".join(f"{k}={v}" for k, v in config["resource_labels"].items()),
    }
    if config["gvnic"]["enabled"]:
        flags["--enable-gvnic"] = True
    if config.get("spot"):
        flags["--spot"] = True
    if config.get("flex_start"):
        flags["--flex-start"] = True
    affinity = config.get("reservation_affinity")
    if affinity:
        flags["--reservation-affinity"] = {"SPECIFIC_RESERVATION": "specific", "NO_RESERVATION": "none"}[
            affinity["consume_reservation_type"]
        ]
        if affinity.get("values"):
            flags["--reservation"] = ",".join(affinity["values"])
    if "autoscaling" in args:
        scaling = args["autoscaling"]
        flags |= {
            "--enable-autoscaling": True,
            "--location-policy": scaling["location_policy"],
            "--min-nodes": str(scaling["min_node_count"]),
            "--max-nodes": str(scaling["max_node_count"]),
        }
    management = args["management"]
    flags["--enable-autorepair" if management["auto_repair"] else "--no-enable-autorepair"] = True
    flags["--enable-autoupgrade" if management["auto_upgrade"] else "--no-enable-autoupgrade"] = True
    placement = args.get("placement_policy")
    if placement:
        if placement["type"]:
            flags["--placement-type"] = placement["type"]
        flags["--tpu-topology"] = placement["tpu_topology"]
        if placement.get("policy_name"):
            flags["--placement-policy"] = placement["policy_name"]
    if "max_pods_per_node" in args:
        flags["--max-pods-per-node"] = str(args["max_pods_per_node"])
    if args.get("maintenance_policies"):
        flags["--maintenance-exclusion-until-end-of-support"] = True
    return flags


def ours(fixture: str) -> list[dict[str, str | bool]]:
    shape = SHAPES[fixture]
    policy = "tpu-dev-golden-slice" if shape.accelerator.needs_workload_policy else None
    return [
        as_gcloud(specs.node_pool_args(shape, i, upgrades="end-of-support", labels=LABELS, policy_name=policy))
        for i in range(shape.slices)
    ]


@pytest.mark.parametrize("fixture", sorted(SHAPES))
def test_node_pools_ask_for_what_xpk_asks_for(fixture):
    theirs, mine = xpk_node_pools(fixture), ours(fixture)
    assert len(theirs) == len(mine) == SHAPES[fixture].slices  # one node pool per slice
    for index, (xpk, us) in enumerate(zip(theirs, mine, strict=True)):
        assert (xpk["name"], us["name"]) == (f"golden-np-{index}", f"golden-{index}")  # <pool>-<i>, as xpk's -np-<i>
        for flag, value in xpk.items():
            if flag == "name" or flag in ON_PURPOSE:
                continue
            assert us.get(flag) == value, f"{fixture}: {flag}: xpk {value!r}, ours {us.get(flag)!r}"
        extra = {flag for flag in us if flag not in xpk and flag != "name"}
        assert extra <= set(OURS_ONLY) | set(ON_PURPOSE), f"{fixture}: flags only we pass, unexplained: {extra}"


def test_every_stated_difference_is_real():
    """An ON_PURPOSE entry xpk never passes, or passes exactly as we do, is stale."""
    for flag in ON_PURPOSE:
        differs = [
            fixture
            for fixture in SHAPES
            for xpk, us in zip(xpk_node_pools(fixture), ours(fixture), strict=True)
            if (flag in xpk and xpk[flag] != us.get(flag)) or (flag not in xpk and flag in us)
        ]
        assert differs, f"{flag} is listed as a difference but no shape differs on it"


def test_the_tpu7x_workload_policy_is_the_one_xpk_creates():
    """xpk: `gcloud beta compute resource-policies create workload-policy NAME --region=R --type=HIGH_THROUGHPUT
    --accelerator-topology=T` (recorded with its describe answered 'not found')."""
    (create,) = [line for line in (XPK / "tpu7x-16-workload-policy.txt").read_text().splitlines() if " create " in line]
    xpk = _flags(shlex.split(create)[6:])
    args = specs.workload_policy_args(SHAPES["tpu7x-16-on-demand"], "dev")
    assert (args["region"], args["workload_policy"]["type"], args["workload_policy"]["accelerator_topology"]) == (
        xpk["--region"],
        xpk["--type"],
        xpk["--accelerator-topology"],
    )
    (node_pool,) = ours("tpu7x-16-on-demand")
    assert "--placement-type" not in node_pool  # COMPACT is refused for TPU7x: the workload policy places it
    assert node_pool["--placement-policy"] == args["name"]


def test_the_recording_names_the_command_of_each_fixture():
    commands = (XPK / "COMMANDS.txt").read_text()
    for fixture in SHAPES:
        assert re.search(rf"^{re.escape(fixture)}: xpk cluster create .*--dry-run", commands, flags=re.M)
    assert all((XPK / f"{f}.txt").read_text().startswith("[XPK] Starting xpk v1.16.0") for f in SHAPES)
