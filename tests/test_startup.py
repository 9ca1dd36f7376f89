"""The start-up script renderer, without Pulumi: deterministic, size-guarded, and clean under shellcheck."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import parse_stack_config
from infra.programs import Program
from infra.schema import ConfigError
from infra.startup import (
    MAX_METADATA_VALUE_BYTES,
    StartupSpec,
    metadata_size_problem,
    render_env,
    render_startup_script,
)
from infra.tpu.metadata import startup_spec, vm_metadata
from tests.support import stack_config

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
    assert "readonly FRAMEWORK_VERSION=2.14.1" in dev and "'tensorflow-tpu==2.14.1'" in dev
    assert "readonly FRAMEWORK_VERSION=2.15.0" in prod and "'tensorflow-tpu==2.15.0'" in prod
    # The install is guarded by a version check, so an image that has it installs nothing.
    assert 'if [[ "${installed}" == "${FRAMEWORK_VERSION}" ]]; then' in dev


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
    assert 'runlib.py" status --checkpoint-dir' in script


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
    from infra.offline.mocks import GcpMocks, RecordingMonitor
    from infra.offline.runner import run_program

    monkeypatch.setattr(Program, "source", lambda self: "# padding\n" * 30_000)
    monitor = RecordingMonitor(GcpMocks("acme-ml-sandbox"))
    with pytest.raises(Exception, match="GCP allows 262,144 per value"):
        run_program("dev", stack_config(), monitor=monitor)
    assert monitor.registrations == []
