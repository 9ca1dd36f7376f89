"""Each TPU VM's metadata: its start-up script, run settings and access settings, size-checked.

Computed for every VM before any resource is declared, so an oversized or unrenderable workload
fails the plan with a config error and nothing registered.
"""

from __future__ import annotations

from infra import naming
from infra.catalog import load_catalog
from infra.config import PROJECT, PlatformConfig, TpuVmSettings
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


def render_metadata(spec: StartupSpec) -> dict[str, str]:
    return {
        "startup-script": render_startup_script(spec),
        ENV_ATTRIBUTE: render_env(spec),
        # Log in with IAM identities (OS Login), never with keys pasted into metadata.
        "enable-oslogin": "TRUE",
        "block-project-ssh-keys": "TRUE",
    }


def vm_metadata(cfg: PlatformConfig) -> dict[str, dict[str, str]]:
    """Metadata per TPU VM name; raises ConfigError when GCP would refuse one."""
    problems = Problems()
    out: dict[str, dict[str, str]] = {}
    for index, vm in enumerate(cfg.tpu_vms):
        metadata = render_metadata(startup_spec(cfg, vm))
        if why := metadata_size_problem(metadata):
            problems.add(f"{PROJECT}:tpuVms[{index}].workload", vm.workload, f"{why}; ship a smaller program")
        out[vm.name] = metadata
    problems.raise_if_any(cfg.stack)
    return out
