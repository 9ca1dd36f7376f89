"""A stack's settings, parsed and validated once into frozen objects.

Components never read `pulumi.Config`; they take these objects, so they are testable with plain
values. `parse_stack_config` is pure: it takes the raw config strings exactly as Pulumi hands them to
the program (objects JSON-encoded) and either returns a `PlatformConfig` or raises one `ConfigError`
listing every bad setting with its key, value and what is allowed.
"""

from __future__ import annotations

import ipaddress
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass

from infra import iam, naming
from infra.catalog import PROVISIONING_MODELS, RECLAIMABLE, AcceleratorType, load_catalog
from infra.programs import PROGRAMS
from infra.schedule import CronError, parse_cron
from infra.schema import MISSING, ConfigError, Node, Problems, decode_objects

PROJECT = "tpu-platform"
BUCKET_PURPOSES = ("data", "checkpoints", "models")
# Settings that are objects; Pulumi hands them over JSON-encoded.
OBJECT_KEYS = ("buckets", "budget", "workloads", "network", "tpuVms", "monitoring", "automation")
SCALAR_KEYS = ("owner", "billingAccount", "production", "namePrefix", "deployer")

# Cloud Storage locations (https://cloud.google.com/storage/docs/locations): multi-regions,
# predefined dual-regions and the regions where Cloud TPUs run or data is commonly kept.
BUCKET_LOCATIONS = frozenset(
    {
        "US",
        "EU",
        "ASIA",
        "NAM4",
        "EUR4",
        "EUR5",
        "EUR7",
        "EUR8",
        "ASIA1",
        "US-CENTRAL1",
        "US-CENTRAL2",
        "US-EAST1",
        "US-EAST4",
        "US-EAST5",
        "US-SOUTH1",
        "US-WEST1",
        "US-WEST4",
        "EUROPE-WEST4",
        "EUROPE-WEST1",
        "ASIA-EAST1",
        "ASIA-NORTHEAST1",
        "ASIA-SOUTHEAST1",
    }
)
STORAGE_CLASSES = ("STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE")
SPEND_BASIS = {"current": "CURRENT_SPEND", "forecasted": "FORECASTED_SPEND"}
GCP_PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
BILLING_ACCOUNT = r"[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}"
KMS_KEY = re.compile(r"projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/keyRings/[^/]+/cryptoKeys/[^/]+")
EMAIL = r"[^@\s]+@[^@\s]+\.[a-z]{2,}"
ON_COMPLETION = ("keep", "stop", "delete")
RESERVED_LABELS = ("environment", "owner", "managed-by", "workload", "provisioning")
MAX_BUDGET_CHANNELS = 5  # the Billing Budgets API accepts at most 5 monitoring channels


@dataclass(frozen=True)
class BucketSettings:
    location: str
    storage_class: str
    kms_key_name: str | None
    noncurrent_versions_to_keep: int
    noncurrent_version_days: int
    # Purposes whose bucket, objects included, `pulumi destroy` may delete. Empty by default.
    destroyable: frozenset[str]


@dataclass(frozen=True)
class Threshold:
    percent: float  # 100 = the whole budget
    basis: str  # CURRENT_SPEND | FORECASTED_SPEND


@dataclass(frozen=True)
class BudgetSettings:
    amount: float
    currency: str
    thresholds: tuple[Threshold, ...]
    emails: tuple[str, ...]
    pubsub_topic: bool
    fail_over_budget: bool  # an estimate above the budget fails the plan instead of warning


@dataclass(frozen=True)
class WorkloadSettings:
    name: str
    description: str
    bucket_access: tuple[tuple[str, str], ...]  # (purpose, "read" | "write")
    project_roles: tuple[str, ...]
    program: str  # a key of infra.programs.PROGRAMS
    framework_version: str  # the framework release the program is pinned to (S21)
    memory_gib_per_chip: float | None  # declared HBM need per chip, checked against the TPU type (S20)
    data_object: str  # path of the training data in the data bucket; "" = the program's own download
    run: str  # run id: checkpoints, model and completion marker live under it; a new id is a new run
    checkpoint_every_steps: int
    checkpoint_every_minutes: float
    epochs: int
    batch_size: int

    @property
    def framework(self) -> str:
        return PROGRAMS[self.program].framework

    def access(self, purpose: str) -> str:
        return dict(self.bucket_access).get(purpose, "none")


@dataclass(frozen=True)
class NetworkSettings:
    subnets: tuple[tuple[str, str], ...]  # (region, private CIDR)
    flow_log_sampling: float

    def cidr(self, region: str) -> str | None:
        return dict(self.subnets).get(region)


@dataclass(frozen=True)
class AutomationSettings:
    budget_action: str | None  # stop | delete the environment's TPUs when spend reaches budget_at_percent
    budget_at_percent: float
    dry_run: bool  # log what would be done, do nothing
    recovery_every_minutes: int  # 0: no preemption recovery
    recovery_max_attempts: int

    @property
    def enabled(self) -> bool:
        return bool(self.budget_action or self.recovery_every_minutes)


@dataclass(frozen=True)
class MonitoringSettings:
    idle_minutes: int  # alert when a TPU's TensorCores idle longer than this


@dataclass(frozen=True)
class ScheduleSettings:
    start: str  # unix-cron, as Cloud Scheduler reads it
    stop: str
    time_zone: str


@dataclass(frozen=True)
class TpuVmSettings:
    name: str
    accelerator: AcceleratorType
    zone: str
    runtime_version: str
    provisioning: str  # on-demand | spot | preemptible | reserved
    workload: str
    labels: tuple[tuple[str, str], ...]
    description: str
    schedule: ScheduleSettings | None
    on_completion: str  # keep | stop | delete: what happens to the TPU when its run has finished

    @property
    def reclaimable(self) -> bool:
        """Spot or preemptible: GCE may take it back at any time."""
        return self.provisioning in RECLAIMABLE

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


@dataclass(frozen=True)
class PlatformConfig:
    stack: str
    project: str
    region: str
    owner: str
    billing_account: str
    production: bool
    name_prefix: str
    deployer: str  # CI's deploy service account, or "" when people deploy
    buckets: BucketSettings
    budget: BudgetSettings
    workloads: tuple[WorkloadSettings, ...]
    network: NetworkSettings
    tpu_vms: tuple[TpuVmSettings, ...]
    monitoring: MonitoringSettings
    automation: AutomationSettings
    warnings: tuple[str, ...] = ()  # legal settings that are likely mistakes, shown by the plan

    @property
    def has_schedules(self) -> bool:
        return any(vm.schedule for vm in self.tpu_vms)

    @property
    def has_self_stop(self) -> bool:
        return any(vm.on_completion != "keep" for vm in self.tpu_vms)

    def workload(self, name: str) -> WorkloadSettings:
        return next(w for w in self.workloads if w.name == name)

    @property
    def environment(self) -> str:
        return self.stack

    def bucket_name(self, purpose: str) -> str:
        return bucket_name(self.name_prefix, self.stack, purpose)

    @property
    def labels(self) -> dict[str, str]:
        return {"environment": self.stack, "owner": self.owner, "managed-by": "pulumi"}


def bucket_name(prefix: str, stack: str, purpose: str) -> str:
    return f"{prefix}-{stack}-{purpose}"


def service_account_id(workload: str, stack: str) -> str:
    return f"tpu-{workload}-{stack}"


def parse_stack_config(stack: str, raw: Mapping[str, str]) -> PlatformConfig:
    """Parse the raw config of `stack` (keys like `tpu-platform:budget`), or raise ConfigError."""
    problems = Problems()
    own = decode_objects(
        {k: v for k, v in raw.items() if k.startswith(f"{PROJECT}:")}, [f"{PROJECT}:{k}" for k in OBJECT_KEYS], problems
    )
    gcp = {k: v for k, v in raw.items() if k.startswith("gcp:")}
    root = Node(own, "", problems)

    if naming.label_value_problem(stack) or not re.fullmatch(r"[a-z][a-z0-9-]{0,11}", stack):
        problems.add("stack name", stack, "1-12 lowercase letters, digits and '-', starting with a letter")
    project = Node(gcp, "", problems).str(
        "gcp:project", pattern=GCP_PROJECT_ID, allowed="a GCP project id: 6-30 lowercase letters, digits and '-'"
    )
    region = gcp.get("gcp:region", "us-central1")

    owner = root.str(f"{PROJECT}:owner", check=_label_value)
    billing_account = root.str(
        f"{PROJECT}:billingAccount", pattern=BILLING_ACCOUNT, allowed="a billing account id like 012345-6789AB-CDEF01"
    )
    production = root.bool(f"{PROJECT}:production", False)
    name_prefix = root.str(f"{PROJECT}:namePrefix", "") or project or ""
    deployer = root.str(
        f"{PROJECT}:deployer",
        "",
        pattern=r"([a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com)?",
        allowed="a service account email like ci-deployer@PROJECT.iam.gserviceaccount.com",
    )

    buckets = _buckets(root.child(f"{PROJECT}:buckets"), production, problems)
    budget = _budget(root.child(f"{PROJECT}:budget"))
    workloads = tuple(_workload(name, node) for name, node in root.items(f"{PROJECT}:workloads"))
    if not workloads:
        problems.add(f"{PROJECT}:workloads", MISSING, "declare at least one workload")
    network = _network(root.child(f"{PROJECT}:network"))
    tpu_vms = _tpu_vms(root, {w.name: w for w in workloads}, network)
    monitoring = _monitoring(root.child(f"{PROJECT}:monitoring", {}))
    automation = _automation(root.child(f"{PROJECT}:automation", {}), budget, tpu_vms)
    root.done([f"{PROJECT}:{k}" for k in SCALAR_KEYS + OBJECT_KEYS])

    if name_prefix and not problems.items:
        for purpose in BUCKET_PURPOSES:
            name = bucket_name(name_prefix, stack, purpose)
            if why := naming.bucket_name_problem(name):
                problems.add(f"{PROJECT}:namePrefix", name_prefix, f"gives bucket name '{name}', which needs {why}")
                break
        for w in workloads:
            account = service_account_id(w.name, stack)
            if why := naming.service_account_id_problem(account):
                problems.add(
                    f"{PROJECT}:workloads.{w.name}", w.name, f"gives service account id '{account}', which needs {why}"
                )

    problems.raise_if_any(stack)
    return PlatformConfig(
        stack=stack,
        project=project,
        region=region,
        owner=owner,
        billing_account=billing_account,
        production=production,
        name_prefix=name_prefix,
        deployer=deployer,
        buckets=buckets,
        budget=budget,
        workloads=workloads,
        network=network,
        tpu_vms=tpu_vms,
        monitoring=monitoring,
        automation=automation,
        warnings=tuple(f"stack '{stack}': {w}" for w in problems.warnings),
    )


def _label_value(value: str) -> str | None:
    if not value:
        return "must not be empty"
    return naming.label_value_problem(value)


def _buckets(node: Node | None, production: bool, problems: Problems) -> BucketSettings:
    if node is None:
        return BucketSettings("", "STANDARD", None, 0, 0, frozenset())
    location = node.str("location", choices=BUCKET_LOCATIONS)
    kms_key_name = node.str(
        "kmsKeyName", None, pattern=KMS_KEY.pattern, allowed="projects/P/locations/L/keyRings/R/cryptoKeys/K"
    )
    destroyable = node.str_list("destroyable", [], choices=BUCKET_PURPOSES)
    settings = BucketSettings(
        location=location,
        storage_class=node.str("storageClass", "STANDARD", choices=STORAGE_CLASSES),
        kms_key_name=kms_key_name,
        noncurrent_versions_to_keep=node.number("noncurrentVersionsToKeep", 3, minimum=1, maximum=100, integer=True),
        noncurrent_version_days=node.number("noncurrentVersionDays", 30, minimum=1, maximum=3650, integer=True),
        destroyable=frozenset(destroyable or ()),
    )
    node.done()
    if kms_key_name and location:
        key_location = KMS_KEY.fullmatch(kms_key_name)
        if key_location and key_location["location"].upper() != location:
            problems.add(
                node.key("kmsKeyName"),
                kms_key_name,
                f"the key must be in the buckets' location {location.lower()}, not {key_location['location']}",
            )
    if production:
        if not kms_key_name:
            problems.add(
                node.key("kmsKeyName"),
                MISSING,
                "required when production is true (customer-managed encryption)",
            )
        if destroyable:
            problems.add(
                node.key("destroyable"),
                destroyable,
                "must be empty when production is true: no production bucket is destroyable",
            )
    return settings


def _budget(node: Node | None) -> BudgetSettings:
    if node is None:
        return BudgetSettings(0, "USD", (), (), False, False)
    thresholds = []
    for t in node.elements("thresholds", max_items=20):
        thresholds.append(
            Threshold(
                percent=t.number("percent", minimum=0, maximum=1000, exclusive_minimum=True),
                basis=SPEND_BASIS.get(t.str("basis", "current", choices=SPEND_BASIS) or "", ""),
            )
        )
        t.done()
    seen = [(t.percent, t.basis) for t in thresholds]
    for i, pair in enumerate(seen):
        if pair in seen[:i]:
            node.problems.add(
                f"{node.key('thresholds')}[{i}]",
                {"percent": pair[0]},
                "duplicates an earlier threshold with the same percent and basis",
            )
    if not thresholds:
        node.problems.add(node.key("thresholds"), MISSING, "list at least one threshold")
    settings = BudgetSettings(
        amount=node.number("amount", minimum=0, exclusive_minimum=True),
        currency=node.str(
            "currency",
            "USD",
            pattern=r"[A-Z]{3}",
            allowed="an ISO 4217 code like USD, matching the billing account's currency",
        ),
        thresholds=tuple(thresholds),
        emails=tuple(
            node.str_list("emails", [], max_items=MAX_BUDGET_CHANNELS, pattern=EMAIL, allowed="an email address") or ()
        ),
        pubsub_topic=node.bool("pubsubTopic", False),
        fail_over_budget=node.bool("failOverBudget", False),
    )
    node.done()
    return settings


def _workload(name: str, node: Node) -> WorkloadSettings:
    if why := naming.resource_id_problem(name, max_length=16):
        node.problems.add(node.path, name, f"workload names need {why}")
    access_node = node.child("bucketAccess", {})
    access = dict(iam.DEFAULT_BUCKET_ACCESS)
    if access_node is not None:
        for purpose in BUCKET_PURPOSES:
            level = access_node.str(purpose, access[purpose], choices=(*iam.BUCKET_ROLE_FOR_ACCESS, "none"))
            if level:
                access[purpose] = level
        access_node.done(BUCKET_PURPOSES)
    roles = node.str_list(
        "projectRoles",
        list(iam.DEFAULT_PROJECT_ROLES),
        choices=iam.ALLOWED_PROJECT_ROLES,
        allowed="project roles are allow-listed in infra/iam.py; storage access is granted per bucket "
        "with bucketAccess (read, write or none)",
    )
    settings = WorkloadSettings(
        name=name,
        description=node.str("description", f"TPU workload {name}"),
        bucket_access=tuple((p, level) for p, level in access.items() if level != "none"),
        project_roles=tuple(roles or ()),
        program=node.str("program", choices=PROGRAMS),
        framework_version=node.str(
            "frameworkVersion", pattern=r"\d+\.\d+\.\d+", allowed="an exact release like 2.15.0 (pinned, S21)"
        ),
        memory_gib_per_chip=node.number("memoryGibPerChip", None, minimum=0, exclusive_minimum=True),
        data_object=node.str(
            "dataObject",
            "",
            pattern=r"([A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+",
            allowed="an object path in the data bucket like mnist/mnist.npz",
        ),
        run=node.str("run", "r1", check=lambda r: naming.resource_id_problem(r, 32)),
        checkpoint_every_steps=node.number("checkpointEverySteps", 200, minimum=1, maximum=10**7, integer=True),
        checkpoint_every_minutes=node.number("checkpointEveryMinutes", 10, minimum=0.5, maximum=1440),
        epochs=node.number("epochs", 5, minimum=1, maximum=10_000, integer=True),
        batch_size=node.number("batchSize", 256, minimum=1, maximum=1_048_576, integer=True),
    )
    node.done()
    return settings


__all__ = ["ConfigError", "PlatformConfig", "parse_stack_config"]


def _network(node: Node | None) -> NetworkSettings:
    if node is None:
        return NetworkSettings((), 0.5)
    subnets: list[tuple[str, str]] = []
    entries = node.entries("subnets")
    for region, cidr, key in entries:
        if not re.fullmatch(r"[a-z]+-[a-z]+\d+", str(region)):
            node.problems.add(key, cidr, f"'{region}' is not a GCP region like us-central1")
            continue
        try:
            network = ipaddress.ip_network(str(cidr), strict=True)
        except ValueError:
            node.problems.add(key, cidr, "must be an IPv4 network like 10.20.0.0/20, with no host bits set")
            continue
        if not network.is_private or network.version != 4 or not 8 <= network.prefixlen <= 29:
            node.problems.add(key, cidr, "must be a private IPv4 range (10/8, 172.16/12, 192.168/16), /8 to /29")
            continue
        clash = next((r for r, c in subnets if ipaddress.ip_network(c).overlaps(network)), None)
        if clash:
            node.problems.add(key, cidr, f"overlaps the subnet of {clash}")
            continue
        subnets.append((str(region), str(cidr)))
    if not entries and "subnets" in node.data:
        node.problems.add(node.key("subnets"), {}, "declare at least one region: CIDR")
    settings = NetworkSettings(
        subnets=tuple(subnets),
        flow_log_sampling=node.number("flowLogSampling", 0.5, minimum=0, maximum=1, exclusive_minimum=True),
    )
    node.done()
    return settings


def _tpu_vms(root: Node, workloads: dict[str, WorkloadSettings], network: NetworkSettings) -> tuple[TpuVmSettings, ...]:
    vms: list[TpuVmSettings] = []
    names: set[str] = set()
    for node in root.elements(f"{PROJECT}:tpuVms", []):
        vm = _tpu_vm(node, workloads)
        if vm.name in names:
            node.problems.add(node.key("name"), vm.name, "another TPU VM of this stack has this name")
        names.add(vm.name)
        workload = workloads.get(vm.workload) if vm.workload else None
        if workload:
            _check_against_catalog(node, vm, workload)
        if vm.zone and network.subnets and network.cidr(vm.region) is None:
            node.problems.add(
                node.key("zone"), vm.zone, f"add a subnet for {vm.region} under {PROJECT}:network.subnets"
            )
        vms.append(vm)
    if vms and not network.subnets:
        root.problems.add(f"{PROJECT}:network.subnets", MISSING, "TPU VMs need a subnet in their region")
    return tuple(vms)


def _tpu_vm(node: Node, workloads: dict[str, WorkloadSettings]) -> TpuVmSettings:
    accelerator_name = node.str("acceleratorType")
    accelerator = load_catalog().accelerator(accelerator_name) if accelerator_name else None
    if isinstance(accelerator, str):
        node.problems.add(node.key("acceleratorType"), accelerator_name, accelerator)
        accelerator = None
    user_labels: list[tuple[str, str]] = []
    for key, value, path in node.entries("labels", {}):
        if why := naming.label_key_problem(key):
            node.problems.add(path, key, f"label keys need {why}")
        elif key in RESERVED_LABELS:
            node.problems.add(path, value, f"'{key}' is set by the platform; reserved: {', '.join(RESERVED_LABELS)}")
        elif not isinstance(value, str) or (why := naming.label_value_problem(value)):
            node.problems.add(path, value, f"label values need {why or 'a string'}")
        else:
            user_labels.append((key, value))
    vm = TpuVmSettings(
        name=node.str("name", check=lambda n: naming.resource_id_problem(n, 63)),
        accelerator=accelerator,  # type: ignore[arg-type]  # None only when a problem is raised
        zone=node.str("zone", pattern=r"[a-z]+-[a-z]+\d+-[a-z]", allowed="a zone like us-central1-b"),
        runtime_version=node.str("runtimeVersion"),
        provisioning=node.str("provisioning", "on-demand", choices=PROVISIONING_MODELS),
        workload=node.str("workload", choices=workloads) if workloads else node.str("workload"),
        labels=tuple(user_labels),
        description=node.str("description", ""),
        schedule=_schedule(node.child("schedule", None)),
        on_completion=node.str("onCompletion", "keep", choices=ON_COMPLETION),
    )
    node.done()
    return vm


def _cron(text: str) -> str | None:
    try:
        parse_cron(text)
    except CronError as error:
        return f"not a unix-cron schedule: {error}"
    return None


def _time_zone(name: str) -> str | None:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "an IANA time zone like Europe/Berlin or America/New_York"
    return None


def _schedule(node: Node | None) -> ScheduleSettings | None:
    if node is None or not node.data:
        return None
    schedule = ScheduleSettings(
        start=node.str("start", check=_cron),
        stop=node.str("stop", check=_cron),
        time_zone=node.str("timeZone", "Etc/UTC", check=_time_zone),
    )
    node.done()
    return schedule


def _check_against_catalog(node: Node, vm: TpuVmSettings, workload: WorkloadSettings) -> None:
    """The seed's troubleshooting items (S16, S17, S19, S20), caught before anything is created."""
    catalog = load_catalog()
    problems = node.problems
    if vm.reclaimable and workload.access("checkpoints") != "write":
        problems.add(
            node.key("provisioning"),
            vm.provisioning,
            f"a {vm.provisioning} TPU can be reclaimed at any time (S19): its workload '{workload.name}' needs "
            "write access to the checkpoints bucket to resume, or use on-demand",
        )
    accelerator = vm.accelerator
    if not accelerator:
        return
    if vm.zone and (why := catalog.zone_problem(accelerator, vm.zone)):
        problems.add(node.key("zone"), vm.zone, why)
    if vm.runtime_version and workload.program and workload.framework_version:
        why = catalog.runtime_problem(accelerator, vm.runtime_version, workload.framework, workload.framework_version)
        why = why or catalog.software_problem(vm.runtime_version, workload.framework, workload.framework_version)
        if why:
            problems.add(node.key("runtimeVersion"), vm.runtime_version, why)
    need = workload.memory_gib_per_chip
    if need and (why := catalog.memory_problem(accelerator, need)):
        problems.add(node.key("acceleratorType"), accelerator.name, f"workload '{workload.name}' {why}")
    if vm.schedule and accelerator.multi_host:
        problems.add(
            node.key("schedule"),
            {"start": vm.schedule.start, "stop": vm.schedule.stop},
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop or start; "
            "remove the schedule, or use a single-host type",
        )
    if vm.on_completion == "stop" and accelerator.multi_host:
        problems.add(
            node.key("onCompletion"),
            "stop",
            f"{accelerator.name} is a multi-host slice, which the TPU API cannot stop; use delete or keep",
        )
    if vm.on_completion != "keep" and workload.access("checkpoints") != "write":
        problems.add(
            node.key("onCompletion"),
            vm.on_completion,
            f"a finished run is known by its completion marker in the checkpoints bucket; workload "
            f"'{workload.name}' needs write access to it",
        )
    if workload.batch_size and (advice := catalog.batch_warning(accelerator, workload.batch_size)):
        problems.warn(f"{PROJECT}:workloads.{workload.name}.batchSize", workload.batch_size, advice)


def _monitoring(node: Node | None) -> MonitoringSettings:
    if node is None:
        return MonitoringSettings(60)
    settings = MonitoringSettings(idle_minutes=node.number("idleMinutes", 60, minimum=5, maximum=10080, integer=True))
    node.done()
    return settings


def _automation(node: Node | None, budget: BudgetSettings, vms: tuple[TpuVmSettings, ...]) -> AutomationSettings:
    if node is None:
        return AutomationSettings(None, 100, False, 0, 0)
    action = node.child("budgetAction", {})
    recovery = node.child("recovery", {})
    settings = AutomationSettings(
        budget_action=action.str("action", None, choices=("stop", "delete")) if action else None,
        budget_at_percent=action.number("atPercent", 100, minimum=1, maximum=1000) if action else 100,
        dry_run=action.bool("dryRun", False) if action else False,
        recovery_every_minutes=recovery.number("everyMinutes", 0, minimum=1, maximum=1440, integer=True)
        if recovery
        else 0,
        recovery_max_attempts=recovery.number("maxAttempts", 5, minimum=1, maximum=100, integer=True)
        if recovery
        else 0,
    )
    for child in (action, recovery, node):
        if child is not None:
            child.done()
    if action and action.data and not budget.pubsub_topic:
        node.problems.add(
            f"{node.key('budgetAction')}", action.data, "needs tpu-platform:budget.pubsubTopic: true to hear the budget"
        )
    if recovery and recovery.data and not any(vm.reclaimable for vm in vms):
        node.problems.warn(node.key("recovery"), recovery.data, "no spot or preemptible TPU VM to recover")
    return settings
