"""The Cloud TPU API backend: one `gcp.tpu.V2Vm` per node.

Only description, labels, metadata, tags and data disks update in place; anything else replaces the
VM. The workload lives in metadata, so changing it never replaces the VM.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.tpu.backend import TpuNodeSpec
from infra.tpu.queued import QueuedTpuBackend

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class CloudTpuBackend:
    name = "cloud-tpu"

    def create_node(self, resource_name: str, spec: TpuNodeSpec, opts: pulumi.ResourceOptions) -> gcp.tpu.V2Vm:
        return gcp.tpu.V2Vm(
            resource_name,
            name=spec.node_id,
            project=spec.project,
            zone=spec.zone,
            accelerator_type=spec.accelerator_type,
            runtime_version=spec.runtime_version,
            description=spec.description,
            network_config=gcp.tpu.V2VmNetworkConfigArgs(
                network=spec.network,
                subnetwork=spec.subnetwork,
                enable_external_ips=False,
                can_ip_forward=False,
            ),
            # Access is limited by the account's IAM roles; the scope only has to allow them.
            service_account=gcp.tpu.V2VmServiceAccountArgs(
                email=spec.service_account_email, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            scheduling_config=gcp.tpu.V2VmSchedulingConfigArgs(
                spot=spec.provisioning == "spot",
                preemptible=spec.provisioning == "preemptible",
                reserved=spec.provisioning == "reserved",
            ),
            shielded_instance_config=(
                gcp.tpu.V2VmShieldedInstanceConfigArgs(enable_secure_boot=True) if spec.secure_boot else None
            ),
            labels=spec.labels,
            tags=spec.tags,
            metadata=spec.metadata,
            opts=opts,
        )


BACKENDS = {CloudTpuBackend.name: CloudTpuBackend(), QueuedTpuBackend.name: QueuedTpuBackend()}
