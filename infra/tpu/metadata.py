"""Each TPU VM's metadata: its rendered start-up script plus the access settings, size-checked.

Computed for every VM before any resource is declared, so an oversized or unrenderable workload
fails the plan with a config error and nothing registered.
"""

from __future__ import annotations

from infra.config import PROJECT, PlatformConfig, TpuVmSettings
from infra.programs import PROGRAMS
from infra.schema import Problems
from infra.startup import StartupSpec, metadata_size_problem, render_startup_script


def startup_spec(cfg: PlatformConfig, vm: TpuVmSettings) -> StartupSpec:
    workload = cfg.workload(vm.workload)
    program = PROGRAMS[workload.program]
    run = f"{workload.name}/{vm.name}"
    settings = [
        (
            "TPU_PLATFORM_DATA",
            "--data",
            f"gs://{cfg.bucket_name('data')}/{workload.data_object}" if workload.data_object else "",
        ),
        ("TPU_PLATFORM_EPOCHS", "--epochs", str(workload.epochs)),
        ("TPU_PLATFORM_BATCH_SIZE", "--batch-size", str(workload.batch_size)),
    ]
    if workload.access("checkpoints") == "write":
        settings.append(
            ("TPU_PLATFORM_CHECKPOINT_DIR", "--checkpoint-dir", f"gs://{cfg.bucket_name('checkpoints')}/{run}")
        )
    if workload.access("models") == "write":
        settings.append(("TPU_PLATFORM_MODEL_DIR", "--model-dir", f"gs://{cfg.bucket_name('models')}/{run}"))
    return StartupSpec(
        stack=cfg.stack,
        vm=vm.name,
        workload=workload.name,
        program_filename=program.filename,
        program_source=program.source(),
        framework=program.framework,
        framework_version=workload.framework_version,
        settings=tuple(settings),
    )


def vm_metadata(cfg: PlatformConfig) -> dict[str, dict[str, str]]:
    """Metadata per TPU VM name; raises ConfigError when GCP would refuse one."""
    problems = Problems()
    out: dict[str, dict[str, str]] = {}
    for index, vm in enumerate(cfg.tpu_vms):
        metadata = {
            "startup-script": render_startup_script(startup_spec(cfg, vm)),
            # Log in with IAM identities (OS Login), never with keys pasted into metadata.
            "enable-oslogin": "TRUE",
            "block-project-ssh-keys": "TRUE",
        }
        if why := metadata_size_problem(metadata):
            problems.add(f"{PROJECT}:tpuVms[{index}].workload", vm.workload, f"{why}; ship a smaller program")
        out[vm.name] = metadata
    problems.raise_if_any(cfg.stack)
    return out
