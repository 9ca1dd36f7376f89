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
import types
import typing
from dataclasses import dataclass
from typing import Literal

from pydantic_core import PydanticUndefined

from infra.access import iam
from infra.catalog import load_catalog
from infra.config.declared import (
    Allowed,
    Items,
    Section,
    Unstated,
    base_type,
    choices_of,
    limits,
    literal_choices,
    marks,
    stack_key,
)
from infra.config.examples import examples
from infra.config.model import (
    BUCKET_PURPOSES,
    PROJECT,
    RESEARCHER_MEMBER,
    ArtifactSettings,
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    GkeSettings,
    MonitoringSettings,
    NetworkSettings,
    TpuVmSettings,
)
from infra.config.workload_code import FOLDER_ALLOWED, IMAGE_ALLOWED

Kind = Literal["string", "integer", "number", "boolean", "list", "object", "map"]
Scalar = str | int | float | bool

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


_KINDS: dict[object, Kind] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    float | int: "number",
    str: "string",
    typing.Any: "string",
}


def _kind(annotation: object) -> Kind:
    choices = literal_choices(annotation)
    kind = base_type(annotation)
    if isinstance(kind, type) and issubclass(kind, Section):
        return "object"
    plain = type(choices[0]) if choices else kind
    if plain not in _KINDS and isinstance(plain, types.UnionType):  # `int | Any`: its first type says what it takes
        plain = typing.get_args(plain)[0]
    return _KINDS.get(plain) or _KINDS.get(typing.get_origin(plain), "string")  # else a catalog type, by name


def declared(key: str, model: type[Section], *, optional: bool = True) -> tuple[Setting, ...]:
    """The rows of a section declared as a model (infra/config/model.py): itself, then each of its fields."""
    description = " ".join(inspect.cleandoc(model.__doc__ or "").splitlines())
    rows = [Setting(key, "object", description, optional=optional, any_of=model.any_of)]
    for name, info in model.model_fields.items():
        child = f"{key}.{stack_key(name, info)}"
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
        unstated = any(isinstance(m, Unstated) for m in marks(info))
        default = None if info.default in (PydanticUndefined, ()) or unstated else info.default
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
    *declared("tpuVms[]", TpuVmSettings)[1:],
    *declared("gke", GkeSettings),
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
