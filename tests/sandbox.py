"""A sandbox for the real start-up script: a GCS emulator and a GCE metadata server on loopback (the
server is tools/standins/metadata.py).

Shimmed, because it cannot exist here: `systemctl` (no systemd in a test; the shim starts the unit's
ExecStart with its EnvironmentFile, detached, like `systemctl start`) and `python3` (the workloads'
virtualenv stands in for the VM image's Python). Everything else is real: the rendered script, curl
against the metadata server, the program files it writes, the workload, and google-cloud-storage
against the emulator.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from google.cloud import storage as storage_client

from infra.packaging import agent_wheelhouse
from tests.iam_standins import StsStandIn, serve, sts_handler
from tests.workloads import workloads_python
from tools.standins.metadata import SANDBOX_TOKEN
from tools.standins.storage import storage_emulator  # noqa: F401 (its importers find it here too)

SYSTEMCTL_SHIM = '''#!{python}
"""systemctl for the sandbox: daemon-reload is a no-op; start runs ExecStartPre (a failure fails the
start, as systemd's) then ExecStart detached, once, with the unit's EnvironmentFile and Environment= lines."""
import os, re, shlex, subprocess, sys
from pathlib import Path

state = Path(os.environ["SANDBOX_STATE"])
command, *rest = sys.argv[1:]
if command != "start":
    sys.exit(0)
unit = rest[0]
pid_file = state / (unit + ".pid")
if pid_file.exists():
    try:
        # Running, not a zombie left unreaped after it exited: like systemd, start is then a no-op.
        if Path(f"/proc/{{pid_file.read_text()}}/stat").read_text().split(") ")[-1][0] != "Z":
            sys.exit(0)
    except OSError:
        pass
text = (Path(os.environ.get("TPU_PLATFORM_ROOT", "")) / "etc/systemd/system" / unit).read_text()
fields = dict(re.findall(r"^(\\w+)=(.*)$", text, re.M))
env = dict(os.environ)
for key, value in re.findall(r"^Environment=(\\w+)=(.*)$", text, re.M):
    env[key] = value
for line in Path(fields["EnvironmentFile"]).read_text().splitlines():  # as systemd: the file wins
    if "=" in line:
        key, value = line.split("=", 1)
        env[key] = value
argv = [re.sub(r"\\$\\{{(\\w+)\\}}", lambda m: env.get(m[1], ""), word) for word in fields["ExecStart"].split()]
with open(state / (unit + ".log"), "ab") as log:
    for pre in re.findall(r"^ExecStartPre=(.*)$", text, re.M):
        if subprocess.run(shlex.split(pre), stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
            sys.exit(1)
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
pid_file.write_text(str(process.pid))
with open(state / "starts", "a") as starts:
    starts.write(unit + "\\n")
'''


# The image's Python: Debian's own interpreter (/usr/bin/python3, the minor version the workloads'
# virtualenv was made with) seeing the workloads' packages (TensorFlow, JAX) as its "system" packages. Not
# the virtualenv's own interpreter: that lives under root's home (pyenv), which a run's unprivileged uid
# cannot reach, as a TPU image's /usr/bin/python3 can be. A virtualenv made from it with
# --system-site-packages (the agent's, for a folder source) gets a .pth file with the same packages.
PYTHON3_SHIM = """#!/bin/bash
export PYTHONPATH="{site}${{PYTHONPATH:+:${{PYTHONPATH}}}}"
if [[ "${{1:-}} ${{2:-}}" == "-m venv" ]]; then
  "{python}" "$@" || exit
  venv="${{@: -1}}"
  for inner in "$venv"/lib/python3*/site-packages; do echo "{site}" > "$inner/sandbox-image-python.pth"; done
  exit 0
fi
exec "{python}" "$@"
"""
IMAGE_PYTHON = "/usr/bin/python3"


@functools.cache
def image_python_shim() -> str:
    """PYTHON3_SHIM for this machine: the workloads' packages under the system's interpreter."""
    query = "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print(sys.version_info[:2])"
    site, version = subprocess.run(
        [workloads_python(), "-c", query], capture_output=True, text=True, check=True
    ).stdout.split("\n")[:2]
    own = subprocess.run(
        [IMAGE_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if own != version:
        raise RuntimeError(
            f"{IMAGE_PYTHON} is Python {own}, the workloads' virtualenv {version}: make it from "
            f"{IMAGE_PYTHON} (PYTHON={IMAGE_PYTHON} make .venv-workloads/.installed)"
        )
    return PYTHON3_SHIM.format(python=IMAGE_PYTHON, site=site)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


@functools.cache
def sandbox_sts() -> tuple[StsStandIn, str]:
    """The STS stand-in every sandboxed VM's agent exchanges the VM's token with (one per test process:
    the storage emulator enforces no IAM, so a downscoped token only has to be issued, by the rules)."""
    sts = StsStandIn(frozenset({SANDBOX_TOKEN}))
    _, url = serve(sts_handler(sts))
    return sts, url


class Vm:
    """One sandboxed TPU VM worker: a root folder, shims on PATH, and a way to boot it."""

    def __init__(self, folder: Path, metadata_host: str, emulator_host: str, agent_env: bool = True):
        """`agent_env`: the VM holds its agent's environment from an earlier boot (a copy of one installed
        once per test process), which its boots check file by file and keep; without, its first boot
        installs it (pip, several seconds)."""
        self.root = folder / "root"
        self.state = folder / "state"
        self.shims = folder / "shims"
        for path in (self.root, self.state, self.shims):
            path.mkdir(parents=True, exist_ok=True)
        if agent_env:
            installed = installed_agent_env()
            kept = self.root / "opt/tpu-platform/agent-env" / installed.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(installed, kept, symlinks=True)
        systemctl = self.shims / "systemctl"
        systemctl.write_text(SYSTEMCTL_SHIM.format(python=sys.executable))
        systemctl.chmod(0o755)
        # A wrapper, not a symlink: a virtualenv's Python finds its packages from the path it was run as.
        python3 = self.shims / "python3"
        python3.write_text(image_python_shim())
        python3.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{self.shims}:{os.environ['PATH']}",
            "TPU_PLATFORM_ROOT": str(self.root),
            "TPU_PLATFORM_PYTHON": str(python3),
            "GCE_METADATA_HOST": metadata_host,
            "STORAGE_EMULATOR_HOST": emulator_host,
            "SANDBOX_STATE": str(self.state),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "CUDA_VISIBLE_DEVICES": "",
            # The machine's firewall is shared: the redirect is tested in a namespace of its own
            # (tests/test_vm_agent_isolation.py).
            "TPU_PLATFORM_METADATA_REDIRECT": "0",
            # A run's token comes from STS, exchanged for the VM's: a stand-in that checks each exchange.
            "TPU_PLATFORM_STS_URL": f"{sandbox_sts()[1]}/v1/token",
        }

    booted: ClassVar[list[Vm]] = []  # every VM a test booted: stopped after the test (conftest.py)

    @classmethod
    def shut_down_all(cls) -> None:
        """Stop what the booted VMs still run (an agent waits on its metadata forever), as a VM's
        shutdown does: SIGTERM, then SIGKILL. A leftover agent would poll a loopback port that a later
        test's server may reuse."""
        pids = [pid for vm in cls.booted for f in vm.state.glob("*.pid") if (pid := int(f.read_text()))]
        cls.booted.clear()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.killpg(pid, sig)  # the shim starts each unit in its own session
            deadline = time.monotonic() + 15
            while sig == signal.SIGTERM and time.monotonic() < deadline and any(_running(p) for p in pids):
                time.sleep(0.1)

    def boot(self, script: str) -> subprocess.CompletedProcess[str]:
        Vm.booted.append(self)
        """Run the start-up script as a VM boot does (as root there; as this user here)."""
        path = self.state / "startup-script"
        path.write_text(script)
        self.pid_file("").parent.mkdir(exist_ok=True)
        # Outside the repository, as a VM is: nothing may be imported from the checkout by accident.
        return subprocess.run(
            ["bash", str(path)], env=self.env, capture_output=True, text=True, timeout=300, cwd=self.state
        )

    def pid_file(self, unit: str) -> Path:
        return self.state / f"{unit}.pid"

    def pid(self, unit: str) -> int | None:
        path = self.pid_file(unit)
        return int(path.read_text()) if path.exists() else None

    def alive(self, unit: str) -> bool:
        pid = self.pid(unit)
        if pid is None:
            return False
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return False
        except ChildProcessError:
            pass  # not our child: the shim spawned it
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        # A zombie still answers kill(0); its state says it is done.
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"
        return True

    def log(self, unit: str) -> str:
        path = self.state / f"{unit}.log"
        return path.read_text() if path.exists() else ""

    def starts(self) -> int:
        path = self.state / "starts"
        return len(path.read_text().splitlines()) if path.exists() else 0


def deployed_stack(folders: tuple[str, ...], prefix: str = "acme-ml-sandbox-dev") -> storage_client.Client:
    """The dev stack's buckets on the running emulator (STORAGE_EMULATOR_HOST), with what `pulumi up`
    uploads to the artifacts bucket (infra/artifacts.py): the agent and these folders, by content."""
    from infra.packaging import repository_folder
    from infra.tpu.metadata import agent_package

    client = storage_client.Client()
    for purpose in ("data", "checkpoints", "models", "status", "artifacts"):
        client.create_bucket(f"{prefix}-{purpose}")
    artifacts = client.bucket(f"{prefix}-artifacts")
    for archive in (agent_package(), *(repository_folder(folder) for folder in folders)):
        artifacts.blob(archive.object_name).upload_from_string(archive.data)
    artifacts.blob(agent_wheelhouse().object_name).upload_from_filename(str(agent_wheelhouse_file()))
    return client


@functools.cache
def installed_agent_env() -> Path:
    """The agent's environment as a VM's first boot installs it with the image's Python (vm_agent/environment.py),
    once per test process."""
    sha256 = agent_wheelhouse().sha256
    env = Path(tempfile.mkdtemp(prefix="agent-env-")) / sha256
    atexit.register(shutil.rmtree, env.parent, True)
    done = subprocess.run(
        [IMAGE_PYTHON, "-m", "vm_agent.environment", str(agent_wheelhouse_file()), str(env), sha256],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return env


def agent_wheelhouse_file() -> Path:
    """The agent's wheelhouse the plan names (requirements-agent.wheelhouse), as `make agent-wheelhouse` built
    it: what `pulumi up` uploads, and what a sandboxed VM installs its agent's environment from."""
    path = agent_wheelhouse().built
    assert path is not None
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: build the agent's wheelhouse with `make agent-wheelhouse`")
    return path
