"""The whole environment, built from one validated `PlatformConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

from infra import artifacts
from infra.apis import ProjectApis, guard_needed, required_apis
from infra.artifacts import ArtifactsArgs, WorkloadArtifacts, WorkloadCode
from infra.automation import TpuGuard
from infra.budget import BudgetAlerts
from infra.config import PROJECT, PlatformConfig
from infra.config.sources import REPO_ROOT, parse_image
from infra.cost import StackCost, estimate
from infra.identity import WorkloadIdentity
from infra.lifecycle import RunStatus, TpuSchedules, schedule_outputs
from infra.monitoring import TpuMonitoring
from infra.network import PrivateNetwork
from infra.packaging import Package, package
from infra.run_status import completed_runs
from infra.schema import ConfigError, Problem
from infra.secrets import hide, keep_secret
from infra.storage import PlatformBuckets
from infra.tpu.cloud_tpu import BACKENDS
from infra.tpu.metadata import run_id, source_digests, vm_metadata
from infra.tpu.vm import TpuVm

TPU_BACKEND = "cloud-tpu"
# The VM agent's package (docs/design-runs.md), uploaded next to the workloads' sources once it exists.
AGENT_FOLDER = "vm_agent"
AGENT_PACKAGE = "vm-agent"


def build_platform(cfg: PlatformConfig, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs."""
    secrets = secrets or {}
    digests = source_digests(cfg)  # may refuse the config: before any resource is declared
    metadata = vm_metadata(cfg, digests)
    code_args = artifacts_args(cfg, digests)  # packages the folders; may refuse them, still before any resource
    refuse_secrets_in_metadata(cfg, metadata, secrets)
    cost = check_cost(cfg)
    keep_secret(secrets)
    apis = ProjectApis("apis", cfg.project, required_apis(cfg))
    network = PrivateNetwork("network", cfg, apis)
    buckets = PlatformBuckets("buckets", cfg, apis)
    identities = {w.name: WorkloadIdentity(f"workload-{w.name}", cfg, w, buckets.buckets, apis) for w in cfg.workloads}
    code = WorkloadArtifacts(
        "artifacts",
        cfg.env,
        code_args,
        {n: i.email for n, i in identities.items()},
        apis.needs(*(a.removesuffix(".googleapis.com") for a in artifacts.REQUIRED_APIS)),
    )
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
            needs=[*apis.needs("tpu"), status.grants[vm.name], *code.grants[vm.workload]],
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

    return {
        "project": cfg.project,
        "environment": cfg.environment,
        "enabledApis": sorted(apis.services),
        "network": network.network.self_link,
        "bucketUrls": {**buckets.urls, "status": status.bucket.url, "artifacts": code.bucket.url},
        "imageRegistry": code.registry,
        "serviceAccounts": {name: identity.email for name, identity in identities.items()},
        "budgetName": budget.budget.name,
        "budgetAlertTopic": budget.topic.id if budget.topic else None,
        "tpuVms": {name: vm.outputs for name, vm in vms.items()},
        "schedules": schedule_outputs(cfg.tpu_vms),
        "costEstimate": cost.as_output(),
    }


def source_packages(cfg: PlatformConfig, digests: dict[str, str]) -> dict[str, Package]:
    """The archives to upload, by resource key: each folder source, and the VM agent once it exists."""
    out: dict[str, Package] = {}
    folders: dict[str, str] = {}
    for folder in sorted(digests):
        archive = package(REPO_ROOT.joinpath(*folder.split("/")))
        assert archive.sha256 == digests[folder], f"{folder} changed while the plan ran"
        key = _package_key(folder)
        if key in folders:  # `a/b` and `a-b`: one resource name for two folders
            raise ConfigError(
                cfg.stack,
                [Problem(f"{PROJECT}:workloads", folder,
                         f"source folders {folders[key]} and {folder} would share the resource name {key}; "
                         "rename one of the folders")],
            )  # fmt: skip
        folders[key] = folder
        out[key] = archive
    agent = REPO_ROOT / AGENT_FOLDER
    if agent.is_dir():
        out[AGENT_PACKAGE] = package(agent)
    return out


def _package_key(folder: str) -> str:
    return "source-" + folder.replace("/", "-").replace("_", "-").replace(".", "-").lower()


def artifacts_args(cfg: PlatformConfig, digests: dict[str, str]) -> ArtifactsArgs:
    packages = source_packages(cfg, digests)
    agent = (AGENT_PACKAGE,) if AGENT_PACKAGE in packages else ()
    workloads = {
        w.name: WorkloadCode(
            packages=(*agent, *((_package_key(w.source.folder),) if w.source.kind == "folder" else ())),
            pulls_images=w.source.kind == "image",
        )
        for w in cfg.workloads
    }
    images = (parse_image(w.source.image) for w in cfg.workloads if w.source.kind == "image")
    return ArtifactsArgs(
        location=cfg.buckets.location,
        kms_key_name=cfg.buckets.kms_key_name,
        destroyable="artifacts" in cfg.buckets.destroyable,
        noncurrent_versions_to_keep=cfg.buckets.noncurrent_versions_to_keep,
        noncurrent_version_days=cfg.buckets.noncurrent_version_days,
        packages=packages,
        workloads=workloads,
        pinned_digests=tuple(sorted({i.digest for i in images if i is not None and i.digest})),
        keep_image_versions=cfg.artifacts.keep_image_versions,
        untagged_image_days=cfg.artifacts.untagged_image_days,
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
