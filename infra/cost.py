"""What a stack's TPU VMs cost per month, from the catalog's dated prices. Pure.

chips × slices × price per chip-hour (for the VM's provisioning model, in its region) × hours per
month. The month is Google's 730 hours (infra/schedule.py). Hours are fewer with a stop/start
schedule. A schedule that only stops a VM leaves its starts to people, whose hours the plan cannot
know: it is priced as if started again right after each stop, for every hour it may run ("up to"),
and the table says so; one that only starts it changes nothing (its run's end stops it). A run to
completion (onCompletion stop or delete) is priced for `maxRunHours`, which the guard enforces, and
without it for up to the whole month (the run's length is unknown, and nothing stops it earlier than
its own end: the honest bound is the month, marked "up to"); flex-start for its `runDurationHours`,
after which Google deletes it.

Prices are each region's own: a VM is priced in the region of its zone, and a queued VM that may
fall back to other zones at the dearest of their regions (an upper bound, said so). A region
without a price in the source is never given another region's: the VM is left out of the total
and the table says so. The source has no reserved, committed-use or flex-start prices: those are
priced at the on-demand list price, an upper bound, marked as an assumption in the table.

A GKE slice pool is priced the same way, per chip-hour of its type in its zone's region, for all its
slices: always on, except a flex-start pool, which scales from zero and is priced for every hour it
may run ("up to"). Its nodes are TPU VMs, taken to bill at the Cloud TPU price; the cluster's own fee
and its system nodes are not TPUs and are not in the table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.catalog import AcceleratorType, load_catalog
from infra.catalog.gke import load_gke_catalog
from infra.config.model import BudgetSettings, SlicePoolSettings, TpuVmSettings
from infra.schedule import HOURS_PER_MONTH, running_hours_per_month

# Provisioning models the source has no price for: priced at the on-demand list price.
AT_LIST_PRICE = ("reserved", "flex-start")


@dataclass(frozen=True)
class VmCost:
    name: str
    accelerator_type: str
    chips: int  # all slices together
    slices: int
    provisioning: str
    capacity: str
    price_per_chip_hour: float | None  # None: the source has no price in price_region
    price_region: str
    hours_per_month: float
    hours_basis: str  # always on | schedule | maxRunHours | up to (no maxRunHours) | flex-start run
    monthly: float
    on_demand_monthly: float
    notes: list[str] = field(default_factory=list)

    @property
    def priced(self) -> bool:
        return self.price_per_chip_hour is not None


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
    hours_in_month: float
    unpriced: list[str]  # VMs and pools left out of the total: no price for them in the source
    pools: list[VmCost] = field(default_factory=list)  # the GKE engine's slice pools

    def as_output(self) -> Any:
        """The `costEstimate` stack output: camelCase keys, like every other output (no `pools` key in a
        stack without the GKE engine, whose output stays as it was)."""
        out = _camel(asdict(self))
        if not self.pools:
            del out["pools"]
        return out


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {re.sub(r"_(\w)", lambda m: m[1].upper(), k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def hours_per_month(vm: TpuVmSettings) -> tuple[float, str]:
    """(hours a month the VM is paid for, why that many)."""
    schedule = vm.schedule
    if schedule and schedule.start and schedule.stop:
        scheduled, basis = running_hours_per_month(schedule.start, schedule.stop), "schedule"
    else:  # a stop alone: whoever starts it decides; a start alone: what stops it decides (completion)
        scheduled, basis = HOURS_PER_MONTH, "up to" if schedule and schedule.stop else "always on"
    if vm.provisioning == "flex-start" and vm.run_duration_hours is not None:
        return min(vm.run_duration_hours, scheduled), "flex-start run"
    if vm.on_completion != "keep":
        if vm.max_run_hours is not None:
            return min(vm.max_run_hours, scheduled), "maxRunHours"
        return scheduled, "up to"
    return scheduled, basis


def chip_hour_price(accelerator: AcceleratorType, provisioning: str, zones: Sequence[str]) -> tuple[float | None, str]:
    """USD per chip-hour of `accelerator` bought as `provisioning`, at the dearest of the regions of
    `zones`, and that region; (None, region) when the source has no price in one of them."""
    catalog = load_catalog()
    regions = list(dict.fromkeys(z.rsplit("-", 1)[0] for z in zones))
    prices = [(catalog.price_per_chip_hour(accelerator, provisioning, r), r) for r in regions]
    missing = next((r for p, r in prices if p is None), None)
    if missing:
        return None, missing
    price, region = max((p, r) for p, r in prices if p is not None)
    return price, region


def list_price_note(provisioning: str) -> str | None:
    """What an estimate must say of a provisioning model the source has no price for, or None."""
    if provisioning in AT_LIST_PRICE:
        return f"{provisioning} priced at the on-demand list price: the source has no {provisioning} price"
    return None


def vm_cost(vm: TpuVmSettings) -> VmCost:
    price, region = chip_hour_price(vm.accelerator, vm.provisioning, vm.zones)
    on_demand, _ = chip_hour_price(vm.accelerator, "on-demand", vm.zones)
    hours, basis = hours_per_month(vm)
    chips = vm.accelerator.chips * vm.node_count
    notes = []
    if price is None:
        notes.append(f"no price for {vm.accelerator.name} in {region} in the source: not in the total")
    if at_list := list_price_note(vm.provisioning):
        notes.append(at_list)
    if basis == "up to" and vm.on_completion != "keep":
        notes.append("runs to completion with no maxRunHours: priced for every hour it may run")
    if vm.schedule and not vm.schedule.start:
        notes.append("its schedule only stops it; people start it: priced as if started again right after each stop")
    if len({z.rsplit("-", 1)[0] for z in vm.zones}) > 1:
        notes.append(f"priced at the dearest region it may fall back to ({region})")
    return VmCost(
        name=vm.name,
        accelerator_type=vm.accelerator.name,
        chips=chips,
        slices=vm.node_count,
        provisioning=vm.provisioning,
        capacity=vm.capacity,
        price_per_chip_hour=price,
        price_region=region,
        hours_per_month=hours,
        hours_basis=basis,
        monthly=round(chips * price * hours, 2) if price is not None else 0.0,
        on_demand_monthly=round(chips * on_demand * hours, 2) if on_demand is not None else 0.0,
        notes=notes,
    )


def pool_cost(pool: SlicePoolSettings) -> VmCost:
    catalog = load_gke_catalog()
    price = catalog.price_per_chip_hour(pool.accelerator, pool.provisioning, pool.region)
    on_demand = catalog.price_per_chip_hour(pool.accelerator, "on-demand", pool.region)
    flex = pool.provisioning == "flex-start"
    hours, basis = (HOURS_PER_MONTH, "up to") if flex else (HOURS_PER_MONTH, "always on")
    chips = pool.accelerator.chips * pool.slices
    notes = []
    if price is None:
        notes.append(f"no price for {pool.accelerator.name} in {pool.region} in the source: not in the total")
    if at_list := list_price_note(pool.provisioning):
        notes.append(at_list)
    if flex:
        notes.append("flex-start scales from zero when a job asks: priced for every hour it may run")
    return VmCost(
        name=pool.name,
        accelerator_type=pool.accelerator.name,
        chips=chips,
        slices=pool.slices,
        provisioning=pool.provisioning,
        capacity="gke",
        price_per_chip_hour=price,
        price_region=pool.region,
        hours_per_month=hours,
        hours_basis=basis,
        monthly=round(chips * price * hours, 2) if price is not None else 0.0,
        on_demand_monthly=round(chips * on_demand * hours, 2) if on_demand is not None else 0.0,
        notes=notes,
    )


def estimate(
    tpu_vms: Sequence[TpuVmSettings], budget: BudgetSettings, slice_pools: Sequence[SlicePoolSettings] = ()
) -> StackCost:
    catalog = load_catalog()
    vms = [vm_cost(vm) for vm in tpu_vms]
    pools = [pool_cost(pool) for pool in slice_pools]
    rows = [*vms, *pools]
    total = round(sum(v.monthly for v in rows), 2)
    return StackCost(
        vms=vms,
        pools=pools,
        monthly_total=total,
        on_demand_total=round(sum(v.on_demand_monthly for v in rows), 2),
        budget=budget.amount,
        currency=budget.currency,
        # Prices are USD; a budget in another currency is not compared.
        over_budget=budget.currency == "USD" and total > budget.amount,
        prices_date=catalog.prices_date,
        prices_source=catalog.prices_source,
        hours_in_month=HOURS_PER_MONTH,
        unpriced=[v.name for v in rows if not v.priced],
    )


def cost_table(cost: dict) -> str:
    """The plan's cost section, from the `costEstimate` stack output."""
    lines = [
        f"Estimated TPU cost per month of {cost['hoursInMonth']:g} hours "
        f"(prices of {cost['pricesDate']}, {cost['pricesSource']}):"
    ]
    header = (
        f"  {'TPU VM':<24} {'type':<14} {'chips':>5} {'model':<11} {'region':<12} {'$/chip-h':>9}"
        f" {'hours':>9} {'$/month':>11}"
    )
    lines.append(header)
    notes: list[str] = []
    lines += [_row(vm, notes) for vm in cost["vms"]]
    if cost.get("pools"):
        lines.append(f"  {'GKE slice pool':<24}   (TPU nodes at the Cloud TPU price; the cluster fee is not a TPU)")
        lines += [_row(pool, notes) for pool in cost["pools"]]
    total, on_demand = cost["monthlyTotal"], cost["onDemandTotal"]
    lines.append(f"  {'total':<24} {'':<14} {'':>5} {'':<11} {'':<12} {'':>9} {'':>9} {total:>11,.2f}")
    lines += [f"  [{i}] {note}" for i, note in enumerate(notes, 1)]
    if cost["unpriced"]:
        lines.append(f"  not in the total (no price in the source): {', '.join(cost['unpriced'])}")
    if on_demand > total:
        lines.append(f"  saving against on-demand: {on_demand - total:,.2f} USD/month ({1 - total / on_demand:.0%})")
    if cost["currency"] != "USD":
        lines.append(f"  budget: {cost['budget']:,.2f} {cost['currency']} (not compared: prices are USD)")
    else:
        state = "OVER BUDGET" if cost["overBudget"] else f"{total / cost['budget']:.0%} of it" if cost["budget"] else ""
        lines.append(f"  budget: {cost['budget']:,.2f} USD/month; estimate is {state}")
    return "\n".join(lines)


def _row(vm: dict, notes: list[str]) -> str:
    """One priced row of the table (a VM or a slice pool); its notes numbered into `notes`."""
    price = vm["pricePerChipHour"]
    marks = ""
    for note in vm["notes"]:
        notes.append(note)
        marks += f"[{len(notes)}]"
    hours = f"{'≤' if vm['hoursBasis'] == 'up to' else ''}{vm['hoursPerMonth']:.1f}"
    chips = f"{vm['chips']}" if vm["slices"] == 1 else f"{vm['slices']}×{vm['chips'] // vm['slices']}"
    return (
        f"  {vm['name']:<24} {vm['acceleratorType']:<14} {chips:>5} {vm['provisioning']:<11}"
        f" {vm['priceRegion']:<12} {'n/a' if price is None else f'{price:.4f}':>9} {hours:>9}"
        f" {vm['monthly']:>11,.2f} {marks}".rstrip()
    )
