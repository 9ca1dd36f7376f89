"""Each TPU VM's metadata: its start-up script, run settings and access settings, size-checked.

Computed for every VM before any resource is declared, so an oversized or unrenderable workload
fails the plan with a config error and nothing registered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra import naming
from infra.catalog import load_catalog
from infra.config import PROJECT, PlatformConfig, TpuVmSettings
from infra.config.sources import REPO_ROOT
from infra.packaging import PackagingError, package
from infra.programs import PROGRAMS
from infra.schema import Problems
from infra.startup import ENV_ATTRIBUTE, StartupSpec, metadata_size_problem, render_env, render_startup_script


def run_prefix(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    """Where one run of a VM keeps its checkpoints and model: a new `run` id starts afresh."""
    workload = cfg.workload(vm.workload)
    return f"{workload.name}/{vm.name}/{workload.run}"


def run_id(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    """The id a run records in its completion marker (`TPU_PLATFORM_RUN_ID`)."""
    return f"{cfg.stack}/{run_prefix(cfg, vm)}"


# The run the VM agent starts (docs/design-runs.md, "A run spec"): a change of it (run id, command, a
# source's digest, settings) is a change of metadata only, which the agent sees with wait_for_change.
RUN_ATTRIBUTE = "tpu-platform-run"


def source_digests(cfg: PlatformConfig) -> dict[str, str]:
    """sha256 of each folder source's archive (infra/packaging.py), by folder."""
    problems = Problems()
    out: dict[str, str] = {}
    for workload in cfg.workloads:
        folder = workload.source.folder
        if workload.source.kind != "folder" or not folder or folder in out:
            continue
        try:
            out[folder] = package(REPO_ROOT.joinpath(*folder.split("/"))).sha256
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
        uri = f"gs://{cfg.bucket_name('artifacts')}/{naming.source_object(sha256)}"
        source = {"kind": "folder", "uri": uri, "sha256": sha256}
    spec: dict[str, Any] = {
        "runId": run_id(cfg, vm),
        "source": source,
        "command": list(workload.command),
        "env": dict(workload.env),
        "requester": "stack",
        "data": f"gs://{cfg.bucket_name('data')}/{workload.data_object}" if workload.data_object else "",
        "checkpointDir": f"gs://{cfg.bucket_name('checkpoints')}/{run}" if workload.access("checkpoints") == "write"
        else "",
        "modelDir": f"gs://{cfg.bucket_name('models')}/{run}" if workload.access("models") == "write" else "",
        "completion": True,
    }  # fmt: skip
    if workload.python and workload.source.kind == "folder":
        spec["python"] = workload.python
    return spec


def render_run_spec(spec: Mapping[str, Any]) -> str:
    """Canonical JSON: the same run is the same bytes, so an unchanged stack shows no metadata change."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def startup_spec(cfg: PlatformConfig, vm: TpuVmSettings) -> StartupSpec:
    workload = cfg.workload(vm.workload)
    program = PROGRAMS[workload.program]
    run = run_prefix(cfg, vm)
    data = f"gs://{cfg.bucket_name('data')}/{workload.data_object}" if workload.data_object else ""
    settings = [
        ("TPU_PLATFORM_DATA", "--data", data),
        ("TPU_PLATFORM_EPOCHS", "--epochs", str(workload.epochs)),
        ("TPU_PLATFORM_BATCH_SIZE", "--batch-size", str(workload.batch_size)),
        ("TPU_PLATFORM_RUN_ID", "--run-id", run_id(cfg, vm)),
        ("TPU_PLATFORM_CHECKPOINT_EVERY_STEPS", "--checkpoint-every-steps", str(workload.checkpoint_every_steps)),
        (
            "TPU_PLATFORM_CHECKPOINT_EVERY_MINUTES",
            "--checkpoint-every-minutes",
            f"{workload.checkpoint_every_minutes:g}",
        ),
    ]
    # Where the run says it is complete: the guard acts on `<status-dir>/COMPLETE` (infra/lifecycle.py).
    status_dir = f"gs://{cfg.bucket_name('status')}/{naming.status_prefix(vm.name).rstrip('/')}"
    settings += [("TPU_PLATFORM_STATUS_DIR", "--status-dir", status_dir)]
    if workload.access("checkpoints") == "write":
        settings.append(
            ("TPU_PLATFORM_CHECKPOINT_DIR", "--checkpoint-dir", f"gs://{cfg.bucket_name('checkpoints')}/{run}")
        )
    if workload.access("models") == "write":
        settings.append(("TPU_PLATFORM_MODEL_DIR", "--model-dir", f"gs://{cfg.bucket_name('models')}/{run}"))
    catalog = load_catalog()
    return StartupSpec(
        stack=cfg.stack,
        vm=vm.name,
        workload=workload.name,
        files=program.files(),
        framework=program.framework,
        framework_version=workload.framework_version,
        requirements=program.all_requirements,
        settings=tuple(settings),
        environment=catalog.runtime_environment(vm.runtime_version, vm.name),
        constraints=catalog.install_constraints(program.framework, workload.framework_version),
        min_python=catalog.min_python(program.framework, workload.framework_version) or "",
        install_problem=catalog.install_problem(program.framework, workload.framework_version) or "",
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
            problems.add(f"{PROJECT}:tpuVms[{index}].workload", vm.workload, f"{why}; ship a smaller program")
        out[vm.name] = metadata
    problems.raise_if_any(cfg.stack)
    return out
