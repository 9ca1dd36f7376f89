"""The start-up script renderer, without Pulumi: deterministic, size-guarded, and clean under shellcheck."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import parse_stack_config
from infra.programs import Program
from infra.schema import ConfigError
from infra.startup import (
    COORDINATOR_PORT,
    EXIT_CONFIG,
    MAX_METADATA_VALUE_BYTES,
    StartupSpec,
    metadata_size_problem,
    render_env,
    render_startup_script,
)
from infra.tpu.metadata import startup_spec, vm_metadata
from tests.support import stack_config, with_object

ROOT = Path(__file__).resolve().parents[1]
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))


def spec(stack: str = "dev") -> StartupSpec:
    cfg = parse_stack_config(stack, stack_config(stack))
    return startup_spec(cfg, cfg.tpu_vms[0])


def test_rendering_is_deterministic():
    assert render_startup_script(spec()) == render_startup_script(spec())


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_rendered_script_passes_shellcheck(stack, tmp_path):
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script(spec(stack)))
    done = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_installs_the_version_pinned_for_the_runtime_only_when_missing():
    dev, prod = render_startup_script(spec("dev")), render_startup_script(spec("prod"))
    assert "readonly FRAMEWORK_VERSION=2.14.1" in dev and "readonly FRAMEWORK_VERSION=2.15.0" in prod
    # The install is guarded by a version check, so an image that has it installs nothing.
    assert 'if [[ "${installed}" == "${FRAMEWORK_VERSION}" ]]; then' in dev
    # tensorflow-tpu is on the package index only from 2.16.1: before, a missing TF is a FATAL, no pip.
    assert "tensorflow-tpu" not in dev.split("ensure_packages() {")[1].split("}")[0].replace(
        "tensorflow-tpu 2.14.1 is not on the package index", ""
    )
    assert 'fatal "tensorflow ${FRAMEWORK_VERSION} is not installed' in dev
    newer = render_startup_script(tf_spec("2.16.1", "tpu-vm-tf-2.16.1-pjrt"))
    assert "'tensorflow-tpu==2.16.1'" in newer and "is not installed (found" not in newer


def tf_spec(version: str, runtime: str, accelerator: str | None = None) -> StartupSpec:
    raw = with_object(stack_config(), "workloads", lambda w: w["mnist"].update(frameworkVersion=version))
    pod = {"acceleratorType": accelerator, "zone": "us-central1-a", "onCompletion": "delete"} if accelerator else {}
    raw = with_object(raw, "tpuVms", lambda v: (v[0].update(runtimeVersion=runtime, **pod), v[0].pop("schedule", None)))
    cfg = parse_stack_config("dev", raw)
    return startup_spec(cfg, cfg.tpu_vms[0])


def unit_of(script: str) -> str:
    return script.split("<<'TPU_PLATFORM_UNIT'\n")[1].split("TPU_PLATFORM_UNIT\n")[0]


def test_each_tensorflow_runtime_gets_its_environment_in_the_unit():
    """As Google's TPU test harness exports it (ml-auto-solutions, export_env_variables)."""
    pjrt = unit_of(render_startup_script(spec("prod")))  # tpu-vm-tf-2.15.0-pjrt, single host
    assert "Environment=NEXT_PLUGGABLE_DEVICE_USE_C_API=true\n" in pjrt
    assert "Environment=TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so\n" in pjrt
    assert "TPU_NAME" not in pjrt and "TPU_LOAD_LIBRARY" not in pjrt
    pod = unit_of(render_startup_script(tf_spec("2.15.0", "tpu-vm-tf-2.15.0-pod-pjrt", "v2-32")))
    assert "Environment=TPU_NAME=mnist-v2-spot\n" in pod and "Environment=TPU_LOAD_LIBRARY=0\n" in pod
    assert "NEXT_PLUGGABLE_DEVICE_USE_C_API" not in pod
    se = unit_of(render_startup_script(spec("dev")))  # tpu-vm-tf-2.14.1: stream executor
    assert "Environment=" not in se


def test_the_unit_never_restarts_a_configuration_error_and_gives_up_on_a_crash_loop():
    unit = unit_of(render_startup_script(spec()))
    assert "Restart=on-failure\n" in unit and f"RestartPreventExitStatus={EXIT_CONFIG} 3\n" in unit
    assert "StartLimitIntervalSec=3600\n" in unit and "StartLimitBurst=5\n" in unit


def test_extras_keep_protobuf_below_5_next_to_tensorflow_before_2_18():
    assert """pip install --quiet "${extra#*=}" 'protobuf<5'""" in render_startup_script(spec("prod"))
    newer = render_startup_script(tf_spec("2.18.0", "tpu-vm-tf-2.18.0-pjrt"))
    assert "protobuf<5" not in newer


def boot_with(
    script: str, python_shim: str, tmp_path: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the start-up script against a stand-in for the image's python3; systemctl only records."""
    shims = tmp_path / "shims"
    shims.mkdir(parents=True)
    (shims / "python3").write_text(python_shim)
    (shims / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl\n')
    (shims / "pip-called").write_text("")
    for shim in ("python3", "systemctl"):
        (shims / shim).chmod(0o755)
    env = {**os.environ, "TPU_PLATFORM_ROOT": str(tmp_path / "root"), "TPU_PLATFORM_PYTHON": str(shims / "python3"),
           "PATH": f"{shims}:{os.environ['PATH']}", "GCE_METADATA_HOST": "127.0.0.1:9",
           **(extra_env or {})}  # fmt: skip
    path = tmp_path / "startup.sh"
    path.write_text(script)
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60), tmp_path


# An image whose python3 is 3.10 and has no TensorFlow, JAX or pip to install them.
OLD_IMAGE = """#!/bin/bash
case "$*" in
  *version_info*) exit 1 ;;
  -V) echo "Python 3.10.12" ;;
  *"-m pip"*) echo pip >> "$(dirname "$0")/pip-called"; exit 1 ;;
  *) exit 1 ;;
esac
"""


def test_an_image_too_old_for_the_framework_fails_once_and_starts_nothing(tmp_path):
    jax = {"program": "jax_mnist", "frameworkVersion": "0.10.2"}
    raw = with_object(stack_config(), "workloads", lambda w: w["mnist"].update(jax))
    raw = with_object(raw, "tpuVms", lambda v: v[0].update(acceleratorType="v5litepod-4", zone="us-central1-a",
                                                           runtimeVersion="v2-alpha-tpuv5-lite"))  # fmt: skip
    cfg = parse_stack_config("dev", raw)  # the image's Python is not documented: the plan cannot refuse it
    done, folder = boot_with(render_startup_script(startup_spec(cfg, cfg.tpu_vms[0])), OLD_IMAGE, tmp_path)
    assert done.returncode == EXIT_CONFIG
    fatal = [line for line in done.stderr.splitlines() if "FATAL" in line]
    assert fatal == [
        "tpu-platform: FATAL: jax 0.10.2 needs Python 3.11 or newer; this image has Python 3.10.12; "
        "not starting tpu-workload-mnist.service. Fix the stack (see the plan's catalog checks)."
    ]
    assert not (folder / "systemctl").exists() and (folder / "shims" / "pip-called").read_text() == ""


def test_a_tensorflow_the_image_lacks_and_pip_cannot_supply_fails_once(tmp_path):
    done, folder = boot_with(
        render_startup_script(spec("prod")), OLD_IMAGE.replace("exit 1 ;;\n  -V", "exit 0 ;;\n  -V"), tmp_path
    )
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert (
        "FATAL: tensorflow 2.15.0 is not installed (found: none): tensorflow-tpu 2.15.0 is not on the package index"
        in done.stderr
    )
    assert not (folder / "systemctl").exists() and (folder / "shims" / "pip-called").read_text() == ""


def test_runs_under_systemd_with_settings_from_metadata():
    script = render_startup_script(spec())
    assert "Restart=on-failure" in script and "StandardOutput=journal" in script
    assert 'systemctl start "${UNIT}"' in script
    assert "--data ${TPU_PLATFORM_DATA} --epochs ${TPU_PLATFORM_EPOCHS}" in script
    assert 'metadata "instance/attributes/tpu-platform-env"' in script
    env = render_env(spec())
    assert "TPU_PLATFORM_MODEL_DIR=gs://acme-ml-sandbox-dev-models/mnist/mnist-v2-spot/r1\n" in env
    assert "TPU_PLATFORM_CHECKPOINT_DIR=gs://acme-ml-sandbox-dev-checkpoints/mnist/mnist-v2-spot/r1\n" in env


def test_ships_the_program_and_its_support_files():
    script = render_startup_script(spec())
    for name in ("tf_mnist.py", "runlib.py"):
        assert (ROOT / "workloads" / name).read_text() in script
    assert "google.cloud.storage=google-cloud-storage==3.17.1" in script


def test_a_finished_run_is_not_started_again():
    script = render_startup_script(spec())
    finished = script.index("if run_finished; then")
    assert finished < script.index('systemctl start "${UNIT}"')
    assert '"$runlib" status --checkpoint-dir' in script  # with the env file: the status dir too
    assert 'runlib.py" announce' in script  # and the guard is told again


def test_unsafe_settings_are_refused():
    bad = dataclasses.replace(spec(), settings=(("TPU_PLATFORM_DATA", "--data", "gs://x; rm -rf /"),))
    with pytest.raises(ValueError, match="unsafe setting"):
        render_startup_script(bad)


def test_a_program_cannot_end_the_here_document():
    bad = dataclasses.replace(spec(), files=(("main.py", "print(1)\nTPU_PLATFORM_PROGRAM\n"),))
    with pytest.raises(ValueError, match="ends the here-document"):
        render_startup_script(bad)


def test_metadata_size_limits():
    assert metadata_size_problem({"startup-script": "x" * MAX_METADATA_VALUE_BYTES}) is None
    assert "per value" in (metadata_size_problem({"startup-script": "x" * (MAX_METADATA_VALUE_BYTES + 1)}) or "")
    many = {f"k{i}": "x" * 200_000 for i in range(3)}
    assert "per VM" in (metadata_size_problem(many) or "")


def test_oversized_workload_is_a_config_error(monkeypatch):
    monkeypatch.setattr(Program, "source", lambda self: "# padding\n" * 30_000)
    cfg = parse_stack_config("dev", stack_config())
    with pytest.raises(ConfigError) as caught:
        vm_metadata(cfg)
    message = str(caught.value)
    assert "tpu-platform:tpuVms[0].workload = 'mnist': metadata 'startup-script' is 3" in message
    assert "GCP allows 262,144 per value" in message


def test_oversized_workload_registers_nothing(monkeypatch):
    from tools.offline.mocks import GcpMocks, RecordingMonitor
    from tools.offline.runner import run_program

    monkeypatch.setattr(Program, "source", lambda self: "# padding\n" * 30_000)
    monitor = RecordingMonitor(GcpMocks("acme-ml-sandbox"))
    with pytest.raises(Exception, match="GCP allows 262,144 per value"):
        run_program("dev", stack_config(), monitor=monitor)
    assert monitor.registrations == []


# An image that has the pinned framework and everything else: the script gets as far as starting the unit.
READY_IMAGE = """#!/bin/bash
case "$*" in
  *__version__*) echo {version} ;;
esac
"""


def slice_env(
    tmp_path: Path, attributes: dict[str, str], port: str = "", of: StartupSpec | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """Boot the dev script against a metadata server on loopback; the unit's environment file it wrote."""
    from tests.sandbox import metadata_server

    of = of or spec()
    script = render_startup_script(of)
    with metadata_server({"tpu-platform-env": render_env(of), **attributes}) as host:
        extra = {"GCE_METADATA_HOST": host, **({"TPU_PLATFORM_COORDINATOR_PORT": port} if port else {})}
        done, folder = boot_with(script, READY_IMAGE.format(version=of.framework_version), tmp_path, extra)
    env_file = folder / "root/etc/tpu-platform/mnist.env"
    lines = env_file.read_text().splitlines() if env_file.exists() else []
    return done, dict(line.split("=", 1) for line in lines)


def test_each_worker_of_a_slice_gets_its_id_the_worker_count_and_worker_0_as_coordinator(tmp_path):
    # Both formats of worker-network-endpoints, as jax/_src/clusters/cloud_tpu_cluster.py reads them.
    endpoints = "t1k-w-0:0:10.130.0.5,t1k-w-1:1:10.130.0.6,t1k-w-2:2:10.130.0.7,t1k-w-3:3:10.130.0.8"
    done, env = slice_env(tmp_path / "a", {"agent-worker-number": "2", "worker-network-endpoints": endpoints})
    assert done.returncode == 0, done.stderr
    assert env["TPU_PLATFORM_WORKER_ID"] == env["TPU_WORKER_ID"] == "2"
    assert env["TPU_PLATFORM_WORKER_COUNT"] == "4"
    assert env["TPU_PLATFORM_COORDINATOR"] == f"10.130.0.5:{COORDINATOR_PORT}" == "10.130.0.5:8482"
    assert env["TPU_PLATFORM_RUN_ID"] == "dev/mnist/mnist-v2-spot/r1"  # the run's settings are still there
    _, env = slice_env(tmp_path / "b", {"agent-worker-number": "1", "worker-network-endpoints": "w-0,w-1"}, "9000")
    assert (env["TPU_PLATFORM_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"]) == ("1", "2")
    assert env["TPU_PLATFORM_COORDINATOR"] == "w-0:9000"


def test_a_tensorflow_pod_worker_knows_its_number_and_its_unit_names_the_pod(tmp_path):
    """TF pods are driven from worker 0 (TPU_NAME in the unit); tf_mnist on any other worker exits at
    once by TPU_WORKER_ID. A TF pod cannot run on a CPU: this checks what the script renders and writes."""
    pod = tf_spec("2.15.0", "tpu-vm-tf-2.15.0-pod-pjrt", "v2-32")  # 4 hosts
    endpoints = ",".join(f"w-{i}:{i}:10.0.0.{i + 2}" for i in range(4))
    done, env = slice_env(tmp_path, {"agent-worker-number": "3", "worker-network-endpoints": endpoints}, of=pod)
    assert done.returncode == 0, done.stderr
    assert (env["TPU_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"]) == ("3", "4")
    unit = (tmp_path / "root/etc/systemd/system/tpu-workload-mnist.service").read_text()
    assert "Environment=TPU_NAME=mnist-v2-spot\n" in unit
    assert (
        'process = int(os.environ.get("TPU_WORKER_ID", "0"))' in (ROOT / "workloads/tf_mnist/tf_mnist.py").read_text()
    )


def test_a_single_host_vm_is_one_worker_without_a_coordinator(tmp_path):
    done, env = slice_env(tmp_path, {"agent-worker-number": "0"})
    assert done.returncode == 0, done.stderr
    assert (env["TPU_PLATFORM_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"], env["TPU_PLATFORM_COORDINATOR"]) == (
        "0", "1", ""
    )  # fmt: skip


def test_a_worker_number_outside_its_slice_is_a_configuration_error(tmp_path):
    done, _ = slice_env(tmp_path, {"agent-worker-number": "2", "worker-network-endpoints": "w-0,w-1"})
    assert done.returncode == EXIT_CONFIG
    assert "agent-worker-number '2' is not a worker of this 2-worker slice" in done.stderr
    assert not (tmp_path / "systemctl").exists()
