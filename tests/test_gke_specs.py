"""The GKE engine's pure specs: the slice shape, and node pool and policy arguments checked against
pulumi-gcp's own argument types and Google's discovery documents (the mocks would accept any value)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import googleapiclient
import pulumi_gcp as gcp
import pytest

from infra.catalog.gke import GkeAcceleratorType, load_gke_catalog
from infra.config.model import MaintenanceWindow, SlicePoolSettings
from infra.gke import specs

DISCOVERY = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
CONTAINER = json.loads((DISCOVERY / "container.v1.json").read_text())["schemas"]
CONTAINER_BETA = json.loads((DISCOVERY / "container.v1beta1.json").read_text())["schemas"]
COMPUTE = json.loads((DISCOVERY / "compute.v1.json").read_text())["schemas"]
LABELS = {"environment": "dev", "owner": "ml"}


def pool(accelerator: str, provisioning: str = "on-demand", **changes: Any) -> SlicePoolSettings:
    gke = load_gke_catalog().accelerator(accelerator)
    assert isinstance(gke, GkeAcceleratorType), gke
    zone = gke.generation.zones_for(gke.size)[0]
    return SlicePoolSettings(name="p", accelerator=gke, zone=zone, provisioning=provisioning, **changes)


ALL_KINDS = [
    pool("v5litepod-16", "spot", slices=2),
    pool("v5p-16", "reserved", reservation_name="res-1"),
    pool("v6e-16", "flex-start", run_duration_hours=24),
    pool("v6e-1", "flex-start"),
    pool("v4-8"),
    pool("tpu7x-16"),
    pool("tpu7x-2", "spot"),
]


def sdk_problems(value: dict[str, Any], args_class: type, path: str = "") -> list[str]:
    """Keys of `value` that pulumi-gcp's `args_class` does not take, at any depth (nested dicts are
    checked against the argument class each parameter's annotation names)."""
    module = inspect.getmodule(args_class)
    parameters = inspect.signature(args_class.__init__).parameters
    problems = []
    for key, item in value.items():
        if key not in parameters:
            problems.append(f"{path}{key}: not an argument of {args_class.__name__}")
            continue
        nested = re.search(r"'(\w+Args)'", str(parameters[key].annotation))
        items = item if isinstance(item, list) else [item]
        for element in items:
            if isinstance(element, dict) and nested:
                problems += sdk_problems(element, getattr(module, nested.group(1)), f"{path}{key}.")
    return problems


@pytest.mark.parametrize("slice_pool", ALL_KINDS, ids=lambda p: f"{p.accelerator.name}-{p.provisioning}")
def test_node_pool_arguments_are_pulumi_gcps(slice_pool):
    for upgrades in ("end-of-support", "maintenance-window"):
        args = specs.node_pool_args(slice_pool, 0, upgrades=upgrades, labels=LABELS, policy_name="tpu-dev-p-slice")
        assert sdk_problems(args, gcp.container.NodePoolArgs) == []
    assert sdk_problems(specs.workload_policy_args(slice_pool, "dev"), gcp.compute.ResourcePolicyArgs) == []


def test_the_sdk_check_sees_a_misnamed_argument():
    """What caught `maintenance_policy` (the SDK's is `maintenance_policies`, a list) before a plan did."""
    args = {"maintenance_policy": {}, "node_config": {"machine_typ": "x", "gvnic": {"enabld": True}}}
    assert sdk_problems(args, gcp.container.NodePoolArgs) == [
        "maintenance_policy: not an argument of NodePoolArgs",
        "node_config.machine_typ: not an argument of NodePoolNodeConfigArgs",
        "node_config.gvnic.enabld: not an argument of NodePoolNodeConfigGvnicArgs",
    ]


def enum(schemas: dict, schema: str, field: str) -> list[str]:
    return schemas[schema]["properties"][field]["enum"]


def test_every_enum_value_is_googles():
    """container.v1 (v1beta1 for the host maintenance policy, a beta field pulumi-gcp sends) and compute.v1."""
    spot, reserved, flex = (
        specs.node_pool_args(p, 0, upgrades="end-of-support", labels=LABELS)
        for p in (ALL_KINDS[0], ALL_KINDS[1], ALL_KINDS[2])
    )
    assert spot["placement_policy"]["type"] in enum(CONTAINER, "PlacementPolicy", "type")
    assert flex["autoscaling"]["location_policy"] in enum(CONTAINER, "NodePoolAutoscaling", "locationPolicy")
    for args in (reserved, flex):
        affinity = args["node_config"]["reservation_affinity"]
        assert affinity["consume_reservation_type"] in enum(CONTAINER, "ReservationAffinity", "consumeReservationType")
    assert (
        reserved["node_config"]["reservation_affinity"]["key"]
        in CONTAINER["ReservationAffinity"]["properties"]["key"]["description"]
    )
    assert spot["node_config"]["workload_metadata_config"]["mode"] in enum(CONTAINER, "WorkloadMetadataConfig", "mode")
    interval = spot["node_config"]["host_maintenance_policy"]["maintenance_interval"]
    assert interval in enum(CONTAINER_BETA, "HostMaintenancePolicy", "maintenanceInterval")
    assert "exclusionUntilEndOfSupport" in CONTAINER["NodePoolMaintenancePolicy"]["properties"]
    policy = specs.workload_policy_args(pool("tpu7x-16"), "dev")["workload_policy"]
    assert policy["type"] in enum(COMPUTE, "ResourcePolicyWorkloadPolicy", "type")


def test_flex_start_durations_are_google_durations():
    (_, _, flex, *_) = ALL_KINDS
    duration = specs.node_pool_args(flex, 0, upgrades="end-of-support", labels=LABELS)["node_config"][
        "max_run_duration"
    ]
    assert CONTAINER["NodeConfig"]["properties"]["maxRunDuration"]["format"] == "google-duration"
    assert duration == "86400s"


@pytest.mark.parametrize(
    ("slice_pool", "shape"),
    [
        (ALL_KINDS[0], ("tpu-v5-lite-podslice", "4x4", "ct5lp-hightpu-4t", 4, 4, 2, "spot", 16, 32)),
        (ALL_KINDS[4], ("tpu-v4-podslice", "2x2x1", "ct4p-hightpu-4t", 4, 1, 1, "on-demand", 4, 4)),
        (ALL_KINDS[5], ("tpu7x", "2x2x2", "tpu7x-standard-4t", 4, 2, 1, "on-demand", 8, 8)),
        (ALL_KINDS[3], ("tpu-v6e-slice", "1x1", "ct6e-standard-1t", 1, 1, 1, "flex-start", 1, 1)),
    ],
)
def test_the_shape_of_a_pool(slice_pool, shape):
    got = specs.shape_of(slice_pool)
    assert (
        got.accelerator,
        got.topology,
        got.machine_type,
        got.chips_per_vm,
        got.vms_per_slice,
        got.slices,
        got.provisioning,
        got.chips_per_slice,
        got.chips,
    ) == shape
    spot = {specs.SPOT_LABEL: "true"} if got.provisioning == "spot" else {}
    assert got.node_labels == {specs.ACCELERATOR_LABEL: shape[0], specs.TOPOLOGY_LABEL: shape[1], **spot}


def test_single_host_slices_have_no_placement_and_multi_host_ones_do():
    single = specs.node_pool_args(pool("v4-8"), 0, upgrades="maintenance-window", labels=LABELS)
    assert "placement_policy" not in single and "max_pods_per_node" not in single
    assert "maintenance_policies" not in single  # in the window, like the system pool
    multi = specs.node_pool_args(pool("v4-16"), 0, upgrades="end-of-support", labels=LABELS)
    assert multi["placement_policy"] == {"type": "COMPACT", "tpu_topology": "2x2x2"}
    assert multi["maintenance_policies"] == [{"exclusion_until_end_of_supports": [{"enabled": True}]}]


def test_a_tpu7x_slice_needs_its_workload_policy():
    with pytest.raises(ValueError, match="placed by a workload policy"):
        specs.node_pool_args(pool("tpu7x-16"), 0, upgrades="end-of-support", labels=LABELS)
    single = specs.node_pool_args(pool("tpu7x-2"), 0, upgrades="end-of-support", labels=LABELS)
    assert "placement_policy" not in single  # one VM: no policy


def test_flex_start_scales_per_zone_from_zero():
    args = specs.node_pool_args(pool("v6e-16", "flex-start"), 0, upgrades="end-of-support", labels=LABELS)
    assert args["autoscaling"] == {"min_node_count": 0, "max_node_count": 4, "location_policy": "ANY"}
    assert "total_max_node_count" not in args["autoscaling"] and "node_count" not in args
    assert (args["initial_node_count"], args["management"]["auto_repair"]) == (0, False)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (
            MaintenanceWindow(days=("SA", "SU"), start_utc="02:00", hours=8),
            ("2025-01-06T02:00:00Z", "2025-01-06T10:00:00Z", "SA,SU"),
        ),
        (
            MaintenanceWindow(days=("FR",), start_utc="20:30", hours=12),
            ("2025-01-06T20:30:00Z", "2025-01-07T08:30:00Z", "FR"),
        ),
    ],
)
def test_the_maintenance_window(window, expected):
    recurring = specs.recurring_window(window)
    start, end, days = expected
    assert (recurring["start_time"], recurring["end_time"], recurring["recurrence"]) == (
        start,
        end,
        f"FREQ=WEEKLY;BYDAY={days}",
    )
    assert set(CONTAINER["RecurringTimeWindow"]["properties"]) == {"recurrence", "window"}
    assert sdk_problems(recurring, gcp.container.ClusterMaintenancePolicyRecurringWindowArgs) == []
