"""The settings of one stack, as frozen objects: what the components read. The sections declared as
models (`Section`) are their settings' one declaration too: type, default, bounds and description."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from infra import naming
from infra.catalog import RECLAIMABLE, AcceleratorType
from infra.catalog.gke import GkeAcceleratorType
from infra.config.declared import Allowed, Flag, Integer, Items, Number, OneOf, Section, Text, as_integer, as_text

PROJECT = "tpu-platform"
BUCKET_PURPOSES = ("data", "checkpoints", "models")
# Labels the platform sets on every labelled resource; a stack may not set them itself.
RESERVED_LABELS = ("environment", "owner", "managed-by", "workload", "provisioning", "environment-class")
# Service accounts the platform creates per stack besides the workloads' (infra/lifecycle.py,
# infra/tpu_guard.py): `service_account_id(name, stack)` of each. A workload may not take these
# names, or its account would be the platform's.
PLATFORM_ACCOUNTS = naming.PLATFORM_ACCOUNT_KINDS
# Cloud Storage locations (https://cloud.google.com/storage/docs/locations): multi-regions,
# predefined dual-regions and the regions where Cloud TPUs run or data is commonly kept.
BUCKET_LOCATIONS = (
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
)
STORAGE_CLASSES = ("STANDARD", "NEARLINE", "COLDLINE", "ARCHIVE")
SPEND_BASIS = {"current": "CURRENT_SPEND", "forecasted": "FORECASTED_SPEND"}
PRIVATE_CIDR = "a private IPv4 range (10/8, 172.16/12, 192.168/16), /8 to /29"
KMS_KEY = r"projects/(?P<project>[^/\s]+)/locations/(?P<location>[^/\s]+)/keyRings/[^/\s]+/cryptoKeys/[^/\s]+"
EMAIL = r"[^@\s]+@[^@\s]+\.[a-z]{2,}"
EGRESS = ("open", "google-only")
PACKAGE_INDEX = r"(https://[a-z0-9-]+-python\.pkg\.dev/[a-z][a-z0-9-]{4,28}[a-z0-9]/[a-z][a-z0-9-]*/simple/)?"
MAX_BUDGET_CHANNELS = 5  # the Billing Budgets API accepts at most 5 monitoring channels
# Budget amounts are sent as `units`, an int64 (Billing Budgets API, google.type.Money).
MAX_BUDGET_AMOUNT = 2**63 - 1


class BucketSettings(Section):
    """The data, checkpoints and models buckets."""

    location: Annotated[Text, OneOf(BUCKET_LOCATIONS)] = Field(description="Location of all three buckets.")
    storage_class: Annotated[Text, OneOf(STORAGE_CLASSES)] = Field(
        default="STANDARD", description="Default storage class."
    )
    kms_key_name: Annotated[Text, Allowed("projects/P/locations/L/keyRings/R/cryptoKeys/K", KMS_KEY)] | None = Field(
        default=None, description="Customer-managed key for the buckets, in their location; required in production."
    )
    noncurrent_versions_to_keep: Integer = Field(default=3, ge=1, le=100, description="Older object versions kept.")
    noncurrent_version_days: Integer = Field(default=30, ge=1, le=3650, description="Days an older version is kept.")
    # Purposes whose bucket, objects included, `pulumi destroy` may delete.
    destroyable: Annotated[tuple[Annotated[Text, OneOf((*BUCKET_PURPOSES, "artifacts"))], ...], Items()] = Field(
        default=(),
        description="Buckets `pulumi destroy` may delete, objects included (never in production); `artifacts`: the "
        "source archives and the image repository.",
    )
    data_access_logs: Flag = Field(
        default=True,
        description="Cloud Storage Data Access audit logs (reads and writes of objects) for the project; turning "
        "them off is a visible choice.",
    )


class Threshold(Section):
    percent: Number = Field(gt=0, le=1000, description="Percent of the budget (100 = all of it).")
    basis: Annotated[Text, OneOf(tuple(SPEND_BASIS))] = Field(
        default="current", description="Spend so far or forecast for the month."
    )

    @property
    def spend_basis(self) -> str:
        return SPEND_BASIS[self.basis]


class BudgetSettings(Section):
    """The monthly budget on the billing account, scoped to the project."""

    amount: Number = Field(gt=0, le=MAX_BUDGET_AMOUNT, description="Monthly budget.")
    currency: Annotated[
        Text, Allowed("an ISO 4217 code like USD, matching the billing account's currency", r"[A-Z]{3}")
    ] = Field(default="USD", description="Currency of the amount; the billing account's.")
    # A repeated threshold is refused by the reader, by its position.
    thresholds: Annotated[tuple[Threshold, ...], Items(20, repeats=True)] = Field(
        description="Alert thresholds (at least one)."
    )
    emails: Annotated[tuple[Annotated[Text, Allowed("an email address", EMAIL)], ...], Items(MAX_BUDGET_CHANNELS)] = (
        Field(default=(), description="Who is emailed at each threshold.")
    )
    pubsub_topic: Flag = Field(
        default=False, description="Publish budget notifications to a Pub/Sub topic (needed by budgetAction)."
    )
    fail_over_budget: Flag = Field(
        default=False, description="Fail the plan when the cost estimate exceeds the budget (else warn)."
    )


@dataclass(frozen=True)
class WorkloadSource:
    """Where a workload's code comes from (infra/config/workload_code.py checks it)."""

    kind: str  # "folder" | "image"
    folder: str = ""  # a folder of the repository, relative to its root (POSIX separators)
    image: str = ""  # <region>-docker.pkg.dev/<project>/<repo>/<name>@sha256:<hex> (or :tag where allowed)


class ArtifactSettings(Section):
    """The artifacts bucket and the container image repository."""

    allow_image_tags: Flag = Field(
        default=False, description="Accept images by tag (with a warning); by default only by digest."
    )
    keep_image_versions: Integer = Field(
        default=10, ge=1, le=1000, description="Newest versions of each image the repository's cleanup always keeps."
    )
    untagged_image_days: Integer = Field(
        default=30,
        ge=1,
        le=3650,
        description="Untagged image versions older than this are deleted (unless kept as newest or used by the stack).",
    )


@dataclass(frozen=True)
class WorkloadSettings:
    name: str
    description: str
    bucket_access: tuple[tuple[str, str], ...]  # (purpose, "read" | "write")
    project_roles: tuple[str, ...]
    program: str  # an example folder's name (infra/config/examples.py), or "" for a workload with its own source
    framework_version: str  # the framework release the program is pinned to
    memory_gib_per_chip: float | None  # declared HBM need per chip, checked against the TPU type
    data_object: str  # path of the training data in the data bucket; "" = the program's own download
    run: str  # run id: checkpoints, model and completion marker live under it; a new id is a new run
    checkpoint_every_steps: int
    checkpoint_every_minutes: float
    epochs: int
    batch_size: int
    step_seconds: float | None = None  # one step on its TPU VMs, declared or measured (program only)
    checkpoint_seconds: float | None = None  # a checkpoint's commit, the most it stalls training (program only)
    source: WorkloadSource = WorkloadSource("folder")
    command: tuple[str, ...] = ()  # the program's argv; for an image, empty runs the image's own
    python: str = ""  # a Python version the boot installs for a folder source ("": the image's)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the program (never secrets)
    framework: str = ""  # the example program's framework, "" for a workload with its own source

    def access(self, purpose: str) -> str:
        return dict(self.bucket_access).get(purpose, "none")


class NetworkSettings(Section):
    """The private network."""

    subnets: Annotated[tuple[tuple[str, Any], ...], Items(mapping=True), Allowed(PRIVATE_CIDR)] = Field(
        description="Private IPv4 CIDR of the subnet in each region (one per TPU region)."
    )
    flow_log_sampling: Number = Field(default=0.5, gt=0, le=1, description="VPC flow log sampling rate.")
    egress: Annotated[Text, OneOf(EGRESS)] = Field(
        default="open",
        description="What TPU VMs may reach: `open` (through Cloud NAT), or `google-only` (Google APIs through "
        "private.googleapis.com and the job's own hosts; every other destination denied).",
    )
    package_index: Annotated[
        Text, Allowed("https://REGION-python.pkg.dev/PROJECT/REPOSITORY/simple/", PACKAGE_INDEX)
    ] = Field(
        default="",
        description="With egress google-only: the Python package index runs install from, an Artifact Registry "
        "Python repository (https://REGION-python.pkg.dev/PROJECT/REPO/simple/), reached through "
        "private.googleapis.com.",
    )

    def cidr(self, region: str) -> str | None:
        return dict(self.subnets).get(region)


class BudgetAction(Section):
    """Act on the TPUs when spend reaches a share of the budget."""

    action: Annotated[Literal["stop", "delete"], BeforeValidator(as_text)] | None = Field(
        default=None, description="Stop or delete the stack's TPUs."
    )
    at_percent: Number = Field(default=100, ge=1, le=1000, description="Percent of the budget that triggers it.")
    dry_run: Flag = Field(default=False, description="Log what would be done, do nothing.")


# `recovery.everyMinutes` becomes `*/N * * * *`: N must divide the hour, or the runs are uneven
# (`*/45` fires at :00 and :45) or hourly (`*/90` is `0`).
RecoveryInterval = Literal[1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30]
RECOVERY_INTERVALS: tuple[int, ...] = typing.get_args(RecoveryInterval)


class Recovery(Section):
    """Re-create preempted spot or preemptible TPUs."""

    every_minutes: Annotated[RecoveryInterval, BeforeValidator(as_integer)] | None = Field(
        default=None, description="How often to look for preempted TPUs (divides the hour).", examples=[10]
    )
    max_attempts: Integer = Field(default=5, ge=1, le=100, description="Re-creations per TPU before giving up.")


class AutomationSettings(Section):
    """The TPU guard: budget actions and preemption recovery."""

    budget_action: BudgetAction = BudgetAction()
    recovery: Recovery = Recovery()

    @property
    def enabled(self) -> bool:
        return bool(self.budget_action.action or self.recovery.every_minutes)


class MonitoringSettings(Section):
    """Alerts."""

    idle_minutes: Integer = Field(
        default=60, ge=5, le=10080, description="Alert when a TPU's TensorCores idle longer than this."
    )


@dataclass(frozen=True)
class ScheduleSettings:
    """When Cloud Scheduler starts and stops a VM: either side may be left out ("" when not given)."""

    start: str  # unix-cron, as Cloud Scheduler reads it
    stop: str
    time_zone: str

    @property
    def given(self) -> dict[str, str]:
        """The sides the stack gives, as it spells them."""
        return {side: cron for side, cron in (("start", self.start), ("stop", self.stop)) if cron}


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
    capacity: str = "direct"  # direct | queued (infra/tpu/queued.py)
    reservation_name: str = ""  # a named reservation in `zone` (queued, reserved)
    node_count: int = 1  # > 1: multislice (queued)
    fallback_zones: tuple[str, ...] = ()  # tried in order after `zone` on a stock-out (queued)
    run_duration_hours: float | None = None  # flex-start only
    max_run_hours: float | None = None  # expected hours of a run to completion; the guard enforces it
    hours_between_preemptions: float | None = None  # spot/preemptible: mean running hours, from a record
    self_service: bool = False  # researchers may submit runs to it (vm_agent/run_requests.py takes them)

    @property
    def reclaimable(self) -> bool:
        """Spot or preemptible: GCE may take it back at any time."""
        return self.provisioning in RECLAIMABLE

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def queued(self) -> bool:
        return self.capacity == "queued"

    @property
    def zones(self) -> tuple[str, ...]:
        """Every zone its TPUs may be in: its own, then the fallback zones."""
        return (self.zone, *self.fallback_zones)


@dataclass(frozen=True)
class SlicePoolSettings:
    """TPU slices of one type in one zone, one GKE node pool per slice (infra/gke/)."""

    name: str
    accelerator: GkeAcceleratorType
    zone: str
    provisioning: str  # on-demand | spot | reserved | flex-start
    reservation_name: str = ""  # the specific reservation of a reserved pool
    slices: int = 1
    run_duration_hours: float | None = None  # flex-start: how long a node lives

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


@dataclass(frozen=True)
class MaintenanceWindow:
    """When GKE may upgrade the cluster: weekly, on `days`, from `start_utc` for `hours`."""

    days: tuple[str, ...]  # RFC 5545 weekdays: MO TU WE TH FR SA SU
    start_utc: str  # HH:MM
    hours: int


@dataclass(frozen=True)
class TeamSettings:
    """A team sharing the GKE engine's slice pools through its own Kueue queues (infra/gke/queues.py)."""

    name: str
    members: tuple[str, ...]  # IAM members user:EMAIL / group:EMAIL: who runs the team's jobs
    namespace: str  # the team's Kubernetes namespace: its jobs, its queue, its workloads' identity
    nominal_chips: tuple[tuple[str, int], ...]  # (slice pool, TPU chips guaranteed there), pools of one shape add up
    borrowing_limit: int | None  # chips above nominal it may borrow in each flavor; None: what the cohort lends
    priority: str  # the highest priority class its runs may use


@dataclass(frozen=True)
class GkeSettings:
    """The GKE engine: one regional cluster and its TPU slice pools."""

    region: str
    node_cidr: str  # the cluster subnet's primary range (nodes)
    pod_cidr: str  # its secondary ranges
    service_cidr: str
    release_channel: str  # RAPID | REGULAR | STABLE | EXTENDED
    maintenance: MaintenanceWindow
    tpu_pool_upgrades: str  # end-of-support | maintenance-window
    system_machine_type: str
    system_nodes_per_zone: int
    slice_pools: tuple[SlicePoolSettings, ...]
    teams: tuple[TeamSettings, ...] = ()
    rbac_security_group: str = ""  # gke-security-groups@DOMAIN: Google Groups as RBAC subjects ("": none)

    @property
    def zones(self) -> tuple[str, ...]:
        """The zones of the slice pools, in order: where the cluster's system nodes run too."""
        return tuple(dict.fromkeys(p.zone for p in self.slice_pools))


@dataclass(frozen=True)
class Env:
    """What every component may know about the environment it is declared in, and nothing more:
    its own settings come as a separate, small args object. `PlatformConfig.env` builds it."""

    stack: str
    project: str
    region: str
    owner: str
    production: bool
    name_prefix: str

    @property
    def labels(self) -> dict[str, str]:
        # `environment-class` is the one notion of production the policy pack reads (policy/policies.py).
        kind = {"environment-class": "production"} if self.production else {}
        return {"environment": self.stack, "owner": self.owner, "managed-by": "pulumi", **kind}

    def bucket_name(self, purpose: str) -> str:
        return bucket_name(self.name_prefix, self.stack, purpose)


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
    researchers: tuple[str, ...] = ()  # IAM members (user:/group:) granted the `tpu-runs` rights
    self_service_in_production: bool = False  # the explicit opt-in for selfService VMs in production
    researcher_ssh: bool = False  # IAP tunnel and OS Login for researchers (project-wide)
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    gke: GkeSettings | None = None  # the GKE engine, when the stack declares it
    warnings: tuple[str, ...] = ()  # legal settings that are likely mistakes, shown by the plan

    @property
    def has_schedules(self) -> bool:
        return any(vm.schedule for vm in self.tpu_vms)

    @property
    def has_self_stop(self) -> bool:
        return any(vm.on_completion != "keep" for vm in self.tpu_vms)

    @property
    def self_service_vms(self) -> tuple[TpuVmSettings, ...]:
        return tuple(vm for vm in self.tpu_vms if vm.self_service)

    def workload(self, name: str) -> WorkloadSettings:
        return next(w for w in self.workloads if w.name == name)

    @property
    def env(self) -> Env:
        return Env(self.stack, self.project, self.region, self.owner, self.production, self.name_prefix)

    def bucket_name(self, purpose: str) -> str:
        return self.env.bucket_name(purpose)

    @property
    def labels(self) -> dict[str, str]:
        return self.env.labels


def bucket_name(prefix: str, stack: str, purpose: str) -> str:
    return naming.bucket(prefix, stack, purpose)


def service_account_id(workload: str, stack: str) -> str:
    return naming.workload_account_id(workload, stack)
