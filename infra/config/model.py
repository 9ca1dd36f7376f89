"""The settings of one stack, as frozen objects: what the components read. The sections declared as
models (`Section`) are their settings' one declaration too: type, default, bounds and description."""

from __future__ import annotations

import ipaddress
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types
from pydantic import BeforeValidator, Field, GetCoreSchemaHandler, InstanceOf, model_validator
from pydantic_core import core_schema

from infra import naming
from infra.access import iam
from infra.catalog import PROVISIONING_MODELS, RECLAIMABLE, AcceleratorType, Generation, load_catalog
from infra.catalog.gke import GkeAcceleratorType, GkeGeneration, load_gke_catalog
from infra.config.declared import (
    Allowed,
    Flag,
    Integer,
    Items,
    Number,
    OneOf,
    Placeholder,
    Section,
    Text,
    Unstated,
    as_text,
    refuse,
)
from infra.config.examples import examples, not_an_example
from infra.config.problems import fullmatch
from infra.config.workload_code import FOLDER_ALLOWED, IMAGE_ALLOWED, folder_problem
from infra.schedule import CronError, parse_cron
from run_contract.names import MEMBER_ADDRESS_RULE, RESEARCHER

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
GCP_PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
BILLING_ACCOUNT = r"[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}"
SERVICE_ACCOUNT_EMAIL = r"[a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com"
# IAM ServiceAccount.description: "The maximum length is 256 UTF-8 bytes" (iam v1 discovery document).
MAX_ACCOUNT_DESCRIPTION_BYTES = 256
# A workload's command and environment travel in the VM's metadata (256 KB per value, startup.py):
# bounds well inside it. The contract's own variables (docs/run-contract.md) are the platform's.
MAX_COMMAND_ITEMS = 256
MAX_COMMAND_ARG = 4096
MAX_ENV_ITEMS = 64
RESERVED_ENV_PREFIX = "TPU_PLATFORM_"
ON_COMPLETION = ("keep", "stop", "delete")
CAPACITY = ("direct", "queued")
# gcloud's short reservation name pattern (queued_api._RESERVATION; tpu.v2.json names the reservation
# projects/P/locations/ZONE/reservations/NAME).
RESERVATION_NAME = r"[a-zA-Z0-9-]+"
# A specific reservation's short name, as a VM and a GKE slice pool both take it.
ReservationName = Annotated[
    Text, Allowed("a reservation's short name: letters, digits and '-'", RESERVATION_NAME), Unstated()
]
ZONE = r"[a-z]+-[a-z]+[0-9]+-[a-z]"
VmZone = Annotated[Text, Allowed("a zone like us-central1-b", ZONE)]
# Flex-start: "for up to 7 days" (cloud.google.com/tpu/docs/request-using-flex-start).
MAX_FLEX_START_HOURS = 7 * 24
# "Each resource can have up to 64 labels" (https://cloud.google.com/compute/docs/labeling-resources);
# the platform sets RESERVED_LABELS on each TPU VM itself.
MAX_LABELS = 64
# Cloud TPU Node.description: "Maximum of 512 characters" (tpu v2 discovery document).
MAX_TPU_DESCRIPTION = 512
ACCELERATOR_NAME = r"[a-z][a-z0-9]*-[0-9]{1,5}"
TPU_TYPE_ALLOWED = "a TPU type like v5litepod-8"
GKE_TPU_TYPE_ALLOWED = "a TPU type GKE node pools take, like v5litepod-16"
REGION = r"[a-z]+-[a-z]+[0-9]+"
# container.v1 ReleaseChannel.channel, less UNSPECIFIED (no channel: a static version nobody upgrades).
RELEASE_CHANNELS = ("RAPID", "REGULAR", "STABLE", "EXTENDED")
WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")  # RFC 5545 BYDAY
# GKE ("Maintenance windows and exclusions"): a window is open at least 4 consecutive hours, and 48
# hours in any 32 days.
MIN_MAINTENANCE_WINDOW_HOURS = 4
MIN_MAINTENANCE_HOURS_PER_32_DAYS = 48
TPU_POOL_UPGRADES = ("end-of-support", "maintenance-window")
# A GKE pool's capacity; preemptible is the Spot VMs' predecessor and not offered for TPU pools here.
SLICE_POOL_PROVISIONING = ("on-demand", "spot", "reserved", "flex-start")
# IAM members a researcher grant may name: people and groups only (IAM "principal identifiers");
# service accounts run the platform and are never researchers.
RESEARCHER_MEMBER = RESEARCHER.pattern  # the run contract's (run_contract/names.py)
Members = Annotated[
    tuple[
        Annotated[Text, Allowed(f"an IAM member user:EMAIL or group:EMAIL, {MEMBER_ADDRESS_RULE}", RESEARCHER_MEMBER)],
        ...,
    ],
    Items(100),
]
# container.v1 AuthenticatorGroupsConfig (pulumi-gcp: "Group name must be in format
# gke-security-groups@yourdomain.com"): the group of groups GKE looks members up in for RBAC.
RBAC_SECURITY_GROUP = r"gke-security-groups@[^@\s]+\.[a-z]{2,}"
# A container image pinned by digest, in the image reference grammar (distribution/reference, regexp.go: an
# optional registry host and port, lowercase path components, an optional tag, `@sha256:` and 64 hex digits).
PINNED_IMAGE = (
    r"([a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[0-9]+)?/)?"
    r"[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"@sha256:[0-9a-f]{64}"
)
PINNED_IMAGE_ALLOWED = (
    "an image pinned by digest, like gcr.io/google.com/cloudsdktool/google-cloud-cli@sha256:<64 hex digits>"
)
# A team's name becomes its ClusterQueue's and LocalQueue's (label values, 63) and its namespace's default
# team-NAME; 30 leaves the namespace and the names derived from it room (infra/naming.py).
MAX_TEAM_NAME = 30
# The priority classes of the GKE engine's jobs, lowest first (xpk's five, core/kueue_manager.py): a team's
# `priority` names the highest its jobs may use; infra/gke/queues.py renders them.
PRIORITY_CLASSES: tuple[tuple[str, int], ...] = (
    ("very-low", 100),
    ("low", 250),
    ("medium", 500),
    ("high", 750),
    ("very-high", 1000),
)
# Stands in for an accelerator type that was refused: the parse stops before anything reads it.
NO_ACCELERATOR = AcceleratorType(
    Generation("", "", "chips", (), frozenset(), 1, 1, 0.0, 0.0, False, "", "0.0.0", {}, (), {}, False, False, {}), 0
)
NO_GKE_ACCELERATOR = GkeAcceleratorType(
    GkeGeneration("", "", "chips", "", {1: ""}, (), {0: ""}, {}, (), 0.0, False, False), 0
)


def resource_id(most: int) -> Allowed:
    """A name GCP takes as an id, of at most `most` characters."""
    why = f"1-{most} lowercase letters, digits and '-', starting with a letter"
    return Allowed(why, check=lambda name: naming.resource_id_problem(name, most))


def tpu_regions() -> tuple[str, ...]:
    """Regions with a Cloud TPU zone in the catalog."""
    zones = {z for g in load_catalog().generations.values() for z in g.zones}
    return tuple(sorted({z.rsplit("-", 1)[0] for z in zones}))


class GcpSettings(Section):
    """The provider's settings the platform reads (gcp:project, gcp:region); Pulumi's others are its own."""

    project: Annotated[Text, Allowed("a GCP project id: 6-30 lowercase letters, digits and '-'", GCP_PROJECT_ID)] = (
        Field(description="GCP project the stack deploys into.")
    )
    region: Annotated[Text, OneOf(tpu_regions())] = Field(
        default="us-central1",
        description="Region of the stack's regional services (functions, schedules); a region with Cloud TPUs.",
    )


def _label_value(value: str) -> str | None:
    if not value:
        return "must not be empty"
    return naming.label_value_problem(value)


class StackSettings(Section):
    """The stack's own keys that are not sections (tpu-platform:owner, ...)."""

    owner: Annotated[
        Text, Allowed("a label value: at most 63 lowercase letters, digits, '_' or '-'", check=_label_value)
    ] = Field(description="Team that owns the environment; the `owner` label on every labelled resource.")
    billing_account: Annotated[Text, Allowed("a billing account id like 012345-6789AB-CDEF01", BILLING_ACCOUNT)] = (
        Field(description="Billing account that pays for the project; the budget is created on it.")
    )
    production: Flag = Field(default=False, description="Production: buckets need CMEK and none may be destroyed.")
    name_prefix: Text = Field(
        default="",
        description="Prefix of bucket names; empty means the GCP project id. Changing it replaces the buckets.",
    )
    deployer: Annotated[
        Text,
        Allowed(
            "a service account email like ci-deployer@PROJECT.iam.gserviceaccount.com", f"({SERVICE_ACCOUNT_EMAIL})?"
        ),
    ] = Field(default="", description="CI's deploy service account (the bootstrap's output); empty when people deploy.")
    researchers: Members = Field(
        default=(),
        description="People and groups who may follow, fetch and (on VMs with selfService) submit and stop runs with "
        "`tpu-runs`.",
    )
    self_service_in_production: Flag = Field(
        default=False,
        description="Let researchers submit runs to production VMs marked selfService (off: production runs stay "
        "reviewed).",
    )
    researcher_ssh: Flag = Field(
        default=False,
        description="Grant researchers IAP tunnelling and OS Login: project-wide, as Cloud TPU has no per-node IAM.",
    )


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


class WorkloadSource(Section):
    """Where its code comes from: exactly one of folder or image (instead of program)."""

    folder: Annotated[Text, Allowed(FOLDER_ALLOWED, check=folder_problem), Unstated()] = Field(
        default="",
        description="A folder of this repository, packaged by `pulumi up` into the artifacts bucket by its sha256.",
    )
    image: Annotated[Text, Allowed(IMAGE_ALLOWED), Unstated()] = Field(
        default="", description="A container image in the stack's Artifact Registry repository, by digest."
    )

    @property
    def kind(self) -> str:
        """folder (a folder of the repository, relative to its root) or image
        (<region>-docker.pkg.dev/<project>/<repo>/<name>@sha256:<hex>, or :tag where allowed)."""
        return "image" if self.image else "folder"


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


AccessLevel = Annotated[Text, OneOf((*iam.BUCKET_ROLE_FOR_ACCESS, "none"))]


class BucketAccess(Section):
    """Access to each bucket: read, write or none."""

    data: AccessLevel = Field(default=iam.DEFAULT_BUCKET_ACCESS["data"], description="Access to the data bucket.")
    checkpoints: AccessLevel = Field(
        default=iam.DEFAULT_BUCKET_ACCESS["checkpoints"], description="Access to the checkpoints bucket."
    )
    models: AccessLevel = Field(default=iam.DEFAULT_BUCKET_ACCESS["models"], description="Access to the models bucket.")


def _account_description(description: str) -> str | None:
    if len(description.encode()) > MAX_ACCOUNT_DESCRIPTION_BYTES:
        return f"at most {MAX_ACCOUNT_DESCRIPTION_BYTES} UTF-8 bytes (a service account description)"
    return None


def _argument(value: object) -> object:
    """One argument of a command line: a string, not empty, not overlong, no NUL."""
    if not isinstance(value, str) or not value or len(value) > MAX_COMMAND_ARG or "\x00" in value:
        raise refuse(f"{COMMAND_ALLOWED}, not empty")
    return value


COMMAND_ALLOWED = f"strings of at most {MAX_COMMAND_ARG} characters"
ENV_ALLOWED = (
    f"NAME: value, NAME of A-Z, 0-9 and '_' not starting with {RESERVED_ENV_PREFIX}, values of at most "
    f"{MAX_COMMAND_ARG} characters"
)
ROLES_ALLOWED = (
    "project roles are allow-listed in infra/access/iam.py; storage access is granted per bucket with bucketAccess "
    "(read, write or none)"
)


Positive = Annotated[Number, annotated_types.Gt(0)]
Seconds = Annotated[Positive, annotated_types.Le(86_400)]  # at most a day


class WorkloadSettings(Section):
    """A training workload: its code, its service account's access and its program's settings."""

    # The workload's key in `workloads` (checked by the reader): not a setting of its own.
    name: str = Field(default="", exclude=True)
    description: Annotated[
        Text, Allowed(f"at most {MAX_ACCOUNT_DESCRIPTION_BYTES} UTF-8 bytes", check=_account_description), Unstated()
    ] = Field(default="", description="Description of the workload's service account.")
    program: Annotated[Text, OneOf(lambda: tuple(examples()), not_an_example), Unstated()] = Field(
        default="",
        description="An example of this repository (the source folder `workloads/<program>` and its command); or "
        "give source and command.",
    )
    framework_version: Annotated[
        Text, Allowed("an exact release like 2.15.0", r"[0-9]+\.[0-9]+\.[0-9]+"), Unstated()
    ] = Field(default="", description="Exact framework release the program is pinned to (required with program).")
    source: WorkloadSource = WorkloadSource()
    command: Annotated[
        tuple[Annotated[str, BeforeValidator(_argument)], ...],
        Items(MAX_COMMAND_ITEMS, repeats=True),
        Allowed(COMMAND_ALLOWED),
    ] = Field(
        default=(),
        description="The program's command line (a folder source: a file or module of the folder; an image: its "
        "arguments, empty runs the image's own).",
    )
    python: Annotated[Text, Allowed("a Python version like 3.11", r"3\.[0-9]{1,2}"), Unstated()] = Field(
        default="", description="Python version installed for a folder source (with uv); default: the TPU image's own."
    )
    # Each variable is checked by the reader, which names it.
    env: Annotated[tuple[tuple[str, Any], ...], Items(MAX_ENV_ITEMS, mapping=True), Allowed(ENV_ALLOWED)] = Field(
        default=(), description="Extra environment of the program (visible in the VM's metadata: never a secret)."
    )
    bucket_levels: BucketAccess = Field(default=BucketAccess(), validation_alias="bucketAccess")
    project_roles: Annotated[
        tuple[Annotated[Text, OneOf(tuple(sorted(iam.ALLOWED_PROJECT_ROLES)), hint=ROLES_ALLOWED)], ...],
        Items(),
        Unstated(),
    ] = Field(default=iam.DEFAULT_PROJECT_ROLES, description="Project roles of the workload's account (allow-listed).")
    memory_gib_per_chip: Number | None = Field(
        default=None, gt=0, le=1024, description="Accelerator memory the workload needs per chip (checked)."
    )
    data_object: Annotated[
        Text, Allowed("an object path in the data bucket like mnist/mnist.npz", r"([A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+")
    ] = Field(default="", description="Training data in the data bucket; empty: the program downloads it.")
    run: Annotated[Text, resource_id(32)] = Field(
        default="r1", description="Run id: a new id starts a new run (new checkpoints and model)."
    )
    checkpoint_every_steps: Integer = Field(
        default=200, ge=1, le=10**7, description="Checkpoint every N steps (program only)."
    )
    checkpoint_every_minutes: Number = Field(
        default=10, ge=0.5, le=1440, description="Checkpoint at least every N minutes (program only)."
    )
    step_seconds: Seconds | None = Field(
        default=None,
        description="Seconds one training step takes on its TPU VMs, measured or declared: with checkpointSeconds, "
        "the plan checks checkpointEverySteps against the interval that wastes least (program only).",
    )
    checkpoint_seconds: Seconds | None = Field(
        default=None,
        description="Seconds a checkpoint takes to commit, the most it stalls training; within the VM's notice, a "
        "save on SIGTERM keeps a preempted run's work (program only).",
    )
    epochs: Integer = Field(
        default=5, ge=1, le=10_000, description="Training epochs (program only: a source takes them in command)."
    )
    batch_size: Integer = Field(default=256, ge=1, le=1_048_576, description="Global batch size (program only).")
    # The example program's framework, "" for a workload with its own source (the reader sets it).
    framework: str = Field(default="", exclude=True)

    @classmethod
    def complete(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """A workload without a description is described by its name."""
        if data.get("description") is None and isinstance(data.get("name"), str):
            return {**data, "description": f"TPU workload {data['name']}"}
        return data

    @property
    def bucket_access(self) -> tuple[tuple[str, str], ...]:
        """(purpose, read or write) of each bucket it may use."""
        levels = ((p, getattr(self.bucket_levels, p)) for p in BUCKET_PURPOSES)
        return tuple((p, level) for p, level in levels if level != "none")

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

    action: Annotated[Text, OneOf(("stop", "delete"))] | None = Field(
        default=None, description="Stop or delete the stack's TPUs."
    )
    at_percent: Number = Field(default=100, ge=1, le=1000, description="Percent of the budget that triggers it.")
    dry_run: Flag = Field(default=False, description="Log what would be done, do nothing.")


# `recovery.everyMinutes` becomes `*/N * * * *`: N must divide the hour, or the runs are uneven
# (`*/45` fires at :00 and :45) or hourly (`*/90` is `0`).
RECOVERY_INTERVALS = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)


class Recovery(Section):
    """Re-create preempted spot or preemptible TPUs."""

    every_minutes: Annotated[Integer, OneOf(RECOVERY_INTERVALS)] | None = Field(
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


def _cron(expression: str) -> str | None:
    try:
        parse_cron(expression)
    except CronError as error:
        return f"not a unix-cron schedule: {error}"
    return None


def _time_zone(name: str) -> str | None:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file name
        return "an IANA time zone like Europe/Berlin or America/New_York"
    return None


CRON = Allowed("5 fields: minute hour day-of-month month day-of-week", check=_cron)


class ScheduleSettings(Section):
    """Stop and start it on a schedule (Cloud Scheduler): both, or only stop (people start it), or only start (with
    onCompletion stop or delete, which end each run)."""

    any_of = ("start", "stop")

    start: Annotated[Text, CRON, Unstated()] = Field(
        default="", description="When to start it: unix-cron as Cloud Scheduler reads it."
    )
    stop: Annotated[Text, CRON, Unstated()] = Field(default="", description="When to stop it: unix-cron.")
    time_zone: Annotated[Text, Allowed("an IANA time zone like Europe/Berlin", check=_time_zone)] = Field(
        default="Etc/UTC", description="IANA time zone of the schedule."
    )

    @model_validator(mode="after")
    def _a_side(self) -> ScheduleSettings:
        if not self.start and not self.stop:
            raise refuse(f"give {' or '.join(self.any_of)}, or both")
        return self

    @property
    def given(self) -> dict[str, str]:
        """The sides the stack gives, as it spells them."""
        return {side: cron for side, cron in (("start", self.start), ("stop", self.stop)) if cron}


@dataclass(frozen=True)
class TpuTypeName(Allowed):
    """A TPU type of the catalog (infra/catalog/tpu.yaml), or of its GKE part, read by its name."""

    gke: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.read, handler(source))

    def read(self, value: object) -> object:
        if isinstance(value, AcceleratorType | GkeAcceleratorType):
            return value
        name = str(as_text(value))
        if not fullmatch(ACCELERATOR_NAME, name):
            raise refuse(self.allowed)
        if isinstance(accelerator := (load_gke_catalog() if self.gke else load_catalog()).accelerator(name), str):
            raise refuse(accelerator, None if self.gke else load_catalog().meant(name))
        return accelerator


def _tpu_description(description: str) -> str | None:
    return f"at most {MAX_TPU_DESCRIPTION} characters" if len(description) > MAX_TPU_DESCRIPTION else None


class TpuVmSettings(Section):
    """A TPU VM."""

    name: Annotated[Text, resource_id(63)] = Field(description="TPU node name.")
    accelerator: Annotated[InstanceOf[AcceleratorType], TpuTypeName(TPU_TYPE_ALLOWED), Placeholder(NO_ACCELERATOR)] = (
        Field(validation_alias="acceleratorType", description="TPU type, like v5litepod-8 (infra/catalog/tpu.yaml).")
    )
    zone: VmZone = Field(description="Zone offering that TPU type.")
    runtime_version: Text = Field(description="TPU software version matching the workload's framework.")
    provisioning: Annotated[Text, OneOf(PROVISIONING_MODELS)] = Field(
        default="on-demand", description="How the capacity is bought (flex-start: queued only, with runDurationHours)."
    )
    capacity: Annotated[Text, OneOf(CAPACITY)] = Field(
        default="direct",
        description="direct: one TPU API node in its zone; queued: a queued resource (fallback zones, reservations, "
        "multislice, flex-start).",
    )
    reservation_name: ReservationName = Field(
        default="",
        description="A named reservation in the VM's zone (queued, provisioning reserved, no fallbackZones).",
    )
    node_count: Integer = Field(
        default=1,
        ge=1,
        le=1024,
        description="Slices asked for together (more than 1: multislice; queued, a multislice-capable type).",
    )
    fallback_zones: Annotated[tuple[VmZone, ...], Items(10)] = Field(
        default=(),
        description="Zones tried in order after the VM's own on a stock-out (queued only; each needs a subnet).",
    )
    run_duration_hours: Annotated[Positive, annotated_types.Le(MAX_FLEX_START_HOURS)] | None = Field(
        default=None,
        description="How long a flex-start VM runs before Google deletes it (flex-start only; at most "
        f"{MAX_FLEX_START_HOURS}).",
    )
    max_run_hours: Annotated[Positive, annotated_types.Le(8760)] | None = Field(
        default=None,
        description="Expected hours of a run to completion: priced for them, and the guard stops or deletes the node "
        "running past them (onCompletion stop or delete).",
    )
    hours_between_preemptions: Annotated[Positive, annotated_types.Le(8760)] | None = Field(
        default=None,
        description="Mean running hours between preemptions of this spot or preemptible VM, from your record of them: "
        "the plan checks its workload's checkpoint interval against it.",
    )
    workload: Annotated[Text, Allowed(check=lambda w: None if w else "name one of the workloads")] = Field(
        description="The workload it runs (a key of workloads)."
    )
    self_service: Flag = Field(
        default=False,
        description="Researchers may submit and stop runs on it with `tpu-runs` (requests the VM's agent takes in "
        "order).",
    )
    # Each label's key and value are checked by the reader, which names the label.
    labels: Annotated[tuple[tuple[str, Any], ...], Items(mapping=True)] = Field(
        default=(), description=f"Extra labels (at most {MAX_LABELS} with the platform's own)."
    )
    description: Annotated[Text, Allowed(f"at most {MAX_TPU_DESCRIPTION} characters", check=_tpu_description)] = Field(
        default="", description="Node description."
    )
    on_completion: Annotated[Text, OneOf(ON_COMPLETION)] = Field(
        default="keep", description="What happens to the TPU when its run has finished."
    )
    schedule: ScheduleSettings | None = None

    @classmethod
    def complete(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """An empty schedule is none."""
        return {k: v for k, v in data.items() if k != "schedule"} if data.get("schedule") == {} else data

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


def private_cidr_problem(cidr: object, allowed: str = PRIVATE_CIDR) -> str | None:
    """Why `cidr` is not a private IPv4 network with no host bits set, /8 to /29 (or None)."""
    try:
        network = ipaddress.ip_network(str(cidr), strict=True)
    except ValueError:
        return "must be an IPv4 network like 10.20.0.0/20, with no host bits set"
    if not isinstance(cidr, str) or not network.is_private or network.version != 4 or not 8 <= network.prefixlen <= 29:
        return f"must be {allowed}"
    return None


PrivateCidr = Annotated[Text, Allowed(PRIVATE_CIDR, check=private_cidr_problem)]


class MaintenanceWindow(Section):
    """When GKE may upgrade the cluster, weekly (default: SA and SU from 02:00 UTC for 8 hours)."""

    days: Annotated[tuple[Annotated[Text, OneOf(WEEKDAYS)], ...], Items(len(WEEKDAYS)), Unstated()] = Field(
        default=("SA", "SU"), description="Days of the week of the window (default SA, SU)."
    )
    start_utc: Annotated[Text, Allowed("HH:MM, 24-hour clock", r"([01][0-9]|2[0-3]):[0-5][0-9]")] = Field(
        default="02:00", description="When the window opens, UTC."
    )
    hours: Integer = Field(
        default=8,
        ge=MIN_MAINTENANCE_WINDOW_HOURS,
        le=24,
        description=f"How long the window stays open (GKE: at least {MIN_MAINTENANCE_WINDOW_HOURS} hours).",
    )


class SystemPool(Section):
    """The small node pool for the cluster's own pods."""

    machine_type: Annotated[
        Text, Allowed("a Compute Engine machine type like e2-standard-4", r"[a-z][a-z0-9]*-[a-z0-9-]+")
    ] = Field(default="e2-standard-4", description="Machine type of the system nodes.")
    nodes_per_zone: Integer = Field(default=1, ge=1, le=10, description="System nodes in each zone of the slice pools.")


class SlicePoolSettings(Section):
    """TPU slices of one type in one zone, one GKE node pool per slice (infra/gke/)."""

    name: Annotated[Text, resource_id(naming.MAX_SLICE_POOL)] = Field(
        description="Pool name; its slices are the node pools NAME-0, NAME-1, ..."
    )
    accelerator: Annotated[
        InstanceOf[GkeAcceleratorType],
        TpuTypeName(GKE_TPU_TYPE_ALLOWED, gke=True),
        Placeholder(NO_GKE_ACCELERATOR),
    ] = Field(
        validation_alias="acceleratorType",
        description="TPU type of each slice, like v5litepod-16 or tpu7x-16 (infra/catalog/tpu.yaml, gke).",
    )
    zone: Annotated[Text, Allowed("a zone like us-central1-a", ZONE)] = Field(
        description="Zone offering that type, in the cluster's region."
    )
    provisioning: Annotated[Text, OneOf(SLICE_POOL_PROVISIONING)] = Field(
        default="on-demand",
        description="How the capacity is bought: on-demand, spot, a specific reservation (reserved, with "
        "reservationName) or flex-start (the pool scales from zero when a job asks).",
    )
    reservation_name: ReservationName = Field(
        default="", description="The specific reservation a reserved pool consumes, in its zone."
    )
    slices: Integer = Field(
        default=1, ge=1, le=naming.MAX_SLICES, description="Slices of this type: one node pool each."
    )
    run_duration_hours: Annotated[Positive, annotated_types.Le(MAX_FLEX_START_HOURS)] | None = Field(
        default=None,
        description="How long a flex-start node lives before GKE deletes it (flex-start only; at most "
        f"{MAX_FLEX_START_HOURS}).",
    )

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]


def _team_namespace(namespace: str) -> str | None:
    if why := naming.resource_id_problem(namespace):
        return why
    if namespace in naming.SYSTEM_NAMESPACES or namespace.startswith(naming.SYSTEM_NAMESPACE_PREFIXES):
        return "a namespace of its own: not default, a kube-/gke- namespace or a controller's"
    return None


class TeamSettings(Section):
    """A team sharing the GKE engine's slice pools through its own Kueue queues (infra/gke/queues.py)."""

    name: Annotated[Text, resource_id(MAX_TEAM_NAME)] = Field(
        description="Team name: its ClusterQueue and LocalQueue are named so."
    )
    members: Members = Field(
        default=(), description="Who runs the team's jobs: JobSets in its namespace, nowhere else."
    )
    namespace: Annotated[
        Text,
        Allowed(
            "1-63 lowercase letters, digits and '-', starting with a letter, not a system namespace",
            check=_team_namespace,
        ),
        Unstated(),
    ] = Field(
        default="",
        description="The team's Kubernetes namespace (default team-NAME): its jobs, its queue and its workloads' "
        "identity.",
    )
    # Each pool's chips are checked by the reader, which names the pool (`int | Any`: an integer, read as given).
    nominal_chips: Annotated[tuple[tuple[str, int | Any], ...], Items(mapping=True)] = Field(
        default=(),
        description="TPU chips guaranteed to the team, by slice pool (whole slices; pools of one shape add up; "
        "together at most what the pools hold).",
    )
    borrowing_limit: Annotated[Integer, annotated_types.Ge(0), annotated_types.Le(1_000_000)] | None = Field(
        default=None,
        description="Chips above its nominal ones the team may borrow in each pool shape while others leave them idle "
        "(unset: as many as the cohort lends; 0: none).",
    )
    priority: Annotated[Text, OneOf(tuple(name for name, _ in PRIORITY_CLASSES))] = Field(
        default="medium",
        description="The highest priority class the team's jobs may use; a job preempts only the team's own lesser "
        "ones.",
    )

    @classmethod
    def complete(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """A team without a namespace gets team-NAME (once its name is one)."""
        name = data.get("name")
        if (
            data.get("namespace") is None
            and isinstance(name, str)
            and not naming.resource_id_problem(name, MAX_TEAM_NAME)
        ):
            return {**data, "namespace": naming.team_namespace(name)}
        return data


class GkeSettings(Section):
    """The GKE engine: one regional cluster (private nodes, Workload Identity, Dataplane V2) and TPU slice node
    pools, one node pool per slice. TPU7x runs only here."""

    region: Annotated[Text, Allowed("a region like us-central1", REGION), Unstated()] = Field(
        default="", description="Region of the cluster; its slice pools' zones are in it. Default: gcp:region."
    )
    node_cidr: PrivateCidr = Field(description="Private IPv4 range of the cluster's subnet: its nodes.")
    pod_cidr: PrivateCidr = Field(description="Secondary range of the subnet for pods.")
    service_cidr: PrivateCidr = Field(description="Secondary range of the subnet for services.")
    release_channel: Annotated[Text, OneOf(RELEASE_CHANNELS)] = Field(
        default="REGULAR",
        description="GKE release channel: the control plane and nodes follow it (node auto-upgrade cannot be off on "
        "a channel; tpuPoolUpgrades decides when TPU pools take it).",
    )
    maintenance: MaintenanceWindow = Field(default=MaintenanceWindow(), validation_alias="maintenanceWindow")
    tpu_pool_upgrades: Annotated[Text, OneOf(TPU_POOL_UPGRADES)] = Field(
        default="end-of-support",
        description="When TPU slice pools are upgraded, which recreates their nodes and kills the jobs on them: "
        "end-of-support (an exclusion keeps them on their version until its end of support; you upgrade them "
        "between runs) or maintenance-window (in the window, like the system pool).",
    )
    system_pool: SystemPool = SystemPool()
    slice_pools: Annotated[tuple[SlicePoolSettings, ...], Items(100, repeats=True)] = Field(
        description="The TPU slice pools."
    )
    rbac_security_group: Annotated[
        Text, Allowed("gke-security-groups@ followed by your domain", RBAC_SECURITY_GROUP), Unstated()
    ] = Field(
        default="",
        description="Google Groups for RBAC: the group gke-security-groups@DOMAIN whose member groups GKE resolves, "
        "so a team may list group: members (needed when one does).",
    )
    teams: Annotated[tuple[TeamSettings, ...], Items(50, repeats=True)] = Field(
        default=(),
        description="Teams sharing the slice pools through Kueue: a queue each in one cohort, chips guaranteed per "
        "pool, idle chips lent and reclaimed, jobs only in the team's own namespace.",
    )
    folder_image: Annotated[Text, Allowed(PINNED_IMAGE_ALLOWED, PINNED_IMAGE), Unstated()] = Field(
        default="",
        description="The public image a team's folder source runs in (tpu-runs submit --team --folder), pinned by "
        "digest; it needs python3 no older than the VM agent's oldest, bash, curl 7.71 or newer, sha256sum, tar and "
        "gzip: Google's google-cloud-cli:slim has them (docs/design-gke.md), python:*-slim has no curl. The "
        "researchers' commands run in it too: in that Debian image they say python3, as it has no python command. "
        "Default: none, and only images are submitted.",
        examples=["gcr.io/google.com/cloudsdktool/google-cloud-cli@sha256:<64 hex digits>"],
    )

    @property
    def system_machine_type(self) -> str:
        return self.system_pool.machine_type

    @property
    def system_nodes_per_zone(self) -> int:
        return self.system_pool.nodes_per_zone

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


class PlatformConfig(StackSettings):
    """Every setting of one stack, read: what the composition root is given. Its own keys (owner, production, ...)
    are StackSettings' fields, declared there once."""

    # Not the stack's keys: its name, and the provider's gcp:project and gcp:region (GcpSettings).
    stack: str = Field(exclude=True)
    project: str = Field(exclude=True)
    region: str = Field(exclude=True)
    # The sections, in the order the settings table and the schema list them; a required one is refused when absent.
    buckets: BucketSettings
    budget: BudgetSettings
    # A mapping by name in the stack file; each workload holds its name (the reader supplies it).
    workloads: Annotated[tuple[WorkloadSettings, ...], Items(mapping=True)] = Field(
        description="Training workloads by name (1-16 lowercase letters, digits, '-')."
    )
    artifacts: ArtifactSettings = ArtifactSettings()
    network: NetworkSettings
    # Two VMs alike are refused by the rules, by their names.
    tpu_vms: Annotated[tuple[TpuVmSettings, ...], Items(repeats=True)] = Field(default=(), description="The TPU VMs.")
    gke: GkeSettings | None = None  # the GKE engine, when the stack declares it
    monitoring: MonitoringSettings = MonitoringSettings()
    automation: AutomationSettings = AutomationSettings()
    warnings: tuple[str, ...] = Field(default=(), exclude=True)  # legal settings that are likely mistakes

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
