"""Every fix an error or warning suggests is applied to the stack and the stack planned again.

Each case breaks a fixture stack in one way. Every fix the plan then offers (the "; set …, or remove …"
of its message) is applied to the stack's config as the stack file holds it (`Fix.apply`), and the
real program is planned again under the offline mocks: the problem must be gone, and no error may
appear that was not there before. The last test checks that the cases reach every place in the checks
that offers a fix, so a new suggestion cannot go untested.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pulumi
import pytest

from infra.config.problems import REMOVE, ConfigError, Fix, Problem, Problems
from infra.config.reader import check_stack_config
from tests.support import fixture_config
from tools.offline.runner import run_program

ROOT = Path(__file__).resolve().parents[1]
NS = "tpu-platform"
VM = f"{NS}:tpuVms[small-v2]"
POOL = f"{NS}:gke.slicePools[v5e]"
KEY = "projects/fixture-project/locations/us-central1/keyRings/r/cryptoKeys/k"
V5E = {f"{VM}.acceleratorType": "v5litepod-8", f"{VM}.zone": "us-central1-a"}
V5E_TF = {**V5E, f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pjrt", f"{NS}:workloads.mnist.frameworkVersion": "2.15.0"}
QUEUED = {**V5E_TF, f"{VM}.capacity": "queued"}
PRODUCTION = {f"{NS}:production": True, f"{NS}:buckets.kmsKeyName": KEY}
RECOVERY = {f"{NS}:automation.recovery.everyMinutes": 10, f"{VM}.onCompletion": "stop"}
OFFICE_HOURS = {"start": "0 8 * * 1-5", "stop": "0 20 * * 1-5"}
REGISTRY = "us-central1-docker.pkg.dev/fixture-project/tpu-sources"
ANOTHER_REGISTRY = "us-central1-docker.pkg.dev/other-project/tpu-sources"
DIGEST = "0123456789abcdef" * 4

# case: (fixture stack, edits that break it in one way)
CASES: dict[str, tuple[str, dict[str, object]]] = {
    # The reported case: no TF 2.14.1 runtime runs on v5e, so tpu-vm-tf-2.14.1 must not be offered.
    "v5e-on-its-jax-runtime-with-tf-2.14.1": ("small", {**V5E, f"{VM}.runtimeVersion": "v2-alpha-tpuv5-lite"}),
    "runtime-of-another-tf-version": ("small", {f"{VM}.runtimeVersion": "tpu-vm-tf-2.13.0"}),
    "jax-too-new-for-the-images-python": (
        "small",
        {
            f"{NS}:workloads.mnist.program": "jax_mnist",
            f"{NS}:workloads.mnist.frameworkVersion": "0.10.2",
            f"{VM}.acceleratorType": "v4-8",
            f"{VM}.zone": "us-central2-b",
            f"{VM}.runtimeVersion": "tpu-ubuntu2204-base",
            f"{NS}:network.subnets.us-central2": "10.31.0.0/20",
        },
    ),
    "deployer-of-the-stack-it-was-copied-from": (
        "small",
        {
            f"{NS}:deployer": "tpu-deployer-dev@acme-ml-admin.iam.gserviceaccount.com",
        },
    ),
    "misspelt-key": ("small", {f"{VM}.provisoning": "spot"}),
    "misspelt-choice": ("small", {f"{VM}.provisioning": "spto"}),
    "misspelt-workload-key": ("small", {f"{NS}:workloads.mnist.bacthSize": 128}),
    "misspelt-workload-choice": ("small", {f"{NS}:workloads.mnist.bucketAccess.checkpoints": "wrte"}),
    "generation-name-as-accelerator-type": ("small", {**V5E_TF, f"{VM}.acceleratorType": "v5e-8"}),
    "zone-in-a-region-without-a-subnet": ("small", {f"{VM}.zone": "asia-east1-c"}),
    "no-subnets-at-all": ("small", {f"{NS}:network.subnets": REMOVE}),
    "multislice-on-a-direct-vm": ("small", {**V5E_TF, f"{VM}.nodeCount": 2}),
    "preemptible-queued": ("small", {**QUEUED, f"{VM}.provisioning": "preemptible"}),
    "queued-stopped-on-completion": ("small", {**QUEUED, f"{VM}.onCompletion": "stop"}),
    "queued-with-a-schedule": ("small", {**QUEUED, f"{VM}.schedule": OFFICE_HOURS}),
    "reservation-without-reserved": ("small", {**QUEUED, f"{VM}.reservationName": "team-a"}),
    "reservation-with-fallback-zones": (
        "small",
        {
            **QUEUED,
            f"{VM}.provisioning": "reserved",
            f"{VM}.reservationName": "team-a",
            f"{VM}.fallbackZones": ["us-west1-c"],
            f"{NS}:network.subnets.us-west1": "10.31.0.0/20",
        },
    ),
    "own-zone-as-fallback": ("small", {**QUEUED, f"{VM}.fallbackZones": ["us-central1-a"]}),
    "fallback-zone-without-a-subnet": ("small", {**QUEUED, f"{VM}.fallbackZones": ["us-west1-c"]}),
    "run-duration-without-flex-start": ("small", {**QUEUED, f"{VM}.runDurationHours": 4}),
    "max-run-hours-kept": ("small", {**RECOVERY, f"{VM}.onCompletion": "keep", f"{VM}.maxRunHours": 24}),
    "max-run-hours-and-a-schedule": ("small", {**RECOVERY, f"{VM}.maxRunHours": 24, f"{VM}.schedule": OFFICE_HOURS}),
    "max-run-hours-without-recovery": ("small", {f"{VM}.onCompletion": "stop", f"{VM}.maxRunHours": 24}),
    "spot-that-cannot-checkpoint": (
        "small",
        {
            f"{VM}.provisioning": "spot",
            f"{NS}:workloads.mnist.bucketAccess.checkpoints": "read",
        },
    ),
    "completion-without-its-marker": (
        "small",
        {
            f"{VM}.onCompletion": "delete",
            f"{NS}:workloads.mnist.bucketAccess.checkpoints": "read",
        },
    ),
    "schedule-on-a-multi-host-slice": (
        "small",
        {
            **V5E_TF,
            f"{VM}.acceleratorType": "v5litepod-16",
            f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pod-pjrt",
            f"{VM}.schedule": OFFICE_HOURS,
        },
    ),
    "multi-host-slice-stopped-on-completion": (
        "small",
        {
            **V5E_TF,
            f"{VM}.acceleratorType": "v5litepod-16",
            f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pod-pjrt",
            f"{VM}.onCompletion": "stop",
        },
    ),
    "schedule-that-only-starts-a-kept-vm": ("small", {f"{VM}.schedule": {"start": "0 8 * * 1-5"}}),
    "preemptions-of-an-on-demand-vm": ("small", {f"{VM}.hoursBetweenPreemptions": 6}),
    "preemptible-living-too-long": (
        "small",
        {
            f"{VM}.provisioning": "preemptible",
            f"{VM}.hoursBetweenPreemptions": 48,
        },
    ),
    "misspelled-key-of-a-declared-section": ("small", {f"{NS}:monitoring": {"idleMinute": 30}}),
    "misspelled-choice-of-a-declared-section": (
        "small",
        {f"{NS}:automation.budgetAction": {"action": "stpo"}, f"{NS}:budget.pubsubTopic": True},
    ),
    "budget-action-without-its-topic": ("small", {f"{NS}:automation.budgetAction": {"action": "stop"}}),
    "destroyable-production-bucket": ("small", {**PRODUCTION, f"{NS}:buckets.destroyable": ["checkpoints"]}),
    "self-service-in-production": ("small", {**PRODUCTION, f"{VM}.selfService": True}),
    "over-budget-with-fail-over-budget": (
        "small",
        {
            f"{NS}:budget.amount": 10,
            f"{NS}:budget.failOverBudget": True,
        },
    ),
    "image-by-tag": ("sources", {f"{NS}:workloads.img.source.image": f"{REGISTRY}/trainer:v3"}),
    "image-of-another-repository": (
        "sources",
        {
            f"{NS}:workloads.img.source.image": f"{ANOTHER_REGISTRY}/trainer@sha256:{DIGEST}",
        },
    ),
    # Warnings that suggest a value.
    "batch-that-does-not-split-over-the-devices": ("small", {f"{NS}:workloads.mnist.batchSize": 100}),
    "checkpoint-interval-far-from-the-best": (
        "small",
        {
            f"{VM}.provisioning": "spot",
            f"{VM}.hoursBetweenPreemptions": 4,
            f"{NS}:workloads.mnist.stepSeconds": 0.05,
            f"{NS}:workloads.mnist.checkpointSeconds": 60,
        },
    ),
    # The GKE engine's cluster and pools.
    "cluster-range-overlapping-a-subnet": ("gke", {f"{NS}:gke.nodeCidr": "10.30.0.0/20"}),
    "maintenance-day-twice": ("gke", {f"{NS}:gke.maintenanceWindow": {"days": ["SA", "SU", "SA"]}}),
    "maintenance-window-too-short": ("gke", {f"{NS}:gke.maintenanceWindow": {"days": ["SA"], "hours": 4}}),
    "pool-outside-the-clusters-region": ("gke", {f"{POOL}.zone": "us-west4-a"}),
    "pool-reservation-without-reserved": ("gke", {f"{POOL}.reservationName": "res-1"}),
    "pool-run-duration-without-flex-start": ("gke", {f"{POOL}.runDurationHours": 4}),
}


def findings(stack: str, raw: dict[str, str]) -> tuple[list[Problem], list[Problem]]:
    """(errors, warnings) of the real program: its config checks, then, when they pass, the program's own
    checks before it declares anything (the budget), by planning it under the offline mocks."""
    _, problems = check_stack_config(stack, raw)
    if problems.items:
        return problems.items, problems.warnings
    try:
        run_program(stack, raw)
    except pulumi.RunError as error:  # infra/stack.py reports a ConfigError as a RunError with its text
        assert isinstance(error.__context__, ConfigError), error
        return list(error.__context__.problems), problems.warnings
    return [], problems.warnings


def broken(case: str) -> tuple[str, dict[str, str]]:
    stack, edits = CASES[case]
    return stack, Fix.of(edits).apply(fixture_config(stack))


@pytest.mark.slow  # about a minute: each fix is a plan of the whole program
@pytest.mark.parametrize("case", CASES)
def test_each_fix_offered_plans_without_the_problem_and_without_a_new_error(case):
    stack, raw = broken(case)
    errors, warnings = findings(stack, raw)
    offered = [p for p in (errors or warnings) if p.fixes]
    assert offered, f"no fix offered for: {[str(p) for p in errors or warnings]}"
    before = {p.identity for p in errors}
    for problem in offered:
        for fix in problem.fixes:
            assert fix.says(problem.key) in str(problem)  # the message names exactly what is applied
            after_errors, after_warnings = findings(stack, fix.apply(raw))
            left = {p.identity for p in (*after_errors, *after_warnings)}
            assert problem.identity not in left, f"{fix.says(problem.key)} leaves {problem}"
            new = [str(p) for p in after_errors if p.identity not in before - {problem.identity}]
            assert not new, f"{fix.says(problem.key)} for {problem} gives {new}"


def test_the_reported_case_is_offered_tensorflow_that_v5e_runs():
    """v5litepod-8 on v2-alpha-tpuv5-lite with a workload pinned to TF 2.14.1: tpu-vm-tf-2.14.1 was
    offered, which v5e refuses (it needs TF 2.15.0 or newer)."""
    (problem,), _ = findings(*broken("v5e-on-its-jax-runtime-with-tf-2.14.1"))
    assert str(problem) == (
        f"{VM}.runtimeVersion = 'v2-alpha-tpuv5-lite': not a TensorFlow runtime, which a workload pinned to "
        "TensorFlow 2.14.1 needs (v5e needs TensorFlow 2.15.0 or newer); set "
        f"{NS}:workloads.mnist.frameworkVersion: 2.15.0 and set runtimeVersion: tpu-vm-tf-2.15.0-pjrt"
    )


def test_a_new_pin_moves_every_vm_running_the_workload_and_is_not_offered_where_one_cannot_move():
    """Pinning the workload to another TF version changes the runtime of every VM that runs it; where one
    of them takes no runtime of that version (v5e and TF 2.13.0), the pin is not offered."""
    stack, raw = broken("v5e-on-its-jax-runtime-with-tf-2.14.1")
    old = {
        "name": "old",
        "acceleratorType": "v2-8",
        "zone": "us-central1-b",
        "workload": "mnist",
        "runtimeVersion": "tpu-vm-tf-2.14.1",
    }
    (problem,), _ = findings(stack, Fix.of({f"{NS}:tpuVms[1]": old}).apply(raw))
    (fix,) = problem.fixes
    assert dict(fix.edits) == {
        f"{NS}:workloads.mnist.frameworkVersion": "2.15.0",
        f"{NS}:tpuVms[old].runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
        f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
    }
    stack, raw = broken("runtime-of-another-tf-version")  # a v2-8 on TF 2.13.0, the workload on 2.14.1
    (problem,), _ = findings(stack, raw)
    assert [f.says(problem.key) for f in problem.fixes] == [
        "set runtimeVersion: tpu-vm-tf-2.14.1",
        f"set {NS}:workloads.mnist.frameworkVersion: 2.13.0",
    ]
    v5e = {
        **old,
        "name": "v5e",
        "acceleratorType": "v5litepod-8",
        "zone": "us-central1-a",
        "runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
    }
    pinned = Fix.of({f"{NS}:workloads.mnist.frameworkVersion": "2.15.0", f"{NS}:tpuVms[1]": v5e}).apply(raw)
    (problem,), _ = findings(stack, pinned)  # the v2-8 on 2.13.0, a v5e on the workload's 2.15.0
    assert [f.says(problem.key) for f in problem.fixes] == ["set runtimeVersion: tpu-vm-tf-2.15.0-pjrt"]


def test_fixes_that_lead_to_another_error_are_dropped():
    """A queued multislice's nodeCount on a direct VM: `capacity: queued` would be offered, but with a
    schedule a queued VM is refused, so only removing nodeCount is."""
    stack, raw = broken("multislice-on-a-direct-vm")
    (problem,), _ = findings(stack, Fix.of({f"{VM}.schedule": OFFICE_HOURS}).apply(raw))
    assert [fix.says(problem.key) for fix in problem.fixes] == ["remove nodeCount"]
    (without_schedule,), _ = findings(stack, raw)
    assert [fix.says(problem.key) for fix in without_schedule.fixes] == ["set capacity: queued", "remove nodeCount"]


def fix_sites() -> set[tuple[Path, int]]:
    """Every call in the platform's code that adds a problem or warning with fixes: (file, line)."""
    sites = set()
    for path in (ROOT / "infra").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add", "warn")
                and any(k.arg == "fixes" for k in node.keywords)
            ):
                sites.add((path, node.lineno))
    return sites


def test_the_cases_reach_every_check_that_offers_a_fix(monkeypatch):
    reached: set[tuple[Path, int]] = set()

    def recording(original):
        def record(self, key, value, allowed, *, fixes=(), **rest):
            fixes = tuple(fixes)
            if fixes:
                caller = sys._getframe(1)
                reached.add((Path(caller.f_code.co_filename).resolve(), caller.f_lineno))
            return original(self, key, value, allowed, fixes=fixes, **rest)

        return record

    monkeypatch.setattr(Problems, "add", recording(Problems.add))
    monkeypatch.setattr(Problems, "warn", recording(Problems.warn))
    unfixed = []
    for case in CASES:
        errors, warnings = findings(*broken(case))
        if not any(p.fixes for p in errors or warnings):
            unfixed.append(case)
    assert not unfixed, f"every fix was dropped as leading to another error: {unfixed}"
    missed = sorted(f"{path.relative_to(ROOT)}:{line}" for path, line in fix_sites() - reached)
    assert not missed, f"no case reaches these fixes; add one to CASES: {missed}"


def test_a_fix_is_said_with_keys_as_near_to_the_problem_as_they_are_and_applied_to_the_raw_config():
    fix = Fix.of(
        {
            f"{VM}.runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",  # the same VM: its own key
            f"{NS}:workloads.mnist.frameworkVersion": "2.15.0",  # elsewhere: the whole key
            f"{VM}.schedule": REMOVE,
            f"{NS}:selfServiceInProduction": True,  # a top-level scalar: as Pulumi passes it, a string
            f"{NS}:tpuVms[1]": {"name": "next"},  # the next position of a list: added
        }
    )
    assert fix.says(f"{VM}.zone") == (
        f"set runtimeVersion: tpu-vm-tf-2.15.0-pjrt and set {NS}:workloads.mnist.frameworkVersion: 2.15.0 and "
        f"remove schedule and set {NS}:selfServiceInProduction: true and set {NS}:tpuVms[1]: {{name: next}}"
    )
    raw = {
        f"{NS}:tpuVms": '[{"name": "small-v2", "runtimeVersion": "x", "schedule": {"stop": "0 20 * * *"}}]',
        f"{NS}:workloads": '{"mnist": {"frameworkVersion": "2.14.1"}}',
    }
    assert fix.apply(raw) == {
        f"{NS}:tpuVms": '[{"name": "small-v2", "runtimeVersion": "tpu-vm-tf-2.15.0-pjrt"}, {"name": "next"}]',
        f"{NS}:workloads": '{"mnist": {"frameworkVersion": "2.15.0"}}',
        f"{NS}:selfServiceInProduction": "true",
    }
    assert raw[f"{NS}:tpuVms"].startswith('[{"name": "small-v2", "runtimeVersion": "x"')  # a copy: the original is kept
    beside = Fix.of({f"{NS}:budget.failOverBudget": False})
    assert beside.says(f"{NS}:budget.amount") == "set failOverBudget: false"  # beside it in its mapping
    assert beside.says(f"{NS}:automation.budgetAction") == f"set {NS}:budget.failOverBudget: false"
