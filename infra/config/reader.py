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
from collections.abc import Callable, Mapping

from infra import naming
from infra.access import iam
from infra.config import declared, rules, workload_code
from infra.config.declared import S
from infra.config.examples import EXAMPLES_FOLDER, examples
from infra.config.model import (
    BUCKET_PURPOSES,
    MAX_LABELS,
    PROJECT,
    RESERVED_LABELS,
    ArtifactSettings,
    AutomationSettings,
    BucketSettings,
    BudgetSettings,
    GkeSettings,
    MonitoringSettings,
    NetworkSettings,
    PlatformConfig,
    TpuVmSettings,
    WorkloadSettings,
    WorkloadSource,
    private_cidr_problem,
)
from infra.config.problems import MISSING, Node, Problems, decode_objects, item_key, type_name
from infra.config.settings import (
    MAX_ACCOUNT_DESCRIPTION_BYTES,
    MAX_COMMAND_ARG,
    RESERVED_ENV_PREFIX,
    SETTINGS,
    Setting,
    children,
    setting,
)

OBJECT_KEYS = tuple(s.name for s in children("") if s.kind in ("object", "map", "list"))
SCALAR_KEYS = tuple(s.name for s in children("") if s.kind not in ("object", "map", "list"))
# A built-in program's own settings (its command line); a workload with its own source would ignore them.
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
    tpu_vms = _tpu_vms(root.value(f"{PROJECT}:tpuVms"), problems)
    monitoring = _section(root, "monitoring", MonitoringSettings)
    automation = _section(root, "automation", AutomationSettings)
    artifacts = _section(root, "artifacts", ArtifactSettings)
    root.value(f"{PROJECT}:gke")  # read here: a null section is refused, not left out
    gke = _gke(own.get(f"{PROJECT}:gke", MISSING), region, problems)
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
        elif why := private_cidr_problem(cidr):
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


def _tpu_vms(value: object, problems: Problems) -> tuple[TpuVmSettings, ...]:
    """Each TPU VM as its model reads it, its labels checked one by one."""
    key = f"{PROJECT}:tpuVms"
    if value is MISSING or value is None:
        return ()
    if not isinstance(value, list):
        problems.add(key, value, f"must be a list, not {type_name(value)}")
        return ()
    vms = []
    for index, item in enumerate(value):
        at = item_key(key, value, index)
        if not isinstance(item, Mapping):
            problems.add(at, item, f"must be a mapping, not {type_name(item)}")
            continue
        vm = declared.read(TpuVmSettings, item, at, problems)
        if vm.labels:
            vm = vm.model_copy(update={"labels": _labels(vm.labels, f"{at}.labels", problems)})
        vms.append(vm)
    return tuple(vms)


def _labels(labels: tuple[tuple[str, object], ...], key: str, problems: Problems) -> tuple[tuple[str, str], ...]:
    if len(labels) > MAX_LABELS - len(RESERVED_LABELS):
        problems.add(key, dict(labels), f"must have at most {MAX_LABELS - len(RESERVED_LABELS)} entries")
        return ()
    user_labels: list[tuple[str, str]] = []
    for name, value in labels:
        path = f"{key}.{name}"
        if why := naming.label_key_problem(name):
            problems.add(path, name, f"label keys need {why}")
        elif name in RESERVED_LABELS:
            problems.add(path, value, f"'{name}' is set by the platform; reserved: {', '.join(RESERVED_LABELS)}")
        elif not isinstance(value, str) or (why := naming.label_value_problem(value)):
            problems.add(path, value, f"label values need {why or 'a string'}")
        else:
            user_labels.append((name, value))
    return tuple(user_labels)


def _gke(value: object, default_region: str, problems: Problems) -> GkeSettings | None:
    """The GKE engine's section, when the stack has one; each team's chips checked pool by pool."""
    if value is MISSING:
        return None
    if not isinstance(value, Mapping):  # refused: no engine to check further
        declared.read(GkeSettings, value, f"{PROJECT}:gke", problems, required=True)
        return None
    gke = declared.read(GkeSettings, value, f"{PROJECT}:gke", problems)
    teams = value.get("teams") if isinstance(value, Mapping) else None
    checked = []
    for index, team in enumerate(gke.teams):
        chips: list[tuple[str, int]] = []
        for pool, count in team.nominal_chips:
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                at = item_key(f"{PROJECT}:gke.teams", teams if isinstance(teams, list) else gke.teams, index)
                problems.add(f"{at}.nominalChips.{pool}", count, "a whole number of TPU chips, 0 or more")
            else:
                chips.append((pool, count))
        checked.append(team.model_copy(update={"nominal_chips": tuple(chips)}))
    return gke.model_copy(update={"region": gke.region or default_region, "teams": tuple(checked)})


__all__ = ["SETTINGS", "check_stack_config", "parse_stack_config"]
