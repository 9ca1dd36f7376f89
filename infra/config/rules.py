"""Rules across settings, checked once every value has been read on its own.

Each adds a problem (the plan stops) or a warning (the plan goes on) naming the key it is about.
These are the troubleshooting items of the seed guide, caught before anything is created: no TPU of
that type in the zone, a runtime that does not carry the pinned framework, a reclaimable TPU with
nowhere to checkpoint, and the names GCP would refuse or that would collide.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

from infra import naming
from infra.catalog import AcceleratorType, Generation, load_catalog
from infra.catalog.gke import GkeAcceleratorType, GkeGeneration, load_gke_catalog
from infra.config.model import (
    BUCKET_PURPOSES,
    PLATFORM_ACCOUNTS,
    PROJECT,
    GkeSettings,
    PlatformConfig,
    TpuVmSettings,
    WorkloadSettings,
    bucket_name,
    service_account_id,
)
from infra.config.settings import KMS_KEY, MIN_MAINTENANCE_HOURS_PER_32_DAYS
from infra.config.sources import image_problem, parse_image
from infra.goodput.interval import NO_EVENTS, PREEMPTIBLE_LIFE_HOURS, Losses, Rate, best_interval, waste
from infra.schema import MISSING, Problems

# Stands in for an accelerator type that was refused: the parse stops before anything reads it.
NO_ACCELERATOR = AcceleratorType(
    Generation("", "", "chips", (), frozenset(), 1, 1, 0.0, 0.0, False, "", "0.0.0", {}, (), {}, False, False, {}), 0
)
NO_GKE_ACCELERATOR = GkeAcceleratorType(
    GkeGeneration("", "", "chips", "", {1: ""}, (), {0: ""}, {}, (), 0.0, False, False), 0
)


def check(cfg: PlatformConfig, problems: Problems) -> None:
    _production(cfg, problems)
    _kms_location(cfg, problems)
    _tpu_vms(cfg, problems)
    _sources(cfg, problems)
    _automation(cfg, problems)
    _self_service(cfg, problems)
    _checkpoint_intervals(cfg, problems)
    _gke(cfg, problems)
    if cfg.name_prefix and not problems.items:
        _names(cfg, problems)


def _production(cfg: PlatformConfig, problems: Problems) -> None:
    if not cfg.production:
        return
    if not cfg.buckets.kms_key_name:
        problems.add(
            f"{PROJECT}:buckets.kmsKeyName", MISSING, "required when production is true (customer-managed encryption)"
        )
    if cfg.buckets.destroyable:
        problems.add(
            f"{PROJECT}:buckets.destroyable",
            sorted(cfg.buckets.destroyable),
            "must be empty when production is true: no production bucket is destroyable",
        )


def _kms_location(cfg: PlatformConfig, problems: Problems) -> None:
    key, location = cfg.buckets.kms_key_name, cfg.buckets.location
    match = re.fullmatch(KMS_KEY, key or "")
    if match and location and match["location"].upper() != location:
        problems.add(
            f"{PROJECT}:buckets.kmsKeyName",
            key,
            f"the key must be in the buckets' location {location.lower()}, not {match['location']}",
        )


def _sources(cfg: PlatformConfig, problems: Problems) -> None:
    """Images come from the stack's own repository, by digest unless the stack allows tags; the image
    repository takes the stack's key, which Artifact Registry needs in the repository's region."""
    for workload in cfg.workloads:
        ref = workload.source.image
        if workload.source.kind != "image" or not ref:
            continue
        key = f"{PROJECT}:workloads.{workload.name}.source.image"
        why = image_problem(
            ref, stack=cfg.stack, project=cfg.project, region=cfg.region, allow_tags=cfg.artifacts.allow_image_tags
        )
        image = parse_image(ref)
        if why:
            problems.add(key, ref, why)
        elif image is not None and image.tag:
            problems.warn(key, ref, "runs whatever the tag points to when the VM pulls it; pin it by @sha256 digest")
    match = re.fullmatch(KMS_KEY, cfg.buckets.kms_key_name or "")
    if match and cfg.region and match["location"] != cfg.region:
        problems.add(
            f"{PROJECT}:buckets.kmsKeyName",
            cfg.buckets.kms_key_name,
            f"the stack's image repository in {cfg.region} is encrypted with this key, which Artifact Registry "
            f"needs in the repository's region {cfg.region}, not {match['location']}",
        )


def _tpu_vms(cfg: PlatformConfig, problems: Problems) -> None:
    workloads = {w.name: w for w in cfg.workloads}
    names: set[str] = set()
    nodes: dict[str, str] = {}  # TPU node id -> the VM it is a node of (a multislice's are `<vm>-<i>`)
    for index, vm in enumerate(cfg.tpu_vms):
        key = f"{PROJECT}:tpuVms[{index}]"
        if vm.name and vm.name in names:
            problems.add(f"{key}.name", vm.name, "another TPU VM of this stack has this name")
        elif clash := sorted({nodes[n] for n in naming.node_ids(vm.name, vm.node_count) if n in nodes}):
            problems.add(f"{key}.name", vm.name, f"its TPU nodes' names are taken by TPU VM {', '.join(clash)}")
        names.add(vm.name)
        nodes.update(dict.fromkeys(naming.node_ids(vm.name, vm.node_count), vm.name))
        workload = workloads.get(vm.workload)
        already = any(p.key == f"{key}.workload" for p in problems.items)  # e.g. not set: said once
        if workload is None and workloads and not already:  # an empty name too: the reader accepts ""
            problems.add(f"{key}.workload", vm.workload, f"must be one of {', '.join(sorted(workloads))}")
        if workload:
            _against_catalog(key, vm, workload, problems)
        if vm.zone and cfg.network.subnets and cfg.network.cidr(vm.region) is None:
            problems.add(f"{key}.zone", vm.zone, f"add a subnet for {vm.region} under {PROJECT}:network.subnets")
        _capacity(cfg, key, vm, problems)
    if cfg.tpu_vms and not cfg.network.subnets:
        problems.add(f"{PROJECT}:network.subnets", MISSING, "TPU VMs need a subnet in their region")


def _capacity(cfg: PlatformConfig, key: str, vm: TpuVmSettings, problems: Problems) -> None:
    """capacity, reservationName, nodeCount, fallbackZones, flex-start and maxRunHours together."""
    if not vm.queued:
        queued_only = {
            "reservationName": (vm.reservation_name, "only a queued request names a reservation (TPU API v2)"),
            "nodeCount": (vm.node_count if vm.node_count > 1 else None, "a multislice is a queued request"),
            "fallbackZones": (list(vm.fallback_zones) or None, "a direct VM's zone is fixed; only a queued request "
                              "falls back to other zones"),
            "provisioning": ("flex-start" if vm.provisioning == "flex-start" else None,
                             "flex-start exists only for queued requests"),
        }  # fmt: skip
        for name, (value, why) in queued_only.items():
            if value:
                problems.add(f"{key}.{name}", value, f"{why}: set capacity: queued, or remove it")
    elif vm.provisioning == "preemptible":
        problems.add(
            f"{key}.provisioning",
            vm.provisioning,
            "a queued request takes on-demand, spot, reserved or flex-start (Spot replaced preemptible TPUs)",
        )
    if vm.queued:
        # A queued request's TPUs are deleted through the request (force=true deletes its nodes: tpu.v2
        # queuedResources.delete); the API has no stop for a request, and what stopping one of its nodes
        # does to it is documented nowhere. The guard and the schedules would stop a node by the name and
        # zone in the stack, which a request that fell back to another zone, or a multislice's `<vm>-<i>`
        # nodes, do not have. So only delete is offered (tools/smoke.py tries stop on a real one).
        why = "a queued request's TPUs cannot be stopped, only deleted with their request"
        if vm.on_completion == "stop":
            problems.add(f"{key}.onCompletion", "stop", f"{why}: use delete or keep")
        if vm.schedule is not None:
            problems.add(
                f"{key}.schedule",
                {"start": vm.schedule.start, "stop": vm.schedule.stop},
                f"{why}: remove the schedule, or use capacity: direct",
            )
    if vm.reservation_name and vm.queued:
        if vm.provisioning != "reserved":
            problems.add(f"{key}.reservationName", vm.reservation_name, "needs provisioning: reserved")
        if vm.fallback_zones:
            problems.add(
                f"{key}.reservationName",
                vm.reservation_name,
                f"a reservation belongs to one zone ({vm.zone}); remove fallbackZones {list(vm.fallback_zones)}",
            )
    flex = vm.provisioning == "flex-start"
    if flex and vm.run_duration_hours is None:
        problems.add(f"{key}.runDurationHours", MISSING, "flex-start needs how long the VM runs, in hours")
    if not flex and vm.run_duration_hours is not None:
        problems.add(f"{key}.runDurationHours", vm.run_duration_hours, "only provisioning: flex-start takes it")
    if vm.max_run_hours is not None:
        if vm.on_completion == "keep":
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                "bounds a run to completion: set onCompletion to stop or delete, or remove maxRunHours",
            )
        if vm.schedule is not None:
            # The guard measures a run from the node's createTime, which a scheduled stop and start keeps.
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                "counts from the node's creation, so a schedule's daily restarts would trip it: drop one of them",
            )
        if not cfg.automation.recovery_every_minutes:
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                f"is enforced by the guard's periodic check: set {PROJECT}:automation.recovery.everyMinutes",
            )
    for index, zone in enumerate(vm.fallback_zones):
        zone_key = f"{key}.fallbackZones[{index}]"
        region = zone.rsplit("-", 1)[0]
        if zone == vm.zone:
            problems.add(zone_key, zone, "is the VM's own zone, tried first anyway; list other zones")
        elif vm.accelerator is not NO_ACCELERATOR and (why := load_catalog().zone_problem(vm.accelerator, zone)):
            problems.add(zone_key, zone, why)
        elif cfg.network.subnets and cfg.network.cidr(region) is None:
            problems.add(zone_key, zone, f"add a subnet for {region} under {PROJECT}:network.subnets")
    if vm.accelerator is not NO_ACCELERATOR:
        why = load_catalog().capacity_problem(vm.accelerator, queued=vm.queued, node_count=vm.node_count, flex=flex)
        if why:
            problems.add(f"{key}.acceleratorType", vm.accelerator.name, why)
        elif flex and vm.queued:
            _flex_start_zones(key, vm, problems)


def _flex_start_zones(key: str, vm: TpuVmSettings, problems: Problems) -> None:
    """Flex-start is offered in a few zones per generation (the catalog's list, from Google's page)."""
    catalog = load_catalog()
    keys = [f"{key}.zone", *(f"{key}.fallbackZones[{i}]" for i in range(len(vm.fallback_zones)))]
    for zone_key, zone in zip(keys, vm.zones, strict=True):
        if catalog.zone_problem(vm.accelerator, zone):
            continue  # not offered there at all: said already
        if why := catalog.flex_start_problem(vm.accelerator, zone):
            problems.add(zone_key, zone, why)
        elif advice := catalog.flex_start_warning(vm.accelerator, zone):
            problems.warn(zone_key, zone, advice)


def _against_catalog(key: str, vm: TpuVmSettings, workload: WorkloadSettings, problems: Problems) -> None:
    catalog = load_catalog()
    if vm.reclaimable and workload.access("checkpoints") != "write":
        problems.add(
            f"{key}.provisioning",
            vm.provisioning,
            f"a {vm.provisioning} TPU can be reclaimed at any time: its workload '{workload.name}' needs "
            "write access to the checkpoints bucket to resume, or use on-demand",
        )
    accelerator = vm.accelerator
    if accelerator is NO_ACCELERATOR:
        return
    if vm.zone and (why := catalog.zone_problem(accelerator, vm.zone)):
        problems.add(f"{key}.zone", vm.zone, why)
    if vm.runtime_version and workload.program and workload.framework_version:
        why = catalog.runtime_problem(accelerator, vm.runtime_version, workload.framework, workload.framework_version)
        why = why or catalog.software_problem(vm.runtime_version, workload.framework, workload.framework_version)
        if why:
            problems.add(f"{key}.runtimeVersion", vm.runtime_version, why)
    need = workload.memory_gib_per_chip
    if need and (why := catalog.memory_problem(accelerator, need)):
        problems.add(f"{key}.acceleratorType", accelerator.name, f"workload '{workload.name}' {why}")
    if vm.self_service and accelerator.multi_host:
        # vm_agent/requests.py: only worker 0 takes requests; every host would have to run the program.
        problems.add(
            f"{key}.selfService",
            True,
            f"{accelerator.name} is a multi-host slice; self-service runs need a single-host TPU VM (for now)",
        )
    if vm.schedule and accelerator.multi_host:
        problems.add(
            f"{key}.schedule",
            {"start": vm.schedule.start, "stop": vm.schedule.stop},
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop or start; "
            "remove the schedule, or use a single-host type",
        )
    if vm.on_completion == "stop" and accelerator.multi_host:
        problems.add(
            f"{key}.onCompletion",
            "stop",
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop; use delete or keep",
        )
    if vm.on_completion != "keep" and workload.access("checkpoints") != "write":
        problems.add(
            f"{key}.onCompletion",
            vm.on_completion,
            f"a finished run is known by its completion marker in the checkpoints bucket; workload "
            f"'{workload.name}' needs write access to it",
        )
    if workload.batch_size and (advice := catalog.batch_warning(accelerator, workload.batch_size)):
        problems.warn(f"{PROJECT}:workloads.{workload.name}.batchSize", workload.batch_size, advice)


def _automation(cfg: PlatformConfig, problems: Problems) -> None:
    auto = cfg.automation
    if auto.budget_action and not cfg.budget.pubsub_topic:
        problems.add(
            f"{PROJECT}:automation.budgetAction",
            {"action": auto.budget_action},
            f"needs {PROJECT}:budget.pubsubTopic: true to hear the budget",
        )
    if auto.recovery_every_minutes and not any(vm.reclaimable or vm.max_run_hours for vm in cfg.tpu_vms):
        problems.warn(
            f"{PROJECT}:automation.recovery",
            {"everyMinutes": auto.recovery_every_minutes},
            "no spot or preemptible TPU VM to recover",
        )


def _self_service(cfg: PlatformConfig, problems: Problems) -> None:
    """Self-service runs: refused in production unless the stack opts in, in words, and then still warned.

    Production runs stay reviewed by default (issue 16): a run there is a PR. A team that shares
    production capacity on purpose says so with selfServiceInProduction, which every plan then repeats.
    """
    for index, vm in enumerate(cfg.tpu_vms):
        if not vm.self_service:
            continue
        key = f"{PROJECT}:tpuVms[{index}].selfService"
        if cfg.production and not cfg.self_service_in_production:
            problems.add(
                key,
                True,
                "production runs stay reviewed: remove selfService, or set "
                f"{PROJECT}:selfServiceInProduction: true to let researchers run unreviewed code on this VM",
            )
        elif cfg.production:
            problems.warn(key, True, "researchers may run unreviewed code on this production VM")
        if not cfg.researchers:
            problems.warn(key, True, f"nobody may submit: list people or groups under {PROJECT}:researchers")
    if cfg.self_service_in_production and not cfg.production:
        problems.warn(f"{PROJECT}:selfServiceInProduction", True, "has no effect: the stack is not production")
    if cfg.researcher_ssh and not cfg.researchers:
        problems.warn(f"{PROJECT}:researcherSsh", True, f"nobody is granted SSH: {PROJECT}:researchers is empty")


# "Far" from the best interval: twice or half of it wastes a quarter more than the best, (k + 1/k)/2 to
# first order (docs/goodput.md). With no best (nothing loses work), saves costing more than this share.
FAR_FROM_BEST, SAVES_SHARE = 2.0, 0.10


def _checkpoint_intervals(cfg: PlatformConfig, problems: Problems) -> None:
    """A built-in program's checkpoint interval against the one that wastes least on its VM
    (infra/goodput/interval.py). The stack knows the interval in steps and minutes; the step's and the
    save's seconds (stepSeconds, checkpointSeconds) give it in time, and a spot VM's record of
    preemptions (hoursBetweenPreemptions; a preemptible VM's 24 h life bounds it) gives the best. A
    workload with its own source keeps its interval in its command, which the plan does not read."""
    from infra.goodput.whatif import NOTICE_S  # the agent's grace period: infra.tpu imports this package

    workloads = {w.name: w for w in cfg.workloads}
    for index, vm in enumerate(cfg.tpu_vms):
        key = f"{PROJECT}:tpuVms[{index}].hoursBetweenPreemptions"
        hours = vm.hours_between_preemptions
        if hours is not None and not vm.reclaimable:
            problems.add(key, hours, f"only spot and preemptible VMs are preempted, not {vm.provisioning}")
            continue
        if hours is not None and vm.provisioning == "preemptible" and hours > PREEMPTIBLE_LIFE_HOURS:
            problems.add(key, hours, f"a preemptible TPU lives at most {PREEMPTIBLE_LIFE_HOURS:g} hours")
            continue
        workload = workloads.get(vm.workload)
        if not workload or not workload.program or not workload.step_seconds or not workload.checkpoint_seconds:
            continue
        advice = _interval_advice(vm, workload, NOTICE_S)
        if advice:
            problems.warn(
                f"{PROJECT}:workloads.{workload.name}.checkpointEverySteps", workload.checkpoint_every_steps, advice
            )


def _interval_advice(vm: TpuVmSettings, workload: WorkloadSettings, notice_s: float) -> str | None:
    step_s, save_s = workload.step_seconds or 0.0, workload.checkpoint_seconds or 0.0
    interval = min(workload.checkpoint_every_steps * step_s, 60 * workload.checkpoint_every_minutes)
    capped = " (checkpointEveryMinutes caps it)" if interval < workload.checkpoint_every_steps * step_s else ""
    yours = f"checkpoints every {interval:.4g} s of steps{capped}"
    hours = vm.hours_between_preemptions
    if vm.provisioning == "preemptible" and hours is None:
        hours = PREEMPTIBLE_LIFE_HOURS  # at most: a shorter mean only makes the best interval shorter
    losses = Losses(Rate.every(hours) if vm.reclaimable and hours else NO_EVENTS, NO_EVENTS, notice_s, save_s)
    on = f"on {vm.provisioning} VM '{vm.name}'"
    if vm.reclaimable and not losses.fits and hours is None:
        return (
            f"{on}: a checkpoint commits in {save_s:g} s, longer than the {notice_s:g} s notice, so a preemption "
            f"loses the work since the last one (up to {interval:.4g} s); set tpuVms[].hoursBetweenPreemptions to "
            "check the interval against the one that wastes least"
        )
    best = best_interval(save_s, losses)
    if best.seconds is None:
        share = save_s / interval
        if share <= SAVES_SHARE:
            return None
        why = (
            f"a checkpoint commits in {save_s:g} s, within the {notice_s:g} s notice, so a preemption's save on "
            "SIGTERM keeps its work"
            if vm.reclaimable
            else f"nothing preempts {vm.provisioning} VMs"
        )
        return (
            f"{on}: {yours}, each stalling training {save_s:g} s: saves take {share:.0%} of it. As {why}, "
            "periodic checkpoints only insure against losses without notice: checkpoint less often"
        )
    ratio = interval / best.seconds
    if 1 / FAR_FROM_BEST <= ratio <= FAR_FROM_BEST:
        return None
    steps = max(1, round(best.seconds / step_s))
    minutes = "" if best.seconds <= 60 * workload.checkpoint_every_minutes else (
        f" and checkpointEveryMinutes ≥ {best.seconds / 60:.3g}"
    )  # fmt: skip
    return (
        f"{on}: {yours}, {ratio:.2g}× the interval that wastes least, as {best.why}. Saves and "
        f"lost work would take {waste(interval, save_s, losses):.1%} of training, "
        f"{waste(best.seconds, save_s, losses):.1%} at checkpointEverySteps {steps}{minutes}"
    )


def _gke(cfg: PlatformConfig, problems: Problems) -> None:
    """The GKE engine's cluster and slice pools, against each other, the network and the GKE catalog."""
    gke = cfg.gke
    if gke is None:
        return
    key = f"{PROJECT}:gke"
    if not gke.slice_pools and not any(p.key.startswith(f"{key}.slicePools") for p in problems.items):
        problems.add(
            f"{key}.slicePools", [], "declare at least one slice pool: a cluster without TPUs costs money for nothing"
        )
    ranges = {"nodeCidr": gke.node_cidr, "podCidr": gke.pod_cidr, "serviceCidr": gke.service_cidr}
    taken = [(f"{PROJECT}:network.subnets.{r}", c) for r, c in cfg.network.subnets]
    for name, cidr in ranges.items():
        network = _network(cidr)
        if network is None:
            continue  # refused by the reader
        clash = next((k for k, c in taken if (other := _network(c)) is not None and other.overlaps(network)), None)
        if clash:
            problems.add(f"{key}.{name}", cidr, f"overlaps {clash}; the cluster's ranges need their own addresses")
        taken.append((f"{key}.{name}", cidr))
    window = gke.maintenance
    if len(set(window.days)) != len(window.days):
        problems.add(f"{key}.maintenanceWindow.days", list(window.days), "list each day once")
    elif window.days and window.hours and 4 * len(window.days) * window.hours < MIN_MAINTENANCE_HOURS_PER_32_DAYS:
        # Four weeks fit in any 32 days: the window's hours in them are the least GKE can count.
        problems.add(
            f"{key}.maintenanceWindow",
            {"days": list(window.days), "hours": window.hours},
            f"GKE needs a window open at least {MIN_MAINTENANCE_HOURS_PER_32_DAYS} hours in any 32 days; this one "
            f"is open {4 * len(window.days) * window.hours}: add days or hours",
        )
    catalog = load_gke_catalog()
    names: set[str] = set()
    for index, pool in enumerate(gke.slice_pools):
        pool_key = f"{key}.slicePools[{index}]"
        if pool.name and pool.name in names:
            problems.add(f"{pool_key}.name", pool.name, "another slice pool of this stack has this name")
        names.add(pool.name)
        if pool.zone and pool.region != gke.region:
            problems.add(
                f"{pool_key}.zone",
                pool.zone,
                f"is not in the cluster's region {gke.region}: use a zone of {gke.region}, or set {key}.region",
            )
        elif (
            pool.zone
            and pool.accelerator is not NO_GKE_ACCELERATOR
            and (why := catalog.zone_problem(pool.accelerator, pool.zone))
        ):
            problems.add(f"{pool_key}.zone", pool.zone, why)
        reserved, flex = pool.provisioning == "reserved", pool.provisioning == "flex-start"
        if reserved and not pool.reservation_name:
            problems.add(f"{pool_key}.reservationName", MISSING, "a reserved pool names the reservation it consumes")
        if pool.reservation_name and not reserved:
            problems.add(f"{pool_key}.reservationName", pool.reservation_name, "needs provisioning: reserved")
        if pool.run_duration_hours is not None and not flex:
            problems.add(
                f"{pool_key}.runDurationHours", pool.run_duration_hours, "only provisioning: flex-start takes it"
            )
        if (
            flex
            and pool.accelerator is not NO_GKE_ACCELERATOR
            and (why := catalog.flex_start_problem(pool.accelerator))
        ):
            problems.add(f"{pool_key}.provisioning", pool.provisioning, why)
    _teams(gke, problems)


def _teams(gke: GkeSettings, problems: Problems) -> None:
    """Teams against each other and the slice pools: a guarantee is whole slices of pools the stack has,
    and the teams' guarantees in a pool shape add up to at most the chips its pools hold."""
    from infra.gke import queues  # here: infra.gke reads this package's model (an import cycle)
    from infra.gke.specs import shape_of

    key = f"{PROJECT}:gke.teams"
    shapes = {p.name: shape_of(p) for p in gke.slice_pools if p.accelerator is not NO_GKE_ACCELERATOR}
    refused = {p.name for p in gke.slice_pools} - set(shapes)  # their own problems say why
    names: set[str] = set()
    namespaces: set[str] = set()
    promised: dict[str, int] = {}
    for index, team in enumerate(gke.teams):
        team_key = f"{key}[{index}]"
        if team.name and team.name in names:
            problems.add(f"{team_key}.name", team.name, "another team of this stack has this name")
        elif team.namespace in namespaces:
            problems.add(f"{team_key}.namespace", team.namespace, "another team of this stack has this namespace")
        names.add(team.name)
        namespaces.add(team.namespace)
        if not team.members and not any(p.key.startswith(f"{team_key}.members") for p in problems.items):
            problems.add(f"{team_key}.members", [], "list at least one user: or group: who runs the team's jobs")
        groups = [m for m in team.members if m.startswith("group:")]
        if groups and not gke.rbac_security_group:
            problems.add(
                f"{team_key}.members",
                groups,
                f"GKE resolves groups in RBAC only with Google Groups for RBAC: set {PROJECT}:gke.rbacSecurityGroup "
                "to gke-security-groups@YOUR_DOMAIN (and nest the team's group in it), or list users",
            )
        guaranteed = []  # the team's guarantees that are each right: what the pools' total is checked with
        for pool, chips in team.nominal_chips:
            chips_key = f"{team_key}.nominalChips.{pool}"
            shape = shapes.get(pool)
            if pool in refused:
                continue
            if shape is None:
                pools = ", ".join(shapes) or "none"
                problems.add(chips_key, chips, f"names no slice pool of this stack (its pools: {pools})")
            elif chips % shape.chips_per_slice:
                problems.add(
                    chips_key,
                    chips,
                    f"a job takes whole slices: a multiple of {shape.chips_per_slice} chips (one {pool} slice)",
                )
            elif chips > shape.chips:
                problems.add(chips_key, chips, f"pool {pool} holds {shape.chips} chips")
            else:
                guaranteed.append((pool, chips))
        for flavor, chips in queues.nominal_by_flavor(replace(team, nominal_chips=tuple(guaranteed)), shapes).items():
            promised[flavor] = promised.get(flavor, 0) + chips
    for flavor in queues.flavors(shapes.values()):
        if promised.get(flavor.name, 0) > flavor.chips:
            pools = [name for name, s in shapes.items() if queues.flavor_name(s.node_labels) == flavor.name]
            problems.add(
                f"{key}[].nominalChips",
                {p: [c for t in gke.teams for n, c in t.nominal_chips if n == p] for p in pools},
                f"the teams are guaranteed {promised[flavor.name]} chips of {flavor.name} (pools "
                f"{', '.join(pools)}), which hold {flavor.chips}: a guarantee is chips that exist",
            )


def _network(cidr: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(cidr)
    except ValueError:
        return None


def _names(cfg: PlatformConfig, problems: Problems) -> None:
    for purpose in BUCKET_PURPOSES:
        name = bucket_name(cfg.name_prefix, cfg.stack, purpose)
        if why := naming.bucket_name_problem(name):
            problems.add(f"{PROJECT}:namePrefix", cfg.name_prefix, f"gives bucket name '{name}', which needs {why}")
            break
    platform = {service_account_id(p, cfg.stack): p for p in PLATFORM_ACCOUNTS}
    reserved = (*PLATFORM_ACCOUNTS, "deployer")  # and the name of CI's deploy identity, to avoid confusion
    for w in cfg.workloads:
        account = service_account_id(w.name, cfg.stack)
        if why := naming.service_account_id_problem(account):
            problems.add(
                f"{PROJECT}:workloads.{w.name}", w.name, f"gives service account id '{account}', which needs {why}"
            )
        elif account in platform or w.name in reserved:
            problems.add(
                f"{PROJECT}:workloads.{w.name}",
                w.name,
                f"is reserved: the platform's own service accounts are named after "
                f"{', '.join(reserved)} (this one would be '{account}')",
            )
