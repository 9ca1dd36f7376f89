"""One TPU VM (single host or a multi-host slice) running one workload."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.config import PlatformConfig, TpuVmSettings
from infra.identity import WorkloadIdentity
from infra.network import TPU_VM_TAG, PrivateNetwork
from infra.tpu.backend import TpuBackend, TpuNodeSpec


def ssh_command(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    workers = " --worker=all" if vm.accelerator.multi_host else ""
    return (
        f"gcloud compute tpus tpu-vm ssh {vm.name} --zone {vm.zone} --project {cfg.project}"
        f" --tunnel-through-iap{workers}"
    )


def console_url(cfg: PlatformConfig, vm: TpuVmSettings) -> str:
    return f"https://console.cloud.google.com/compute/tpus/details/{vm.zone}/{vm.name}?project={cfg.project}"


class TpuVm(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: PlatformConfig,
        vm: TpuVmSettings,
        metadata: dict[str, str],
        identity: WorkloadIdentity,
        network: PrivateNetwork,
        backend: TpuBackend,
        needs: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:tpu:TpuVm", name, None, opts)
        spec = TpuNodeSpec(
            node_id=vm.name,
            project=cfg.project,
            zone=vm.zone,
            accelerator_type=vm.accelerator.name,
            runtime_version=vm.runtime_version,
            provisioning=vm.provisioning,
            service_account_email=identity.email,
            network=network.network.id,
            subnetwork=network.subnets[vm.region].id,
            secure_boot=vm.accelerator.generation.secure_boot,
            labels={
                **dict(vm.labels),
                **cfg.labels,
                "workload": vm.workload,
                "provisioning": vm.provisioning,
            },
            tags=[TPU_VM_TAG],
            metadata=metadata,
            description=vm.description or f"{vm.workload} on {vm.accelerator.name} ({cfg.stack})",
        )
        # Wait for the identity's grants and the NAT: the workload starts at boot and needs both.
        self.node = backend.create_node(
            f"{name}-node",
            spec,
            pulumi.ResourceOptions(
                parent=self,
                depends_on=[*needs, *identity.grants, network.nats[vm.region]],
            ),
        )
        self.outputs = {
            "name": vm.name,
            "zone": vm.zone,
            "acceleratorType": vm.accelerator.name,
            "chips": vm.accelerator.chips,
            "hosts": vm.accelerator.hosts,
            "provisioning": vm.provisioning,
            "onCompletion": vm.on_completion,
            "runtimeVersion": vm.runtime_version,
            "workload": vm.workload,
            "serviceAccount": identity.email,
            "startupScriptBytes": len(metadata["startup-script"].encode()),
            "sshCommand": ssh_command(cfg, vm),
            "logsCommand": f"{ssh_command(cfg, vm)} --command 'journalctl -u tpu-workload-{vm.workload} -f'",
            "consoleUrl": console_url(cfg, vm),
        }
        self.register_outputs(self.outputs)
