"""Read a stack's raw config into `PlatformConfig`, read whole as one model (model.py), then the checks a
setting's type cannot make (a workload's code, labels, subnets, a team's chips).

`parse_stack_config` is pure: it takes the raw config strings exactly as Pulumi hands them to the
program (objects JSON-encoded) and either returns a `PlatformConfig` or raises one `ConfigError`
listing every bad setting with its key, value and what is allowed. Rules that span settings
(a TPU type in its zone, production needs CMEK, …) are in `rules.py`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from infra import naming
from infra.config import declared, rules, workload_code
from infra.config.examples import examples, not_an_example
from infra.config.model import (
    ENV_ALLOWED,
    MAX_COMMAND_ARG,
    MAX_LABELS,
    PROJECT,
    REGION,
    RESERVED_ENV_PREFIX,
    RESERVED_LABELS,
    BudgetSettings,
    GcpSettings,
    GkeSettings,
    NetworkSettings,
    PlatformConfig,
    TpuVmSettings,
    WorkloadSettings,
    WorkloadSource,
    private_cidr_problem,
)
from infra.config.problems import MISSING, Problems, decode_objects, fullmatch, item_key, item_keys, type_name
from infra.config.settings import children

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


def parse_stack_config(stack: str, raw: Mapping[str, str]) -> PlatformConfig:
    """Parse the raw config of `stack` (keys like `tpu-platform:budget`), or raise ConfigError."""
    cfg, problems = check_stack_config(stack, raw)
    problems.raise_if_any(stack)
    return cfg.model_copy(update={"warnings": tuple(f"stack '{stack}': {w}" for w in problems.warnings)})


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
    if why := naming.stack_problem(stack):
        problems.add("stack name", stack, why)
    # Only the provider's keys the platform reads: Pulumi's others (gcp:billingProject, ...) are its own.
    gcp = declared.read(
        GcpSettings,
        {k.removeprefix("gcp:"): raw[k] for k in ("gcp:project", "gcp:region") if k in raw},
        "gcp:",
        problems,
    )
    workloads = _workloads(own.get(f"{PROJECT}:workloads"), problems)
    if not workloads:
        problems.add(f"{PROJECT}:workloads", MISSING, "declare at least one workload")
    known = sorted(f"{PROJECT}:{k}" for k in SCALAR_KEYS + OBJECT_KEYS)
    for key in own.keys() - set(known):
        problems.add(key, own[key], f"unknown key; known keys: {', '.join(known)}")
    if own.get(f"{PROJECT}:gke", MISSING) is None:  # null: refused, not left out
        problems.add(f"{PROJECT}:gke", MISSING, "required")
    given = {k: v for k in known if k != f"{PROJECT}:workloads" and (v := own.get(k)) is not None}
    cfg = declared.read(
        PlatformConfig,
        {k.removeprefix(f"{PROJECT}:"): v for k, v in given.items()},
        f"{PROJECT}:",
        problems,
        supplied={"stack": stack, "project": gcp.project, "region": gcp.region, "workloads": workloads},
    )
    cfg = cfg.model_copy(
        update={
            "name_prefix": cfg.name_prefix or gcp.project,
            "budget": _budget(cfg.budget, problems),
            "network": _network(cfg.network, problems),
            "tpu_vms": _tpu_vms(cfg.tpu_vms, own.get(f"{PROJECT}:tpuVms"), problems),
            "gke": _gke(cfg.gke, own.get(f"{PROJECT}:gke"), gcp.region, problems),
        }
    )
    rules.check(cfg, problems)
    return cfg, problems


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


def _workloads(value: object, problems: Problems) -> tuple[WorkloadSettings, ...]:
    """Each workload by its name, as its model reads it, then its code and environment checked."""
    key = f"{PROJECT}:workloads"
    if value is None:  # not set: said by the caller
        return ()
    if not isinstance(value, Mapping):
        problems.add(key, value, f"must be a mapping, not {type_name(value)}")
        return ()
    out = []
    for name, item in value.items():
        at = f"{key}.{name}"
        if item is None:
            item = {}
        if not isinstance(item, Mapping):
            problems.add(at, item, f"must be a mapping, not {type_name(item)}")
            continue
        if why := naming.resource_id_problem(str(name), max_length=16):
            problems.add(at, name, f"workload names need {why}")
        workload = declared.read(WorkloadSettings, item, at, problems, supplied={"name": str(name)})
        out.append(workload.model_copy(update=_code(workload, item, at, problems)))
    return tuple(out)


def _code(workload: WorkloadSettings, item: Mapping[str, object], at: str, problems: Problems) -> dict[str, object]:
    """The checks of a workload's source, command, Python and environment across them; a built-in program is a
    folder source with its own command."""
    env = _env(workload.env, f"{at}.env", problems)
    given = item.get("source")
    if (given is not None and not isinstance(given, Mapping)) or (
        item.get("program") is not None and not workload.program
    ):
        return {"env": env}  # refused already
    if workload.program:
        for key, value in (("source", given), ("command", list(workload.command)), ("python", workload.python)):
            if value:
                problems.add(
                    f"{at}.{key}", value, "not with program: a built-in program brings its own source and command"
                )
        if not workload.framework_version:
            problems.add(f"{at}.frameworkVersion", MISSING, "required with program")
        example = examples().get(workload.program)
        if example is None:  # the settings' choices are this checkout's; the stack's repository may differ
            problems.add(f"{at}.program", workload.program, not_an_example(workload.program))
            return {"env": env, "program": ""}  # refused: nothing else is checked against it
        return {
            "source": WorkloadSource(folder=example.folder),
            "command": ("python", example.entry, *_program_flags(workload)),
            "env": env,
            "framework": example.framework,
        }
    if not given:
        problems.add(
            f"{at}.source", MISSING, f"give source (folder or image) and command, or program: {', '.join(examples())}"
        )
        return {"env": env}
    for key in PROGRAM_ONLY:
        if key in item:
            why = f"only with program: a workload with its own source takes {key} in its command or env"
            problems.add(f"{at}.{key}", item[key], why)
    if [side for side in ("folder", "image") if given.get(side) is not None] not in (["folder"], ["image"]):
        problems.add(f"{at}.source", dict(given), "exactly one of folder or image")
    elif given.get("folder") is not None:
        folder, read = workload.source.folder, item.get("command") in (None, list(workload.command))  # else refused
        if folder and read and (why := workload_code.command_problem(workload.command, folder)):
            problems.add(f"{at}.command", list(workload.command), why)
    elif workload.python:
        problems.add(f"{at}.python", workload.python, "only for a folder source: an image brings its own Python")
    return {"env": env}


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


def _env(env: tuple[tuple[str, object], ...], key: str, problems: Problems) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for name, value in env:
        if not fullmatch(r"[A-Z_][A-Z0-9_]*", name) or name.startswith(RESERVED_ENV_PREFIX):
            problems.add(f"{key}.{name}", name, f"must be {ENV_ALLOWED}")
        elif not isinstance(value, str) or len(value) > MAX_COMMAND_ARG or "\x00" in value:
            problems.add(f"{key}.{name}", value, f"must be {ENV_ALLOWED}")
        else:
            out.append((name, value))
    return tuple(sorted(out))


def _network(network: NetworkSettings, problems: Problems) -> NetworkSettings:
    """The subnets that are private, apart and in a region; the package index only with google-only egress."""
    subnets: list[tuple[str, str]] = []
    for region, cidr in network.subnets:
        key = f"{PROJECT}:network.subnets.{region}"
        if not fullmatch(REGION, region):
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


def _tpu_vms(vms: tuple[TpuVmSettings, ...], given: object, problems: Problems) -> tuple[TpuVmSettings, ...]:
    """Each TPU VM's labels checked one by one, named by the VM's key in the list the stack gives."""
    items = given if isinstance(given, list) else []
    keys = [
        at for item, at in zip(items, item_keys(f"{PROJECT}:tpuVms", items), strict=True) if isinstance(item, Mapping)
    ]
    return tuple(
        vm.model_copy(update={"labels": _labels(vm.labels, f"{at}.labels", problems)}) if vm.labels else vm
        for vm, at in zip(vms, keys, strict=True)
    )


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


def _gke(gke: GkeSettings | None, given: object, default_region: str, problems: Problems) -> GkeSettings | None:
    """The GKE engine's section, when the stack has one; each team's chips checked pool by pool."""
    if gke is None or not isinstance(given, Mapping):
        return None
    teams = given.get("teams")
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


__all__ = ["check_stack_config", "parse_stack_config"]
