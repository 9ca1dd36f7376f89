"""The whole environment, built from one validated `PlatformConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

from infra import naming
from infra.apis import ProjectApis, guard_needed, required_apis
from infra.automation import TpuGuard
from infra.budget import BudgetAlerts
from infra.config import PROJECT, PlatformConfig
from infra.cost import StackCost, estimate
from infra.identity import WorkloadIdentity
from infra.lifecycle import RunStatus, TpuSchedules, schedule_outputs
from infra.monitoring import TpuMonitoring
from infra.network import PrivateNetwork
from infra.researchers import ResearcherAccess, ResearcherArgs
from infra.run_status import completed_runs
from infra.schema import ConfigError, Problem
from infra.secrets import hide, keep_secret
from infra.storage import PlatformBuckets
from infra.tpu.cloud_tpu import BACKENDS
from infra.tpu.metadata import run_id, vm_metadata
from infra.tpu.vm import TpuVm

TPU_BACKEND = "cloud-tpu"


def build_platform(cfg: PlatformConfig, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs."""
    secrets = secrets or {}
    metadata = vm_metadata(cfg)  # may refuse the config: before any resource is declared
    refuse_secrets_in_metadata(cfg, metadata, secrets)
    cost = check_cost(cfg)
    keep_secret(secrets)
    apis = ProjectApis("apis", cfg.project, required_apis(cfg))
    network = PrivateNetwork("network", cfg, apis)
    buckets = PlatformBuckets("buckets", cfg, apis)
    identities = {w.name: WorkloadIdentity(f"workload-{w.name}", cfg, w, buckets.buckets, apis) for w in cfg.workloads}
    budget = BudgetAlerts("budget", cfg, apis)
    accounts = {n: i.account for n, i in identities.items()}
    status = RunStatus(
        "run-status", cfg, apis, {n: i.email for n, i in identities.items()}, buckets.encryption, buckets.ready
    )
    # A VM deleted by the guard once its run completed is no longer declared, so `up`, `refresh` and
    # the drift check agree with the project (the status is read through an invoke; mocked offline).
    gone = completed_runs(
        cfg.project,
        status.bucket_name,
        {vm.name: run_id(cfg, vm) for vm in cfg.tpu_vms if vm.on_completion == "delete"},
    )
    for vm_name in sorted(gone):
        pulumi.log.warn(f"stack '{cfg.stack}': TPU VM {vm_name} completed its run and was deleted; no longer declared")
    vms = {
        vm.name: TpuVm(
            f"tpu-{vm.name}",
            cfg,
            vm,
            metadata[vm.name],
            identities[vm.workload],
            network,
            BACKENDS["queued" if vm.queued else TPU_BACKEND],
            needs=[*apis.needs("tpu"), status.grants[vm.name]],
        )
        for vm in cfg.tpu_vms
        if vm.name not in gone
    }
    guard = None
    if guard_needed(cfg):
        guard = TpuGuard(
            "guard", cfg, apis, buckets.encryption, buckets.ready, accounts, status.bucket, budget.topic,
            budget.budget.name,
        )  # fmt: skip
    if cfg.has_schedules:
        assert guard is not None and guard.start is not None  # schedules need the guard (guard_needed)
        TpuSchedules("schedules", cfg, apis, {name: vm.node for name, vm in vms.items()}, guard.start)
    TpuMonitoring("monitoring", cfg, apis, budget.channels)
    if cfg.researchers:
        ResearcherAccess("researchers", cfg.env, researcher_args(cfg), apis, [*buckets.buckets.values(), status.bucket])

    return {
        "project": cfg.project,
        "environment": cfg.environment,
        "enabledApis": sorted(apis.services),
        "network": network.network.self_link,
        "bucketUrls": {**buckets.urls, "status": status.bucket.url},
        "serviceAccounts": {name: identity.email for name, identity in identities.items()},
        "budgetName": budget.budget.name,
        "budgetAlertTopic": budget.topic.id if budget.topic else None,
        "tpuVms": {name: vm.outputs for name, vm in vms.items()},
        "schedules": schedule_outputs(cfg.tpu_vms),
        "costEstimate": cost.as_output(),
    }


def researcher_args(cfg: PlatformConfig) -> ResearcherArgs:
    return ResearcherArgs(
        members=cfg.researchers,
        self_service_vms=tuple(vm.name for vm in cfg.self_service_vms),
        status_bucket=cfg.bucket_name("status"),
        models_bucket=cfg.bucket_name("models"),
        artifacts_bucket=naming.bucket(cfg.name_prefix, cfg.stack, naming.ARTIFACTS),
        ssh=cfg.researcher_ssh,
    )


def check_cost(cfg: PlatformConfig) -> StackCost:
    """The monthly estimate; over the budget it warns, or fails the plan when the stack says so."""
    cost = estimate(cfg)
    if cost.over_budget:
        message = (
            f"estimated TPU cost {cost.monthly_total:,.2f} USD/month exceeds the budget of "
            f"{cfg.budget.amount:,.2f} USD (prices of {cost.prices_date})"
        )
        if cfg.budget.fail_over_budget:
            raise ConfigError(
                cfg.stack,
                [Problem(f"{PROJECT}:budget.amount", cfg.budget.amount,
                         f"{message}; raise the budget, use spot TPUs or schedules, or set failOverBudget: false")],
            )  # fmt: skip
        pulumi.log.warn(f"stack '{cfg.stack}': {message}")
    return cost


def refuse_secrets_in_metadata(
    cfg: PlatformConfig, metadata: dict[str, dict[str, str]], secrets: Mapping[str, str]
) -> None:
    """VM metadata is readable by whoever can read the node: no secret value may end up there."""
    problems = [
        Problem(key, "[secret]",
                f"a value marked secure would reach the metadata of TPU VM {vm}, which anyone who can read the node "
                "sees; keep it out of workload settings (a secret belongs in Secret Manager, read by the "
                "workload's account)")
        for vm, items in metadata.items()
        for plaintext, key in secrets.items()
        if any(plaintext in value for value in items.values())
    ]  # fmt: skip
    if problems:
        raise ConfigError(cfg.stack, problems)


def export_all(outputs: dict[str, Any], secrets: Mapping[str, str] | None = None) -> None:
    for key, value in outputs.items():
        pulumi.export(key, hide(value, secrets or {}))
