"""Read a stack's raw config into `PlatformConfig`, each value through its declaration in `settings.py`.

`parse_stack_config` is pure: it takes the raw config strings exactly as Pulumi hands them to the
program (objects JSON-encoded) and either returns a `PlatformConfig` or raises one `ConfigError`
listing every bad setting with its key, value and what is allowed. Rules that span settings
(a TPU type in its zone, production needs CMEK, …) are in `rules.py`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import zoneinfo
from collections.abc import Callable, Mapping

from infra import naming
from infra.access import iam
from infra.catalog import AcceleratorType, load_catalog
from infra.catalog.gke import GkeAcceleratorType, load_gke_catalog
from infra.config import declared, rules, workload_code
from infra.config.declared import S
from infra.config.examples import EXAMPLES_FOLDER, examples
from infra.config.model import (
    BUCKET_PURPOSES,
    PRIVATE_CIDR,
    PROJECT,
    RESERVED_LABELS,
    ArtifactSettings,
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    GkeSettings,
    MaintenanceWindow,
    MonitoringSettings,
    NetworkSettings,
    PlatformConfig,
    ScheduleSettings,
    SlicePoolSettings,
    TeamSettings,
    TpuVmSettings,
    WorkloadSettings,
    WorkloadSource,
)
from infra.config.problems import MISSING, Fix, Node, Problems, decode_objects
from infra.config.settings import (
    MAX_ACCOUNT_DESCRIPTION_BYTES,
    MAX_COMMAND_ARG,
    MAX_LABELS,
    MAX_TEAM_NAME,
    MAX_TPU_DESCRIPTION,
    RESERVED_ENV_PREFIX,
    SETTINGS,
    Setting,
    children,
    setting,
)
from infra.schedule import CronError, parse_cron

OBJECT_KEYS = tuple(s.name for s in children("") if s.kind in ("object", "map", "list"))
SCALAR_KEYS = tuple(s.name for s in children("") if s.kind not in ("object", "map", "list"))
_ACCELERATOR_NAME = r"[a-z][a-z0-9]*-[0-9]{1,5}"
# A built-in program's own settings (its command line); a workload with its own source would ignore them.
DEFAULT_MAINTENANCE_DAYS = ("SA", "SU")
PROGRAM_ONLY = (
    "frameworkVersion",
    "epochs",
    "batchSize",
    "checkpointEverySteps",
    "checkpointEveryMinutes",
    "stepSeconds",
    "checkpointSeconds",
)


def _name(s: Setting) -> str:
    """How the key is found in its node: top-level keys whole (`tpu-platform:owner`), others by leaf."""
    return s.full if "." not in s.key else s.name


def _str_choices(s: Setting) -> tuple[str, ...] | None:
    return tuple(c for c in s.choices if isinstance(c, str)) or None


def text(node: Node, key: str, check: Callable[[str], str | None] | None = None) -> str:
    s = setting(key)
    default = s.default if isinstance(s.default, str) else MISSING
    return node.text(_name(s), default, choices=_str_choices(s), pattern=s.pattern, allowed=s.allowed, check=check)


def optional_text(node: Node, key: str, check: Callable[[str], str | None] | None = None) -> str | None:
    s = setting(key)
    return node.text(_name(s), None, choices=_str_choices(s), pattern=s.pattern, allowed=s.allowed, check=check)


def texts(node: Node, key: str, default: list[str]) -> list[str]:
    s = setting(key)
    return node.texts(
        _name(s), default, max_items=s.max_items, choices=_str_choices(s), pattern=s.pattern, allowed=s.allowed
    )


def integer(node: Node, key: str) -> int:
    s = setting(key)
    default = s.default if isinstance(s.default, int) and not isinstance(s.default, bool) else MISSING
    ints = tuple(c for c in s.choices if isinstance(c, int)) or None
    return node.integer(
        _name(s),
        0 if s.optional and default is MISSING else default,
        minimum=None if s.minimum is None else int(s.minimum),
        maximum=None if s.maximum is None else int(s.maximum),
        choices=ints,
    )


def number(node: Node, key: str) -> float:
    s = setting(key)
    default = s.default if isinstance(s.default, int | float) and not isinstance(s.default, bool) else MISSING
    return node.number(_name(s), default, minimum=s.minimum, maximum=s.maximum, exclusive_minimum=s.exclusive_minimum)


def optional_number(node: Node, key: str) -> float | None:
    s = setting(key)
    return node.optional_number(_name(s), minimum=s.minimum, maximum=s.maximum, exclusive_minimum=s.exclusive_minimum)


def flag(node: Node, key: str) -> bool:
    s = setting(key)
    return node.boolean(_name(s), s.default if isinstance(s.default, bool) else MISSING)


def parse_stack_config(stack: str, raw: Mapping[str, str]) -> PlatformConfig:
    """Parse the raw config of `stack` (keys like `tpu-platform:budget`), or raise ConfigError."""
    cfg, problems = check_stack_config(stack, raw)
    problems.raise_if_any(stack)
    return dataclasses.replace(cfg, warnings=tuple(f"stack '{stack}': {w}" for w in problems.warnings))


def check_stack_config(stack: str, raw: Mapping[str, str]) -> tuple[PlatformConfig, Problems]:
    """The config of `stack` as far as it could be read, and every problem and warning found in it. A
    fix offered with one is kept only if the stack with it applied has that problem no more and no
    other error: a suggestion is checked by the same code that refused the value."""
    cfg, problems = _read(stack, raw, Problems())
    problems.keep_fixes_that_work(lambda fix: _read(stack, fix.apply(raw), Problems(offer_fixes=False))[1])
    return cfg, problems


def _read(stack: str, raw: Mapping[str, str], problems: Problems) -> tuple[PlatformConfig, Problems]:
    own = decode_objects(
        {k: v for k, v in raw.items() if k.startswith(f"{PROJECT}:")}, [f"{PROJECT}:{k}" for k in OBJECT_KEYS], problems
    )
    gcp = Node({k: v for k, v in raw.items() if k.startswith("gcp:")}, "", problems)
    root = Node(own, "", problems)

    if why := naming.stack_problem(stack):
        problems.add("stack name", stack, why)
    project = text(gcp, "gcp:project")
    region = text(gcp, "gcp:region")
    owner = text(root, "owner", check=_label_value)
    billing_account = text(root, "billingAccount")
    production = flag(root, "production")
    name_prefix = text(root, "namePrefix") or project
    deployer = text(root, "deployer")
    researchers = tuple(texts(root, "researchers", []))
    self_service_in_production = flag(root, "selfServiceInProduction")
    researcher_ssh = flag(root, "researcherSsh")

    buckets = _section(root, "buckets", BucketSettings, required=True)
    budget = _budget(_section(root, "budget", BudgetSettings, required=True), problems)
    workloads = tuple(_workload(name, node) for name, node in root.items(f"{PROJECT}:workloads"))
    if not workloads:
        problems.add(f"{PROJECT}:workloads", MISSING, "declare at least one workload")
    network = _network(_section(root, "network", NetworkSettings, required=True), problems)
    tpu_vms = tuple(_tpu_vm(node) for node in root.elements(f"{PROJECT}:tpuVms", []))
    monitoring = _section(root, "monitoring", MonitoringSettings)
    automation = _section(root, "automation", AutomationSettings)
    artifacts = _section(root, "artifacts", ArtifactSettings)
    gke = _gke(root.child(f"{PROJECT}:gke"), region) if f"{PROJECT}:gke" in own else None
    root.done([f"{PROJECT}:{k}" for k in SCALAR_KEYS + OBJECT_KEYS])

    cfg = PlatformConfig(
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
        researchers=researchers,
        self_service_in_production=self_service_in_production,
        researcher_ssh=researcher_ssh,
        artifacts=artifacts,
        gke=gke,
    )
    rules.check(cfg, problems)
    return cfg, problems


def _label_value(value: str) -> str | None:
    if not value:
        return "must not be empty"
    return naming.label_value_problem(value)


def _budget(budget: BudgetSettings, problems: Problems) -> BudgetSettings:
    key = f"{PROJECT}:budget.thresholds"
    seen = [(t.percent, t.basis) for t in budget.thresholds]
    for i, pair in enumerate(seen):
        if pair in seen[:i]:
            problems.add(
                f"{key}[{i}]", {"percent": pair[0]}, "duplicates an earlier threshold with the same percent and basis"
            )
    if not budget.thresholds:
        problems.add(key, MISSING, "list at least one threshold")
    return budget


def _account_description(description: str) -> str | None:
    if len(description.encode()) > MAX_ACCOUNT_DESCRIPTION_BYTES:
        return f"at most {MAX_ACCOUNT_DESCRIPTION_BYTES} UTF-8 bytes (a service account description)"
    return None


def _workload(name: str, node: Node) -> WorkloadSettings:
    if why := naming.resource_id_problem(name, max_length=16):
        node.problems.add(node.path, name, f"workload names need {why}")
    access_node = node.child("bucketAccess", False)
    access = {p: str(setting(f"workloads.<name>.bucketAccess.{p}").default) for p in BUCKET_PURPOSES}
    if access_node is not None:
        for purpose in BUCKET_PURPOSES:
            access[purpose] = text(access_node, f"workloads.<name>.bucketAccess.{purpose}") or access[purpose]
        access_node.done(BUCKET_PURPOSES)
    settings = WorkloadSettings(
        name=name,
        description=optional_text(node, "workloads.<name>.description", check=_account_description)
        or f"TPU workload {name}",
        bucket_access=tuple((p, level) for p, level in access.items() if level != "none"),
        project_roles=tuple(texts(node, "workloads.<name>.projectRoles", list(iam.DEFAULT_PROJECT_ROLES))),
        program=optional_text(node, "workloads.<name>.program") or "",
        framework_version=optional_text(node, "workloads.<name>.frameworkVersion") or "",
        memory_gib_per_chip=optional_number(node, "workloads.<name>.memoryGibPerChip"),
        data_object=text(node, "workloads.<name>.dataObject"),
        run=text(node, "workloads.<name>.run", check=lambda r: naming.resource_id_problem(r, 32)),
        checkpoint_every_steps=integer(node, "workloads.<name>.checkpointEverySteps"),
        checkpoint_every_minutes=number(node, "workloads.<name>.checkpointEveryMinutes"),
        step_seconds=optional_number(node, "workloads.<name>.stepSeconds"),
        checkpoint_seconds=optional_number(node, "workloads.<name>.checkpointSeconds"),
        epochs=integer(node, "workloads.<name>.epochs"),
        batch_size=integer(node, "workloads.<name>.batchSize"),
    )
    settings = dataclasses.replace(settings, **_code(node, settings))
    node.done()
    return settings


def _code(node: Node, workload: WorkloadSettings) -> dict[str, object]:
    """The workload's source, command, Python and environment; a built-in program is a folder source."""
    source_node = node.child("source", False)
    command = _command(node)
    python = optional_text(node, "workloads.<name>.python") or ""
    env = _env(node)
    if source_node is None or (node.data.get("program") is not None and not workload.program):  # refused already
        return {"env": env}
    given = bool(source_node.data)
    if workload.program:
        for key, value in (("source", source_node.data), ("command", command), ("python", python)):
            if value:
                node.problems.add(
                    node.key(key), value, "not with program: a built-in program brings its own source and command"
                )
        source_node.done(())
        if not workload.framework_version:
            node.problems.add(node.key("frameworkVersion"), MISSING, "required with program")
        example = examples().get(workload.program)
        if example is None:  # the settings' choices are this checkout's; the stack's repository may differ
            node.problems.add(
                node.key("program"),
                workload.program,
                f"not an example of the stack's repository "
                f"({EXAMPLES_FOLDER}/{workload.program}/example.json); its examples: {', '.join(examples()) or 'none'}",
            )
            return {"env": env, "program": ""}  # refused: nothing else is checked against it
        return {
            "source": WorkloadSource("folder", example.folder),
            "command": ("python", example.entry, *_program_flags(workload)),
            "env": env,
            "framework": example.framework,
        }
    if not given:
        node.problems.add(
            node.key("source"),
            MISSING,
            f"give source (folder or image) and command, or program: {', '.join(examples())}",
        )
        return {"env": env}
    for key in PROGRAM_ONLY:
        if key in node.data:
            node.problems.add(
                node.key(key),
                node.data[key],
                f"only with program: a workload with its own source takes {key} in its command or env",
            )
    folder = optional_text(source_node, "workloads.<name>.source.folder", check=workload_code.folder_problem)
    image = optional_text(source_node, "workloads.<name>.source.image")
    source_node.done()
    if (folder is None) == (image is None):
        source_node.problems.add(source_node.path, dict(source_node.data), "exactly one of folder or image")
        return {"env": env}
    if folder is not None:
        if not folder:  # refused above
            return {"env": env}
        if why := workload_code.command_problem(tuple(command), folder):
            node.problems.add(node.key("command"), command, why)
        return {
            "source": WorkloadSource("folder", folder=folder),
            "command": tuple(command),
            "python": python,
            "env": env,
        }
    if python:
        node.problems.add(node.key("python"), python, "only for a folder source: an image brings its own Python")
    return {"source": WorkloadSource("image", image=image or ""), "command": tuple(command), "env": env}


def _program_flags(workload: WorkloadSettings) -> tuple[str, ...]:
    """A built-in program's own settings, as its command line (workloads/runlib.py's flags)."""
    return (
        "--epochs",
        str(workload.epochs),
        "--batch-size",
        str(workload.batch_size),
        "--checkpoint-every-steps",
        str(workload.checkpoint_every_steps),
        "--checkpoint-every-minutes",
        f"{workload.checkpoint_every_minutes:g}",
    )


def _command(node: Node) -> list[str]:
    """A command line: strings, repeats allowed (`--x 1 --y 1`), none empty or overlong."""
    key = node.key("command")
    out = []
    for i, item in enumerate(node.sequence("command", [], max_items=setting("workloads.<name>.command").max_items)):
        if not isinstance(item, str) or not item or len(item) > MAX_COMMAND_ARG or "\x00" in item:
            node.problems.add(f"{key}[{i}]", item, setting("workloads.<name>.command").allowed + ", not empty")
            continue
        out.append(item)
    return out


def _env(node: Node) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    allowed = setting("workloads.<name>.env").allowed
    for name, value, path in node.entries("env", False, max_items=setting("workloads.<name>.env").max_items):
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name, flags=re.ASCII) or name.startswith(RESERVED_ENV_PREFIX):
            node.problems.add(path, name, f"must be {allowed}")
        elif not isinstance(value, str) or len(value) > MAX_COMMAND_ARG or "\x00" in value:
            node.problems.add(path, value, f"must be {allowed}")
        else:
            out.append((name, value))
    return tuple(sorted(out))


def _section(root: Node, name: str, model: type[S], *, required: bool = False) -> S:
    """A top-level section declared as a model (infra/config/declared.py)."""
    key = root.key(f"{PROJECT}:{name}")
    return declared.read(model, root.value(f"{PROJECT}:{name}"), key, root.problems, required=required)


def _network(network: NetworkSettings, problems: Problems) -> NetworkSettings:
    """The subnets that are private, apart and in a region; the package index only with google-only egress."""
    subnets: list[tuple[str, str]] = []
    for region, cidr in network.subnets:
        key = f"{PROJECT}:network.subnets.{region}"
        if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+", region, flags=re.ASCII):
            problems.add(key, cidr, f"'{region}' is not a GCP region like us-central1")
        elif why := private_cidr_problem(cidr, PRIVATE_CIDR):
            problems.add(key, cidr, why)
        elif clash := next(
            (r for r, c in subnets if ipaddress.ip_network(c).overlaps(ipaddress.ip_network(cidr))), None
        ):
            problems.add(key, cidr, f"overlaps the subnet of {clash}")
        else:
            subnets.append((region, str(cidr)))
    if not network.subnets and network.model_fields_set >= {"subnets"}:
        problems.add(f"{PROJECT}:network.subnets", {}, "declare at least one region: CIDR")
    if network.package_index and network.egress != "google-only":
        why = "only with egress: google-only (open egress reaches any index through Cloud NAT)"
        problems.add(f"{PROJECT}:network.packageIndex", network.package_index, why)
    return network.model_copy(update={"subnets": tuple(subnets)})


def private_cidr_problem(cidr: object, allowed: str) -> str | None:
    """Why `cidr` is not a private IPv4 network with no host bits set, /8 to /29 (or None)."""
    try:
        network = ipaddress.ip_network(str(cidr), strict=True)
    except ValueError:
        return "must be an IPv4 network like 10.20.0.0/20, with no host bits set"
    if not isinstance(cidr, str) or not network.is_private or network.version != 4 or not 8 <= network.prefixlen <= 29:
        return f"must be {allowed}"
    return None


def _labels(node: Node) -> tuple[tuple[str, str], ...]:
    user_labels: list[tuple[str, str]] = []
    for key, value, path in node.entries("labels", False, max_items=MAX_LABELS - len(RESERVED_LABELS)):
        if why := naming.label_key_problem(key):
            node.problems.add(path, key, f"label keys need {why}")
        elif key in RESERVED_LABELS:
            node.problems.add(path, value, f"'{key}' is set by the platform; reserved: {', '.join(RESERVED_LABELS)}")
        elif not isinstance(value, str) or (why := naming.label_value_problem(value)):
            node.problems.add(path, value, f"label values need {why or 'a string'}")
        else:
            user_labels.append((key, value))
    return tuple(user_labels)


def _accelerator(node: Node) -> AcceleratorType | None:
    name = text(node, "tpuVms[].acceleratorType")
    if not name:
        return None
    if not re.fullmatch(_ACCELERATOR_NAME, name, flags=re.ASCII):
        node.problems.add(node.key("acceleratorType"), name, setting("tpuVms[].acceleratorType").allowed)
        return None
    accelerator = load_catalog().accelerator(name)
    if isinstance(accelerator, str):
        meant = load_catalog().meant(name)
        fixes = [Fix.of({node.key("acceleratorType"): meant})] if meant else []
        node.problems.add(node.key("acceleratorType"), name, accelerator, fixes=fixes)
        return None
    return accelerator


def _tpu_description(description: str) -> str | None:
    return f"at most {MAX_TPU_DESCRIPTION} characters" if len(description) > MAX_TPU_DESCRIPTION else None


def _tpu_vm(node: Node) -> TpuVmSettings:
    accelerator = _accelerator(node)
    vm = TpuVmSettings(
        name=text(node, "tpuVms[].name", check=lambda n: naming.resource_id_problem(n, 63)),
        accelerator=accelerator or rules.NO_ACCELERATOR,
        zone=text(node, "tpuVms[].zone"),
        runtime_version=text(node, "tpuVms[].runtimeVersion"),
        provisioning=text(node, "tpuVms[].provisioning"),
        workload=text(node, "tpuVms[].workload", check=lambda w: None if w else "name one of the workloads"),
        labels=_labels(node),
        description=text(node, "tpuVms[].description", check=_tpu_description),
        schedule=_schedule(node.child("schedule", False)),
        on_completion=text(node, "tpuVms[].onCompletion"),
        capacity=text(node, "tpuVms[].capacity"),
        reservation_name=optional_text(node, "tpuVms[].reservationName") or "",
        node_count=integer(node, "tpuVms[].nodeCount"),
        fallback_zones=tuple(texts(node, "tpuVms[].fallbackZones", [])),
        run_duration_hours=optional_number(node, "tpuVms[].runDurationHours"),
        max_run_hours=optional_number(node, "tpuVms[].maxRunHours"),
        hours_between_preemptions=optional_number(node, "tpuVms[].hoursBetweenPreemptions"),
        self_service=flag(node, "tpuVms[].selfService"),
    )
    node.done()
    return vm


def _gke(node: Node | None, default_region: str) -> GkeSettings | None:
    if node is None:
        return None
    # An absent (or refused) window or system pool takes the defaults.
    window = node.child("maintenanceWindow", False) or Node({}, node.key("maintenanceWindow"), node.problems)
    system = node.child("systemPool", False) or Node({}, node.key("systemPool"), node.problems)
    settings = GkeSettings(
        region=optional_text(node, "gke.region") or default_region,
        node_cidr=text(node, "gke.nodeCidr", check=_private_cidr),
        pod_cidr=text(node, "gke.podCidr", check=_private_cidr),
        service_cidr=text(node, "gke.serviceCidr", check=_private_cidr),
        release_channel=text(node, "gke.releaseChannel"),
        maintenance=MaintenanceWindow(
            days=tuple(texts(window, "gke.maintenanceWindow.days", list(DEFAULT_MAINTENANCE_DAYS))),
            start_utc=text(window, "gke.maintenanceWindow.startUtc"),
            hours=integer(window, "gke.maintenanceWindow.hours"),
        ),
        tpu_pool_upgrades=text(node, "gke.tpuPoolUpgrades"),
        system_machine_type=text(system, "gke.systemPool.machineType"),
        system_nodes_per_zone=integer(system, "gke.systemPool.nodesPerZone"),
        slice_pools=tuple(
            _slice_pool(pool) for pool in node.elements("slicePools", max_items=setting("gke.slicePools").max_items)
        ),
        teams=tuple(_team(team) for team in node.elements("teams", [], max_items=setting("gke.teams").max_items)),
        rbac_security_group=optional_text(node, "gke.rbacSecurityGroup") or "",
    )
    for child in (window, system, node):
        child.done()
    return settings


def _private_cidr(cidr: str) -> str | None:
    return private_cidr_problem(cidr, PRIVATE_CIDR)


def _gke_accelerator(node: Node) -> GkeAcceleratorType | None:
    name = text(node, "gke.slicePools[].acceleratorType")
    if not name:
        return None
    if not re.fullmatch(_ACCELERATOR_NAME, name, flags=re.ASCII):
        node.problems.add(node.key("acceleratorType"), name, setting("gke.slicePools[].acceleratorType").allowed)
        return None
    accelerator = load_gke_catalog().accelerator(name)
    if isinstance(accelerator, str):
        node.problems.add(node.key("acceleratorType"), name, accelerator)
        return None
    return accelerator


def _slice_pool(node: Node) -> SlicePoolSettings:
    accelerator = _gke_accelerator(node)
    pool = SlicePoolSettings(
        name=text(node, "gke.slicePools[].name", check=lambda n: naming.resource_id_problem(n, naming.MAX_SLICE_POOL)),
        accelerator=accelerator or rules.NO_GKE_ACCELERATOR,
        zone=text(node, "gke.slicePools[].zone"),
        provisioning=text(node, "gke.slicePools[].provisioning"),
        reservation_name=optional_text(node, "gke.slicePools[].reservationName") or "",
        slices=integer(node, "gke.slicePools[].slices"),
        run_duration_hours=optional_number(node, "gke.slicePools[].runDurationHours"),
    )
    node.done()
    return pool


def _team(node: Node) -> TeamSettings:
    name = text(node, "gke.teams[].name", check=lambda n: naming.resource_id_problem(n, MAX_TEAM_NAME))
    chips: list[tuple[str, int]] = []
    for pool, value, path in node.entries("nominalChips", False):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            node.problems.add(path, value, "a whole number of TPU chips, 0 or more")
        else:
            chips.append((pool, value))
    limit = node.data.get("borrowingLimit")
    team = TeamSettings(
        name=name,
        members=tuple(texts(node, "gke.teams[].members", [])),
        namespace=optional_text(node, "gke.teams[].namespace", check=_team_namespace) or naming.team_namespace(name),
        nominal_chips=tuple(chips),
        borrowing_limit=None if limit is None else integer(node, "gke.teams[].borrowingLimit"),
        priority=text(node, "gke.teams[].priority"),
    )
    node.done()
    return team


def _team_namespace(namespace: str) -> str | None:
    if why := naming.resource_id_problem(namespace):
        return why
    if namespace in naming.SYSTEM_NAMESPACES or namespace.startswith(naming.SYSTEM_NAMESPACE_PREFIXES):
        return "a namespace of its own: not default, a kube-/gke- namespace or a controller's"
    return None


def _cron(expression: str) -> str | None:
    try:
        parse_cron(expression)
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
        start=optional_text(node, "tpuVms[].schedule.start", check=_cron) or "",
        stop=optional_text(node, "tpuVms[].schedule.stop", check=_cron) or "",
        time_zone=text(node, "tpuVms[].schedule.timeZone", check=_time_zone),
    )
    sides = setting("tpuVms[].schedule").any_of
    if not any(node.data.get(side) is not None for side in sides):
        node.problems.add(node.path, dict(node.data), f"give {' or '.join(sides)}, or both")
    node.done()
    return schedule


__all__ = ["SETTINGS", "check_stack_config", "parse_stack_config"]
