"""The training programs in `workloads/` that a workload can run: files shipped, framework, extras."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"
SUPPORT_FILES = ("runlib.py",)  # shared by every program: CLI contract, storage, checkpoints
# (import name, pinned requirement) every program needs beyond its framework; installed only if missing.
COMMON_REQUIREMENTS = (("google.cloud.storage", "google-cloud-storage==3.17.1"),)


@dataclass(frozen=True)
class Program:
    name: str
    framework: str  # "tensorflow" | "jax"
    filename: str
    requirements: tuple[tuple[str, str], ...] = ()

    @property
    def path(self) -> Path:
        return WORKLOADS_DIR / self.filename

    def source(self) -> str:
        return _read(self.path)

    def files(self) -> tuple[tuple[str, str], ...]:
        """(filename, source) of everything the VM needs; the entry point first."""
        return ((self.filename, self.source()), *((f, _read(WORKLOADS_DIR / f)) for f in SUPPORT_FILES))

    @property
    def all_requirements(self) -> tuple[tuple[str, str], ...]:
        return COMMON_REQUIREMENTS + self.requirements


@functools.cache  # read once per run, however many VMs ship the file
def _read(path: Path) -> str:
    return path.read_text()


PROGRAMS: dict[str, Program] = {
    "tf_mnist": Program("tf_mnist", "tensorflow", "tf_mnist/tf_mnist.py"),
    "jax_mnist": Program("jax_mnist", "jax", "jax_mnist/jax_mnist.py", (("optax", "optax==0.2.8"),)),
}
