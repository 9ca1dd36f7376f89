"""TPU slice shapes that GKE node pools take: the `gke:` section of tpu.yaml. Pure: no Pulumi.

A GKE TPU node pool of a type (`v5litepod-16`, `tpu7x-16`) is a set of nodes of one machine type,
`chips_per_vm` chips each, that together hold the type's topology; a pool of more than one node is a
multi-host slice, which GKE creates, repairs and deletes as one unit. Like the Cloud TPU catalog
(`infra/catalog/__init__.py`), each `*_problem` returns why a choice would fail on GCP, phrased as
what to do instead, or None.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.catalog import (
    CATALOG_FILE,
    PriceRow,
    catalog_data,
    chips_of,
    load_catalog,
    price_in_region,
    price_rows,
    zones_offering,
)


@dataclass(frozen=True)
class GkeGeneration:
    name: str
    prefix: str
    suffix: str  # "cores" (2 per chip) or "chips", as in the Cloud TPU catalog
    accelerator: str  # GKE's node label cloud.google.com/gke-tpu-accelerator
    machine_types: dict[int, str]  # chips per node -> machine type
    sizes: tuple[int, ...]
    topologies: dict[int, str]  # size -> chip topology
    zones: dict[str, frozenset[int] | None]  # zone -> sizes offered there (None: every size)
    prices: tuple[PriceRow, ...]
    hbm_gib_per_chip: float
    workload_policy: bool  # a multi-host slice is placed by a HIGH_THROUGHPUT workload policy
    flex_start: bool

    def type_name(self, size: int) -> str:
        return f"{self.prefix}-{size}"

    def zones_for(self, size: int) -> list[str]:
        return zones_offering(self.zones, size)


@dataclass(frozen=True)
class GkeAcceleratorType:
    """One TPU type as a GKE node pool: a slice of `vms_per_slice` nodes."""

    generation: GkeGeneration
    size: int

    @property
    def name(self) -> str:
        return self.generation.type_name(self.size)

    @property
    def chips(self) -> int:
        return chips_of(self.generation.suffix, self.size)

    @property
    def topology(self) -> str:
        return self.generation.topologies[self.size]

    @property
    def chips_per_vm(self) -> int:
        """The largest node the generation has that the slice holds: 1 chip for a one-chip slice, else 4."""
        return max(c for c in self.generation.machine_types if c <= self.chips)

    @property
    def machine_type(self) -> str:
        return self.generation.machine_types[self.chips_per_vm]

    @property
    def vms_per_slice(self) -> int:
        return self.chips // self.chips_per_vm

    @property
    def multi_host(self) -> bool:
        return self.vms_per_slice > 1

    @property
    def needs_workload_policy(self) -> bool:
        """A multi-host slice of a generation placed by a workload policy (TPU7x)."""
        return self.multi_host and self.generation.workload_policy


@dataclass(frozen=True)
class GkeCatalog:
    generations: dict[str, GkeGeneration]
    not_in_gke: dict[str, str]  # Cloud TPU API generations GKE's node pools do not take -> why

    def accelerator(self, name: str) -> GkeAcceleratorType | str:
        """The GKE node pool type `name` (like `v5litepod-16` or `tpu7x-16`), or why it is not one."""
        prefix, _, size = name.rpartition("-")
        by_prefix = {g.prefix: g for g in self.generations.values()}
        known = ", ".join(f"{g.prefix}-N ({g.name})" for g in self.generations.values())
        if prefix not in by_prefix:
            cloud_tpu = {g.prefix: g.name for g in load_catalog().generations.values()}
            if cloud_tpu.get(prefix) in self.not_in_gke:
                return f"{self.not_in_gke[cloud_tpu[prefix]]}; GKE node pools take {known}"
            return f"unknown TPU type for GKE; types look like {known}"
        generation = by_prefix[prefix]
        if not size.isdigit() or int(size) not in generation.sizes:
            sizes = ", ".join(generation.type_name(s) for s in generation.sizes)
            return f"not a {generation.name} size GKE node pools take; valid sizes: {sizes}"
        return GkeAcceleratorType(generation, int(size))

    def zone_problem(self, accelerator: GkeAcceleratorType, zone: str) -> str | None:
        zones = accelerator.generation.zones_for(accelerator.size)
        if zone not in zones:
            return f"{accelerator.name} is not offered in {zone}; zones that offer it: {', '.join(zones)}"
        return None

    def flex_start_problem(self, accelerator: GkeAcceleratorType) -> str | None:
        if accelerator.generation.flex_start:
            return None
        able = ", ".join(g.name for g in self.generations.values() if g.flex_start)
        return f"{accelerator.generation.name} node pools are not offered with flex-start; generations that are: {able}"

    def price_per_chip_hour(self, accelerator: GkeAcceleratorType, provisioning: str, region: str) -> float | None:
        """USD per chip-hour in `region`, as the Cloud TPU catalog prices it (None: no price there)."""
        return price_in_region(accelerator.generation.prices, accelerator.size, provisioning, region)


def _generation(name: str, data: dict[str, Any]) -> GkeGeneration:
    base = load_catalog().generations.get(data.get("base", ""))

    def inherited(key: str) -> Any:
        """The generation's own value, else its base's (tpu.yaml names a base for every missing key)."""
        if key in data:
            return data[key]
        if base is None:
            raise KeyError(f"gke generation {name}: no {key} and no base generation to take it from")
        return getattr(base, key)

    zones = data.get("zones")
    return GkeGeneration(
        name=name,
        prefix=inherited("prefix"),
        suffix=inherited("suffix"),
        accelerator=data["accelerator"],
        machine_types={int(c): str(m) for c, m in data["machine_types"].items()},
        sizes=tuple(data["sizes"]),
        topologies={int(k): str(v) for k, v in inherited("topologies").items()},
        zones={z: None if s == "all" else frozenset(s) for z, s in zones.items()}
        if zones
        else dict(inherited("zones")),
        prices=price_rows(data["prices"]) if "prices" in data else inherited("prices"),
        hbm_gib_per_chip=float(inherited("hbm_gib_per_chip")),
        workload_policy=bool(data["workload_policy"]),
        flex_start=bool(data["flex_start"]),
    )


@functools.cache
def load_gke_catalog(path: Path = CATALOG_FILE) -> GkeCatalog:
    data = catalog_data(path)["gke"]
    return GkeCatalog(
        generations={name: _generation(name, g) for name, g in data["generations"].items()},
        not_in_gke=dict(data["not_in_gke"]),
    )
