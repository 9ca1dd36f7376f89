"""What a GKE slice pool is made of, and the arguments its resources are declared with. Pure: no Pulumi.

A slice pool is `slices` TPU slices of one type in one zone; each slice is one GKE node pool (GKE
creates, repairs and scales a multi-host slice as one unit, and never adds a node to it). The
arguments below are pulumi-gcp's (`gcp.container.NodePool`, `gcp.compute.ResourcePolicy`), keyword
names and nested dicts, so the components pass them through and the tests compare them, without
Pulumi, with what `xpk==1.16.0 cluster create --dry-run` runs (recorded in tests/xpk/).

Where they follow xpk (core/nodepool.py, core/capacity.py): the machine type, the node count (the
slice's VMs; none to start with for flex-start), `--host-maintenance-interval=AS_NEEDED`, gVNIC, at
most 15 pods a node and COMPACT placement with the topology on a multi-host slice, TPU7x's named
HIGH_THROUGHPUT workload policy instead, spot, a specific reservation, and flex-start's autoscaling
from zero with location policy ANY, no reservation and no auto-repair.
Where they differ on purpose, each said where it is set: the node service account and its scope,
Workload Identity on the nodes, the placement policy's empty type and topology on TPU7x, per-zone
autoscaling bounds, upgrades, and no accelerator network profile.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from infra import naming
from infra.config.model import MaintenanceWindow, SlicePoolSettings

# The node labels GKE sets on a TPU node, which a pod's nodeSelector (and a Kueue ResourceFlavor) selects.
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
# GKE labels a Spot VM's node so, and a spot flavor selects it (xpk core/capacity.py; vllm-project/ci-infra
# workers.tf: "GKE labels the nodes cloud.google.com/gke-spot, which the Spot ResourceFlavor selects on").
SPOT_LABEL = "cloud.google.com/gke-spot"
# One scope, and IAM decides: the node account holds only what its roles grant (GKE, "Configure node
# service accounts"; xpk adds storage-full and gke-default, which only subtract from cloud-platform).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# xpk (core/nodepool.py): `--max-pods-per-node 15` on a multi-host slice, which runs one pod a node.
MAX_PODS_PER_SLICE_NODE = 15
# xpk's default `--host-maintenance-interval`, on every TPU pool it makes.
HOST_MAINTENANCE_INTERVAL = "AS_NEEDED"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"  # container.v1 ReservationAffinity.key
# A fixed first day of the recurring maintenance window: GKE repeats it by the RRULE from that date on,
# and returns it in UTC ("Z"), which a window given in UTC matches with no permanent diff.
WINDOW_EPOCH = datetime.date(2025, 1, 6)
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class SliceShape:
    """One slice pool's shape: what a Kueue ResourceFlavor and a JobSet select, and what it holds."""

    accelerator: str  # GKE's cloud.google.com/gke-tpu-accelerator, like tpu-v5-lite-podslice
    topology: str  # cloud.google.com/gke-tpu-topology, like 4x4
    machine_type: str
    chips_per_vm: int  # google.com/tpu a pod on one node asks for
    vms_per_slice: int  # nodes of one slice: a JobSet's parallelism
    slices: int  # node pools of this shape in the pool: a JobSet's replicas at most
    provisioning: str  # on-demand | spot | reserved | flex-start

    @property
    def chips_per_slice(self) -> int:
        return self.chips_per_vm * self.vms_per_slice

    @property
    def chips(self) -> int:
        return self.chips_per_slice * self.slices

    @property
    def node_labels(self) -> dict[str, str]:
        """The labels GKE puts on every node of the pool: what a flavor's or a job's selector names."""
        spot = {SPOT_LABEL: "true"} if self.provisioning == "spot" else {}
        return {ACCELERATOR_LABEL: self.accelerator, TOPOLOGY_LABEL: self.topology, **spot}


def shape_of(pool: SlicePoolSettings) -> SliceShape:
    accelerator = pool.accelerator
    return SliceShape(
        accelerator=accelerator.generation.accelerator,
        topology=accelerator.topology,
        machine_type=accelerator.machine_type,
        chips_per_vm=accelerator.chips_per_vm,
        vms_per_slice=accelerator.vms_per_slice,
        slices=pool.slices,
        provisioning=pool.provisioning,
    )


def node_pool_names(pool: SlicePoolSettings) -> list[str]:
    return [naming.slice_node_pool(pool.name, i) for i in range(pool.slices)]


def workload_policy_args(pool: SlicePoolSettings, stack: str) -> dict[str, Any]:
    """The HIGH_THROUGHPUT workload policy a TPU7x multi-host slice is placed by (xpk: `gcloud beta compute
    resource-policies create workload-policy NAME --type=HIGH_THROUGHPUT --accelerator-topology=T`)."""
    return {
        "name": naming.workload_policy(stack, pool.name),
        "region": pool.region,
        "workload_policy": {"type": "HIGH_THROUGHPUT", "accelerator_topology": pool.accelerator.topology},
    }


def _placement(pool: SlicePoolSettings, policy_name: str | None) -> dict[str, Any] | None:
    """A multi-host slice's placement; none for one VM (xpk: "--tpu-topology should not be set for
    single-host node pools")."""
    accelerator = pool.accelerator
    if not accelerator.multi_host:
        return None
    if accelerator.needs_workload_policy:
        if not policy_name:
            raise ValueError(f"slice pool {pool.name}: {accelerator.name} is placed by a workload policy; name it")
        # GKE stores a TPU7x pool's policy name and topology and no type: an empty type matches it, where
        # COMPACT would diff and replace the pool at every `up` (vllm-project/ci-infra#547, workers.tf,
        # applied against a live cluster). xpk passes the policy alone; the topology is what GKE reports.
        return {"type": "", "policy_name": policy_name, "tpu_topology": accelerator.topology}
    return {"type": "COMPACT", "tpu_topology": accelerator.topology}


def _capacity(pool: SlicePoolSettings) -> dict[str, Any]:
    """The node config's capacity fields, as xpk's `get_capacity_arguments_from_capacity_type`."""
    if pool.provisioning == "spot":
        return {"spot": True}
    if pool.provisioning == "reserved":
        return {
            "reservation_affinity": {
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "key": RESERVATION_KEY,
                "values": [pool.reservation_name],
            }
        }
    if pool.provisioning == "flex-start":
        flex: dict[str, Any] = {
            "flex_start": True,
            "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
        }
        if pool.run_duration_hours is not None:
            flex["max_run_duration"] = f"{round(pool.run_duration_hours * SECONDS_PER_HOUR)}s"
        return flex
    return {}


def node_pool_args(
    pool: SlicePoolSettings,
    index: int,
    *,
    upgrades: str,
    labels: dict[str, str],
    policy_name: str | None = None,
) -> dict[str, Any]:
    """The arguments of slice `index`'s node pool, without the cluster and the node service account.

    `upgrades`: `end-of-support` keeps the pool off automatic upgrades until its version's end of support
    (container.v1 NodePool.maintenancePolicy.exclusionUntilEndOfSupport): an upgrade recreates the slice's
    nodes and kills its jobs, so it happens between runs, by hand. Auto-upgrade itself stays on: a cluster
    on a release channel cannot turn it off (container.v1 ReleaseChannel).
    """
    accelerator, flex = pool.accelerator, pool.provisioning == "flex-start"
    vms = accelerator.vms_per_slice
    args: dict[str, Any] = {
        "name": naming.slice_node_pool(pool.name, index),
        "location": pool.region,
        "node_locations": [pool.zone],
        "node_config": {
            "machine_type": accelerator.machine_type,
            **_capacity(pool),
            "host_maintenance_policy": {"maintenance_interval": HOST_MAINTENANCE_INTERVAL},
            "gvnic": {"enabled": True},
            "oauth_scopes": [CLOUD_PLATFORM_SCOPE],
            # Pods see their Kubernetes service account's Workload Identity, never the node's account.
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "resource_labels": {**labels, "provisioning": pool.provisioning, "slice-pool": pool.name},
        },
        "management": {"auto_repair": not flex, "auto_upgrade": True},
    }
    if flex:
        # From zero when a job asks; the bounds are per zone, never total_*: GKE sizes a slice against the
        # per-zone maximum ("Maximum node count 0 is not a valid size of TPU pod slice with topology
        # 2x2x2", vllm-project/ci-infra#545), and ANY, since a balanced spread cannot assemble a slice.
        args["initial_node_count"] = 0
        args["autoscaling"] = {"min_node_count": 0, "max_node_count": vms, "location_policy": "ANY"}
    else:
        args["node_count"] = vms
    placement = _placement(pool, policy_name)
    if placement is not None:
        args["placement_policy"] = placement
        args["max_pods_per_node"] = MAX_PODS_PER_SLICE_NODE
    if upgrades == "end-of-support":
        args["maintenance_policies"] = [{"exclusion_until_end_of_supports": [{"enabled": True}]}]
    return args


def recurring_window(window: MaintenanceWindow) -> dict[str, str]:
    """The cluster's weekly maintenance window (container.v1 RecurringTimeWindow: a window and an RRULE)."""
    hour, minute = (int(part) for part in window.start_utc.split(":"))
    start = datetime.datetime.combine(WINDOW_EPOCH, datetime.time(hour, minute), tzinfo=datetime.UTC)
    end = start + datetime.timedelta(hours=window.hours)
    return {
        "start_time": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "end_time": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recurrence": f"FREQ=WEEKLY;BYDAY={','.join(window.days)}",
    }
