"""The GKE catalog (tpu.yaml `gke:`): every node pool type against xpk 1.16.0's own table, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.catalog import load_catalog
from infra.catalog.gke import GkeAcceleratorType, load_gke_catalog

CATALOG = load_gke_catalog()
XPK_DEVICES = json.loads((Path(__file__).parent / "xpk" / "devices.json").read_text())
TYPES = [g.type_name(size) for g in CATALOG.generations.values() for size in g.sizes]


def gke(name: str) -> GkeAcceleratorType:
    accelerator = CATALOG.accelerator(name)
    assert isinstance(accelerator, GkeAcceleratorType), accelerator
    return accelerator


@pytest.mark.parametrize("name", TYPES)
def test_each_type_is_what_xpk_builds(name):
    """Label, topology, machine type, chips per node, nodes per slice, workload policy: as xpk's table."""
    accelerator, xpk = gke(name), XPK_DEVICES[name]
    ours = {
        "gkeAccelerator": accelerator.generation.accelerator,
        "topology": accelerator.topology,
        "machineType": accelerator.machine_type,
        "chipsPerVm": accelerator.chips_per_vm,
        "vmsPerSlice": accelerator.vms_per_slice,
        "requiresWorkloadPolicy": accelerator.needs_workload_policy,
    }
    assert ours == xpk


def test_the_types_cover_every_generation_the_issue_names():
    assert {g.name for g in CATALOG.generations.values()} == {"v4", "v5e", "v5p", "v6e", "tpu7x"}
    assert len(TYPES) == len(set(TYPES)) >= 40


def test_a_generation_with_a_cloud_tpu_base_shares_its_zones_prices_and_topologies():
    v5e, base = CATALOG.generations["v5e"], load_catalog().generations["v5e"]
    assert (v5e.prefix, v5e.zones, v5e.prices, v5e.topologies) == (
        base.prefix,
        base.zones,
        base.prices,
        base.topologies,
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v3-8", "TPU v3 is not offered as GKE node pools; GKE node pools take v4-N (v4), v5litepod-N (v5e)"),
        ("v2-8", "TPU v2 is not offered as GKE node pools"),
        ("v5litepod-4", "not a v5e size GKE node pools take; valid sizes: v5litepod-8, v5litepod-16"),
        ("tpu7x-12", "not a tpu7x size GKE node pools take; valid sizes: tpu7x-2, tpu7x-8, tpu7x-16"),
        ("h100-8", "unknown TPU type for GKE; types look like v4-N (v4)"),
    ],
)
def test_types_gke_does_not_take_are_refused_with_what_it_does(name, expected):
    why = CATALOG.accelerator(name)
    assert isinstance(why, str) and why.startswith(expected)


def test_tpu7x_is_gke_only_the_cloud_tpu_api_refuses_it():
    assert isinstance(CATALOG.accelerator("tpu7x-16"), GkeAcceleratorType)
    assert "only through Compute Engine and GKE" in str(load_catalog().accelerator("tpu7x-16"))


def test_zones_and_flex_start_come_from_the_catalog():
    assert CATALOG.zone_problem(gke("tpu7x-16"), "us-central1-c") is None
    assert CATALOG.zone_problem(gke("tpu7x-16"), "us-central1-a") == (
        "tpu7x-16 is not offered in us-central1-a; zones that offer it: us-central1-c"
    )
    assert CATALOG.zone_problem(gke("v4-16"), "us-central2-b") is None
    assert CATALOG.flex_start_problem(gke("v6e-16")) is None
    assert CATALOG.flex_start_problem(gke("v4-16")) == (
        "v4 node pools are not offered with flex-start; generations that are: v5e, v6e, tpu7x"
    )


def test_prices_are_the_cloud_tpu_ones_and_tpu7x_has_none():
    v5e, cloud_tpu = gke("v5litepod-16"), load_catalog().accelerator("v5litepod-16")
    assert not isinstance(cloud_tpu, str)
    spot = load_catalog().price_per_chip_hour(cloud_tpu, "spot", "us-central1")
    assert CATALOG.price_per_chip_hour(v5e, "spot", "us-central1") == spot
    assert CATALOG.price_per_chip_hour(gke("tpu7x-16"), "on-demand", "us-central1") is None
