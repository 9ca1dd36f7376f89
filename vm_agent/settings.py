"""The agent's static settings: `agent.env`, which the start-up script writes and systemd passes in.

Names as in docs/run-contract.md ("agent.env"); one strict parse that lists every problem.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from run_contract.names import REGISTRY, WorkerPlace, worker_place
from run_contract.spec import Allowed

from vm_agent.credentials import STS_URL
from vm_agent.gcs import metadata_url

DEFAULT_GRACE_SECONDS = 30.0  # a spot VM's preemption notice gives about 30 s
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_DELAY_SECONDS = 30.0
DEFAULT_POLL_SECONDS = 60.0  # the metadata wait's timeout, and how often the requests folder is listed


class SettingsError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("agent settings (agent.env): " + "; ".join(problems))


@dataclass(frozen=True)
class Settings:
    stack: str
    vm: str
    project: str
    root: Path
    status_dir: str  # gs://<status-bucket>/<vm> (a local folder for a dev run)
    artifacts: str  # gs://<artifacts-bucket>, or "" when the stack has none
    registry: str  # <region>-docker.pkg.dev/<project>/<repo>, or ""
    worker_id: int
    worker_count: int
    coordinator: str
    grace_s: float
    max_retries: int
    self_service: bool
    metadata_url: str
    # The TPU runtime's environment (from the catalog) passed on to the program and into a container.
    runtime_env: tuple[tuple[str, str], ...] = ()
    retry_delay_s: float = DEFAULT_RETRY_DELAY_SECONDS
    poll_s: float = DEFAULT_POLL_SECONDS
    # Where self-service runs keep checkpoints and models: `<bucket>/<workload>/<vm>/<runId>`, under the
    # workload account's grants; "" for a bucket the workload may not write (then the run gets no dir).
    workload: str = ""
    checkpoints: str = ""  # gs://<checkpoints-bucket>
    models: str = ""  # gs://<models-bucket>
    python: str = sys.executable  # the image's Python, which runs the programs (the agent has its own)
    docker: str = "docker"
    # Where the agent's claims on run uids live (machine-wide, so two agents of one machine never share a uid:
    # the tests) and the device nodes the TPU chips appear as (vm_agent/isolation.py).
    uid_locks: Path = Path("/run/tpu-platform/uids")
    devices: Path = Path("/dev")
    # The metadata server redirected to the agent's proxy for every run uid (vm_agent/firewall.py). Off only
    # where the firewall is not the VM's own to change: the tests' sandbox in the machine's shared network
    # namespace (the redirect is tested for real in a namespace of its own).
    metadata_redirect: bool = True
    sts_url: str = STS_URL
    iptables: str = "iptables"
    # Bounds the image's framework needs (e.g. protobuf<5 beside TensorFlow < 2.18; infra/catalog): kept
    # when a run's requirements are installed, so pip cannot upgrade a package from under the framework.
    pip_constraints: tuple[str, ...] = ()

    @property
    def allowed(self) -> Allowed:
        return Allowed(self.artifacts, self.registry)

    @property
    def opt(self) -> Path:
        return self.root / "opt" / "tpu-platform"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        problems: list[str] = []

        def text(name: str, required: bool = True, pattern: str = r".*") -> str:
            value = environ.get(name, "")
            if required and not value:
                problems.append(f"{name} is missing")
            elif value and not re.fullmatch(pattern, value):
                problems.append(f"{name}={value!r} does not match {pattern}")
            return value

        def number(name: str, default: float, low: float, high: float) -> float:
            value = environ.get(name, "")
            if not value:
                return default
            try:
                parsed = float(value)
            except ValueError:
                parsed = low - 1
            if not low <= parsed <= high:
                problems.append(f"{name}={value!r}: a number from {low:g} to {high:g}")
                return default
            return parsed

        stack = text("TPU_PLATFORM_STACK")
        vm = text("TPU_PLATFORM_VM")
        project = text("TPU_PLATFORM_PROJECT", required=False)
        status_dir = text("TPU_PLATFORM_STATUS_DIR")
        artifacts = text("TPU_PLATFORM_ARTIFACTS", required=False, pattern=r"gs://[a-z0-9][a-z0-9._-]*[a-z0-9]")
        registry = text("TPU_PLATFORM_REGISTRY", required=False, pattern=REGISTRY.pattern)
        self_service = text("TPU_PLATFORM_SELF_SERVICE", required=False, pattern=r"[01]")
        redirect = text("TPU_PLATFORM_METADATA_REDIRECT", required=False, pattern=r"[01]")
        bucket = r"gs://[a-z0-9][a-z0-9._-]*[a-z0-9]"
        workload = text("TPU_PLATFORM_WORKLOAD", required=False, pattern=r"[a-z][a-z0-9-]*")
        checkpoints = text("TPU_PLATFORM_CHECKPOINTS", required=False, pattern=bucket)
        models = text("TPU_PLATFORM_MODELS", required=False, pattern=bucket)
        if self_service == "1" and not workload:
            problems.append("TPU_PLATFORM_WORKLOAD is missing (self-service runs keep their files under it)")
        names = text("TPU_PLATFORM_RUNTIME_ENV", required=False, pattern=r"\w+(,\w+)*")
        try:
            place = worker_place(environ)
        except ValueError as error:
            problems.append(str(error))
            place = WorkerPlace(0, 1, "")
        root = Path(environ.get("TPU_PLATFORM_ROOT", "") or "/")
        settings = cls(
            stack=stack,
            vm=vm,
            project=project,
            root=root,
            status_dir=status_dir.rstrip("/"),
            artifacts=artifacts,
            registry=registry,
            worker_id=place.worker_id,
            worker_count=place.worker_count,
            coordinator=place.coordinator,
            grace_s=number("TPU_PLATFORM_GRACE_SECONDS", DEFAULT_GRACE_SECONDS, 1, 3600),
            max_retries=int(number("TPU_PLATFORM_MAX_RETRIES", DEFAULT_MAX_RETRIES, 0, 100)),
            self_service=self_service == "1",
            metadata_url=metadata_url(environ),  # GCE_METADATA_HOST, where google-auth looks too
            runtime_env=tuple((n, environ.get(n, "")) for n in names.split(",") if n) if names else (),
            retry_delay_s=number("TPU_PLATFORM_RETRY_DELAY_SECONDS", DEFAULT_RETRY_DELAY_SECONDS, 0, 3600),
            poll_s=number("TPU_PLATFORM_POLL_SECONDS", DEFAULT_POLL_SECONDS, 0.1, 3600),
            workload=workload,
            checkpoints=checkpoints,
            models=models,
            python=environ.get("TPU_PLATFORM_PYTHON", "") or sys.executable,
            pip_constraints=tuple(environ.get("TPU_PLATFORM_PIP_CONSTRAINTS", "").split()),
            uid_locks=Path(environ.get("TPU_PLATFORM_UID_LOCKS", "") or "/run/tpu-platform/uids"),
            devices=Path(environ.get("TPU_PLATFORM_DEVICES", "") or (root / "dev")),
            metadata_redirect=redirect != "0",
            sts_url=text("TPU_PLATFORM_STS_URL", required=False, pattern=r"https?://\S+") or STS_URL,
        )
        if problems:
            raise SettingsError(problems)
        return settings

    def contract_env(self) -> dict[str, str]:
        """What every run sees of this VM (the run's own locations are added per run)."""
        return {
            "TPU_PLATFORM_STATUS_DIR": self.status_dir,
            "TPU_PLATFORM_WORKER_ID": str(self.worker_id),
            "TPU_PLATFORM_WORKER_COUNT": str(self.worker_count),
            "TPU_PLATFORM_COORDINATOR": self.coordinator,
            "TPU_PLATFORM_GRACE_SECONDS": f"{self.grace_s:g}",
        }
