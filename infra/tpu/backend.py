"""What every TPU backend takes and returns.

The Cloud TPU API (`gcp.tpu.V2Vm`) is in maintenance and newer TPUs (TPU7x) exist only through
Compute Engine or GKE; a backend for those implements `TpuBackend` and nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pulumi


@dataclass(frozen=True)
class TpuNodeSpec:
    node_id: str
    project: str
    zone: str
    accelerator_type: str
    runtime_version: str
    provisioning: str  # on-demand | spot | preemptible | reserved
    service_account_email: pulumi.Input[str]
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    secure_boot: bool
    labels: dict[str, str]
    tags: list[str]
    metadata: dict[str, str]
    description: str


class TpuBackend(Protocol):
    name: str

    def create_node(
        self, resource_name: str, spec: TpuNodeSpec, opts: pulumi.ResourceOptions
    ) -> pulumi.CustomResource: ...
