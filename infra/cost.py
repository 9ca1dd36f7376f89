"""What a stack's TPU VMs cost per month, from the catalog's dated prices. Pure.

chips × price per chip-hour (for the VM's provisioning model) × hours per month (24×30 when always
on, fewer with a stop/start schedule). Spot and preemptible use the spot price; reserved capacity is
priced as on-demand (contracts differ). Prices are the catalog's region's; the table says which.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from infra.catalog import load_catalog
from infra.config import PlatformConfig, TpuVmSettings
from infra.schedule import HOURS_PER_MONTH, running_hours_per_month


@dataclass(frozen=True)
class VmCost:
    name: str
    accelerator_type: str
    chips: int
    provisioning: str
    price_per_chip_hour: float
    price_region: str
    hours_per_month: float
    monthly: float
    on_demand_monthly: float


@dataclass(frozen=True)
class StackCost:
    vms: list[VmCost]
    monthly_total: float
    on_demand_total: float
    budget: float
    currency: str
    over_budget: bool
    prices_date: str
    prices_source: str

    def as_output(self) -> Any:
        """The `costEstimate` stack output: camelCase keys, like every other output."""
        return _camel(asdict(self))


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {re.sub(r"_(\w)", lambda m: m[1].upper(), k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def hours_per_month(vm: TpuVmSettings) -> float:
    return running_hours_per_month(vm.schedule.start, vm.schedule.stop) if vm.schedule else HOURS_PER_MONTH


def vm_cost(vm: TpuVmSettings) -> VmCost:
    catalog = load_catalog()
    price, region = catalog.price_per_chip_hour(vm.accelerator, vm.provisioning)
    on_demand, _ = catalog.price_per_chip_hour(vm.accelerator, "on-demand")
    hours = hours_per_month(vm)
    chips = vm.accelerator.chips
    return VmCost(
        name=vm.name,
        accelerator_type=vm.accelerator.name,
        chips=chips,
        provisioning=vm.provisioning,
        price_per_chip_hour=price,
        price_region=region,
        hours_per_month=hours,
        monthly=round(chips * price * hours, 2),
        on_demand_monthly=round(chips * on_demand * hours, 2),
    )


def estimate(cfg: PlatformConfig) -> StackCost:
    catalog = load_catalog()
    vms = [vm_cost(vm) for vm in cfg.tpu_vms]
    total = round(sum(v.monthly for v in vms), 2)
    return StackCost(
        vms=vms,
        monthly_total=total,
        on_demand_total=round(sum(v.on_demand_monthly for v in vms), 2),
        budget=cfg.budget.amount,
        currency=cfg.budget.currency,
        # Prices are USD; a budget in another currency is not compared.
        over_budget=cfg.budget.currency == "USD" and total > cfg.budget.amount,
        prices_date=catalog.prices_date,
        prices_source=catalog.prices_source,
    )


def cost_table(cost: dict) -> str:
    """The plan's cost section, from the `costEstimate` stack output."""
    lines = [f"Estimated TPU cost per month (prices of {cost['pricesDate']}, {cost['pricesSource']}):"]
    header = f"  {'TPU VM':<24} {'type':<14} {'chips':>5} {'model':<11} {'$/chip-h':>9} {'hours':>7} {'$/month':>11}"
    lines.append(header)
    for vm in cost["vms"]:
        lines.append(
            f"  {vm['name']:<24} {vm['acceleratorType']:<14} {vm['chips']:>5} {vm['provisioning']:<11}"
            f" {vm['pricePerChipHour']:>9.3f} {vm['hoursPerMonth']:>7.1f} {vm['monthly']:>11,.2f}"
        )
    total, on_demand = cost["monthlyTotal"], cost["onDemandTotal"]
    lines.append(f"  {'total':<24} {'':<14} {'':>5} {'':<11} {'':>9} {'':>7} {total:>11,.2f}")
    if on_demand > total:
        lines.append(f"  saving against on-demand: {on_demand - total:,.2f} USD/month ({1 - total / on_demand:.0%})")
    if cost["currency"] != "USD":
        lines.append(f"  budget: {cost['budget']:,.2f} {cost['currency']} (not compared: prices are USD)")
    else:
        state = "OVER BUDGET" if cost["overBudget"] else f"{total / cost['budget']:.0%} of it" if cost["budget"] else ""
        lines.append(f"  budget: {cost['budget']:,.2f} USD/month; estimate is {state}")
    regions = sorted({vm["priceRegion"] for vm in cost["vms"]})
    if regions:
        lines.append(f"  (prices are those of {', '.join(regions)}; other regions differ)")
    return "\n".join(lines)
