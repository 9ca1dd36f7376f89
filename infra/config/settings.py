"""One declaration per stack setting: key, type, default, bounds and description.

The reader (`reader.py`) reads each value through its declaration, and the JSON Schema of
`Pulumi.<stack>.yaml` and the settings table of docs/stack-settings.md are generated from the same list
(`python -m tools.offline schema --write`), so the three cannot disagree.

Keys are paths below the stack file's `config:`: `tpu-platform:budget.amount`; `[]` is each item
of a list (`tpuVms[].zone`) and `<name>` each key of a mapping (`workloads.<name>.epochs`).
Limits are GCP's where GCP has one; the comment beside each says where it is documented.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Literal

from pydantic_core import PydanticUndefined

from infra import naming
from infra.access import iam
from infra.catalog import PROVISIONING_MODELS, load_catalog
from infra.config.declared import Allowed, Items, Section, base_type, choices_of, limits, literal_choices, marks
from infra.config.examples import examples
from infra.config.model import (
    BUCKET_PURPOSES,
    PRIVATE_CIDR,
    PROJECT,
    ArtifactSettings,
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    MonitoringSettings,
    NetworkSettings,
)
from infra.config.workload_code import FOLDER_ALLOWED, IMAGE_ALLOWED
from run_contract.names import RESEARCHER

Kind = Literal["string", "integer", "number", "boolean", "list", "object", "map"]
Scalar = str | int | float | bool

ON_COMPLETION = ("keep", "stop", "delete")
CAPACITY = ("direct", "queued")
# gcloud's short reservation name pattern (queued_api._RESERVATION; tpu.v2.json names the reservation
# projects/P/locations/ZONE/reservations/NAME).
RESERVATION_NAME = r"[a-zA-Z0-9-]+"
ZONE = r"[a-z]+-[a-z]+[0-9]+-[a-z]"
# Flex-start: "for up to 7 days" (cloud.google.com/tpu/docs/request-using-flex-start).
MAX_FLEX_START_HOURS = 7 * 24
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
GCP_PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
BILLING_ACCOUNT = r"[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}"
# IAM members a researcher grant may name: people and groups only (IAM "principal identifiers");
# service accounts run the platform and are never researchers.
RESEARCHER_MEMBER = RESEARCHER.pattern  # the run contract's (run_contract/names.py)
# container.v1 AuthenticatorGroupsConfig (pulumi-gcp: "Group name must be in format
# gke-security-groups@yourdomain.com"): the group of groups GKE looks members up in for RBAC.
RBAC_SECURITY_GROUP = r"gke-security-groups@[^@\s]+\.[a-z]{2,}"
SERVICE_ACCOUNT_EMAIL = r"[a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com"
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
# IAM ServiceAccount.description: "The maximum length is 256 UTF-8 bytes" (iam v1 discovery document).
MAX_ACCOUNT_DESCRIPTION_BYTES = 256
# Cloud TPU Node.description: "Maximum of 512 characters" (tpu v2 discovery document).
MAX_TPU_DESCRIPTION = 512
# "Each resource can have up to 64 labels" (https://cloud.google.com/compute/docs/labeling-resources);
# the platform sets RESERVED_LABELS on each TPU VM itself.
MAX_LABELS = 64
# A workload's command and environment travel in the VM's metadata (256 KB per value, startup.py):
# bounds well inside it. The contract's own variables (docs/run-contract.md) are the platform's.
MAX_COMMAND_ITEMS = 256
MAX_COMMAND_ARG = 4096
MAX_ENV_ITEMS = 64
RESERVED_ENV_PREFIX = "TPU_PLATFORM_"


def tpu_regions() -> tuple[str, ...]:
    """Regions with a Cloud TPU zone in the catalog."""
    zones = {z for g in load_catalog().generations.values() for z in g.zones}
    return tuple(sorted({z.rsplit("-", 1)[0] for z in zones}))


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    description: str
    default: Scalar | None = None  # None: no default (required unless `optional`)
    optional: bool = False  # may be left unset with no default
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] | tuple[int, ...] = ()
    pattern: str | None = None
    allowed: str = ""  # what a pattern or check accepts, in words (error messages, the table)
    max_items: int | None = None
    items: Kind | None = None  # kind of list items / map values
    unique: bool = True  # list items may not repeat (a command's arguments may)
    example: Scalar | None = None  # what an error suggests when a rule needs it set and it has no default
    any_of: tuple[str, ...] = ()  # an object: at least one of these children must be given

    @property
    def full(self) -> str:
        """The key as the stack file writes it at the top: `tpu-platform:budget.amount`, `gcp:region`."""
        return self.key if self.key.startswith("gcp:") else f"{PROJECT}:{self.key}"

    @property
    def name(self) -> str:
        """The key as written in the stack file: `tpu-platform:budget`, `gcp:region`, or a nested leaf."""
        return self.key.rsplit(".", 1)[-1].removesuffix("[]")

    @property
    def required(self) -> bool:
        return self.default is None and not self.optional and self.kind not in ("object", "map", "list")


_KINDS: dict[object, Kind] = {bool: "boolean", int: "integer", float: "number", str: "string", typing.Any: "string"}


def _kind(annotation: object) -> Kind:
    choices = literal_choices(annotation)
    kind = base_type(annotation)
    if isinstance(kind, type) and issubclass(kind, Section):
        return "object"
    return _KINDS[type(choices[0]) if choices else typing.get_origin(kind) or kind]


def declared(key: str, model: type[Section], *, optional: bool = True) -> tuple[Setting, ...]:
    """The rows of a section declared as a model (infra/config/model.py): itself, then each of its fields."""
    rows = [Setting(key, "object", inspect.cleandoc(model.__doc__ or ""), optional=optional)]
    for name, info in model.model_fields.items():
        child = f"{key}.{info.alias or name}"
        kind = base_type(info.annotation)
        if isinstance(kind, type) and issubclass(kind, Section):
            rows.extend(declared(child, kind, optional=not info.is_required()))
            continue
        rule = next((m for m in marks(info) if isinstance(m, Allowed)), Allowed())
        many = next((m for m in info.metadata if isinstance(m, Items)), None)
        item = typing.get_args(kind)[0] if many else None
        if many and many.mapping:
            item = typing.get_args(item)[1]
        low, high, exclusive = limits(info)
        default = None if info.default in (PydanticUndefined, ()) else info.default
        rows.append(
            Setting(
                child,
                ("map" if many.mapping else "list") if many else _kind(info.annotation),
                info.description or "",
                default=default,
                optional=default is None and not info.is_required(),
                minimum=low,
                maximum=high,
                exclusive_minimum=exclusive,
                choices=choices_of(info),
                pattern=rule.pattern,
                allowed=rule.allowed,
                max_items=many.most if many else None,
                items=_kind(item) if many else None,
                unique=not (many and many.repeats),
                example=info.examples[0] if info.examples else None,
            )
        )
        if many and not many.mapping and _kind(item) == "object":
            rows.extend(declared(f"{child}[]", base_type(item))[1:])  # type: ignore[arg-type]
    return tuple(rows)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "gcp:project",
        "string",
        "GCP project the stack deploys into.",
        pattern=GCP_PROJECT_ID,
        allowed="a GCP project id: 6-30 lowercase letters, digits and '-'",
    ),
    Setting(
        "gcp:region",
        "string",
        "Region of the stack's regional services (functions, schedules); a region with Cloud TPUs.",
        default="us-central1",
        choices=tpu_regions(),
    ),
    Setting(
        "owner",
        "string",
        "Team that owns the environment; the `owner` label on every labelled resource.",
        allowed="a label value: at most 63 lowercase letters, digits, '_' or '-'",
    ),
    Setting(
        "billingAccount",
        "string",
        "Billing account that pays for the project; the budget is created on it.",
        pattern=BILLING_ACCOUNT,
        allowed="a billing account id like 012345-6789AB-CDEF01",
    ),
    Setting("production", "boolean", "Production: buckets need CMEK and none may be destroyed.", default=False),
    Setting(
        "namePrefix",
        "string",
        "Prefix of bucket names; empty means the GCP project id. Changing it replaces the buckets.",
        default="",
    ),
    Setting(
        "deployer",
        "string",
        "CI's deploy service account (the bootstrap's output); empty when people deploy.",
        default="",
        pattern=f"({SERVICE_ACCOUNT_EMAIL})?",
        allowed="a service account email like ci-deployer@PROJECT.iam.gserviceaccount.com",
    ),
    Setting(
        "researchers",
        "list",
        "People and groups who may follow, fetch and (on VMs with selfService) submit and stop runs with `tpu-runs`.",
        items="string",
        optional=True,
        pattern=RESEARCHER_MEMBER,
        allowed="an IAM member user:EMAIL or group:EMAIL",
        max_items=100,
    ),
    Setting(
        "selfServiceInProduction",
        "boolean",
        "Let researchers submit runs to production VMs marked selfService (off: production runs stay reviewed).",
        default=False,
    ),
    Setting(
        "researcherSsh",
        "boolean",
        "Grant researchers IAP tunnelling and OS Login: project-wide, as Cloud TPU has no per-node IAM.",
        default=False,
    ),
    *declared("buckets", BucketSettings, optional=False),
    *declared("budget", BudgetSettings, optional=False),
    Setting("workloads", "map", "Training workloads by name (1-16 lowercase letters, digits, '-').", items="object"),
    Setting(
        "workloads.<name>.description",
        "string",
        "Description of the workload's service account.",
        optional=True,
        allowed=f"at most {MAX_ACCOUNT_DESCRIPTION_BYTES} UTF-8 bytes",
    ),
    Setting(
        "workloads.<name>.program",
        "string",
        "An example of this repository (the source folder `workloads/<program>` and its command); or give "
        "source and command.",
        optional=True,
        choices=tuple(examples()),
    ),
    Setting(
        "workloads.<name>.frameworkVersion",
        "string",
        "Exact framework release the program is pinned to (required with program).",
        optional=True,
        pattern=r"[0-9]+\.[0-9]+\.[0-9]+",
        allowed="an exact release like 2.15.0",
    ),
    Setting(
        "workloads.<name>.source",
        "object",
        "Where its code comes from: exactly one of folder or image (instead of program).",
        optional=True,
    ),
    Setting(
        "workloads.<name>.source.folder",
        "string",
        "A folder of this repository, packaged by `pulumi up` into the artifacts bucket by its sha256.",
        optional=True,
        allowed=FOLDER_ALLOWED,
    ),
    Setting(
        "workloads.<name>.source.image",
        "string",
        "A container image in the stack's Artifact Registry repository, by digest.",
        optional=True,
        allowed=IMAGE_ALLOWED,
    ),
    Setting(
        "workloads.<name>.command",
        "list",
        "The program's command line (a folder source: a file or module of the folder; an image: its arguments, "
        "empty runs the image's own).",
        items="string",
        optional=True,
        max_items=MAX_COMMAND_ITEMS,
        unique=False,
        allowed=f"strings of at most {MAX_COMMAND_ARG} characters",
    ),
    Setting(
        "workloads.<name>.python",
        "string",
        "Python version installed for a folder source (with uv); default: the TPU image's own.",
        optional=True,
        pattern=r"3\.[0-9]{1,2}",
        allowed="a Python version like 3.11",
    ),
    Setting(
        "workloads.<name>.env",
        "map",
        "Extra environment of the program (visible in the VM's metadata: never a secret).",
        items="string",
        optional=True,
        max_items=MAX_ENV_ITEMS,
        allowed=f"NAME: value, NAME of A-Z, 0-9 and '_' not starting with {RESERVED_ENV_PREFIX}, "
        f"values of at most {MAX_COMMAND_ARG} characters",
    ),
    Setting("workloads.<name>.bucketAccess", "object", "Access to each bucket: read, write or none.", optional=True),
    *(
        Setting(
            f"workloads.<name>.bucketAccess.{purpose}",
            "string",
            f"Access to the {purpose} bucket.",
            default=iam.DEFAULT_BUCKET_ACCESS[purpose],
            choices=(*iam.BUCKET_ROLE_FOR_ACCESS, "none"),
        )
        for purpose in BUCKET_PURPOSES
    ),
    Setting(
        "workloads.<name>.projectRoles",
        "list",
        "Project roles of the workload's account (allow-listed).",
        items="string",
        default=None,
        optional=True,
        choices=tuple(sorted(iam.ALLOWED_PROJECT_ROLES)),
        allowed="project roles are allow-listed in infra/access/iam.py; storage access is granted per bucket "
        "with bucketAccess (read, write or none)",
    ),
    Setting(
        "workloads.<name>.memoryGibPerChip",
        "number",
        "Accelerator memory the workload needs per chip (checked).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=1024,
    ),
    Setting(
        "workloads.<name>.dataObject",
        "string",
        "Training data in the data bucket; empty: the program downloads it.",
        default="",
        pattern=r"([A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+",
        allowed="an object path in the data bucket like mnist/mnist.npz",
    ),
    Setting(
        "workloads.<name>.run",
        "string",
        "Run id: a new id starts a new run (new checkpoints and model).",
        default="r1",
        allowed="1-32 lowercase letters, digits and '-', starting with a letter",
    ),
    Setting(
        "workloads.<name>.checkpointEverySteps",
        "integer",
        "Checkpoint every N steps (program only).",
        default=200,
        minimum=1,
        maximum=10**7,
    ),
    Setting(
        "workloads.<name>.checkpointEveryMinutes",
        "number",
        "Checkpoint at least every N minutes (program only).",
        default=10,
        minimum=0.5,
        maximum=1440,
    ),
    Setting(
        "workloads.<name>.stepSeconds",
        "number",
        "Seconds one training step takes on its TPU VMs, measured or declared: with checkpointSeconds, the plan "
        "checks checkpointEverySteps against the interval that wastes least (program only).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=86_400,
    ),
    Setting(
        "workloads.<name>.checkpointSeconds",
        "number",
        "Seconds a checkpoint takes to commit, the most it stalls training; within the VM's notice, a save "
        "on SIGTERM keeps a preempted run's work (program only).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=86_400,
    ),
    Setting(
        "workloads.<name>.epochs",
        "integer",
        "Training epochs (program only: a source takes them in command).",
        default=5,
        minimum=1,
        maximum=10_000,
    ),
    Setting(
        "workloads.<name>.batchSize",
        "integer",
        "Global batch size (program only).",
        default=256,
        minimum=1,
        maximum=1_048_576,
    ),
    *declared("artifacts", ArtifactSettings),
    *declared("network", NetworkSettings, optional=False),
    Setting("tpuVms", "list", "The TPU VMs.", items="object", optional=True),
    Setting(
        "tpuVms[].name",
        "string",
        "TPU node name.",
        allowed="1-63 lowercase letters, digits and '-', starting with a letter",
    ),
    Setting(
        "tpuVms[].acceleratorType",
        "string",
        "TPU type, like v5litepod-8 (infra/catalog/tpu.yaml).",
        allowed="a TPU type like v5litepod-8",
    ),
    Setting(
        "tpuVms[].zone",
        "string",
        "Zone offering that TPU type.",
        pattern=ZONE,
        allowed="a zone like us-central1-b",
    ),
    Setting("tpuVms[].runtimeVersion", "string", "TPU software version matching the workload's framework."),
    Setting(
        "tpuVms[].provisioning",
        "string",
        "How the capacity is bought (flex-start: queued only, with runDurationHours).",
        default="on-demand",
        choices=PROVISIONING_MODELS,
    ),
    Setting(
        "tpuVms[].capacity",
        "string",
        "direct: one TPU API node in its zone; queued: a queued resource (fallback zones, reservations, "
        "multislice, flex-start).",
        default="direct",
        choices=CAPACITY,
    ),
    Setting(
        "tpuVms[].reservationName",
        "string",
        "A named reservation in the VM's zone (queued, provisioning reserved, no fallbackZones).",
        optional=True,
        pattern=RESERVATION_NAME,
        allowed="a reservation's short name: letters, digits and '-'",
    ),
    Setting(
        "tpuVms[].nodeCount",
        "integer",
        "Slices asked for together (more than 1: multislice; queued, a multislice-capable type).",
        default=1,
        minimum=1,
        maximum=1024,
    ),
    Setting(
        "tpuVms[].fallbackZones",
        "list",
        "Zones tried in order after the VM's own on a stock-out (queued only; each needs a subnet).",
        items="string",
        optional=True,
        pattern=ZONE,
        allowed="a zone like us-central1-b",
        max_items=10,
    ),
    Setting(
        "tpuVms[].runDurationHours",
        "number",
        f"How long a flex-start VM runs before Google deletes it (flex-start only; at most {MAX_FLEX_START_HOURS}).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=MAX_FLEX_START_HOURS,
    ),
    Setting(
        "tpuVms[].maxRunHours",
        "number",
        "Expected hours of a run to completion: priced for them, and the guard stops or deletes the node "
        "running past them (onCompletion stop or delete).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=8760,
    ),
    Setting(
        "tpuVms[].hoursBetweenPreemptions",
        "number",
        "Mean running hours between preemptions of this spot or preemptible VM, from your record of them: the "
        "plan checks its workload's checkpoint interval against it.",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=8760,
    ),
    Setting("tpuVms[].workload", "string", "The workload it runs (a key of workloads)."),
    Setting(
        "tpuVms[].selfService",
        "boolean",
        "Researchers may submit and stop runs on it with `tpu-runs` (requests the VM's agent takes in order).",
        default=False,
    ),
    Setting(
        "tpuVms[].labels",
        "map",
        f"Extra labels (at most {MAX_LABELS} with the platform's own).",
        items="string",
        optional=True,
    ),
    Setting(
        "tpuVms[].description",
        "string",
        "Node description.",
        default="",
        allowed=f"at most {MAX_TPU_DESCRIPTION} characters",
    ),
    Setting(
        "tpuVms[].onCompletion",
        "string",
        "What happens to the TPU when its run has finished.",
        default="keep",
        choices=ON_COMPLETION,
    ),
    Setting(
        "tpuVms[].schedule",
        "object",
        "Stop and start it on a schedule (Cloud Scheduler): both, or only stop (people start it), or only start "
        "(with onCompletion stop or delete, which end each run).",
        optional=True,
        any_of=("start", "stop"),
    ),
    Setting(
        "tpuVms[].schedule.start",
        "string",
        "When to start it: unix-cron as Cloud Scheduler reads it.",
        optional=True,
        allowed="5 fields: minute hour day-of-month month day-of-week",
    ),
    Setting(
        "tpuVms[].schedule.stop",
        "string",
        "When to stop it: unix-cron.",
        optional=True,
        allowed="5 fields: minute hour day-of-month month day-of-week",
    ),
    Setting(
        "tpuVms[].schedule.timeZone",
        "string",
        "IANA time zone of the schedule.",
        default="Etc/UTC",
        allowed="an IANA time zone like Europe/Berlin",
    ),
    Setting(
        "gke",
        "object",
        "The GKE engine: one regional cluster (private nodes, Workload Identity, Dataplane V2) and TPU slice "
        "node pools, one node pool per slice. TPU7x runs only here.",
        optional=True,
    ),
    Setting(
        "gke.region",
        "string",
        "Region of the cluster; its slice pools' zones are in it. Default: gcp:region.",
        optional=True,
        pattern=REGION,
        allowed="a region like us-central1",
    ),
    Setting(
        "gke.nodeCidr",
        "string",
        "Private IPv4 range of the cluster's subnet: its nodes.",
        allowed=PRIVATE_CIDR,
    ),
    Setting("gke.podCidr", "string", "Secondary range of the subnet for pods.", allowed=PRIVATE_CIDR),
    Setting("gke.serviceCidr", "string", "Secondary range of the subnet for services.", allowed=PRIVATE_CIDR),
    Setting(
        "gke.releaseChannel",
        "string",
        "GKE release channel: the control plane and nodes follow it (node auto-upgrade cannot be off on a "
        "channel; tpuPoolUpgrades decides when TPU pools take it).",
        default="REGULAR",
        choices=RELEASE_CHANNELS,
    ),
    Setting(
        "gke.maintenanceWindow",
        "object",
        "When GKE may upgrade the cluster, weekly (default: SA and SU from 02:00 UTC for 8 hours).",
        optional=True,
    ),
    Setting(
        "gke.maintenanceWindow.days",
        "list",
        "Days of the week of the window (default SA, SU).",
        items="string",
        optional=True,
        choices=WEEKDAYS,
        max_items=len(WEEKDAYS),
    ),
    Setting(
        "gke.maintenanceWindow.startUtc",
        "string",
        "When the window opens, UTC.",
        default="02:00",
        pattern=r"([01][0-9]|2[0-3]):[0-5][0-9]",
        allowed="HH:MM, 24-hour clock",
    ),
    Setting(
        "gke.maintenanceWindow.hours",
        "integer",
        f"How long the window stays open (GKE: at least {MIN_MAINTENANCE_WINDOW_HOURS} hours).",
        default=8,
        minimum=MIN_MAINTENANCE_WINDOW_HOURS,
        maximum=24,
    ),
    Setting(
        "gke.tpuPoolUpgrades",
        "string",
        "When TPU slice pools are upgraded, which recreates their nodes and kills the jobs on them: "
        "end-of-support (an exclusion keeps them on their version until its end of support; you upgrade them "
        "between runs) or maintenance-window (in the window, like the system pool).",
        default="end-of-support",
        choices=TPU_POOL_UPGRADES,
    ),
    Setting("gke.systemPool", "object", "The small node pool for the cluster's own pods.", optional=True),
    Setting(
        "gke.systemPool.machineType",
        "string",
        "Machine type of the system nodes.",
        default="e2-standard-4",
        pattern=r"[a-z][a-z0-9]*-[a-z0-9-]+",
        allowed="a Compute Engine machine type like e2-standard-4",
    ),
    Setting(
        "gke.systemPool.nodesPerZone",
        "integer",
        "System nodes in each zone of the slice pools.",
        default=1,
        minimum=1,
        maximum=10,
    ),
    Setting("gke.slicePools", "list", "The TPU slice pools.", items="object", max_items=100),
    Setting(
        "gke.slicePools[].name",
        "string",
        "Pool name; its slices are the node pools NAME-0, NAME-1, ...",
        allowed=f"1-{naming.MAX_SLICE_POOL} lowercase letters, digits and '-', starting with a letter",
    ),
    Setting(
        "gke.slicePools[].acceleratorType",
        "string",
        "TPU type of each slice, like v5litepod-16 or tpu7x-16 (infra/catalog/tpu.yaml, gke).",
        allowed="a TPU type GKE node pools take, like v5litepod-16",
    ),
    Setting(
        "gke.slicePools[].zone",
        "string",
        "Zone offering that type, in the cluster's region.",
        pattern=ZONE,
        allowed="a zone like us-central1-a",
    ),
    Setting(
        "gke.slicePools[].provisioning",
        "string",
        "How the capacity is bought: on-demand, spot, a specific reservation (reserved, with reservationName) or "
        "flex-start (the pool scales from zero when a job asks).",
        default="on-demand",
        choices=SLICE_POOL_PROVISIONING,
    ),
    Setting(
        "gke.slicePools[].reservationName",
        "string",
        "The specific reservation a reserved pool consumes, in its zone.",
        optional=True,
        pattern=RESERVATION_NAME,
        allowed="a reservation's short name: letters, digits and '-'",
    ),
    Setting(
        "gke.slicePools[].slices",
        "integer",
        "Slices of this type: one node pool each.",
        default=1,
        minimum=1,
        maximum=naming.MAX_SLICES,
    ),
    Setting(
        "gke.slicePools[].runDurationHours",
        "number",
        f"How long a flex-start node lives before GKE deletes it (flex-start only; at most {MAX_FLEX_START_HOURS}).",
        optional=True,
        minimum=0,
        exclusive_minimum=True,
        maximum=MAX_FLEX_START_HOURS,
    ),
    Setting(
        "gke.rbacSecurityGroup",
        "string",
        "Google Groups for RBAC: the group gke-security-groups@DOMAIN whose member groups GKE resolves, so a "
        "team may list group: members (needed when one does).",
        optional=True,
        pattern=RBAC_SECURITY_GROUP,
        allowed="gke-security-groups@ followed by your domain",
    ),
    Setting(
        "gke.teams",
        "list",
        "Teams sharing the slice pools through Kueue: a queue each in one cohort, chips guaranteed per pool, "
        "idle chips lent and reclaimed, jobs only in the team's own namespace.",
        items="object",
        optional=True,
        max_items=50,
    ),
    Setting(
        "gke.teams[].name",
        "string",
        "Team name: its ClusterQueue and LocalQueue are named so.",
        allowed=f"1-{MAX_TEAM_NAME} lowercase letters, digits and '-', starting with a letter",
    ),
    Setting(
        "gke.teams[].members",
        "list",
        "Who runs the team's jobs: JobSets in its namespace, nowhere else.",
        items="string",
        pattern=RESEARCHER_MEMBER,
        allowed="an IAM member user:EMAIL or group:EMAIL",
        max_items=100,
    ),
    Setting(
        "gke.teams[].namespace",
        "string",
        "The team's Kubernetes namespace (default team-NAME): its jobs, its queue and its workloads' identity.",
        optional=True,
        allowed="1-63 lowercase letters, digits and '-', starting with a letter, not a system namespace",
    ),
    Setting(
        "gke.teams[].nominalChips",
        "map",
        "TPU chips guaranteed to the team, by slice pool (whole slices; pools of one shape add up; together "
        "at most what the pools hold).",
        items="integer",
        optional=True,
    ),
    Setting(
        "gke.teams[].borrowingLimit",
        "integer",
        "Chips above its nominal ones the team may borrow in each pool shape while others leave them idle "
        "(unset: as many as the cohort lends; 0: none).",
        optional=True,
        minimum=0,
        maximum=1_000_000,
    ),
    Setting(
        "gke.teams[].priority",
        "string",
        "The highest priority class the team's jobs may use; a job preempts only the team's own lesser ones.",
        default="medium",
        choices=tuple(name for name, _ in PRIORITY_CLASSES),
    ),
    *declared("monitoring", MonitoringSettings),
    *declared("automation", AutomationSettings),
)

BY_KEY = {s.key: s for s in SETTINGS}


def setting(key: str) -> Setting:
    """The declaration of `key` (`budget.amount`, `tpuVms[].zone` or `gcp:region`)."""
    return BY_KEY[key]


def children(parent: str) -> tuple[Setting, ...]:
    """The settings directly below `parent` (`budget`, `budget.thresholds[]`; "" for the top level)."""
    if not parent:
        return tuple(s for s in SETTINGS if "." not in s.key and not s.key.startswith("gcp:"))
    return tuple(s for s in SETTINGS if s.key.startswith(parent + ".") and "." not in s.key[len(parent) + 1 :])
