"""Seconds by timeline category in chip-hours and list-price USD. Pure.

Prices come from the one lookup the cost table uses (infra/cost.py `chip_hour_price`: the catalog's
dated price for the VM's provisioning model in its own region, the dearest region where it may fall
back, never another region's); reserved and flex-start are priced at the on-demand list price and
say so, as the cost table does. Only billed categories cost: the node does not run while it waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.catalog import AcceleratorType, load_catalog
from infra.catalog.gke import load_gke_catalog
from infra.config.model import SlicePoolSettings
from infra.cost import chip_hour_price, list_price_note
from run_contract.timeline import BY_KEY, CATEGORIES, RunTimeline


@dataclass(frozen=True)
class Price:
    per_chip_hour: float | None  # USD; None: the source has no price in `region`
    region: str
    provisioning: str
    date: str  # the catalog's prices_date
    source: str
    notes: tuple[str, ...]  # list-price estimates, missing prices

    @property
    def list_price_estimate(self) -> bool:
        """Priced at the on-demand list price for want of this model's own price."""
        return list_price_note(self.provisioning) is not None


def price(accelerator: AcceleratorType, provisioning: str, zones: Sequence[str]) -> Price:
    per_chip_hour, region = chip_hour_price(accelerator, provisioning, zones)
    return _dated(per_chip_hour, accelerator.name, region, provisioning)


def pool_price(pool: SlicePoolSettings) -> Price:
    """A GKE slice pool's chip-hour price: the lookup its cost table row uses (infra/cost.py pool_cost)."""
    per_chip_hour = load_gke_catalog().price_per_chip_hour(pool.accelerator, pool.provisioning, pool.region)
    return _dated(per_chip_hour, pool.accelerator.name, pool.region, pool.provisioning)


def _dated(per_chip_hour: float | None, accelerator: str, region: str, provisioning: str) -> Price:
    notes = [f"no price for {accelerator} in {region} in the source"] if per_chip_hour is None else []
    if at_list := list_price_note(provisioning):
        notes.append(at_list)
    catalog = load_catalog()
    return Price(per_chip_hour, region, provisioning, catalog.prices_date, catalog.prices_source, tuple(notes))


@dataclass(frozen=True)
class Line:
    category: str
    seconds: float
    chip_hours: float  # 0 where the node does not run
    usd: float | None  # None: no price
    untrusted: bool  # a self-service program's step lines decide it


@dataclass(frozen=True)
class Priced:
    lines: tuple[Line, ...]
    chips: int
    price: Price

    @property
    def chip_hours(self) -> float:
        return sum(line.chip_hours for line in self.lines)

    @property
    def usd(self) -> float | None:
        return None if self.price.per_chip_hour is None else sum(line.usd or 0.0 for line in self.lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "chips": self.chips,
            "chipHours": self.chip_hours,
            "usd": self.usd,
            "price": {
                "perChipHour": self.price.per_chip_hour,
                "region": self.price.region,
                "provisioning": self.price.provisioning,
                "date": self.price.date,
                "source": self.price.source,
                "listPriceEstimate": self.price.list_price_estimate,
                "notes": list(self.price.notes),
            },
            "categories": {
                line.category: {
                    "seconds": line.seconds,
                    "chipHours": line.chip_hours,
                    "usd": line.usd,
                    "untrusted": line.untrusted,
                }
                for line in self.lines
            },
        }


def priced(seconds: Mapping[str, float], chips: int, at: Price, untrusted: Sequence[str] = ()) -> Priced:
    """Each category of `seconds` (timeline keys) on `chips` chips at the price `at`."""
    lines = []
    for category in CATEGORIES:
        s = seconds.get(category.key, 0.0)
        chip_hours = chips * s / 3600 if BY_KEY[category.key].billed else 0.0
        usd = None if at.per_chip_hour is None else chip_hours * at.per_chip_hour
        lines.append(Line(category.key, s, chip_hours, usd, category.key in untrusted))
    return Priced(tuple(lines), chips, at)


def price_timeline(timeline: RunTimeline) -> Priced:
    """A run's timeline priced for its VM's type, provisioning model and zone."""
    accelerator = load_catalog().accelerator(timeline.accelerator_type)
    if isinstance(accelerator, str):
        raise ValueError(f"run {timeline.run_id}: acceleratorType {timeline.accelerator_type!r}: {accelerator}")
    at = price(accelerator, timeline.provisioning, (timeline.zone,))
    return priced(timeline.seconds, timeline.chips, at, timeline.untrusted)
