"""Start and stop one run under the run contract (docs/run-contract.md), as its own uid.

Every process of a run, its installs included, runs as a fresh unprivileged uid in a jail of its own
(vm_agent/isolation.py, vm_agent/jail.py): its own /tmp and other world-writable folders, no sight of
the agent's code, settings or caches, no capability, no way to gain one; when the run ends every process
of that uid is killed and its folders removed.

A folder source: its archive is fetched from the artifacts bucket and verified by sha256 before anything
of it runs (a mismatch fails the run, never retried); the verified archive is kept, root's, under
`<root>/opt/tpu-platform/archives/` and checked again on every use; each run unpacks it afresh into its
own folder (root's, read-only to the run). Its requirements are installed only by hash
(vm_agent/installs.py), by the run's uid, into a virtualenv that sees the image's packages
(`--system-site-packages`), made with `uv` when the spec pins a Python; the virtualenv is then made
root's, its tree digest recorded, and checked again on every later use (vm_agent/isolation.py
CachedTree). One virtualenv per source digest, Python, bounds, lock and requester: one researcher's
install never serves another's run.

An image source runs with docker, hardened where Google's "Run TPU workloads in a Docker container"
guide (https://cloud.google.com/tpu/docs/run-in-container) uses `--privileged --net=host`: the run's
uid (`--user`), no capability (`--cap-drop=ALL`), `no-new-privileges`, only the TPU's device nodes
(`--device`, the nodes GKE's TPU device plugin gives a TPU container), an unlimited memlock (VFIO), and
`--net=host` only on a multi-host slice (the hosts of a slice reach each other on the host's network;
one host needs none). The VM pulls as its own service account: an access token from the metadata
server given to `docker login -u oauth2accesstoken --password-stdin https://<region>-docker.pkg.dev`
(Artifact Registry, "Configure authentication to Artifact Registry for Docker", access token:
https://cloud.google.com/artifact-registry/docs/docker/authentication#token).

Stopping sends SIGTERM to the program's process group (for an image, the attached `docker run`
client proxies it to the container: `--sig-proxy`, on by default), waits the grace period, then kills
every process of the run's uid. Exit codes: 0 finished; 75 retry later; 78 failed for good; anything
else failed, retried at most `max_retries` times. The run's state goes to
`<status-dir>/runs/<runId>/status.json` on every transition; the stack's run (`completion`) ends in
`<status-dir>/COMPLETE`, in its one schema (run_contract/completion_marker.py, which the guard reads): only
the agent writes it, where no run's credentials reach.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from run_contract import completion_marker as marker_schema
from run_contract import lines
from run_contract.names import (
    CHECKPOINT_DIR_ENV,
    CONTRACT_PREFIX,
    DATA_ENV,
    EXIT_CONFIG,
    EXIT_FINISHED,
    MODEL_DIR_ENV,
    RUN_ID_ENV,
)
from run_contract.paths import status_name
from run_contract.spec import FolderSource, ImageSource, RunSpec
from run_contract.status import ENDED

from vm_agent import credentials, installs, telemetry
from vm_agent import timeline as run_timeline
from vm_agent.archives import sha256_file, unpack
from vm_agent.firewall import RUNS_NETWORK
from vm_agent.gcs import Folder, Storage, StorageError, fresh_token, split_gs, vm_credentials
from vm_agent.isolation import CachedTree, Isolation, IsolationError, RunSandbox, root_own_tree
from vm_agent.settings import Settings

COMPLETE = marker_schema.NAME

Log = Callable[..., None]


@functools.cache
def image_paths(python: str) -> tuple[Path, ...]:
    """The image's Python's folder and the folders it imports from (its sys.path), which a run's jail must keep
    readable where they lie under a folder it covers: never on a VM (they are under /usr), in the tests where
    the sandbox's image packages live in a checkout under /tmp. Asked once per agent."""
    query = "import json, sys; print(json.dumps([p for p in sys.path if p]))"
    try:
        found = json.loads(subprocess.run([python, "-c", query], capture_output=True, text=True, timeout=60).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        found = []
    return (Path(python).parent, *(Path(p) for p in found if os.path.isdir(p)))


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def completion_marker(spec: RunSpec, steps: int | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """`<status-dir>/COMPLETE`, as its one schema says (run_contract/completion_marker.py, which the guard and
    infra/run_status.py read with)."""
    return marker_schema.marker(spec.run_id, "vm-agent", utc_now(), program_name(spec), steps, metrics)


def program_name(spec: RunSpec) -> str:
    if isinstance(spec.source, ImageSource):
        return spec.source.image
    return " ".join(spec.command)


class SourceError(Exception):
    """The run's code could not be made ready. `final`: retrying cannot help (e.g. a digest mismatch)."""

    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final


@dataclass
class Prepared:
    argv: list[str]
    cwd: Path | None
    env: dict[str, str]
    container: str = ""  # docker's name for the container, to kill it after the grace period


class Run:
    """One desired run: made ready, started (again, on retries), stopped; its state recorded."""

    def __init__(
        self,
        spec: RunSpec,
        settings: Settings,
        status: Folder,
        storage: Storage,
        log: Log,
        ship: Callable[[str, RunSpec], None] = telemetry.ship,
        isolation: Isolation | None = None,
        opening: list[run_timeline.Event] | None = None,
    ):
        self.spec = spec
        self.settings = settings
        self.status = status
        self.storage = storage
        self.log = log
        self.ship = ship
        self.state = "queued"
        self.exit_code: int | None = None
        self.attempt = 0
        self.started_at = ""
        self.ended_at = ""
        self.error = ""
        self.steps: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._container = ""
        self.isolation = isolation or Isolation.of(settings)
        self.sandbox: RunSandbox | None = None  # its uid and folders, from its first install to its end
        self._thread = threading.Thread(target=self._supervise, name=f"run-{spec.run_id}", daemon=True)
        # Its events (vm_agent/timeline.py): worker 0's agent keeps the run's; a request's step lines are untrusted.
        self.timeline = run_timeline.Recorder(
            spec.run_id,
            settings.vm,
            not spec.request,
            status,
            log,
            write=settings.worker_id == 0,
            publish=telemetry.run_seconds,
        )
        self._opening = list(opening or [])  # this boot's and this agent's start, for the boot's first run

    # ------------------------------------------------------------------------------------ control
    def start(self) -> None:
        self._record("queued")
        if self._opening:
            self.timeline.extend(self._opening)
        self._thread.start()

    def done(self) -> bool:
        return not self._thread.is_alive() and self.state in ENDED

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, reason: str) -> None:
        """Ask the program to checkpoint and exit (SIGTERM); kill it after the grace period."""
        self._stop.set()
        with self._lock:
            process = self._process
        if process is not None and process.poll() is None:
            self.log(f"stopping run {self.spec.run_id}: {reason}", run=self.spec.run_id)
            if self.state == "running":
                self._record("stopping")
            self.timeline.record("sigterm")
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(self.settings.grace_s)
            except subprocess.TimeoutExpired:
                self.log(
                    f"run {self.spec.run_id} did not exit within {self.settings.grace_s:g}s of SIGTERM: killed",
                    severity="WARNING",
                    run=self.spec.run_id,
                )
                if self._container:
                    subprocess.run([self.settings.docker, "kill", self._container], capture_output=True, check=False)
                _signal_group(process, signal.SIGKILL)
                self._kill_all()
        self._thread.join(self.settings.grace_s + 30)

    def requeue(self, reason: str) -> None:
        """Stopped to make way (the stack's run comes first): waiting again, to resume later."""
        self.state, self.error = "queued", reason
        self._record("queued")
        self.timeline.record("end")

    # ------------------------------------------------------------------------------------ the run
    def _supervise(self) -> None:
        retries = 0
        prepared: Prepared | None = None
        while True:
            if self._stop.is_set():
                self._end("stopped")
                return
            if prepared is None:
                self._record("starting")
                self.timeline.record("prepare")
                try:
                    prepared = self._prepare()
                except SourceError as error:
                    self.error = str(error)
                    self.log(f"run {self.spec.run_id}: {error}", severity="ERROR", run=self.spec.run_id)
                    if self._stop.is_set():
                        self._end("stopped")
                        return
                    if error.final or retries >= self.settings.max_retries:
                        self._end("failed")
                        return
                    retries += 1
                    self._record("retry")
                    self._stop.wait(self.settings.retry_delay_s)
                    continue
            code = self._execute(prepared)
            self.exit_code = code
            if code == EXIT_FINISHED:
                self._end("finished")
                return
            if self._stop.is_set():
                self._end("stopped")
                return
            if code == EXIT_CONFIG:
                self.error = f"exit {EXIT_CONFIG} (EX_CONFIG): the program says this run cannot work; not retried"
                self._end("failed")
                return
            if retries >= self.settings.max_retries:
                limit = self.settings.max_retries
                self.error = f"exit {code} after {retries} retries (TPU_PLATFORM_MAX_RETRIES={limit})"
                self._end("failed")
                return
            retries += 1
            self.error = f"exit {code}; retry {retries} of {self.settings.max_retries}"
            self.log(f"run {self.spec.run_id}: {self.error}", severity="WARNING", run=self.spec.run_id)
            self._record("retry")
            self._stop.wait(self.settings.retry_delay_s)

    def _execute(self, prepared: Prepared) -> int:
        self._kill_all()  # what an earlier attempt left behind never meets this one
        with self._lock:
            if self._stop.is_set():
                return -int(signal.SIGTERM)
            process = subprocess.Popen(
                prepared.argv,
                cwd=str(prepared.cwd) if prepared.cwd else None,
                env=prepared.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: SIGTERM reaches its children too
            )
            self._process = process
            self._container = prepared.container
            self.attempt += 1
        self.timeline.record("programStart")
        if not self.started_at:
            self.started_at = utc_now()
        self._record("running")
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            lines.line(line)
            step = self.timeline.line(line)
            if step is not None:  # the last step a step line reports, for the completion marker
                self.steps = step
            try:
                self.ship(line, self.spec)
            except Exception as error:
                self.log(f"telemetry.ship failed: {error}", severity="WARNING", run=self.spec.run_id)
        code = process.wait()
        self.timeline.record("exit", code=code)
        with self._lock:
            self._process = None
        self._kill_all()  # what it forked, daemonized or left in a container ends with it
        return code

    def _kill_all(self) -> None:
        if self.sandbox is not None:
            try:
                self.sandbox.kill()
            except IsolationError as error:
                self.log(f"run {self.spec.run_id}: {error}", severity="ERROR", run=self.spec.run_id)

    # ---------------------------------------------------------------------------------- prepare
    def _prepare(self) -> Prepared:
        if self.sandbox is None:
            problem = Isolation.check()
            if problem:
                raise SourceError(f"{problem}; no run starts without its own uid", final=True)
            spec = self.spec
            try:
                within = credentials.boundary(spec.checkpoint_dir, spec.model_dir, spec.data)
            except (credentials.BoundaryError, ValueError) as error:
                raise SourceError(f"this run's objects cannot be its token's boundary: {error}", final=True) from None
            try:
                self.sandbox = self.isolation.open(within)
            except IsolationError as error:
                raise SourceError(str(error)) from None
            self.log(f"run {self.spec.run_id} runs as uid {self.sandbox.uid}", run=self.spec.run_id)
        env = self._environment()
        source = self.spec.source
        if isinstance(source, FolderSource):
            folder = self._unpack(source)
            venv = self._virtualenv(folder, source)
            program_env = self._program_env(env)
            argv = list(self.spec.command)
            keep = [folder, *image_paths(self.settings.python)]
            if venv is not None:
                program_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{program_env.get('PATH', '')}"
                program_env["VIRTUAL_ENV"] = str(venv)
                keep.append(venv)
            elif argv[0] in ("python", "python3"):
                argv[0] = self.settings.python  # the image's Python (Ubuntu has no `python` by default)
            return Prepared(self.sandbox.jail(argv, folder, keep), None, program_env)
        return self._prepare_image(source, env)

    def _environment(self) -> dict[str, str]:
        """The run contract's environment: the runtime's, the VM's place, this run's, then the spec's."""
        env = dict(self.settings.runtime_env)
        env.update(self.settings.contract_env())
        env.update(
            {
                RUN_ID_ENV: self.spec.run_id,
                DATA_ENV: self.spec.data,
                CHECKPOINT_DIR_ENV: self.spec.checkpoint_dir,
                MODEL_DIR_ENV: self.spec.model_dir,
            }
        )
        env.update(dict(self.spec.env))
        return env

    def _program_env(self, env: dict[str, str]) -> dict[str, str]:
        """A process of the run: the agent's environment without its own settings, then the run's."""
        program_env = dict(os.environ)
        for name in list(program_env):
            if name.startswith(CONTRACT_PREFIX):  # the agent's own settings are not the program's
                del program_env[name]
        program_env.pop("PYTHONPATH", None)  # the agent's package: not the program's to import
        assert self.sandbox is not None
        program_env.update(self.sandbox.environment())
        program_env.update(env)
        return program_env

    def _unpack(self, source: FolderSource) -> Path:
        """The source, unpacked afresh for this run from the archive verified by its digest on this very use."""
        archives = self.settings.opt / "archives"
        archive = archives / f"{source.sha256}.tar.gz"
        if archive.is_file() and sha256_file(archive) != source.sha256:
            self.log(f"{archive} does not match its digest: fetched again", severity="WARNING", run=self.spec.run_id)
            archive.unlink()
        if not archive.is_file():
            archives.mkdir(parents=True, exist_ok=True, mode=0o700)
            bucket, name = split_gs(source.uri)
            fetching = archives / f"{source.sha256}.fetching"
            try:
                self.storage.download(bucket, name, fetching)
            except StorageError as error:
                raise SourceError(f"cannot fetch {source.uri}: {error}", final=error.status in (403, 404)) from None
            digest = sha256_file(fetching)
            if digest != source.sha256:
                fetching.unlink()
                raise SourceError(
                    f"{source.uri} has sha256 {digest}, the run spec says {source.sha256}: refused, nothing of it ran",
                    final=True,
                )
            fetching.replace(archive)
            self.log(f"fetched {source.uri} (sha256 verified)", run=self.spec.run_id)
        assert self.sandbox is not None
        target = self.sandbox.source
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(mode=0o755)
        try:
            unpack(archive, target)
        except (tarfile.TarError, ValueError) as error:
            shutil.rmtree(target, ignore_errors=True)
            raise SourceError(f"{source.uri}: {error}", final=True) from None
        root_own_tree(target)
        return target

    def _virtualenv(self, folder: Path, source: FolderSource) -> Path | None:
        try:
            lock = installs.choose_lock(folder, self.settings.pip_constraints)
        except installs.LockError as error:
            raise SourceError(str(error), final=True) from None
        if lock is None and not self.spec.python:
            return None
        key = hashlib.sha256(
            json.dumps(
                {
                    "source": source.sha256,
                    "python": self.spec.python,
                    "bounds": list(self.settings.pip_constraints),
                    "lock": sha256_file(lock) if lock else "",
                    "requester": self.spec.requester,
                },
                sort_keys=True,
            ).encode()
        ).hexdigest()
        venv = (
            self.settings.opt
            / "venvs"
            / (f"{source.sha256[:16]}-{key[:16]}" + (f"-py{self.spec.python}" if self.spec.python else ""))
        )
        cached = CachedTree(venv)
        if cached.verified(lambda line: self.log(line, severity="WARNING", run=self.spec.run_id)):
            return venv
        assert self.sandbox is not None
        cached.prepare(self.sandbox.claim)
        python = str(venv / "bin" / "python")
        requirements = str(lock.relative_to(folder)) if lock else ""
        if self.spec.python:
            uv = self._uv()
            steps = [[str(uv), "venv", "--quiet", "--python", self.spec.python, "--system-site-packages", str(venv)]]
            if requirements:
                steps.append(
                    [
                        str(uv),
                        "pip",
                        "install",
                        "--quiet",
                        "--python",
                        python,
                        "--require-hashes",
                        "--no-deps",
                        "-r",
                        requirements,
                    ]
                )
            keep = [uv.parent]
        else:
            # --without-pip: Ubuntu splits ensurepip into python3-venv, which a TPU image need not have; the
            # image's pip (system site-packages, visible here) installs into the venv all the same.
            steps = [[self.settings.python, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)]]
            if requirements:
                pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
                steps.append([*pip, "--require-hashes", "--no-deps", "-r", requirements])
            keep = []
        for argv in steps:
            self._install_step(argv, folder, keep=keep, writable=[venv])
        self.sandbox.kill()  # nothing of the install keeps running, or writing, once it is sealed
        try:
            cached.seal(self.sandbox.claim)
        except IsolationError as error:
            cached.remove()
            raise SourceError(f"the virtualenv built for this run was refused: {error}", final=True) from None
        self.log(f"virtualenv {venv} ready (installed by hash)", run=self.spec.run_id)
        return venv

    def _uv(self) -> Path:
        """`uv` from PATH, else installed by hash next to the agent's caches (a real VM reaches the index)."""
        found = shutil.which("uv")
        if found:
            return Path(found)
        tools = CachedTree(self.settings.opt / "tools")
        uv = tools.path / "bin" / "uv"
        if tools.verified(lambda line: self.log(line, severity="WARNING", run=self.spec.run_id)) and uv.is_file():
            return uv
        assert self.sandbox is not None
        tools.prepare(self.sandbox.claim)
        pinned = Path(self.sandbox.private["/tmp"]) / installs.UV_REQUIREMENTS.name  # where the run's uid reads it
        shutil.copyfile(installs.UV_REQUIREMENTS, pinned)
        pinned.chmod(0o644)
        pip = [self.settings.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
        self._install_step(
            [*pip, "--require-hashes", "--no-deps", "--target", str(tools.path), "-r", f"/tmp/{pinned.name}"],
            None,
            writable=[tools.path],
        )
        self.sandbox.kill()
        try:
            tools.seal(self.sandbox.claim)
        except IsolationError as error:
            tools.remove()
            raise SourceError(f"uv as installed was refused: {error}", final=True) from None
        return uv

    def _install_step(
        self, argv: list[str], cwd: Path | None, keep: Iterable[Path] = (), writable: Iterable[Path] = ()
    ) -> None:
        """One step of an install, as the run's uid in its jail."""
        assert self.sandbox is not None
        env = self._program_env({})
        env["UV_LINK_MODE"] = "copy"  # no hard link from uv's cache into the virtualenv
        keep = [*([cwd] if cwd else []), *image_paths(self.settings.python), *keep]
        jailed = self.sandbox.jail(argv, cwd, keep=keep, writable=writable)
        with self._lock:
            if self._stop.is_set():
                raise SourceError("stopped while installing")
            process = subprocess.Popen(
                jailed, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
            self._process = process
        output, _ = process.communicate()
        with self._lock:
            self._process = None
        text = output.decode(errors="replace")
        for line in text.splitlines():
            lines.line(line)
        if process.returncode != 0:
            tail = " | ".join(text.strip().splitlines()[-3:])
            raise SourceError(f"`{' '.join(argv)}` exited {process.returncode}: {tail}")

    def _prepare_image(self, source: ImageSource, env: dict[str, str]) -> Prepared:
        docker = self.settings.docker
        if not source.by_digest:
            self.log(
                f"run {self.spec.run_id} uses the tag {source.image}: a tag can move; the stack allowed it",
                severity="WARNING",
                run=self.spec.run_id,
            )
        registry_host = source.image.split("/", 1)[0]
        try:
            token, _ = fresh_token(vm_credentials())
        except StorageError as error:
            raise SourceError(f"no access token from the metadata server to pull {source.image}: {error}") from None
        login = [docker, "login", "-u", "oauth2accesstoken", "--password-stdin", f"https://{registry_host}"]
        done = subprocess.run(login, input=token.encode(), capture_output=True, check=False)
        if done.returncode != 0:
            raise SourceError(f"docker login to {registry_host} failed: {done.stderr.decode(errors='replace').strip()}")
        self._install_step_as_agent([docker, "pull", source.image])  # a stop interrupts a long pull
        container = "tpu-platform-" + re.sub(r"[^A-Za-z0-9_.-]", "-", self.spec.run_id)[-100:]
        assert self.sandbox is not None
        env = {**env, "HOME": "/tmp"}  # the run's uid has no home in the image
        address = ""
        if self.settings.worker_count == 1 and self.sandbox.isolation.proxy is not None:
            try:  # its own address on the runs' network; its metadata server the proxy's listener there
                address, proxy = self.sandbox.container(docker)
            except IsolationError as error:
                raise SourceError(str(error)) from None
            env.update({"GCE_METADATA_HOST": proxy, "GCE_METADATA_IP": proxy})
        return Prepared(
            container_argv(
                docker, container, self.sandbox, self.settings, source.image, self.spec.command, env, address
            ),
            None,
            {**os.environ, **env},
            container,
        )

    def _install_step_as_agent(self, argv: list[str]) -> None:
        """A step the agent itself takes for a run (a `docker pull`), interruptible by a stop."""
        with self._lock:
            if self._stop.is_set():
                raise SourceError("stopped while installing")
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            self._process = process
        output, _ = process.communicate()
        with self._lock:
            self._process = None
        if process.returncode != 0:
            tail = " | ".join(output.decode(errors="replace").strip().splitlines()[-3:])
            raise SourceError(f"`{' '.join(argv)}` exited {process.returncode}: {tail}")

    # ---------------------------------------------------------------------------------- records
    def _end(self, state: str) -> None:
        self._close_sandbox()  # the run has ended only once nothing of it is left
        self.ended_at = utc_now()
        if state != "failed":
            self.error = ""  # a retry's message is history once the run ends well
        self._record(state)
        self.timeline.record("end")
        if state == "finished" and self.spec.completion and self.settings.worker_id == 0:
            marker = completion_marker(self.spec, self.steps, {})
            self._write(COMPLETE, marker)  # last: the guard stops or deletes the VM when it appears
        self.log(
            f"run {self.spec.run_id} {state}" + (f": {self.error}" if state == "failed" else ""),
            severity="ERROR" if state == "failed" else "INFO",
            run=self.spec.run_id,
        )

    def _close_sandbox(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            try:
                sandbox.close()
            except IsolationError as error:
                self.log(f"run {self.spec.run_id}: {error}", severity="ERROR", run=self.spec.run_id)

    def _record(self, state: str) -> None:
        self.state = state
        self._write(status_name(self.spec.run_id, self.settings.worker_id), self.describe())

    def describe(self) -> dict[str, Any]:
        record = {
            "runId": self.spec.run_id,
            "state": self.state,
            "exitCode": self.exit_code,
            "startedAt": self.started_at or None,
            "endedAt": self.ended_at or None,
            "requester": self.spec.requester,
            "source": self.spec.source.describe(),
            "attempt": self.attempt,
            "worker": self.settings.worker_id,
            "specSha256": self.spec.fingerprint,
            "updatedAt": utc_now(),
        }
        if self.error:
            record["error"] = self.error
        if self.spec.request:  # the researcher side's record of where the run came from (vm_agent/run_requests.py)
            record["request"] = self.spec.request
            record["spec"] = self.request_spec()  # what a reboot resumes from (run_requests.py `unfinished`)
        return record

    def request_spec(self) -> dict[str, Any]:
        """The request's fields (vm_agent/run_requests.py REQUEST_FIELDS) of this run."""
        spec = self.spec
        # A request's run id is `<member>/<runId>` (vm_agent/run_requests.py); the request said `<runId>`.
        fields = {
            "runId": spec.run_id.rsplit("/", 1)[-1],
            "source": spec.source.describe(),
            "command": list(spec.command),
            "env": dict(spec.env),
            "requester": spec.requester,
        }
        if spec.python:
            fields["python"] = spec.python
        return fields

    def _write(self, name: str, record: dict[str, Any]) -> None:
        try:
            self.status.write_json(name, record)
        except (StorageError, OSError) as error:  # a lost status write must not stop the run
            self.log(f"could not write {self.status.url}/{name}: {error}", severity="WARNING", run=self.spec.run_id)


def container_argv(
    docker: str,
    name: str,
    sandbox: RunSandbox,
    settings: Settings,
    image: str,
    command: tuple[str, ...],
    env: dict[str, str],
    address: str = "",
) -> list[str]:
    """`docker run` for one image run: the run's uid, no capability, no privilege to gain, only the TPU's
    device nodes, unlimited memlock (VFIO), the host's network only for a multi-host slice (else the runs'
    network at the run's own `address`, vm_agent/firewall.py), and the environment by name (`-e NAME`
    takes the value from the client's environment: not in `ps`)."""
    argv = [
        docker,
        "run",
        "--rm",
        "--name",
        name,
        "--user",
        f"{sandbox.claim.uid}:{sandbox.claim.gid}",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--ulimit",
        "memlock=-1:-1",
    ]
    dev = sandbox.isolation.devices.dev
    for node in [*sandbox.devices, *sandbox.isolation.devices.shared()]:
        argv += ["--device", f"{node}:/dev/{node.relative_to(dev)}"]
    if settings.worker_count > 1:
        argv.append("--net=host")  # the slice's hosts reach each other (JAX's coordinator, ICI set-up)
    elif address:
        argv += ["--network", RUNS_NETWORK, "--ip", address]
    for name_ in sorted(env):
        argv += ["-e", name_]
    return [*argv, image, *command]


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
