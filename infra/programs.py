"""The training programs in `workloads/` that a workload can run, and the framework each uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"


@dataclass(frozen=True)
class Program:
    name: str
    framework: str  # "tensorflow" | "jax"
    filename: str

    @property
    def path(self) -> Path:
        return WORKLOADS_DIR / self.filename

    def source(self) -> str:
        return self.path.read_text()


PROGRAMS: dict[str, Program] = {
    "tf_mnist": Program("tf_mnist", "tensorflow", "tf_mnist.py"),
}
