"""One TPU VM (single host or a multi-host slice) running one workload."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra import naming
from infra.apis import ProjectApis
from infra.config import Env, TpuVmSettings
from infra.grants import propagation_wait
from infra.identity import WorkloadIdentity
from infra.network import TPU_VM_TAG, PrivateNetwork
from infra.tpu.backend import TpuBackend, TpuNodeSpec
from infra.tpu.queued import QueuedCapacity, QueuedTpu, QueuedTpuBackend

SECONDS_PER_HOUR = 3600
TPU_VM_APIS = ("tpu.googleapis.com",)


def ssh_command(project: str, vm: TpuVmSettings, zone: str | None = None) -> str:
    """`zone`: where the TPUs are, when a queued request got a fallback zone (its `zone` output)."""
    workers = " --worker=all" if vm.accelerator.multi_host else ""
    node = f"{vm.name}-0" if vm.node_count > 1 else vm.name  # a multislice's first slice
    return (
        f"gcloud compute tpus tpu-vm ssh {node} --zone {zone or vm.zone} --project {project}"
        f" --tunnel-through-iap{workers}"
    )


def console_url(project: str, vm: TpuVmSettings, zone: str | None = None) -> str:
    node = f"{vm.name}-0" if vm.node_count > 1 else vm.name
    return f"https://console.cloud.google.com/compute/tpus/details/{zone or vm.zone}/{node}?project={project}"


def _commands(project: str, vm: TpuVmSettings, zone: pulumi.Input[str]) -> dict[str, pulumi.Input[str]]:
    """How to reach the VM: plain strings when its zone is known at plan time, else once the request has one."""

    def commands(z: str) -> dict[str, str]:
        ssh = ssh_command(project, vm, z)
        return {
            "sshCommand": ssh,
            "logsCommand": f"{ssh} --command 'journalctl -u tpu-workload-{vm.workload} -f'",
            "consoleUrl": console_url(project, vm, z),
        }

    if isinstance(zone, str):
        return dict(commands(zone))
    known = pulumi.Output.from_input(zone)
    return {key: known.apply(lambda z, key=key: commands(z)[key]) for key in commands(vm.zone)}


def queued_capacity(vm: TpuVmSettings, network: PrivateNetwork) -> QueuedCapacity:
    """What a `capacity: queued` VM asks for beyond the node spec: its stack settings, mapped."""
    return QueuedCapacity(
        fallback_zones=tuple((z, network.subnets[z.rsplit("-", 1)[0]].id) for z in vm.fallback_zones),
        node_count=vm.node_count,
        reservation_name=vm.reservation_name,
        max_run_duration_s=round((vm.run_duration_hours or 0) * SECONDS_PER_HOUR),
        provisioning=vm.provisioning,
    )


def multi_host_job(vm: TpuVmSettings) -> bool:
    """More than one host: a multi-host slice, or a multislice of several slices (infra/network.py job rules)."""
    return vm.accelerator.multi_host or vm.node_count > 1


class TpuVm(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        vm: TpuVmSettings,
        metadata: dict[str, str],
        identity: WorkloadIdentity,
        network: PrivateNetwork,
        backend: TpuBackend,
        apis: ProjectApis,
        needs: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:tpu:TpuVm", name, None, opts)
        spec = TpuNodeSpec(
            node_id=vm.name,
            project=env.project,
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
                **env.labels,
                "workload": vm.workload,
                "provisioning": vm.provisioning,
            },
            # Its job's own tag only on a VM of more than one host: its hosts and slices reach each other.
            tags=[TPU_VM_TAG, *([naming.job_tag(env.stack, vm.name)] if multi_host_job(vm) else [])],
            metadata=metadata,
            description=vm.description or f"{vm.workload} on {vm.accelerator.name} ({env.stack})",
        )
        # Wait for the identity's grants to apply, and the NAT: the workload starts at boot and needs both
        # (a queued VM may land in any of its zones: every region's NAT).
        nats = [network.nats[z.rsplit("-", 1)[0]] for z in dict.fromkeys(vm.zones)]
        granted = propagation_wait(f"{name}-grants-applied", [*needs, *identity.grants], parent=self)
        opts = pulumi.ResourceOptions(
            parent=self, depends_on=[*apis.needs("tpu"), *needs, *identity.grants, granted, *nats]
        )
        if vm.queued:
            assert isinstance(backend, QueuedTpuBackend), f"{vm.name} is queued: it needs the queued backend"
            self.node: pulumi.CustomResource = backend.create_node(
                f"{name}-node", spec, opts, queued_capacity(vm, network)
            )
        else:
            self.node = backend.create_node(f"{name}-node", spec, opts)
        # A queued request records the zone it got (a fallback zone after a stock-out): outputs use it.
        zone: pulumi.Input[str] = self.node.zone if isinstance(self.node, QueuedTpu) else vm.zone
        self.outputs = {
            "name": vm.name,
            "zone": zone,
            "capacity": vm.capacity,
            "slices": vm.node_count,
            "acceleratorType": vm.accelerator.name,
            "chips": vm.accelerator.chips,
            "hosts": vm.accelerator.hosts,
            "provisioning": vm.provisioning,
            "onCompletion": vm.on_completion,
            "runtimeVersion": vm.runtime_version,
            "workload": vm.workload,
            "serviceAccount": identity.email,
            "startupScriptBytes": len(metadata["startup-script"].encode()),
            **_commands(env.project, vm, zone),
        }
        self.register_outputs(self.outputs)
