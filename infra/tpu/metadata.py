"""Each TPU VM's metadata: its start-up script, run settings and access settings, size-checked.

Computed for every VM before any resource is declared, so an oversized or unrenderable workload
fails the plan with a config error and nothing registered.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from infra import naming
from infra.catalog import framework_lock, load_catalog
from infra.config.model import PROJECT, PlatformConfig, TpuVmSettings
from infra.config.problems import Problems, item_key
from infra.config.workload_code import registry
from infra.packaging import Package, PackagingError, agent_wheelhouse, repository_folder, repository_packages
from infra.startup import (
    ENV_ATTRIBUTE,
    RUN_ATTRIBUTE,
    Artifact,
    StartupSpec,
    metadata_size_problem,
    render_env,
    render_startup_script,
)
from run_contract import paths


def run_prefix(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    """Where one run of a VM keeps its checkpoints and model: a new `run` id starts afresh."""
    workload = cfg.workload(vm.workload)
    return f"{workload.name}/{vm.name}/{workload.run}"


def run_id(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    """The id a run records in its completion marker (`TPU_PLATFORM_RUN_ID`)."""
    return f"{cfg.stack}/{run_prefix(cfg, vm)}"


def source_digests(cfg: PlatformConfig) -> dict[str, str]:
    """sha256 of each folder source's archive (infra/packaging.py), by folder."""
    problems = Problems()
    out: dict[str, str] = {}
    for workload in cfg.workloads:
        folder = workload.source.folder
        if workload.source.kind != "folder" or not folder or folder in out:
            continue
        try:
            out[folder] = repository_folder(folder).sha256
        except PackagingError as error:
            key, value = ("program", workload.program) if workload.program else ("source.folder", folder)
            problems.add(f"{PROJECT}:workloads.{workload.name}.{key}", value, f"cannot be packaged: {error}")
    problems.raise_if_any(cfg.stack)
    return out


def run_spec(cfg: PlatformConfig, vm: TpuVmSettings, digests: Mapping[str, str]) -> dict[str, Any]:
    """The stack's run of `vm` as a run spec (`requester: "stack"`), with where its data, checkpoints and
    model live and `completion`: the stack's own run ends in the completion marker the guard acts on."""
    workload = cfg.workload(vm.workload)
    run = run_prefix(cfg, vm)
    source: dict[str, str]
    if workload.source.kind == "image":
        source = {"kind": "image", "image": workload.source.image}
    else:
        sha256 = digests[workload.source.folder]
        uri = f"gs://{cfg.bucket_name('artifacts')}/{paths.source_object(sha256)}"
        source = {"kind": "folder", "uri": uri, "sha256": sha256}
    spec: dict[str, Any] = {
        "runId": run_id(cfg, vm),
        "source": source,
        "command": list(workload.command),
        "env": dict(workload.env),
        "requester": "stack",
        "data": f"gs://{cfg.bucket_name('data')}/{workload.data_object}" if workload.data_object else "",
        "checkpointDir": f"gs://{cfg.bucket_name('checkpoints')}/{run}"
        if workload.access("checkpoints") == "write"
        else "",
        "modelDir": f"gs://{cfg.bucket_name('models')}/{run}" if workload.access("models") == "write" else "",
        "completion": True,
    }
    if workload.python and workload.source.kind == "folder":
        spec["python"] = workload.python
    return spec


def render_run_spec(spec: Mapping[str, Any]) -> str:
    """Canonical JSON: the same run is the same bytes, so an unchanged stack shows no metadata change."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# The VM agent (vm_agent/, docs/run-contract.md) and the run contract it keeps (run_contract/): one archive
# with both packages side by side, fetched by the start-up script (and a GKE folder run's fetch step), verified
# by its digest, under the runners' prefix (run_contract/paths.py RUNNERS_PREFIX).
AGENT_PACKAGES = ("vm_agent", "run_contract")
# How long a run has between SIGTERM and SIGKILL: GCE gives a spot/preemptible VM about 30 s of notice
# (https://cloud.google.com/compute/docs/instances/preemptible#preemption-process).
GRACE_SECONDS = 30
MAX_RETRIES = 3  # a run exiting 75 or crashing is started again this many times, then marked failed


def agent_package() -> Package:
    return dataclasses.replace(repository_packages(*AGENT_PACKAGES), prefix=paths.RUNNERS_PREFIX)


def agent_settings(
    cfg: PlatformConfig, vm: TpuVmSettings, environment: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    """The agent's static settings (`agent.env`, docs/run-contract.md), the same on every worker."""
    workload = cfg.workload(vm.workload)

    def bucket_if_written(purpose: str) -> str:
        return f"gs://{cfg.bucket_name(purpose)}" if workload.access(purpose) == "write" else ""

    status_dir = f"gs://{cfg.bucket_name('status')}/{paths.status_prefix(vm.name).rstrip('/')}"
    return (
        ("TPU_PLATFORM_STACK", cfg.stack),
        ("TPU_PLATFORM_VM", vm.name),
        ("TPU_PLATFORM_PROJECT", cfg.project),
        ("TPU_PLATFORM_WORKLOAD", workload.name),
        ("TPU_PLATFORM_STATUS_DIR", status_dir),
        ("TPU_PLATFORM_ARTIFACTS", f"gs://{cfg.bucket_name(naming.ARTIFACTS)}"),
        ("TPU_PLATFORM_REGISTRY", registry(cfg.region, cfg.project, naming.artifact_repository(cfg.stack))),
        ("TPU_PLATFORM_CHECKPOINTS", bucket_if_written("checkpoints")),
        ("TPU_PLATFORM_MODELS", bucket_if_written("models")),
        ("TPU_PLATFORM_SELF_SERVICE", "1" if vm.self_service else "0"),
        ("TPU_PLATFORM_GRACE_SECONDS", str(GRACE_SECONDS)),
        ("TPU_PLATFORM_MAX_RETRIES", str(MAX_RETRIES)),
        # The runtime's environment (infra/catalog) is the unit's; the agent passes these names on.
        ("TPU_PLATFORM_RUNTIME_ENV", ",".join(name for name, _ in environment)),
    )


def startup_spec(cfg: PlatformConfig, vm: TpuVmSettings) -> StartupSpec:
    workload = cfg.workload(vm.workload)
    catalog = load_catalog()
    environment = catalog.runtime_environment(vm.runtime_version, vm.name)
    framework, version = workload.framework, workload.framework_version
    agent, wheelhouse = agent_package(), agent_wheelhouse()
    artifacts = cfg.bucket_name(naming.ARTIFACTS)
    return StartupSpec(
        stack=cfg.stack,
        vm=vm.name,
        workload=workload.name,
        agent=Artifact(artifacts, agent.object_name, agent.sha256),
        agent_environment=Artifact(artifacts, wheelhouse.object_name, wheelhouse.sha256),
        agent_pythons=catalog.agent_pythons,
        settings=agent_settings(cfg, vm, environment),
        framework=framework,
        framework_version=version if framework else "",
        environment=environment,
        constraints=catalog.install_constraints(framework, version) if framework else (),
        min_python=(catalog.min_python(framework, version) or "") if framework else "",
        install_problem=(catalog.install_problem(framework, version) or "") if framework else "",
        framework_lock=framework_lock(framework, version) if framework else "",
        grace_seconds=GRACE_SECONDS,
    )


def render_metadata(spec: StartupSpec, run: Mapping[str, Any] | None = None) -> dict[str, str]:
    return {
        "startup-script": render_startup_script(spec),
        ENV_ATTRIBUTE: render_env(spec),
        **({RUN_ATTRIBUTE: render_run_spec(run)} if run is not None else {}),
        # Log in with IAM identities (OS Login), never with keys pasted into metadata.
        "enable-oslogin": "TRUE",
        "block-project-ssh-keys": "TRUE",
    }


def vm_metadata(cfg: PlatformConfig, digests: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Metadata per TPU VM name; raises ConfigError when GCP would refuse one. `digests`: the folder
    sources' archive hashes when already packaged (source_digests)."""
    problems = Problems()
    out: dict[str, dict[str, str]] = {}
    digests = source_digests(cfg) if digests is None else digests
    for index, vm in enumerate(cfg.tpu_vms):
        metadata = render_metadata(startup_spec(cfg, vm), run_spec(cfg, vm, digests))
        if why := metadata_size_problem(metadata):
            problems.add(
                f"{item_key(f'{PROJECT}:tpuVms', cfg.tpu_vms, index)}.workload",
                vm.workload,
                f"{why}; ship a smaller program",
            )
        out[vm.name] = metadata
    problems.raise_if_any(cfg.stack)
    return out
