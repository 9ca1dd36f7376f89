"""Helpers shared by the tests: stack configs to vary, and plans to query."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.offline.mocks import Registration
from tools.offline.runner import PlanResult, run_program
from tools.offline.stackfile import ROOT, read_stack_config

NS = "tpu-platform"
FIXTURE_STACKS = Path(__file__).resolve().parent / "stacks"  # small stacks that behaviour tests vary
_plans: dict[tuple[str, tuple[tuple[str, str], ...]], PlanResult] = {}


def stack_config(stack: str = "dev") -> dict[str, str]:
    """A shipped stack's raw config, as Pulumi would pass it."""
    return read_stack_config(stack)


def fixture_config(name: str = "small") -> dict[str, str]:
    """A fixture stack's raw config (tests/stacks/Pulumi.<name>.yaml), with the project's defaults."""
    return read_stack_config(name, ROOT, FIXTURE_STACKS / f"Pulumi.{name}.yaml")


def with_object(raw: dict[str, str], key: str, edit: Callable[[Any], object]) -> dict[str, str]:
    """A copy of `raw` whose object setting `key` (e.g. 'budget') was changed in place by `edit`."""
    value = copy.deepcopy(json.loads(raw[f"{NS}:{key}"])) if f"{NS}:{key}" in raw else {}
    edit(value)
    return replace_object(raw, key, value)


def replace_object(raw: dict[str, str], key: str, value: Any) -> dict[str, str]:
    return {**raw, f"{NS}:{key}": json.dumps(value)}


def workload_settings(raw: dict[str, str], name: str = "mnist") -> dict[str, Any]:
    """A copy of one workload's settings from `raw`, to declare another like it."""
    return copy.deepcopy(json.loads(raw[f"{NS}:workloads"])[name])


def with_scalar(raw: dict[str, str], key: str, value: str | None) -> dict[str, str]:
    out = dict(raw)
    full = key if ":" in key else f"{NS}:{key}"
    if value is None:
        out.pop(full, None)
    else:
        out[full] = value
    return out


def plan(raw: dict[str, str], stack: str = "dev") -> PlanResult:
    """The offline plan of `raw`, run once per distinct config in a session: the program is deterministic
    (test_program proves runs do not leak into each other), so a repeat returns a copy of the first."""
    key = (stack, tuple(sorted(raw.items())))
    if key not in _plans:
        _plans[key] = run_program(stack, raw)
    return copy.deepcopy(_plans[key])  # callers may edit what they get


def depends_on(plan_result: PlanResult, resource: Registration, target_urn: str) -> bool:
    """Whether `resource` waits for `target_urn`, directly or through the resources it depends on."""
    by_urn = plan_result.by_urn()
    seen: set[str] = set()
    stack = list(resource.dependencies)
    while stack:
        urn = stack.pop()
        if urn == target_urn:
            return True
        if urn in seen or urn not in by_urn:
            continue
        seen.add(urn)
        stack.extend(by_urn[urn].dependencies)
    return False
