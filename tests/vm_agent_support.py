"""What the VM agent's tests share: folder sources packed as the stack packs them, the trainer's one
requirement as a local wheel (no index offline: pip finds it through PIP_FIND_LINKS), and a `docker`
shim (no daemon here).

The docker shim checks what a run's container gets (vm_agent/runner.py container_argv): its own uid
(`--user`), no capability, `no-new-privileges`, the memlock limit, devices the run's uid owns, no
`--privileged`, the host's network only on a multi-host slice, the contract's `-e` variables; that the
VM logged in to the image's registry with its token before pulling, and that the image was pulled;
then it runs the image's command locally as that uid, in the image's folder, with only the `-e`
environment (as a container would), forwarding SIGTERM to it (`--sig-proxy`, docker's default).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from pathlib import Path

from tools.standins.metadata import SANDBOX_TOKEN

SOURCES = Path(__file__).resolve().parent / "agent_sources"
REPO = Path(__file__).resolve().parents[1]
REGISTRY = "us-central1-docker.pkg.dev/acme-ml-sandbox/workloads"
ARTIFACTS = "acme-ml-sandbox-dev-artifacts"
STATUS = "acme-ml-sandbox-dev-status"
CHECKPOINTS = "acme-ml-sandbox-dev-checkpoints"
MODELS = "acme-ml-sandbox-dev-models"
CONTRACT = (
    "TPU_PLATFORM_RUN_ID",
    "TPU_PLATFORM_DATA",
    "TPU_PLATFORM_CHECKPOINT_DIR",
    "TPU_PLATFORM_MODEL_DIR",
    "TPU_PLATFORM_STATUS_DIR",
    "TPU_PLATFORM_WORKER_ID",
    "TPU_PLATFORM_WORKER_COUNT",
    "TPU_PLATFORM_COORDINATOR",
    "TPU_PLATFORM_GRACE_SECONDS",
)


def build_wheel(target: Path) -> Path:
    """tinyckpt 0.1 as a pure-Python wheel (PEP 427: the package, METADATA, WHEEL, RECORD)."""
    target.mkdir(parents=True, exist_ok=True)
    wheel = target / "tinyckpt-0.1-py3-none-any.whl"
    info = "tinyckpt-0.1.dist-info"
    files = {
        "tinyckpt/__init__.py": (SOURCES / "tinyckpt" / "__init__.py").read_bytes(),
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: tinyckpt\nVersion: 0.1\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            # Fixed times and modes: the same bytes every time, so the trainer's lock can pin its hash.
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data)
    return wheel


@functools.cache
def wheelhouse() -> Path:
    """A folder holding the trainer's requirement (tinyckpt 0.1) as a wheel."""
    folder = Path(tempfile.mkdtemp(prefix="tpu-platform-wheels-"))
    build_wheel(folder)
    return folder


@functools.cache
def wheel_index() -> str:
    """The wheelhouse served on loopback, as find-links for pip and uv (PIP_FIND_LINKS, UV_FIND_LINKS): in
    place of the package index a real VM reaches, and reachable from a run's jail, which sees no folder
    of the machine's /tmp."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(wheelhouse())))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


def trainer_folder(tmp: Path) -> Path:
    """A copy of the trainer's source folder, ready to pack (its requirement comes from `wheelhouse`)."""
    folder = tmp / "trainer"
    shutil.copytree(SOURCES / "trainer", folder)
    return folder


def pack(folder: Path) -> tuple[bytes, str]:
    """A deterministic .tar.gz of a folder (sorted members, fixed mtime/owner/mode, gzip mtime 0) and its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            info = tarfile.TarInfo(str(path.relative_to(folder)))
            data = path.read_bytes()
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue(), mtime=0)
    return packed, hashlib.sha256(packed).hexdigest()


def image_folder(tmp: Path) -> Path:
    """What the test image holds: the trainer and its requirement, installed (importable from its folder)."""
    folder = tmp / "image"
    shutil.copytree(SOURCES / "trainer", folder)
    shutil.copytree(SOURCES / "tinyckpt", folder / "tinyckpt")
    return folder


DOCKER_SHIM = """#!{python}
import json, os, shutil, signal, subprocess, sys, tempfile
from pathlib import Path

state = Path(os.environ["DOCKER_SHIM_STATE"])
state.mkdir(parents=True, exist_ok=True)
images = json.loads(os.environ["DOCKER_SHIM_IMAGES"])
command, args = sys.argv[1], sys.argv[2:]
with open(state / "calls.jsonl", "a") as calls:
    calls.write(json.dumps([command] + args) + "\\n")


def fail(message, code=125):
    print("docker (shim): " + message, file=sys.stderr)
    sys.exit(code)


logins = state / "logins"
pulled = state / "pulled"
if command == "login":
    if args[:3] != ["-u", "oauth2accesstoken", "--password-stdin"] or len(args) != 4:
        fail("login: expected -u oauth2accesstoken --password-stdin https://HOST, got %r" % args)
    if sys.stdin.read().strip() != os.environ["DOCKER_SHIM_TOKEN"]:
        fail("login: not the VM's access token", 1)
    with open(logins, "a") as f:
        f.write(args[3].replace("https://", "") + "\\n")
elif command == "pull":
    image = args[0]
    if not logins.exists() or image.split("/")[0] not in logins.read_text().split():
        fail("pull %s: unauthenticated (no login to its registry)" % image, 1)
    if image not in images:
        fail("pull %s: manifest unknown" % image, 1)
    with open(pulled, "a") as f:
        f.write(image + "\\n")
elif command == "network":
    made = state / "networks"
    if args[0] == "inspect":
        sys.exit(0 if made.exists() and args[1] in made.read_text().split() else 1)
    expected = ["create", "--driver", "bridge", "--subnet", "172.31.254.0/24", "--gateway", "172.31.254.1",
                "-o", "com.docker.network.bridge.name=tpu-runs0", "tpu-platform-runs"]
    if args != expected:
        fail("network: expected %r, got %r" % (expected, args))
    with open(made, "a") as f:
        f.write(args[-1] + "\\n")
elif command == "kill":
    pid_file = state / (args[0] + ".pid")
    if pid_file.exists():
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
elif command == "run":
    flags, env, name, user, limits, devices, rest = set(), {{}}, "", "", [], [], list(args)
    network, address = "", ""
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag == "-e":  # NAME=value, or NAME: the value from the client's environment, if set
            key, equals, value = rest.pop(0).partition("=")
            if equals:
                env[key] = value
            elif key in os.environ:
                env[key] = os.environ[key]
        elif flag == "--name":
            name = rest.pop(0)
        elif flag == "--user":
            user = rest.pop(0)
        elif flag == "--ulimit":
            limits.append(rest.pop(0))
        elif flag == "--device":
            devices.append(rest.pop(0))
        elif flag == "--network":
            network = rest.pop(0)
        elif flag == "--ip":
            address = rest.pop(0)
        else:
            flags.add(flag)
    image, argv = rest[0], rest[1:]
    if "--privileged" in flags:
        fail("run: --privileged is host root; a run gets its devices with --device")
    hardening = ("--rm", "--cap-drop=ALL", "--security-opt=no-new-privileges")
    missing = [f for f in hardening if f not in flags]
    missing += [] if "memlock=-1:-1" in limits else ["--ulimit memlock=-1:-1"]
    if missing:
        fail("run: a run's container needs %s" % missing)
    many_hosts = int(env.get("TPU_PLATFORM_WORKER_COUNT", "1")) > 1
    if ("--net=host" in flags) != many_hosts:
        fail("run: --net=host is for a multi-host slice only (workers: %s)" % env.get("TPU_PLATFORM_WORKER_COUNT"))
    on_runs_network = network == "tpu-platform-runs" and address.startswith("172.31.254.")
    if not many_hosts and not on_runs_network:
        fail("run: one host's container goes on the runs' network at its own address, got %r %r" % (network, address))
    if not on_runs_network and network:
        fail("run: --network %r" % network)
    if on_runs_network and "tpu-platform-runs" not in (state / "networks").read_text().split():
        fail("run: network tpu-platform-runs was not created")
    unknown = sorted(flags - set(hardening) - {{"--net=host"}})
    if unknown:
        fail("run: unexpected flags %s" % unknown)
    uid, _, gid = user.partition(":")
    if not (uid.isdigit() and gid.isdigit() and int(uid) >= 1000 and int(gid) >= 1000):
        fail("run: --user UID:GID of the run's own unprivileged uid, got %r" % user)
    for device in devices:  # as docker does: the node as the host has it, so the run's uid must own it
        host = device.split(":")[0]
        if os.stat(host).st_uid != int(uid):
            fail("run: device %s is not the run's (owner %d)" % (host, os.stat(host).st_uid))
    lacking = [v for v in {contract!r} if v not in env]
    if lacking:
        fail("run: the contract's environment lacks %s" % lacking)
    if not pulled.exists() or image not in pulled.read_text().split():
        fail("run: %s was not pulled" % image)
    if not name:
        fail("run: no --name (the agent kills a container by name after the grace period)")
    env.update({{"PATH": "/usr/local/bin:/usr/bin:/bin"}})  # the image's own, not the host's
    # The image's files where the run's uid can read them (pytest's folders are root's alone), as in a container.
    files = tempfile.mkdtemp(prefix="docker-shim-")
    os.chmod(files, 0o755)
    shutil.copytree(images[image], files, dirs_exist_ok=True)
    as_user = ["setpriv", "--reuid", uid, "--regid", gid, "--clear-groups", "--no-new-privs", "--inh-caps=-all",
               "--bounding-set=-all"]  # no capability, as --cap-drop=ALL
    child = subprocess.Popen(as_user + argv, cwd=files, env=env, start_new_session=True)
    (state / (name + ".pid")).write_text(str(child.pid))
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    shutil.rmtree(files, ignore_errors=True)
    sys.exit(code)
else:
    fail("unsupported command " + command)
"""


def install_docker_shim(shims: Path) -> Path:
    shims.mkdir(parents=True, exist_ok=True)
    docker = shims / "docker"
    docker.write_text(DOCKER_SHIM.format(python=sys.executable, contract=CONTRACT))
    docker.chmod(0o755)
    return docker


def agent_environ(tmp: Path, metadata_host: str, emulator: str, **extra: str) -> dict[str, str]:
    """agent.env as the start-up script writes it, for a sandboxed VM under `tmp`."""
    from tests.sandbox import installed_agent_env

    installed_agent_env()  # what start_agent runs the agent with: installed before any sandboxed VM's clock starts
    shims = tmp / "shims"
    install_docker_shim(shims)
    env = {
        "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": str(REPO),
        "TPU_PLATFORM_STACK": "dev",
        "TPU_PLATFORM_VM": "trainer-1",
        "TPU_PLATFORM_PROJECT": "acme-ml-sandbox",
        "TPU_PLATFORM_ROOT": str(tmp / "root"),
        "TPU_PLATFORM_PYTHON": "/usr/bin/python3",  # the image's, as agent.env names it
        "TPU_PLATFORM_STATUS_DIR": f"gs://{STATUS}/trainer-1",
        "TPU_PLATFORM_ARTIFACTS": f"gs://{ARTIFACTS}",
        "TPU_PLATFORM_REGISTRY": REGISTRY,
        "TPU_PLATFORM_WORKER_ID": "0",
        "TPU_PLATFORM_WORKER_COUNT": "1",
        "TPU_PLATFORM_COORDINATOR": "",
        "TPU_PLATFORM_GRACE_SECONDS": "10",
        "TPU_PLATFORM_MAX_RETRIES": "2",
        "TPU_PLATFORM_RETRY_DELAY_SECONDS": "0",
        "TPU_PLATFORM_SELF_SERVICE": "0",
        "TPU_PLATFORM_METADATA_REDIRECT": "0",  # the machine's firewall is shared (tests/sandbox.py says why)
        "GCE_METADATA_HOST": metadata_host,  # where google-auth and the agent find the metadata server
        "TPU_PLATFORM_POLL_SECONDS": "2",  # an absent attribute is asked for again this often
        "TPU_PLATFORM_RUNTIME_ENV": "TPU_RUNTIME_FLAG",
        "TPU_RUNTIME_FLAG": "from-the-catalog",
        "STORAGE_EMULATOR_HOST": emulator,
        "DOCKER_SHIM_STATE": str(tmp / "docker"),
        "DOCKER_SHIM_TOKEN": SANDBOX_TOKEN,
        "DOCKER_SHIM_IMAGES": "{}",
        "PIP_NO_INDEX": "1",  # offline: the folder's requirement is a local wheel
        "PIP_FIND_LINKS": wheel_index(),
        "UV_FIND_LINKS": wheel_index(),  # uv installs for a pinned Python; it reads no PIP_ settings
        "UV_NO_INDEX": "1",  # offline: find-links only (a loopback server; UV_OFFLINE would refuse it)
        "UV_PYTHON_DOWNLOADS": "never",
    }
    env.update(extra)
    return env


def start_agent(env: dict[str, str], log: Path) -> subprocess.Popen:
    """`python -m vm_agent` as the unit runs it: the Python of the agent's own environment (the image's
    Python with the wheelhouse's libraries, vm_agent/environment.py), writing nothing into it."""
    from tests.sandbox import installed_agent_env

    python = str(installed_agent_env() / "bin" / "python")
    with open(log, "ab") as out:
        return subprocess.Popen(
            [python, "-m", "vm_agent"],
            env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


def run_spec(run_id: str, source: dict, command: list[str], **fields: object) -> str:
    spec = {"runId": run_id, "source": source, "command": command, "requester": "stack", **fields}
    return json.dumps(spec)
