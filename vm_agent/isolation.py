"""Each run as a fresh unprivileged uid that cannot outlive it: the agent's side of vm_agent/jail.py.

What systemd gives a transient unit with DynamicUser=, PrivateTmp=, PrivateIPC= and LimitMEMLOCK=,
done by the agent itself, so that the same code runs on a TPU VM and in the tests (whose machines have
no systemd as PID 1):

- A uid (and the gid of the same number) from systemd's own range for dynamic users, 61184-65519
  ("Users, Groups, UIDs and GIDs on systemd Systems", systemd's docs/UIDS-GIDS.md), which no account of
  the image holds. A uid is claimed with an exclusive lock file held for the run's whole life, so two
  agents on one machine (the tests) never share one, and the next claim starts past the last one used.
- Its folders: `<root>/var/lib/tpu-platform/runs/<uid>/` with the empty world-writable folders the jail
  puts over the machine's (`/tmp`, `/var/tmp`, `/dev/shm`, `/run/lock`, `/var/crash`), its HOME inside
  its own /tmp, and its unpacked source.
- Its end: every process of the uid killed (`kill(-1, SIGKILL)` sent *as that uid*, which reaches every
  process the uid owns however it forked, setsid or daemonized, and nothing else: kill(2)), until none
  is left; then its folders removed, the TPU devices given back to root, and the uid's lock released.
- The TPU devices the VM's generation exposes (`/dev/accel*` on v2 to v4; `/dev/vfio/<group>` where
  Google's image binds v5e/v5p/v6e/TPU7x chips to vfio-pci, beside `/dev/vfio/vfio`: GKE's TPU device
  plugin hands containers exactly these, tpu-device-plugin pkg/tpu DeviceSpec/DefaultDeviceSpec) are
  given to the run's uid for its life (mode rw for the owner) and back to their first owner and mode
  after. What a real TPU must prove (tools/smoke.py's dry run): libtpu opens them as that uid.

Cached artefacts (a virtualenv, the `uv` tool) are built by the run's uid in a folder it owns, then made
root's (no file of another owner may be in it: a hard link to a foreign file is refused), and their tree
digest recorded; every later use recomputes it and rebuilds on a mismatch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from vm_agent.firewall import RUNS_GATEWAY, RUNS_NETWORK, Firewall, FirewallError, container_ip, network_create

if TYPE_CHECKING:
    from google.auth.downscoped import CredentialAccessBoundary

    from vm_agent.metadata_proxy import MetadataProxy
    from vm_agent.settings import Settings

UID_FIRST, UID_LAST = 61184, 65519  # systemd's DynamicUser= range (module docstring)
# The world-writable folders of a Linux image (FHS 3.0; Ubuntu's /run/lock and /var/crash): a run gets
# empty ones of its own in their place.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/crash")
JAIL = Path(__file__).resolve().with_name("jail.py")
RUN_HOME = "/tmp/home"  # inside the run's own /tmp
# `kill(-1, SIGKILL)` as the uid: every process it may signal, which is every process of that uid.
_KILL_AS = (
    "import os; os.setgroups([]); os.setresgid({gid}, {gid}, {gid}); os.setresuid({uid}, {uid}, {uid})\n"
    "try:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n    pass\n"
)


class IsolationError(Exception):
    """The platform could not isolate a run (no free uid, not root): the run does not start."""


def processes_of(uid: int) -> list[int]:
    """Live processes whose real, effective, saved or filesystem uid is `uid` (zombies are already dead)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if str(uid) in fields.get("Uid", "").split():
            found.append(int(entry))
    return found


def kill_uid(uid: int, timeout_s: float = 10.0) -> bool:
    """Kill every process of `uid` (see the module's docstring); True when none is left."""
    deadline = time.monotonic() + timeout_s
    while processes_of(uid):
        if time.monotonic() > deadline:
            return False
        subprocess.run([sys.executable, "-I", "-S", "-c", _KILL_AS.format(uid=uid, gid=uid)], check=False)
        time.sleep(0.02)
    return True


class UidClaim:
    def __init__(self, uid: int, lock: int):
        self.uid = uid
        self.gid = uid
        self._lock = lock

    def release(self) -> None:
        if self._lock >= 0:
            os.close(self._lock)  # the kernel drops the lock with the descriptor
            self._lock = -1


class UidPool:
    """Uids from `first` to `last`, each held by an exclusive lock on `<locks>/<uid>.lock`."""

    def __init__(self, locks: Path, first: int = UID_FIRST, last: int = UID_LAST):
        self.locks = locks
        self.first, self.last = first, last

    def claim(self) -> UidClaim:
        self.locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        size = self.last - self.first + 1
        cursor = self.locks / "next"
        try:
            start = int(cursor.read_text()) - self.first
        except (OSError, ValueError):
            start = (os.getpid() * 7919) % size
        for step in range(size):
            uid = self.first + (start + step) % size
            fd = os.open(self.locks / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                os.close(fd)
                if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    continue
                raise
            if processes_of(uid) and not kill_uid(uid):  # left by an agent that died: it cannot be this run's
                os.close(fd)
                continue
            with contextlib.suppress(OSError):
                cursor.write_text(str(self.first + (start + step + 1) % size))
            return UidClaim(uid, fd)
        raise IsolationError(f"no free uid in {self.first}-{self.last}: every one is held by a run")


# ------------------------------------------------------------------------------------ cached trees
def tree_digest(root: Path) -> str:
    """sha256 over every entry under `root`: its path, type, mode, owner and content (or link target)."""
    digest = hashlib.sha256()
    entries = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in [*dirs, *files]:
            entries.append(os.path.join(folder, name))
    for path in sorted(entries):
        info = os.lstat(path)
        relative = os.path.relpath(path, root)
        line = f"{stat.S_IFMT(info.st_mode):o} {stat.S_IMODE(info.st_mode):o} {info.st_uid} {info.st_gid} {relative!r}"
        if stat.S_ISLNK(info.st_mode):
            line += " -> " + os.readlink(path)
        elif stat.S_ISREG(info.st_mode):
            content = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    content.update(block)
            line += " " + content.hexdigest()
        digest.update(line.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def root_own_tree(root: Path) -> None:
    """Everything under `root` (and itself) root's, unwritable by others, no setuid/setgid bit."""
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in [*files, *dirs]:
            _root_own(os.path.join(folder, name))
    _root_own(str(root))


def make_root_owned(root: Path, builder: int) -> None:
    """Give everything under `root` to root, unwritable by others, no setuid/setgid bit. Refuses a tree
    with an entry of another owner than `builder` (the uid that built it could only have put it there as
    a hard link to a file that is not its own)."""
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if info.st_uid != builder:
                raise IsolationError(f"{path} belongs to uid {info.st_uid}, not to the build's uid {builder}")
    root_own_tree(root)


def _root_own(path: str) -> None:
    info = os.lstat(path)
    os.lchown(path, 0, 0)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(path, stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID | 0o022))


class CachedTree:
    """A folder built once by a run's uid and used by later runs: root's, and checked on every use."""

    def __init__(self, path: Path):
        self.path = path
        self.record = path.with_name(path.name + ".sha256")

    def verified(self, log: Callable[[str], None]) -> bool:
        """True when it exists and hashes to its recorded digest; a mismatch removes it (to be rebuilt)."""
        if not self.path.is_dir() or not self.record.is_file():
            self.remove()
            return False
        if tree_digest(self.path) == self.record.read_text().strip():
            return True
        log(f"{self.path} does not match its recorded digest: removed, built again")
        self.remove()
        return False

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self.record.unlink()

    def prepare(self, builder: UidClaim) -> None:
        """An empty folder the builder's uid may fill (its parents root's and closed to it)."""
        self.remove()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.mkdir(mode=0o755)
        os.chown(self.path, builder.uid, builder.gid)

    def seal(self, builder: UidClaim) -> None:
        make_root_owned(self.path, builder.uid)
        partial = self.record.with_name(self.record.name + ".partial")
        partial.write_text(tree_digest(self.path) + "\n")
        partial.replace(self.record)


# ------------------------------------------------------------------------------------------- devices
class Devices:
    """The TPU chips' device nodes under `dev`, lent to one run's uid at a time."""

    def __init__(self, dev: Path, state: Path):
        self.dev = dev
        self.state = state  # their first owners and modes, root's: restored after a crash too

    def nodes(self) -> list[Path]:
        accel = sorted(self.dev.glob("accel[0-9]*"), key=lambda p: int(p.name[len("accel") :] or 0))
        groups = self.dev / "vfio"
        vfio = sorted(p for p in groups.glob("*") if p.name != "vfio") if groups.is_dir() else []
        return [p for p in [*accel, *vfio] if p.is_char_device()]

    def shared(self) -> list[Path]:
        """Nodes every TPU process opens and no run owns: the VFIO container `/dev/vfio/vfio`."""
        node = self.dev / "vfio" / "vfio"
        return [node] if node.is_char_device() else []

    def lend(self, claim: UidClaim) -> list[Path]:
        self.restore()
        nodes = self.nodes()
        first = {str(p): [p.stat().st_uid, p.stat().st_gid, stat.S_IMODE(p.stat().st_mode)] for p in nodes}
        self.state.parent.mkdir(parents=True, exist_ok=True)
        self.state.write_text(json.dumps(first))
        for node in nodes:
            os.chown(node, claim.uid, claim.gid)
            os.chmod(node, 0o600)
        return nodes

    def restore(self) -> None:
        try:
            first = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return
        for path, (uid, gid, mode) in first.items():
            with contextlib.suppress(OSError):
                os.chown(path, uid, gid)
                os.chmod(path, mode)
        self.state.unlink()


# ---------------------------------------------------------------------------------------- one run
class Isolation:
    """The agent's means to isolate runs: a uid pool, the runs' folders, the devices, what runs never see."""

    def __init__(
        self,
        root: Path,
        locks: Path,
        dev: Path,
        memlock: bool = True,
        proxy: MetadataProxy | None = None,
        tpu_env: dict[str, str] | None = None,
    ):
        self.root = root
        self.opt = root / "opt" / "tpu-platform"
        self.runs = root / "var" / "lib" / "tpu-platform" / "runs"
        self.pool = UidPool(locks)
        self.devices = Devices(dev, root / "var" / "lib" / "tpu-platform" / "devices.json")
        self.memlock = memlock
        self.proxy = proxy  # the metadata server as runs see it, which hands out each run's own token
        self.tpu_env = dict(tpu_env or {})  # the TPU_* variables of this VM (vm_agent/metadata_proxy.py)
        # The metadata redirect for containers (vm_agent/firewall.py): the firewall and the metadata server's
        # address, when the agent owns the VM's firewall (None: the tests' shared sandbox).
        self.redirect: tuple[Firewall, str] | None = None
        self._images_proxy = ""
        # What a run never sees: the agent's code, settings and caches, and the runs' folders.
        self.hidden = (self.opt, root / "etc" / "tpu-platform", root / "var" / "lib" / "tpu-platform")

    @classmethod
    def of(cls, settings: Settings) -> Isolation:
        return cls(settings.root, settings.uid_locks, settings.devices)

    @staticmethod
    def check() -> str:
        """Why runs cannot be isolated here, or ""."""
        if os.geteuid() != 0:
            return "the agent must run as root to start each run as its own uid"
        return ""

    def clean_up(self) -> None:
        """At the agent's start: what runs of an earlier life (a crash, a reboot) left is gone."""
        self.devices.restore()
        if self.runs.is_dir():
            for folder in self.runs.iterdir():
                if folder.name.isdigit():
                    kill_uid(int(folder.name))
                shutil.rmtree(folder, ignore_errors=True)

    def image_network(self, docker: str) -> str:
        """The Docker network of single-host image runs (vm_agent/firewall.py), made once, and the address at which
        its containers reach the metadata proxy; IsolationError when it cannot be had."""
        if self._images_proxy:
            return self._images_proxy
        if self.proxy is None:
            raise IsolationError("no metadata proxy: image runs need one")
        inspect = subprocess.run([docker, "network", "inspect", RUNS_NETWORK], capture_output=True, text=True)
        if inspect.returncode != 0:
            made = subprocess.run(network_create(docker), capture_output=True, text=True)
            if made.returncode != 0:
                raise IsolationError(f"docker network {RUNS_NETWORK}: {made.stderr.strip() or made.returncode}")
        try:
            if self.redirect is not None:
                firewall, metadata_ip = self.redirect
                address = self.proxy.listen(RUNS_GATEWAY)
                firewall.apply_bridge(int(address.rsplit(":", 1)[1]), metadata_ip)
            else:  # the tests' sandbox: the docker shim runs the image's command on this machine, as the uid
                address = self.proxy.listen("127.0.0.1")
        except (OSError, FirewallError) as error:
            raise IsolationError(f"the metadata server cannot be redirected for image runs: {error}") from None
        self._images_proxy = address
        return address

    def open(self, within: CredentialAccessBoundary | None = None) -> RunSandbox:
        """A uid and folders for one run, whose token reaches only what `within` names (vm_agent/credentials.py
        boundary); None: the run gets no token."""
        return RunSandbox(self, self.pool.claim(), within)


class RunSandbox:
    """One run's uid and folders, from its first install to its end."""

    def __init__(self, isolation: Isolation, claim: UidClaim, within: CredentialAccessBoundary | None):
        self.isolation = isolation
        self.claim = claim
        self.uid = claim.uid
        self.dir = isolation.runs / str(claim.uid)
        try:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir.mkdir(parents=True, mode=0o711)
            isolation.runs.chmod(0o711)
            self.private: dict[str, str] = {}
            for target in SHARED_WRITABLE:
                if os.path.isdir(target):
                    folder = self.dir / ("private" + target.replace("/", "-"))
                    folder.mkdir()
                    folder.chmod(0o1777)  # like the folder it stands for
                    self.private[target] = str(folder)
            home = Path(self.private["/tmp"]) / "home"
            home.mkdir(mode=0o700)
            os.chown(home, claim.uid, claim.gid)
            self.devices = isolation.devices.lend(claim)
            if isolation.proxy is not None:
                isolation.proxy.admit(claim.uid, within)
        except BaseException:
            claim.release()
            raise
        self.source = self.dir / "src"

    def environment(self) -> dict[str, str]:
        """What a run's process is told of where it lives: its home, its metadata server, its TPU."""
        env = {"HOME": RUN_HOME, "TMPDIR": "/tmp", "USER": f"tpu-run-{self.uid}", "LOGNAME": f"tpu-run-{self.uid}"}
        env.update(self.isolation.tpu_env)
        if self.isolation.proxy is not None:
            env.update(self.isolation.proxy.environment())
        return env

    def jail(
        self, argv: list[str], cwd: Path | None, keep: Iterable[Path] = (), writable: Iterable[Path] = ()
    ) -> list[str]:
        """`argv` as this run's uid, in the jail (vm_agent/jail.py). Its TPU device nodes are put back as they are
        (no nodev) where they lie under a covered folder: only in the tests, whose /dev is under a VM root."""
        devices = [*self.devices, *self.isolation.devices.shared()]
        writable = [*writable, *devices]
        spec = {
            "uid": self.claim.uid,
            "gid": self.claim.gid,
            "cwd": str(cwd) if cwd else "/tmp",
            "private": self.private,
            "hide": [str(h) for h in self.isolation.hidden],
            "keep": [str(k) for k in (*keep, *writable)],
            "writable": [str(w) for w in writable],
            "memlock": self.isolation.memlock,
        }
        return [sys.executable, "-I", "-S", str(JAIL), json.dumps(spec, sort_keys=True), "--", *argv]

    def container(self, docker: str) -> tuple[str, str]:
        """For a single-host image run: its address on the runs' Docker network, admitted to the proxy as this
        run, and the proxy's address there."""
        assert self.isolation.proxy is not None
        proxy = self.isolation.image_network(docker)
        address = container_ip(self.uid, UID_FIRST)
        self.isolation.proxy.admit_container(address, self.uid)
        return address, proxy

    def kill(self) -> None:
        if not kill_uid(self.uid):
            raise IsolationError(f"processes of uid {self.uid} survived SIGKILL")

    def close(self) -> None:
        """The run has ended: nothing of it is left."""
        try:
            if self.isolation.proxy is not None:
                self.isolation.proxy.revoke(self.uid)
            self.kill()
        finally:
            self.isolation.devices.restore()
            shutil.rmtree(self.dir, ignore_errors=True)
            self.claim.release()
