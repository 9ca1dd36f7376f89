"""Helpers shared by the tests: stack configs to vary, and plans to query."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.config.stackfile import ROOT, read_stack_config
from tools.offline.deploys import plan_deploys
from tools.offline.mocks import Registration
from tools.offline.runner import PlanResult, run_program

NS = "tpu-platform"
FIXTURE_STACKS = Path(__file__).resolve().parent / "stacks"  # small stacks that behaviour tests vary
# The command a `program: tf_mnist` workload runs with the project's default settings (epochs, batch
# size, checkpoint intervals), written out so that a change of any default shows in the tests.
TF_MNIST_DEFAULT_COMMAND = (
    "python",
    "tf_mnist.py",
    "--epochs",
    "5",
    "--batch-size",
    "256",
    "--checkpoint-every-steps",
    "200",
    "--checkpoint-every-minutes",
    "10",
)
# The goodput categories a run's own step lines decide, with the remainder they leave: untrusted when
# the program is a researcher's, which may print anything (run_contract/timeline.py).
STEP_LINE_CATEGORIES = {"restore", "firstStep", "productive", "checkpointSave", "wastedProgress", "unattributed"}
_plans: dict[tuple[str, tuple[tuple[str, str], ...]], PlanResult] = {}


def stack_config(stack: str = "dev") -> dict[str, str]:
    """A shipped stack's raw config, as Pulumi would pass it (a fresh dict each time: callers edit it)."""
    return dict(_read(stack, None))


def fixture_config(name: str = "small") -> dict[str, str]:
    """A fixture stack's raw config (tests/stacks/Pulumi.<name>.yaml), with the project's defaults."""
    return dict(_read(name, FIXTURE_STACKS / f"Pulumi.{name}.yaml"))


@functools.cache
def _read(stack: str, path: Path | None) -> dict[str, str]:
    """Each stack file is read once a session (property tests ask for it hundreds of times); the
    values are strings, so a shallow copy is a private one."""
    return read_stack_config(stack, ROOT, path)


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


def shipped_plan(stack: str) -> PlanResult:
    """A shipped stack's plan (`plan_stack`: Pulumi.<stack>.yaml), from the session's cache."""
    return plan(stack_config(stack), stack)


@functools.cache
def _deploys(stack: str, raw: tuple[tuple[str, str], ...]) -> dict[str, PlanResult]:
    return plan_deploys(plan(dict(raw), stack))


def deploys(raw: dict[str, str], stack: str = "dev") -> dict[str, PlanResult]:
    """`raw` planned as a first deploy and as a later one (tools/offline/deploys.py), once a session."""
    return _deploys(stack, tuple(sorted(raw.items())))


def shipped_deploys(stack: str) -> dict[str, PlanResult]:
    return deploys(stack_config(stack), stack)


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


def offline_cli(*args: str, in_process: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m tools.offline ARGS`: its exit code, stdout and stderr.

    In-process by default: the same `main` as the command, without a second interpreter's start-up (a
    second or more each). `in_process=False` runs the real command, for the tests of the entry point
    itself (tests/test_offline_cli.py keeps a few). An exception in-process fails the test with its
    traceback, as a traceback on the command's stderr would."""
    command = [sys.executable, "-m", "tools.offline", *args]
    if not in_process:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    from tools.offline.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code if isinstance(exit_.code, int) else 2
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


def policies_as_bootstrapped(result: PlanResult) -> list:
    """The policy pack's verdict on a stack the bootstrap has made the identities for. The pack knows the
    bootstrap's custom roles from bootstrap/access.json, which lists the repository's environments; a
    fixture or an example stack is judged with its own roles added, as after `tools.offline access --write`."""
    import policy.stack_grants
    from infra.config import parse_stack_config
    from infra.platform import stack_identities
    from tools.offline.policy_check import check_policies

    cfg = parse_stack_config(result.stack, result.config)
    made = dict(policy.stack_grants.bootstrap_roles())
    made |= {role.name(cfg.project): frozenset(role.permissions) for role in stack_identities(cfg).roles}
    original = policy.stack_grants.bootstrap_roles
    policy.stack_grants.bootstrap_roles = lambda: made
    try:
        return check_policies(result)
    finally:
        policy.stack_grants.bootstrap_roles = original


class Writes(io.StringIO):
    """A stream that keeps each write apart, as an unbuffered one hands each to the pipe or the journal: a line
    and its newline in two writes is a line another thread's output can land inside."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)
