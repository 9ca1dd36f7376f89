"""The whole environment, built from one validated `PlatformConfig`.

This is the one reader of the whole config: it decides which
components a stack declares, gives each the environment (`Env`) and its own small args, and enables
the APIs that those components declare they need. One block per component, in each of the two steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pulumi

from infra import naming
from infra.access.accounts import StackIdentities
from infra.access.identities import (
    gke_node_account,
    guard_identities,
    scheduler_identities,
    self_service_account,
    team_identities,
    workload_account,
)
from infra.apis import ProjectApis, required_apis
from infra.artifacts import ARTIFACTS_APIS, ArtifactsArgs, WorkloadArtifacts, WorkloadCode
from infra.budget import BudgetAlerts, BudgetAlertsArgs, budget_apis
from infra.config import PROJECT, PlatformConfig, TpuVmSettings, WorkloadSettings
from infra.config.problems import ConfigError, Fix, Problem, Problems
from infra.config.workload_code import parse_image
from infra.cost import StackCost, estimate
from infra.gke import queues
from infra.gke.cluster import GKE_APIS, GkeCluster, GkeClusterArgs
from infra.gke.install import TeamQueues, cluster_provider
from infra.gke.slice_pools import SlicePool, SlicePoolArgs
from infra.gke.specs import shape_of
from infra.gke.team_access import TeamAccess, TeamAccessArgs
from infra.identity import IDENTITY_APIS, WorkloadIdentity, WorkloadIdentityArgs
from infra.lifecycle import (
    RUN_STATUS_APIS,
    SCHEDULES_APIS,
    RunStatus,
    RunStatusArgs,
    TpuSchedules,
    TpuSchedulesArgs,
    schedule_outputs,
)
from infra.monitoring import MONITORING_APIS, TpuMonitoring, TpuMonitoringArgs
from infra.network import ClusterRanges, PrivateNetwork, network_apis
from infra.packaging import Package, agent_wheelhouse, repository_folder
from infra.researchers import (
    ResearcherAccess,
    ResearcherArgs,
    SelfServiceVm,
    researcher_apis,
    researcher_identities,
)
from infra.run_status import completed_runs
from infra.secrets import hide, keep_secret
from infra.storage import STORAGE_APIS, PlatformBuckets
from infra.tpu.cloud_tpu import BACKENDS
from infra.tpu.metadata import agent_package, run_id, source_digests, vm_metadata
from infra.tpu.vm import TPU_VM_APIS, TpuVm, multi_host_job
from infra.tpu_guard import TpuGuard, TpuGuardArgs, guard_apis

TPU_BACKEND = "cloud-tpu"
# The VM agent's package (docs/run-contract.md), uploaded next to the workloads' sources.
AGENT_PACKAGE = "vm-agent"
AGENT_WHEELHOUSE = "vm-agent-wheelhouse"  # the agent's own environment (infra/packaging.py agent_wheelhouse)


def build_platform(cfg: PlatformConfig, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Declare every resource of the stack and return the stack outputs."""
    secrets = secrets or {}
    digests = source_digests(cfg)  # may refuse the config: before any resource is declared
    metadata = vm_metadata(cfg, digests)
    code_args = artifacts_args(cfg, digests)  # packages the folders; may refuse them, still before any resource
    refuse_secrets_in_metadata(cfg, metadata, secrets)
    refuse_secrets_in_production(cfg, secrets)
    team_queues = gke_queue_objects(cfg)  # checked by the validator: before any resource is declared
    cost = check_cost(cfg)
    keep_secret(secrets)
    env = cfg.env

    # 1. What each component reads; a component whose feature is off gets no args and is not declared.
    budget_args = BudgetAlertsArgs(cfg.budget, cfg.billing_account, cfg.buckets.kms_key_name)
    identity_args = {w.name: WorkloadIdentityArgs(w) for w in cfg.workloads}
    status_args = RunStatusArgs(cfg.buckets.location, tuple((vm.name, account_key(vm)) for vm in cfg.tpu_vms))
    guard_args = guard_args_of(cfg)
    scheduled = tuple(vm for vm in cfg.tpu_vms if vm.schedule)
    schedule_args = TpuSchedulesArgs(scheduled) if scheduled else None
    monitoring_args = TpuMonitoringArgs(
        cfg.monitoring.idle_minutes, cfg.tpu_vms, recovery=bool(cfg.automation.recovery.every_minutes)
    )
    researcher_args = researcher_args_of(cfg) if cfg.researchers else None
    gke = cfg.gke
    cluster_args = GkeClusterArgs(gke) if gke else None
    cluster_ranges = ClusterRanges(gke.region, gke.node_cidr, gke.pod_cidr, gke.service_cidr) if gke else None
    pool_args = [SlicePoolArgs(pool, gke.tpu_pool_upgrades) for pool in gke.slice_pools] if gke else []

    # 2. The project APIs: what the declared components need, as each component's module declares it.
    apis = ProjectApis(
        "apis",
        env.project,
        required_apis(
            network_apis(cfg.network),
            STORAGE_APIS,
            IDENTITY_APIS,
            ARTIFACTS_APIS,
            budget_apis(budget_args),
            RUN_STATUS_APIS,
            TPU_VM_APIS,
            guard_apis(guard_args) if guard_args else (),
            SCHEDULES_APIS if schedule_args else (),
            MONITORING_APIS,
            researcher_apis(researcher_args) if researcher_args else (),
            GKE_APIS if cluster_args else (),
        ),
    )

    # 3. The components, each from the environment and its own args.
    jobs = tuple(vm.name for vm in cfg.tpu_vms if multi_host_job(vm))
    network = PrivateNetwork("network", env, cfg.network, apis, cluster=cluster_ranges, jobs=jobs)
    buckets = PlatformBuckets("buckets", env, cfg.buckets, apis)
    identities = {
        name: WorkloadIdentity(f"workload-{name}", env, args, buckets.buckets, apis)
        for name, args in identity_args.items()
    }
    # A self-service VM never shares its workload's account with the VMs that run reviewed work.
    own = {
        account_key(vm): WorkloadIdentity(
            f"self-service-{vm.name}",
            env,
            WorkloadIdentityArgs(cfg.workload(vm.workload), vm=vm.name),
            buckets.buckets,
            apis,
        )
        for vm in cfg.self_service_vms
    }
    emails = {**{n: i.email for n, i in identities.items()}, **{k: i.email for k, i in own.items()}}
    code = WorkloadArtifacts(
        "artifacts",
        env,
        code_args,
        emails,
        apis.needs(*(a.removesuffix(".googleapis.com") for a in ARTIFACTS_APIS)),
    )
    budget = BudgetAlerts("budget", env, budget_args, apis)
    status = RunStatus("run-status", env, status_args, emails, buckets.encryption, buckets.ready)
    # A VM deleted by the guard once its run completed is no longer declared, so `up`, `refresh` and
    # the drift check agree with the project (the status is read through an invoke; mocked offline).
    gone = completed_runs(env.project, status.bucket_name, runs_to_check(cfg))
    for vm_name in sorted(gone):
        pulumi.log.warn(f"stack '{env.stack}': TPU VM {vm_name} completed its run and was deleted; no longer declared")
    vms = {
        vm.name: TpuVm(
            f"tpu-{vm.name}",
            env,
            vm,
            metadata[vm.name],
            own.get(account_key(vm)) or identities[vm.workload],
            network,
            BACKENDS["queued" if vm.queued else TPU_BACKEND],
            apis,
            needs=[status.grants[vm.name], *code.grants[account_key(vm)]],
        )
        for vm in cfg.tpu_vms
        if vm.name not in gone
    }
    guard = None
    if guard_args:
        guard = TpuGuard(
            "guard",
            env,
            guard_args,
            apis,
            buckets.encryption,
            buckets.ready,
            status.bucket,
            budget.topic,
            budget.budget.name,
        )
    if schedule_args:
        start = guard.start if guard else None  # scheduled starts need the guard (TpuGuardArgs.needed)
        TpuSchedules("schedules", env, schedule_args, apis, {name: vm.node for name, vm in vms.items()}, start)
    TpuMonitoring("monitoring", env, monitoring_args, apis, budget.channels)
    if researcher_args:
        ResearcherAccess("researchers", env, researcher_args, apis, [*buckets.buckets.values(), status.bucket])
    engine: dict[str, Any] = {}
    if cluster_args:
        cluster = GkeCluster("gke", env, cluster_args, network, apis)
        pools = {a.pool.name: SlicePool(f"slices-{a.pool.name}", env, a, cluster, apis) for a in pool_args}
        engine["gke"] = {**cluster.outputs, "slicePools": {name: pool.outputs for name, pool in pools.items()}}
        if cluster_args.gke.teams:
            TeamAccess(
                "team-access",
                env,
                TeamAccessArgs(cluster_args.gke.teams),
                {**buckets.buckets, naming.ARTIFACTS: code.bucket},
                apis,
                [cluster.cluster],
            )
        if team_queues:
            # The queues phase: the admin phase (gke-admin/) installed Kueue and gave this stack's deployer
            # the rights to these objects; the pools exist before a queue lends their chips.
            provider = cluster_provider(
                "gke-kubernetes",
                cluster.endpoint,
                naming.gke_cluster(env.stack),
                pulumi.ResourceOptions(parent=cluster),
            )
            TeamQueues("queues", provider, team_queues, pulumi.ResourceOptions(depends_on=list(pools.values())))
            engine["gke"]["teams"] = {
                t.name: {"namespace": t.namespace, "localQueue": t.name, "priority": t.priority}
                for t in cluster_args.gke.teams
            }

    return {
        "project": env.project,
        "environment": env.stack,
        "enabledApis": sorted(apis.services),
        "network": network.network.self_link,
        "bucketUrls": {**buckets.urls, "status": status.bucket.url, "artifacts": code.bucket.url},
        "imageRegistry": code.registry,
        "serviceAccounts": emails,
        "budgetName": budget.budget.name,
        "budgetAlertTopic": budget.topic.id if budget.topic else None,
        "tpuVms": {name: vm.outputs for name, vm in vms.items()},
        "schedules": schedule_outputs(cfg.tpu_vms),
        "costEstimate": cost.as_output(),
        **engine,  # only in a stack with the GKE engine: the others' outputs stay as they were
    }


def guard_args_of(cfg: PlatformConfig) -> TpuGuardArgs | None:
    """The guard's args, or None when no feature of the stack needs it."""
    args = TpuGuardArgs(
        automation=cfg.automation,
        vms=cfg.tpu_vms,
        runs=tuple((vm.name, run_id(cfg, vm)) for vm in cfg.tpu_vms),
        billing_account=cfg.billing_account,
        bucket_location=cfg.buckets.location,
    )
    return args if args.needed else None


def runs_to_check(cfg: PlatformConfig) -> dict[str, str]:
    """The TPU VMs whose completion the program reads from the status bucket (`completed_runs`): those
    deleted once their run completes, each with its current run id."""
    return {vm.name: run_id(cfg, vm) for vm in cfg.tpu_vms if vm.on_completion == "delete"}


def stack_identities(cfg: PlatformConfig) -> StackIdentities:
    """The accounts and custom roles the stack's components use, which the bootstrap makes for it
    (bootstrap/access.json): the components only name them."""
    workloads = tuple(workload_account(w.name, w.description, cfg.stack) for w in cfg.workloads)
    # A self-service VM's own account (infra/researchers.py): the guard re-creates such a VM as it too.
    own = tuple(self_service_account(vm.name, cfg.stack) for vm in cfg.self_service_vms)
    out = StackIdentities(accounts=(*workloads, *own))
    if guard_args_of(cfg):
        out += guard_identities(cfg.stack, tuple(a.account_id for a in (*workloads, *own)))
    if TpuSchedulesArgs(cfg.tpu_vms).stops:  # a schedule that only starts VMs goes through the guard
        out += scheduler_identities(cfg.stack)
    if cfg.researchers:
        out += researcher_identities(cfg.stack, researcher_args_of(cfg))
    if cfg.gke:
        out += StackIdentities(accounts=(gke_node_account(cfg.stack),))
        if cfg.gke.teams:
            out += team_identities(cfg.stack)
    return out


def gke_queue_objects(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """The queues phase's objects (none without teams), checked as a cluster would check them."""
    if cfg.gke is None or not cfg.gke.teams:
        return []
    # Imported here, not at the top: the validator brings jsonschema and a CEL interpreter, about a third
    # of what the program imports beyond the SDK's own modules, and only a stack with GKE teams uses them.
    from infra.gke.validation import platform_validator, validate_all

    pools = {p.name: shape_of(p) for p in cfg.gke.slice_pools}
    objs = queues.queue_objects(cfg.gke.teams, pools)
    validate_all(platform_validator(), objs, list(pools.values())).raise_for(cfg.stack, f"{PROJECT}:gke.teams")
    return objs


def self_service_vm(cfg: PlatformConfig, vm: TpuVmSettings) -> SelfServiceVm:
    workload = cfg.workload(vm.workload)
    return SelfServiceVm(
        vm.name,
        workload.name,
        data=workload.access("data") != "none",
        checkpoints=workload.access("checkpoints") == "write",
        models=workload.access("models") == "write",
        nodes=tuple(naming.node_ids(vm.name, vm.node_count)),
    )


def account_key(vm: TpuVmSettings) -> str:
    """Whose account a VM runs as, by key of the stack's accounts: its own when self-service, else its workload's."""
    return f"self-service-{vm.name}" if vm.self_service else vm.workload


def researcher_args_of(cfg: PlatformConfig) -> ResearcherArgs:
    return ResearcherArgs(
        members=cfg.researchers,
        vms=tuple(self_service_vm(cfg, vm) for vm in cfg.self_service_vms),
        status_bucket=cfg.bucket_name("status"),
        models_bucket=cfg.bucket_name("models"),
        artifacts_bucket=cfg.bucket_name(naming.ARTIFACTS),
        ssh=cfg.researcher_ssh,
    )


def source_packages(cfg: PlatformConfig, digests: dict[str, str]) -> dict[str, Package]:
    """The archives to upload, by resource key: each folder source, and the VM agent."""
    out: dict[str, Package] = {}
    folders: dict[str, str] = {}
    for folder in sorted(digests):
        archive = repository_folder(folder)  # packaged by source_digests already: the cached Package
        key = _package_key(folder)
        if key in folders:  # `a/b` and `a-b`: one resource name for two folders
            raise ConfigError(
                cfg.stack,
                [
                    Problem(
                        f"{PROJECT}:workloads",
                        folder,
                        f"source folders {folders[key]} and {folder} would share the resource name {key}; "
                        "rename one of the folders",
                    )
                ],
            )
        folders[key] = folder
        out[key] = archive
    out[AGENT_PACKAGE] = agent_package()
    out[AGENT_WHEELHOUSE] = agent_wheelhouse()
    return out


def _package_key(folder: str) -> str:
    return "source-" + folder.replace("/", "-").replace("_", "-").replace(".", "-").lower()


def artifacts_args(cfg: PlatformConfig, digests: dict[str, str]) -> ArtifactsArgs:
    packages = source_packages(cfg, digests)

    def own(w: WorkloadSettings) -> tuple[str, ...]:
        folder = (_package_key(w.source.folder),) if w.source.kind == "folder" else ()
        return (AGENT_PACKAGE, AGENT_WHEELHOUSE, *folder)

    workloads = {w.name: WorkloadCode(packages=own(w), pulls_images=w.source.kind == "image") for w in cfg.workloads}
    # A self-service VM's own account reads any archive researchers submit, and pulls any image.
    for vm in cfg.self_service_vms:
        workloads[account_key(vm)] = WorkloadCode(
            packages=own(cfg.workload(vm.workload)), pulls_images=True, any_source=True
        )
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
        images=cfg.artifacts,
    )


def check_cost(cfg: PlatformConfig) -> StackCost:
    """The monthly estimate; over the budget it warns, or fails the plan when the stack says so."""
    cost = estimate(cfg.tpu_vms, cfg.budget, cfg.gke.slice_pools if cfg.gke else ())
    if cost.over_budget:
        message = (
            f"estimated TPU cost {cost.monthly_total:,.2f} USD/month exceeds the budget of "
            f"{cfg.budget.amount:,.2f} USD (prices of {cost.prices_date})"
        )
        if cfg.budget.fail_over_budget:
            problems, key = Problems(), f"{PROJECT}:budget"
            problems.add(
                f"{key}.amount",
                cfg.budget.amount,
                message,
                advice="use spot TPUs or schedules",
                fixes=[
                    Fix.of({f"{key}.amount": math.ceil(cost.monthly_total)}),
                    Fix.of({f"{key}.failOverBudget": False}),
                ],
            )
            problems.raise_if_any(cfg.stack)
        pulumi.log.warn(f"stack '{cfg.stack}': {message}")
    return cost


def refuse_secrets_in_metadata(
    cfg: PlatformConfig, metadata: dict[str, dict[str, str]], secrets: Mapping[str, str]
) -> None:
    """VM metadata is readable by whoever can read the node: no secret value may end up there."""
    problems = [
        Problem(
            key,
            "[secret]",
            f"a value marked secure would reach the metadata of TPU VM {vm}, which anyone who can read the node "
            "sees; keep it out of workload settings (a secret belongs in Secret Manager, read by the "
            "workload's account)",
        )
        for vm, items in metadata.items()
        for plaintext, key in secrets.items()
        if any(plaintext in value for value in items.values())
    ]
    if problems:
        raise ConfigError(cfg.stack, problems)


def refuse_secrets_in_production(cfg: PlatformConfig, secrets: Mapping[str, str]) -> None:
    """A production stack keeps no secret in its stack file: a preview decrypts the stack's secrets, and
    any branch of the repository can run the previewer (bootstrap/program.py)."""
    if not cfg.production:
        return
    problems = [
        Problem(
            key,
            "[secret]",
            "a production stack keeps no value marked secure: every branch's preview can decrypt it (the "
            "previewer reads the state with the stack's key); keep it in Secret Manager, read by the workload's "
            "account",
        )
        for key in sorted(set(secrets.values()))
    ]
    if problems:
        raise ConfigError(cfg.stack, problems)


def export_all(outputs: dict[str, Any], secrets: Mapping[str, str] | None = None) -> None:
    for key, value in outputs.items():
        pulumi.export(key, hide(value, secrets or {}))
