"""Rules across settings, checked once every value has been read on its own.

Each adds a problem (the plan stops) or a warning (the plan goes on) naming the key it is about.
These are the usual troubleshooting items of a hand-run TPU, caught before anything is created: no TPU of
that type in the zone, a runtime that does not carry the pinned framework, a reclaimable TPU with
nowhere to checkpoint, and the names GCP would refuse or that would collide.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Callable, Iterable, Iterator

from infra import naming
from infra.catalog import AcceleratorType, load_catalog
from infra.catalog.gke import load_gke_catalog
from infra.config.model import (
    BUCKET_PURPOSES,
    KMS_KEY,
    MIN_MAINTENANCE_HOURS_PER_32_DAYS,
    NO_ACCELERATOR,
    NO_GKE_ACCELERATOR,
    ON_COMPLETION,
    PLATFORM_ACCOUNTS,
    PROJECT,
    GkeSettings,
    PlatformConfig,
    Recovery,
    TpuVmSettings,
    WorkloadSettings,
    bucket_name,
    service_account_id,
)
from infra.config.problems import MISSING, REMOVE, Fix, Problems, item_keys
from infra.config.workload_code import image_problem, parse_image, rebased_image
from infra.goodput.interval import NO_EVENTS, PREEMPTIBLE_LIFE_HOURS, Losses, Rate, best_interval, waste


def check(cfg: PlatformConfig, problems: Problems) -> None:
    _deployer(cfg, problems)
    _production(cfg, problems)
    _kms_location(cfg, problems)
    _tpu_vms(cfg, problems)
    _sources(cfg, problems)
    _automation(cfg, problems)
    _self_service(cfg, problems)
    _egress(cfg, problems)
    _tensorflow_pods(cfg, problems)
    _checkpoint_intervals(cfg, problems)
    _gke(cfg, problems)
    if cfg.name_prefix and not problems.items:
        _names(cfg, problems)


def _vms(cfg: PlatformConfig) -> Iterator[tuple[TpuVmSettings, str]]:
    """Each TPU VM with its key (`tpu-platform:tpuVms[mnist]`)."""
    return zip(cfg.tpu_vms, item_keys(f"{PROJECT}:tpuVms", cfg.tpu_vms), strict=True)


def _deployer(cfg: PlatformConfig, problems: Problems) -> None:
    """A copied stack file keeps the deployer of the stack it was copied from. The bootstrap makes one
    deployer per environment, tpu-deployer-<stack> in its admin project (bootstrap/program.py), and the
    policy pack lets only that account hold its stack's grants: said once here, on the key, not as a
    policy violation on each grant."""
    account, _, domain = cfg.deployer.partition("@")
    expected = naming.deployer_account_id(cfg.stack)
    if account.startswith(naming.deployer_account_id("")) and account != expected:
        problems.add(
            f"{PROJECT}:deployer",
            cfg.deployer,
            f"is the deployer of stack '{account.removeprefix(naming.deployer_account_id(''))}' (a copied stack "
            f"file?); the bootstrap's deployer of stack '{cfg.stack}' is {expected}@{domain} (its "
            "deployServiceAccounts output)",
            fixes=[Fix.of({f"{PROJECT}:deployer": f"{expected}@{domain}"})],
        )


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
            fixes=[Fix.of({f"{PROJECT}:buckets.destroyable": REMOVE})],
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
            fixes = []
            if image is not None and image.tag and not cfg.artifacts.allow_image_tags:
                fixes.append(Fix.of({f"{PROJECT}:artifacts.allowImageTags": True}))
            if (
                image is not None
                and (ours := rebased_image(image, stack=cfg.stack, project=cfg.project, region=cfg.region)) != ref
            ):
                fixes.append(Fix.of({key: ours}))
            problems.add(key, ref, why, fixes=fixes)
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
    # A workload's new pin moves every VM running it: worked out once per workload and version, as a
    # fleet's VMs share their workload.
    pin = functools.cache(lambda name, version: _pin(cfg, workloads[name], version))
    names: set[str] = set()
    nodes: dict[str, str] = {}  # TPU node id -> the VM it is a node of (a multislice's are `<vm>-<i>`)
    for vm, key in _vms(cfg):
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
            _against_catalog(key, vm, workload, problems, pin)
        if vm.zone and cfg.network.subnets and cfg.network.cidr(vm.region) is None:
            why = f"{vm.region} has no subnet under {PROJECT}:network.subnets"
            problems.add(f"{key}.zone", vm.zone, why, fixes=_subnets(cfg, [vm.region]))
        _capacity(cfg, key, vm, problems)
        _start_only(key, vm, problems)
    if cfg.tpu_vms and not cfg.network.subnets:
        regions = sorted({vm.region for vm in cfg.tpu_vms if vm.zone})
        problems.add(
            f"{PROJECT}:network.subnets", MISSING, "TPU VMs need a subnet in their region", fixes=_subnets(cfg, regions)
        )


def _start_only(key: str, vm: TpuVmSettings, problems: Problems) -> None:
    """A schedule that only starts a VM needs something else to stop it. A TPU VM is created running
    (tpu.v2 Node.state: a node "has been created" when READY; create has no stopped state), so the
    scheduled start serves a VM that is stopped between runs: with onCompletion stop (or delete) each
    run ends it, and the next start boots the stack's next run (never a finished one: the guard checks).
    With keep, nothing would stop it: from its first start it runs, and bills, every hour."""
    schedule = vm.schedule
    if schedule and schedule.start and not schedule.stop and vm.on_completion == "keep":
        problems.add(
            f"{key}.schedule",
            schedule.given,
            "only starts it, and with onCompletion keep nothing stops it: it would run, and bill, every hour from "
            "its first start",
            fixes=[Fix.of({f"{key}.onCompletion": "stop"}), Fix.of({f"{key}.schedule": REMOVE})],
            advice="give it a stop too",
        )


def _subnets(cfg: PlatformConfig, regions: list[str]) -> Iterator[Fix]:
    """A subnet for each of `regions`, in private ranges the stack does not use yet, as large as its first."""
    taken = [cidr for _, cidr in cfg.network.subnets]
    if cfg.gke:
        taken += [cfg.gke.node_cidr, cfg.gke.pod_cidr, cfg.gke.service_cidr]
    first = _network(taken[0]) if taken else None
    edits: dict[str, object] = {}
    for region in regions:
        cidr = free_cidr(taken, first.prefixlen if first else 20)
        if cidr is None:
            return
        edits[f"{PROJECT}:network.subnets.{region}"] = cidr
        taken.append(cidr)
    if edits:
        yield Fix.of(edits)


def free_cidr(taken: Iterable[str], prefix: int) -> str | None:
    """The first /`prefix` range of 10.0.0.0/8 that overlaps none of `taken` (ranges the stack uses)."""
    used = [n for n in map(_network, taken) if n is not None]
    for candidate in ipaddress.ip_network("10.0.0.0/8").subnets(new_prefix=prefix):
        if not any(candidate.overlaps(u) for u in used):
            return str(candidate)
    return None


def _capacity(cfg: PlatformConfig, key: str, vm: TpuVmSettings, problems: Problems) -> None:
    """capacity, reservationName, nodeCount, fallbackZones, flex-start and maxRunHours together."""
    if not vm.queued:
        queued_only = {
            "reservationName": (vm.reservation_name, "only a queued request names a reservation (TPU API v2)"),
            "nodeCount": (vm.node_count if vm.node_count > 1 else None, "a multislice is a queued request"),
            "fallbackZones": (
                list(vm.fallback_zones) or None,
                "a direct VM's zone is fixed; only a queued request falls back to other zones",
            ),
            "provisioning": (
                "flex-start" if vm.provisioning == "flex-start" else None,
                "flex-start exists only for queued requests",
            ),
        }
        for name, (value, why) in queued_only.items():
            if value:
                # Without flex-start, its runDurationHours goes too.
                gone = (name, "runDurationHours") if name == "provisioning" else (name,)
                problems.add(
                    f"{key}.{name}",
                    value,
                    why,
                    fixes=[Fix.of({f"{key}.capacity": "queued"}), Fix.of({f"{key}.{n}": REMOVE for n in gone})],
                )
    elif vm.provisioning == "preemptible":
        problems.add(
            f"{key}.provisioning",
            vm.provisioning,
            "a queued request takes on-demand, spot, reserved or flex-start (Spot replaced preemptible TPUs)",
            fixes=[Fix.of({f"{key}.provisioning": "spot"})],
        )
    if vm.queued:
        # A queued request's TPUs are deleted through the request (force=true deletes its nodes: tpu.v2
        # queuedResources.delete); the API has no stop for a request, and what stopping one of its nodes
        # does to it is documented nowhere. The guard and the schedules would stop a node by the name and
        # zone in the stack, which a request that fell back to another zone, or a multislice's `<vm>-<i>`
        # nodes, do not have. So only delete is offered (tools/smoke.py tries stop on a real one).
        why = "a queued request's TPUs cannot be stopped, only deleted with their request"
        if vm.on_completion == "stop":
            problems.add(
                f"{key}.onCompletion", "stop", why, fixes=_other_choices(f"{key}.onCompletion", ON_COMPLETION, "stop")
            )
        if vm.schedule is not None:
            problems.add(
                f"{key}.schedule",
                vm.schedule.given,
                why,
                fixes=[Fix.of({f"{key}.schedule": REMOVE}), Fix.of({f"{key}.capacity": "direct"})],
            )
    _only_with_their_provisioning(key, vm.provisioning, vm.reservation_name if vm.queued else "", None, problems)
    if vm.reservation_name and vm.queued and vm.fallback_zones:
        problems.add(
            f"{key}.reservationName",
            vm.reservation_name,
            f"a reservation belongs to one zone ({vm.zone}), so a request for it falls back nowhere",
            fixes=[Fix.of({f"{key}.fallbackZones": REMOVE})],
        )
    flex = vm.provisioning == "flex-start"
    if flex and vm.run_duration_hours is None:
        problems.add(f"{key}.runDurationHours", MISSING, "flex-start needs how long the VM runs, in hours")
    _only_with_their_provisioning(key, vm.provisioning, "", vm.run_duration_hours, problems)
    if vm.max_run_hours is not None:
        drop = Fix.of({f"{key}.maxRunHours": REMOVE})
        if vm.on_completion == "keep":
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                "bounds a run to completion, which keep never ends",
                fixes=[*_other_choices(f"{key}.onCompletion", ON_COMPLETION, "keep"), drop],
            )
        if vm.schedule is not None:
            # The guard measures a run from the node's createTime, which a scheduled stop and start keeps.
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                "counts from the node's creation, so a schedule's daily restarts would trip it",
                fixes=[drop, Fix.of({f"{key}.schedule": REMOVE})],
            )
        if not cfg.automation.recovery.every_minutes:
            every = f"{PROJECT}:automation.recovery.everyMinutes"
            problems.add(
                f"{key}.maxRunHours",
                vm.max_run_hours,
                "is enforced by the guard's periodic check",
                fixes=[Fix.of({every: v}) for v in (Recovery.model_fields["every_minutes"].examples or [])[:1]],
            )
    for index, zone in enumerate(vm.fallback_zones):
        zone_key = f"{key}.fallbackZones[{index}]"
        region = zone.rsplit("-", 1)[0]
        if zone == vm.zone:
            others = [z for z in vm.fallback_zones if z != zone]
            problems.add(
                zone_key,
                zone,
                "is the VM's own zone, tried first anyway; list other zones",
                fixes=[Fix.of({f"{key}.fallbackZones": others or REMOVE})],
            )
        elif vm.accelerator is not NO_ACCELERATOR and (why := load_catalog().zone_problem(vm.accelerator, zone)):
            problems.add(zone_key, zone, why)
        elif cfg.network.subnets and cfg.network.cidr(region) is None:
            problems.add(
                zone_key, zone, f"{region} has no subnet under {PROJECT}:network.subnets", fixes=_subnets(cfg, [region])
            )
    if vm.accelerator is not NO_ACCELERATOR:
        why = load_catalog().capacity_problem(vm.accelerator, queued=vm.queued, node_count=vm.node_count, flex=flex)
        if why:
            problems.add(f"{key}.acceleratorType", vm.accelerator.name, why)
        elif flex and vm.queued:
            _flex_start_zones(key, vm, problems)


def _only_with_their_provisioning(
    key: str, provisioning: str, reservation: str, run_hours: float | None, problems: Problems
) -> None:
    """A reservation's name only with reserved capacity, a run's duration only with flex-start (a TPU VM's and a
    GKE slice pool's alike)."""
    if reservation and provisioning != "reserved":
        problems.add(
            f"{key}.reservationName",
            reservation,
            "only provisioning: reserved takes it",
            fixes=[Fix.of({f"{key}.provisioning": "reserved"}), Fix.of({f"{key}.reservationName": REMOVE})],
        )
    if run_hours is not None and provisioning != "flex-start":
        problems.add(
            f"{key}.runDurationHours",
            run_hours,
            "only provisioning: flex-start takes it",
            fixes=[Fix.of({f"{key}.runDurationHours": REMOVE})],
        )


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


def _other_choices(key: str, choices: Iterable[str], current: str) -> list[Fix]:
    """Each other value a setting takes, as a fix (the reader keeps those that lead to no other error)."""
    return [Fix.of({key: choice}) for choice in choices if choice != current]


def _checkpoint_writes(workload: WorkloadSettings) -> Fix:
    return Fix.of({f"{PROJECT}:workloads.{workload.name}.bucketAccess.checkpoints": "write"})


def _against_catalog(key: str, vm: TpuVmSettings, workload: WorkloadSettings, problems: Problems, pin: Pin) -> None:
    catalog = load_catalog()
    if vm.reclaimable and workload.access("checkpoints") != "write":
        problems.add(
            f"{key}.provisioning",
            vm.provisioning,
            f"a {vm.provisioning} TPU can be reclaimed at any time: its workload '{workload.name}' needs "
            "write access to the checkpoints bucket to resume",
            fixes=[_checkpoint_writes(workload), Fix.of({f"{key}.provisioning": "on-demand"})],
        )
    if vm.runtime_version and (why := catalog.agent_problem(vm.runtime_version)):
        problems.add(f"{key}.runtimeVersion", vm.runtime_version, why)
    accelerator = vm.accelerator
    if accelerator is NO_ACCELERATOR:
        return
    if vm.zone and (why := catalog.zone_problem(accelerator, vm.zone)):
        problems.add(f"{key}.zone", vm.zone, why)
    if vm.runtime_version and workload.program and workload.framework_version:
        why = catalog.runtime_problem(accelerator, vm.runtime_version, workload.framework, workload.framework_version)
        image = catalog.software_problem(vm.runtime_version, workload.framework, workload.framework_version)
        if why or image:
            problems.add(
                f"{key}.runtimeVersion",
                vm.runtime_version,
                why or str(image),
                fixes=_runtime_fixes(key, vm, workload, pin),
                advice="" if why else "use a TPU generation with a newer runtime image",
            )
    need = workload.memory_gib_per_chip
    if need and (why := catalog.memory_problem(accelerator, need)):
        problems.add(f"{key}.acceleratorType", accelerator.name, f"workload '{workload.name}' {why}")
    if vm.self_service and accelerator.multi_host:
        # vm_agent/run_requests.py: only worker 0 takes requests; every host would have to run the program.
        problems.add(
            f"{key}.selfService",
            True,
            f"{accelerator.name} is a multi-host slice; self-service runs need a single-host TPU VM (for now)",
        )
    if vm.schedule and accelerator.multi_host:
        problems.add(
            f"{key}.schedule",
            vm.schedule.given,
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop or start",
            fixes=[Fix.of({f"{key}.schedule": REMOVE}), *_single_host(key, vm, workload)],
        )
    if vm.on_completion == "stop" and accelerator.multi_host:
        problems.add(
            f"{key}.onCompletion",
            "stop",
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop",
            fixes=_other_choices(f"{key}.onCompletion", ON_COMPLETION, "stop"),
        )
    if vm.on_completion != "keep" and workload.access("checkpoints") != "write":
        problems.add(
            f"{key}.onCompletion",
            vm.on_completion,
            f"a finished run is known by its completion marker in the checkpoints bucket; workload "
            f"'{workload.name}' needs write access to it",
            fixes=[_checkpoint_writes(workload), Fix.of({f"{key}.onCompletion": "keep"})],
        )
    if workload.batch_size and (advice := catalog.batch_warning(accelerator, workload.batch_size)):
        batch_key = f"{PROJECT}:workloads.{workload.name}.batchSize"
        fixes = [Fix.of({batch_key: size}) for size in catalog.even_batch_sizes(accelerator, workload.batch_size)]
        problems.warn(batch_key, workload.batch_size, advice, fixes=fixes)


Pin = Callable[[str, str], dict[str, object] | None]  # (workload, version) -> _pin's edits


def _runtime_fixes(key: str, vm: TpuVmSettings, workload: WorkloadSettings, pin: Pin) -> Iterator[Fix]:
    """Each runtime and framework version the catalog says would run the workload on this VM, as a change:
    the VM's runtime, and a new pin of the workload with a fitting runtime on every other VM running it."""
    own = f"{key}.runtimeVersion"
    for runtime, version in load_catalog().runtime_choices(
        vm.accelerator, vm.runtime_version, workload.framework, workload.framework_version
    ):
        pinned = {} if version == workload.framework_version else pin(workload.name, version)
        if pinned is not None:
            others = {path: value for path, value in pinned.items() if path != own}
            yield Fix.of({**others, **({own: runtime} if runtime != vm.runtime_version else {})})


def _pin(cfg: PlatformConfig, workload: WorkloadSettings, version: str) -> dict[str, object] | None:
    """The workload pinned to `version`, with each VM running it on the runtime for that version
    (TensorFlow's runtime carries it; JAX's does not change); None when a VM's type takes no such runtime."""
    edits: dict[str, object] = {f"{PROJECT}:workloads.{workload.name}.frameworkVersion": version}
    for vm, key in _vms(cfg):
        if vm.workload != workload.name or vm.accelerator is NO_ACCELERATOR:
            continue
        if workload.framework == "tensorflow":
            runtime = load_catalog().tf_runtime(vm.accelerator, version)
            if runtime is None:
                return None
            if runtime != vm.runtime_version:
                edits[f"{key}.runtimeVersion"] = runtime
    return edits


def _single_host(key: str, vm: TpuVmSettings, workload: WorkloadSettings) -> list[Fix]:
    """The largest single-host type of the VM's generation, on a runtime that runs its workload there."""
    generation, catalog = vm.accelerator.generation, load_catalog()
    if not generation.single_host:
        return []
    single = AcceleratorType(generation, max(generation.single_host))
    edits: dict[str, object] = {f"{key}.acceleratorType": single.name}
    framework, version = workload.framework, workload.framework_version
    if workload.program and version and catalog.runtime_problem(single, vm.runtime_version, framework, version):
        choices = catalog.runtime_choices(single, vm.runtime_version, framework, version)
        runtimes = [runtime for runtime, same in choices if same == version]
        if not runtimes:
            return []
        edits[f"{key}.runtimeVersion"] = runtimes[0]
    return [Fix.of(edits)]


def _automation(cfg: PlatformConfig, problems: Problems) -> None:
    auto = cfg.automation
    if auto.budget_action.action and not cfg.budget.pubsub_topic:
        problems.add(
            f"{PROJECT}:automation.budgetAction",
            {"action": auto.budget_action.action},
            "hears the budget through its Pub/Sub topic",
            fixes=[Fix.of({f"{PROJECT}:budget.pubsubTopic": True})],
        )
    if auto.recovery.every_minutes and not any(vm.reclaimable or vm.max_run_hours for vm in cfg.tpu_vms):
        problems.warn(
            f"{PROJECT}:automation.recovery",
            {"everyMinutes": auto.recovery.every_minutes},
            "no spot or preemptible TPU VM to recover",
        )


MAX_RESEARCHERS = 28


def _tensorflow_pods(cfg: PlatformConfig, problems: Problems) -> None:
    """A TensorFlow pod runtime (`TPU_NAME` in its environment): TPUClusterResolver asks the TPU API for the
    slice's workers with the run's credentials, which the agent narrows to the run's Cloud Storage objects
    (vm_agent/credentials.py; "Other Google Cloud services don't support this feature"): such a run cannot
    find its workers until the agent serves them. Warned in every plan; self-service refuses multi-host."""
    catalog = load_catalog()
    for vm, key in _vms(cfg):
        if any(name == "TPU_NAME" for name, _ in catalog.runtime_environment(vm.runtime_version, vm.name)):
            problems.warn(
                f"{key}.runtimeVersion",
                vm.runtime_version,
                "TensorFlow's pod runtime resolves its workers through the TPU API (TPU_NAME), which a run's "
                "credentials cannot call (each run's token reaches only its own Cloud Storage objects): the run "
                "cannot start its slice; use a JAX runtime for a multi-host slice",
            )


def _egress(cfg: PlatformConfig, problems: Problems) -> None:
    """`egress: google-only` says, in every plan, what it cannot do (infra/network.py)."""
    if cfg.network.egress != "google-only":
        return
    problems.warn(
        f"{PROJECT}:network.egress",
        "google-only",
        "TPU VMs reach Google APIs (private.googleapis.com), their job's hosts and the metadata server only; a "
        "package index by name (pypi.org) needs Cloud NGFW's FQDN objects, and VPC Service Controls "
        "(restricted.googleapis.com, a perimeter) is the stronger option: neither is made by this stack",
    )


def _self_service(cfg: PlatformConfig, problems: Problems) -> None:
    """Self-service runs: refused in production unless the stack opts in, in words, and then still warned.

    Production runs stay reviewed by default: a run there is a PR. A team that shares
    production capacity on purpose says so with selfServiceInProduction, which every plan then repeats.
    """
    for vm, vm_key in _vms(cfg):
        if not vm.self_service:
            continue
        key = f"{vm_key}.selfService"
        if cfg.production and not cfg.self_service_in_production:
            problems.add(
                key,
                True,
                "production runs stay reviewed, unless the stack lets researchers run unreviewed code on "
                "production VMs",
                fixes=[Fix.of({key: REMOVE}), Fix.of({f"{PROJECT}:selfServiceInProduction": True})],
            )
        elif cfg.production:
            problems.warn(key, True, "researchers may run unreviewed code on this production VM")
        if not cfg.researchers:
            problems.warn(key, True, f"nobody may submit: list people or groups under {PROJECT}:researchers")
    if cfg.self_service_in_production and not cfg.production:
        problems.warn(f"{PROJECT}:selfServiceInProduction", True, "has no effect: the stack is not production")
    # Each researcher reads their runs' logs through a log view of their own on the _Default log bucket,
    # which takes "a maximum of 30 log views" (Logging, "Configure log views on a log bucket"), two of them
    # Logging's own (_AllLogs, _Default).
    if cfg.self_service_vms and len(cfg.researchers) > MAX_RESEARCHERS:
        problems.add(
            f"{PROJECT}:researchers",
            len(cfg.researchers),
            f"at most {MAX_RESEARCHERS} members (a log view each on the _Default log bucket, which holds "
            "30, two of them Logging's own): name groups instead of people",
        )
    # A self-service VM has an account of its own (infra/researchers.py): no workload's may take its name.
    accounts = {naming.self_service_account_id(vm.name, cfg.stack): vm.name for vm in cfg.self_service_vms}
    for w in cfg.workloads:
        if service_account_id(w.name, cfg.stack) in accounts:
            problems.add(
                f"{PROJECT}:workloads.{w.name}",
                w.name,
                f"gives the account id of self-service VM {accounts[service_account_id(w.name, cfg.stack)]}'s "
                "own account: rename the workload",
            )
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
    for vm, vm_key in _vms(cfg):
        key = f"{vm_key}.hoursBetweenPreemptions"
        hours = vm.hours_between_preemptions
        if hours is not None and not vm.reclaimable:
            problems.add(
                key,
                hours,
                f"only spot and preemptible VMs are preempted, not {vm.provisioning}",
                fixes=[Fix.of({key: REMOVE})],
            )
            continue
        if hours is not None and vm.provisioning == "preemptible" and hours > PREEMPTIBLE_LIFE_HOURS:
            problems.add(
                key,
                hours,
                f"a preemptible TPU lives at most {PREEMPTIBLE_LIFE_HOURS:g} hours",
                fixes=[Fix.of({key: PREEMPTIBLE_LIFE_HOURS})],
            )
            continue
        workload = workloads.get(vm.workload)
        if not workload or not workload.program or not workload.step_seconds or not workload.checkpoint_seconds:
            continue
        if found := _interval_advice(vm, workload, NOTICE_S):
            advice, best = found
            at = f"{PROJECT}:workloads.{workload.name}"
            fixes = [Fix.of({f"{at}.{name}": value for name, value in best.items()})] if best else []
            problems.warn(f"{at}.checkpointEverySteps", workload.checkpoint_every_steps, advice, fixes=fixes)


def _interval_advice(
    vm: TpuVmSettings, workload: WorkloadSettings, notice_s: float
) -> tuple[str, dict[str, object]] | None:
    """Advice on the workload's checkpoint interval on this VM, and the settings of the best interval
    (checkpointEverySteps, and checkpointEveryMinutes where it would cap it) when there is one."""
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
        ), {}
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
        ), {}
    ratio = interval / best.seconds
    if 1 / FAR_FROM_BEST <= ratio <= FAR_FROM_BEST:
        return None
    settings: dict[str, object] = {"checkpointEverySteps": max(1, round(best.seconds / step_s))}
    if best.seconds > 60 * workload.checkpoint_every_minutes:  # the minutes would cap it: raised too
        settings["checkpointEveryMinutes"] = math.ceil(best.seconds / 60)
    return (
        f"{on}: {yours}, {ratio:.2g}× the interval that wastes least, as {best.why}. Saves and "
        f"lost work would take {waste(interval, save_s, losses):.1%} of training, "
        f"{waste(best.seconds, save_s, losses):.1%} at the best interval"
    ), settings


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
            used = [c for k, c in taken] + [c for n, c in ranges.items() if n != name]
            free = free_cidr(used, network.prefixlen)
            problems.add(
                f"{key}.{name}",
                cidr,
                f"overlaps {clash}; the cluster's ranges need their own addresses",
                fixes=[Fix.of({f"{key}.{name}": free})] if free else [],
            )
        taken.append((f"{key}.{name}", cidr))
    window = gke.maintenance
    if window.days and window.hours and 4 * len(window.days) * window.hours < MIN_MAINTENANCE_HOURS_PER_32_DAYS:
        # Four weeks fit in any 32 days: the window's hours in them are the least GKE can count.
        hours = math.ceil(MIN_MAINTENANCE_HOURS_PER_32_DAYS / (4 * len(window.days)))
        problems.add(
            f"{key}.maintenanceWindow",
            {"days": list(window.days), "hours": window.hours},
            f"GKE needs a window open at least {MIN_MAINTENANCE_HOURS_PER_32_DAYS} hours in any 32 days; this one "
            f"is open {4 * len(window.days) * window.hours}: add days or hours",
            fixes=[Fix.of({f"{key}.maintenanceWindow.hours": hours})],
        )
    catalog = load_gke_catalog()
    names: set[str] = set()
    for pool, pool_key in zip(gke.slice_pools, item_keys(f"{key}.slicePools", gke.slice_pools), strict=True):
        if pool.name and pool.name in names:
            problems.add(f"{pool_key}.name", pool.name, "another slice pool of this stack has this name")
        names.add(pool.name)
        if pool.zone and pool.region != gke.region:
            size = pool.accelerator.size
            zones = [] if pool.accelerator is NO_GKE_ACCELERATOR else pool.accelerator.generation.zones_for(size)
            problems.add(
                f"{pool_key}.zone",
                pool.zone,
                f"is not in the cluster's region {gke.region}",
                fixes=[
                    *(Fix.of({f"{pool_key}.zone": z}) for z in zones if z.rsplit("-", 1)[0] == gke.region),
                    Fix.of({f"{key}.region": pool.region}),
                ],
            )
        elif (
            pool.zone
            and pool.accelerator is not NO_GKE_ACCELERATOR
            and (why := catalog.zone_problem(pool.accelerator, pool.zone))
        ):
            problems.add(f"{pool_key}.zone", pool.zone, why)
        if pool.provisioning == "reserved" and not pool.reservation_name:
            problems.add(f"{pool_key}.reservationName", MISSING, "a reserved pool names the reservation it consumes")
        _only_with_their_provisioning(
            pool_key, pool.provisioning, pool.reservation_name, pool.run_duration_hours, problems
        )
        if (
            pool.provisioning == "flex-start"
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
    for team, team_key in zip(gke.teams, item_keys(key, gke.teams), strict=True):
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
        for flavor, chips in queues.nominal_by_flavor(
            team.model_copy(update={"nominal_chips": tuple(guaranteed)}), shapes
        ).items():
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
