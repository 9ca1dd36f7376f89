"""Start and stop one run under the run contract (README, "The run contract").

A folder source: its archive is fetched from the artifacts bucket and verified by sha256 before
anything of it runs (a mismatch fails the run, never retried), unpacked once per digest under
`<root>/opt/tpu-platform/sources/<sha256>/`, its `requirements.txt` installed into a virtualenv per
digest that sees the image's packages (`--system-site-packages`), made with `uv` when the spec pins a
Python; the command runs in the unpacked folder.

An image source runs with docker as Google's "Run TPU workloads in a Docker container" guide does
(https://cloud.google.com/tpu/docs/run-in-container): `--privileged` (the TPU devices) and
`--net=host` (the slice's network and the metadata server). The VM pulls as its own service account:
an access token from the metadata server given to `docker login -u oauth2accesstoken
--password-stdin https://<region>-docker.pkg.dev` (Artifact Registry, "Configure authentication to
Artifact Registry for Docker", access token:
https://cloud.google.com/artifact-registry/docs/docker/authentication#token).

Stopping sends SIGTERM to the program's process group (for an image, the attached `docker run`
client proxies it to the container: `--sig-proxy`, on by default), waits the grace period, then kills.
Exit codes: 0 finished; 75 retry later; 78 failed for good; anything else failed, retried at most
`max_retries` times. The run's state goes to `<status-dir>/runs/<runId>/status.json` on every
transition; the stack's run (`completion`) ends in `<status-dir>/COMPLETE` in the format the guard
and the program read (workloads/runlib.py `completion`, infra/run_status.py, functions/tpu_guard).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from vm_agent import completion_marker as marker_schema
from vm_agent import telemetry
from vm_agent.gcs import Folder, Storage, StorageError, Tokens, split_gs
from vm_agent.settings import Settings
from vm_agent.sources import CONTRACT_PREFIX, FolderSource, ImageSource, RunSpec

EXIT_FINISHED = 0
EXIT_RETRY = 75  # EX_TEMPFAIL: stopped mid-run with a checkpoint; start again later
EXIT_CONFIG = 78  # EX_CONFIG: this run cannot work; never retried
COMPLETE = "COMPLETE"
STATES = ("queued", "starting", "running", "stopping", "finished", "failed", "stopped", "retry")
ENDED = ("finished", "failed", "stopped")

Log = Callable[..., None]


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def status_name(run_id: str, worker_id: int) -> str:
    """Worker 0 keeps the run's state; another worker of a slice keeps its own beside it."""
    leaf = "status.json" if worker_id == 0 else f"status-worker-{worker_id}.json"
    return f"runs/{run_id}/{leaf}"


def completion_marker(spec: RunSpec, steps: int | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """`<status-dir>/COMPLETE`, as its one schema says (vm_agent/completion_marker.py, which the guard and
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
        self._thread = threading.Thread(target=self._supervise, name=f"run-{spec.run_id}", daemon=True)

    # ------------------------------------------------------------------------------------ control
    def start(self) -> None:
        self._record("queued")
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
        self._thread.join(self.settings.grace_s + 30)

    def requeue(self, reason: str) -> None:
        """Stopped to make way (the stack's run comes first): waiting again, to resume later."""
        self.state, self.error = "queued", reason
        self._record("queued")

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
        if not self.started_at:
            self.started_at = utc_now()
        self._record("running")
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            print(line, flush=True)
            self._note(line)
            try:
                self.ship(line, self.spec)
            except Exception as error:
                self.log(f"telemetry.ship failed: {error}", severity="WARNING", run=self.spec.run_id)
        code = process.wait()
        with self._lock:
            self._process = None
        return code

    def _note(self, line: str) -> None:
        """The last step a structured line reports, for the completion marker."""
        if line.startswith("{") and '"step"' in line:
            try:
                step = json.loads(line).get("step")
            except ValueError:
                return
            if isinstance(step, int):
                self.steps = step

    # ---------------------------------------------------------------------------------- prepare
    def _prepare(self) -> Prepared:
        env = self._environment()
        source = self.spec.source
        if isinstance(source, FolderSource):
            folder = self._fetch_folder(source)
            venv = self._virtualenv(folder, source)
            program_env = dict(os.environ)
            for name in list(program_env):
                if name.startswith(CONTRACT_PREFIX):  # the agent's own settings are not the program's
                    del program_env[name]
            program_env.pop("PYTHONPATH", None)  # the agent's package: not the program's to import
            program_env.update(env)
            argv = list(self.spec.command)
            if venv is not None:
                program_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{program_env.get('PATH', '')}"
                program_env["VIRTUAL_ENV"] = str(venv)
            elif argv[0] in ("python", "python3"):
                argv[0] = self.settings.python  # the image's Python (Ubuntu has no `python` by default)
            return Prepared(argv, folder, program_env)
        return self._prepare_image(source, env)

    def _environment(self) -> dict[str, str]:
        """The run contract's environment: the runtime's, the VM's place, this run's, then the spec's."""
        env = dict(self.settings.runtime_env)
        env.update(self.settings.contract_env())
        env.update({
            "TPU_PLATFORM_RUN_ID": self.spec.run_id,
            "TPU_PLATFORM_DATA": self.spec.data,
            "TPU_PLATFORM_CHECKPOINT_DIR": self.spec.checkpoint_dir,
            "TPU_PLATFORM_MODEL_DIR": self.spec.model_dir,
        })  # fmt: skip
        env.update(dict(self.spec.env))
        return env

    def _fetch_folder(self, source: FolderSource) -> Path:
        sources = self.settings.opt / "sources"
        target = sources / source.sha256
        if target.is_dir():  # renamed into place only after it was verified and unpacked whole
            return target
        sources.mkdir(parents=True, exist_ok=True)
        archive = sources / f"{source.sha256}.tar.gz"
        bucket, name = split_gs(source.uri)
        try:
            self.storage.download(bucket, name, archive)
        except StorageError as error:
            raise SourceError(f"cannot fetch {source.uri}: {error}", final=error.status in (403, 404)) from None
        digest = _sha256(archive)
        if digest != source.sha256:
            archive.unlink()
            raise SourceError(
                f"{source.uri} has sha256 {digest}, the run spec says {source.sha256}: refused, nothing of it ran",
                final=True,
            )
        unpacking = sources / f"{source.sha256}.unpacking"
        shutil.rmtree(unpacking, ignore_errors=True)
        unpacking.mkdir()
        try:
            _unpack(archive, unpacking)
        except (tarfile.TarError, ValueError) as error:
            shutil.rmtree(unpacking, ignore_errors=True)
            raise SourceError(f"{source.uri}: {error}", final=True) from None
        finally:
            archive.unlink()
        unpacking.rename(target)
        self.log(f"fetched {source.uri} (sha256 verified) to {target}", run=self.spec.run_id)
        return target

    def _virtualenv(self, folder: Path, source: FolderSource) -> Path | None:
        requirements = folder / "requirements.txt"
        if not requirements.is_file() and not self.spec.python:
            return None
        name = source.sha256 + (f"-py{self.spec.python}" if self.spec.python else "")
        venv = self.settings.opt / "venvs" / name
        ready = venv / ".tpu-platform-installed"
        if ready.is_file():
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        python = str(venv / "bin" / "python")
        constrained: list[str] = []
        if self.settings.pip_constraints:
            constraints = venv.parent / (name + ".constraints.txt")
            constraints.write_text("".join(c + "\n" for c in self.settings.pip_constraints))
            constrained = ["-c", str(constraints)]
        if self.spec.python:
            uv = self._uv()
            steps = [[uv, "venv", "--quiet", "--python", self.spec.python, "--system-site-packages", str(venv)]]
            if requirements.is_file():
                steps.append(
                    [uv, "pip", "install", "--quiet", "--python", python, "-r", "requirements.txt", *constrained]
                )
        else:
            # --without-pip: Ubuntu splits ensurepip into python3-venv, which a TPU image need not have; the
            # image's pip (system site-packages, visible here) installs into the venv all the same.
            steps = [[self.settings.python, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)]]
            if requirements.is_file():
                pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
                steps.append([*pip, "-r", "requirements.txt", *constrained])
        for argv in steps:
            self._install_step(argv, folder)
        ready.write_text(utc_now() + "\n")
        self.log(f"virtualenv {venv} ready", run=self.spec.run_id)
        return venv

    def _uv(self) -> str:
        """`uv` from PATH, else installed once next to the agent's own files (a real VM reaches the index)."""
        found = shutil.which("uv")
        if found:
            return found
        tools = self.settings.opt / "tools"
        uv = tools / "bin" / "uv"
        if not uv.is_file():
            pip = [self.settings.python, "-m", "pip", "install", "--quiet", "--target", str(tools), "uv"]
            self._install_step(pip, None)
        return str(uv)

    def _install_step(self, argv: list[str], cwd: Path | None) -> None:
        with self._lock:
            if self._stop.is_set():
                raise SourceError("stopped while installing")
            process = subprocess.Popen(
                argv, cwd=str(cwd) if cwd else None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            self._process = process
        output, _ = process.communicate()
        with self._lock:
            self._process = None
        text = output.decode(errors="replace")
        for line in text.splitlines():
            print(line, flush=True)
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
            token = Tokens(self.settings.metadata_url).get()
        except StorageError as error:
            raise SourceError(f"no access token from the metadata server to pull {source.image}: {error}") from None
        login = [docker, "login", "-u", "oauth2accesstoken", "--password-stdin", f"https://{registry_host}"]
        done = subprocess.run(login, input=token.encode(), capture_output=True, check=False)
        if done.returncode != 0:
            raise SourceError(f"docker login to {registry_host} failed: {done.stderr.decode(errors='replace').strip()}")
        self._install_step([docker, "pull", source.image], None)  # a stop interrupts a long pull
        container = "tpu-platform-" + re.sub(r"[^A-Za-z0-9_.-]", "-", self.spec.run_id)[-100:]
        argv = [docker, "run", "--rm", "--name", container, "--privileged", "--net=host"]
        for name in sorted(env):
            argv += ["-e", name]  # `-e NAME` takes the value from the client's environment: not in `ps`
        argv += [source.image, *self.spec.command]
        return Prepared(argv, None, {**os.environ, **env}, container)

    # ---------------------------------------------------------------------------------- records
    def _end(self, state: str) -> None:
        self.ended_at = utc_now()
        if state != "failed":
            self.error = ""  # a retry's message is history once the run ends well
        self._record(state)
        if state == "finished" and self.spec.completion and self.settings.worker_id == 0:
            marker = completion_marker(self.spec, self.steps, {})
            self._write(COMPLETE, marker)  # last: the guard stops or deletes the VM when it appears
        self.log(f"run {self.spec.run_id} {state}" + (f": {self.error}" if state == "failed" else ""),
                 severity="ERROR" if state == "failed" else "INFO", run=self.spec.run_id)  # fmt: skip

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
        if self.spec.request:  # the researcher side's record of where the run came from (vm_agent/requests.py)
            record["request"] = self.spec.request
            record["spec"] = self.request_spec()  # what a reboot resumes from (requests.py `unfinished`)
        return record

    def request_spec(self) -> dict[str, Any]:
        """The request's fields (vm_agent/requests.py REQUEST_FIELDS) of this run."""
        spec = self.spec
        fields = {"runId": spec.run_id, "source": spec.source.describe(), "command": list(spec.command),
                  "env": dict(spec.env), "requester": spec.requester}  # fmt: skip
        if spec.python:
            fields["python"] = spec.python
        return fields

    def _write(self, name: str, record: dict[str, Any]) -> None:
        try:
            self.status.write_json(name, record)
        except (StorageError, OSError) as error:  # a lost status write must not stop the run
            self.log(f"could not write {self.status.url}/{name}: {error}", severity="WARNING", run=self.spec.run_id)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unpack(archive: Path, target: Path) -> None:
    """Unpack refusing what could write outside `target`: absolute names, `..`, links out, devices."""
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts:
                raise ValueError(f"archive member {member.name!r} would land outside the folder")
            if member.issym() or member.islnk():
                link = Path(member.name).parent / member.linkname
                if member.linkname.startswith("/") or ".." in link.parts:
                    raise ValueError(f"archive link {member.name!r} -> {member.linkname!r} points outside the folder")
            elif not (member.isfile() or member.isdir()):
                raise ValueError(f"archive member {member.name!r} is not a file, folder or link")
        if hasattr(tarfile, "data_filter"):  # 3.12, and security releases of 3.8 to 3.11
            tar.extractall(target, members=members, filter="data")
        else:
            tar.extractall(target, members=members)
