"""Run a Pulumi program in-process under the recording GCP mocks and collect what it declared."""

from __future__ import annotations

import runpy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from inspect import isawaitable
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime
import yaml
from pulumi._types import is_input_type
from pulumi.runtime import settings
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.config.stackfile import ROOT, project_name, read_stack_config
from tools.offline.mocks import SECRET, CloudState, GcpMocks, RecordingMonitor, Registration


@dataclass
class PlanResult:
    stack: str
    project: str
    resources: list[Registration]
    outputs: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=dict)  # the raw stack config it was planned with

    def of_type(self, token: str) -> list[Registration]:
        return [r for r in self.resources if r.type == token]

    def by_urn(self) -> dict[str, Registration]:
        return {r.urn: r for r in self.resources}


class _WarningCollector:
    """Receives the engine log (pulumi.log.warn) that would appear in `pulumi preview`."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def debug(self, msg: str) -> None: ...
    def info(self, msg: str) -> None: ...

    def warning(self, msg: str) -> None:
        self.warnings.append(msg)

    def error(self, msg: str) -> None:
        self.warnings.append(f"error: {msg}")


async def _resolved(value: Any) -> tuple[Any, bool, bool]:
    """What `Output.from_input(value)` resolves to, as (value, known, secret), read by walking the value:
    the same deep unwrapping (outputs, args classes, dicts, lists, tuples, awaitables), without the chain of
    `Output.all`s and `apply`s that from_input builds, two per dict, each a task on the loop (the TPU VMs'
    outputs alone made some 1,000 for 300 VMs)."""
    if isinstance(value, pulumi.Output):
        if not await value.is_known():
            return None, False, await value.is_secret()
        inner, known, secret = await _resolved(await value.future())
        return inner, known, secret or await value.is_secret()
    if is_input_type(type(value)):
        fields, known, secret = await _resolved(dict(value.__dict__))
        return type(value)(**fields), known, secret
    if isawaitable(value):
        return await _resolved(await value)
    if not value or not isinstance(value, dict | list | tuple):
        return value, True, False
    keys = value.keys() if isinstance(value, dict) else range(len(value))
    resolved_keys = [await _resolved(k) for k in keys] if isinstance(value, dict) else [(k, True, False) for k in keys]
    items = [await _resolved(value[k]) for k in keys]
    known = all(k[1] for k in resolved_keys) and all(i[1] for i in items)
    secret = any(k[2] for k in resolved_keys) or any(i[2] for i in items)
    values = [i[0] for i in items]
    if isinstance(value, dict):
        return {k[0]: v for k, v in zip(resolved_keys, values, strict=True)}, known, secret
    return (tuple(values) if isinstance(value, tuple) else values), known, secret


def program_file(project: str) -> Path:
    """The `__main__.py` Pulumi runs for `project`: its Pulumi.yaml's folder (the repository root or one of
    its folders), or that file's `main` relative to it."""
    for project_file in (ROOT / "Pulumi.yaml", *sorted(ROOT.glob("*/Pulumi.yaml"))):
        declared = yaml.safe_load(project_file.read_text())
        if declared["name"] == project:
            return (project_file.parent / declared.get("main", ".")).resolve() / "__main__.py"
    raise ValueError(f"no Pulumi.yaml in {ROOT} or its folders names the project {project!r}")


def run_program(
    stack: str,
    config: dict[str, str],
    program: Callable[[], Any] | None = None,
    project: str = "tpu-platform",
    monitor: RecordingMonitor | None = None,
    secret_keys: list[str] | None = None,
    state: CloudState | None = None,
) -> PlanResult:
    """Run `program` (default: the project's real `__main__.py`) with `config` as the stack's config.

    Each call starts from a clean runtime, so runs never see each other's resources or outputs.
    Pass `monitor` to inspect what was registered even when the program fails; `state`, what the
    project already holds (default: nothing, a first deploy).
    """
    gcp_project = config.get("gcp:project", "offline-project")
    monitor = monitor or RecordingMonitor(GcpMocks(gcp_project, state))
    mocks = monitor.mocks
    log = _WarningCollector()
    settings.reset_options(project=project, stack=stack)
    pulumi.runtime.set_all_config(dict(config), secret_keys or [])  # [] resets an earlier run's
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor, logger=log)  # type: ignore[arg-type]
    root = settings.get_root_resource()
    collected: dict[str, Any] = {}

    async def outputs() -> None:
        for key, value in getattr(root, "outputs", {}).items():
            resolved, known, secret = await _resolved(value)
            collected[key] = SECRET if secret else resolved if known else None

    def body() -> Awaitable[None]:
        if program is None:
            runpy.run_path(str(program_file(project)), run_name="__main__")
        else:
            program()
        # Awaited by the running loop, not pumped from inside it with _sync_await: each nested pump puts
        # back as many (cancelled) handles as the ready list held, ~25,000 per output for 300 TPU VMs.
        return outputs()

    try:
        _sync_await(run_pulumi_func(body))
    finally:
        settings.set_root_resource(None)  # type: ignore[arg-type]
    invokes = mocks.invokes if isinstance(mocks, GcpMocks) else []
    return PlanResult(stack, gcp_project, monitor.registrations, collected, log.warnings, invokes, dict(config))


def plan_stack(
    stack: str,
    stack_file: Path | None = None,
    state: CloudState | None = None,
    project: str | None = None,
    program: Callable[[], Any] | None = None,
) -> PlanResult:
    """The offline plan of a stack file: the real program (or `program`) with that stack's config (as
    `project`: by default the environment's, Pulumi.yaml's; the GKE admin phase reads the same stack file)."""
    config = read_stack_config(stack, ROOT, stack_file)
    return run_program(stack, config, program, project=project or project_name(ROOT), state=state)
