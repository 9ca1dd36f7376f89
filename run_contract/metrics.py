"""The Cloud Monitoring metrics the platform writes, declared once: the VM agent writes their points
(vm_agent/telemetry.py), the dashboard charts them (infra/monitoring.py), and a test checks each descriptor
against Google's monitoring.v3 discovery document (MetricDescriptor) and each point the agent writes against
its descriptor.

User-defined metrics live under `custom.googleapis.com/` (Cloud Monitoring, "User-defined metrics overview").
A descriptor is created by the first write of its type ("Auto-creation of metric descriptors"), with the
labels, kind and value type of that write: so the agent writes every point with exactly the labels,
kind and value type declared here, and the descriptor that results is this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from run_contract.timeline import BY_KEY

PREFIX = "custom.googleapis.com/tpu_platform/"


@dataclass(frozen=True)
class Metric:
    name: str  # the type's last part: `<PREFIX><name>`
    display_name: str
    description: str
    unit: str  # UCUM, as MetricDescriptor.unit says: "1" for a plain number, "s" seconds
    labels: tuple[tuple[str, str], ...]  # (key, description), all STRING
    kind: str = "GAUGE"
    value_type: str = "DOUBLE"

    @property
    def type(self) -> str:
        return PREFIX + self.name

    @property
    def label_keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.labels)

    def descriptor(self) -> dict[str, Any]:
        """The MetricDescriptor (monitoring.v3) the metric's first write creates."""
        return {
            "type": self.type,
            "metricKind": self.kind,
            "valueType": self.value_type,
            "unit": self.unit,
            "displayName": self.display_name,
            "description": self.description,
            "labels": [{"key": key, "valueType": "STRING", "description": what} for key, what in self.labels],
        }


RUN_LABELS = (
    ("run_id", "the run"),
    ("vm", "the TPU VM (tpuVms[].name)"),
    ("worker", "the worker of a multi-host slice; 0 for one host"),
)
# What a program's step lines say (vm_agent/telemetry.py reads them from its JSON lines).
TRAINING = (
    Metric("loss", "Training loss", "the program's `loss` at its last step line", "1", RUN_LABELS),
    Metric("steps_per_s", "Training steps per second", "the program's `steps_per_s`", "1/s", RUN_LABELS),
    Metric("examples_per_s", "Training examples per second", "the program's `examples_per_s`", "1/s", RUN_LABELS),
)
# A run's time by category (run_contract/timeline.py), as the agent measured it when the run ended in a boot:
# all its boots so far on the VM, by the agent's view of billed time (the report joins the node's states).
RUN_SECONDS = Metric(
    "run_seconds",
    "Run time by goodput category",
    "seconds of the run in each category so far (run_contract/timeline.py CATEGORIES); untrusted=true when a "
    "self-service program's step lines decide the category",
    "s",
    (*RUN_LABELS, ("category", "the timeline's category"), ("untrusted", "true or false")),
)
# The categories the agent measures itself (not the TPU API's queue, the guard's recovery wait, the VM's idle).
AGENT_CATEGORIES = tuple(key for key in BY_KEY if key not in ("queue", "recoveryWait", "idle"))
METRICS = (*TRAINING, RUN_SECONDS)
