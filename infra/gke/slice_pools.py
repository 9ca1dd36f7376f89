"""One TPU slice pool of the GKE engine: a node pool per slice, and a TPU7x pool's workload policy."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.apis import ProjectApis
from infra.config import Env
from infra.config.model import SlicePoolSettings
from infra.gke import specs
from infra.gke.cluster import GkeCluster

# Fields GKE sets on a TPU node pool by itself and reports back (SMT off on a TPU host, the TPU as a guest
# accelerator, the kubelet's and shielded VM's defaults, upgrade settings): untracked, they read as
# changes to fields that force a new pool, which would rebuild the slice and drop its chips at the next
# `up` (vllm-project/ci-infra, terraform/gcp_old/tpu-inference/k8s/workers.tf, ignore_changes).
REPORTED_BY_GKE = (
    "nodeConfig.advancedMachineFeatures",
    "nodeConfig.guestAccelerators",
    "nodeConfig.kubeletConfig",
    "nodeConfig.shieldedInstanceConfig",
    "upgradeSettings",
)


@dataclass(frozen=True)
class SlicePoolArgs:
    pool: SlicePoolSettings
    upgrades: str  # end-of-support | maintenance-window (infra/gke/specs.py node_pool_args)


class SlicePool(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: SlicePoolArgs,
        cluster: GkeCluster,
        apis: ProjectApis,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:gke:SlicePool", name, None, opts)
        pool = args.pool
        self.shape = specs.shape_of(pool)
        needs: list[pulumi.Resource] = [*apis.needs("container"), *cluster.grants]
        self.workload_policy: gcp.compute.ResourcePolicy | None = None
        policy_name = None
        if pool.accelerator.needs_workload_policy:
            policy = specs.workload_policy_args(pool, env.stack)
            self.workload_policy = gcp.compute.ResourcePolicy(
                f"{name}-workload-policy",
                project=env.project,
                description=f"Places each {pool.accelerator.name} slice of pool {pool.name} ({env.stack}) as one unit",
                **policy,
                opts=pulumi.ResourceOptions(parent=self, depends_on=apis.needs("compute")),
            )
            policy_name = policy["name"]
            needs.append(self.workload_policy)
        self.node_pools: list[gcp.container.NodePool] = []
        for index in range(pool.slices):
            spec = specs.node_pool_args(pool, index, upgrades=args.upgrades, labels=env.labels, policy_name=policy_name)
            spec["node_config"]["service_account"] = cluster.node_email
            self.node_pools.append(
                gcp.container.NodePool(
                    f"{name}-{index}",
                    project=env.project,
                    cluster=cluster.cluster.name,
                    **spec,
                    opts=pulumi.ResourceOptions(parent=self, depends_on=needs, ignore_changes=list(REPORTED_BY_GKE)),
                )
            )
        self.outputs = {
            "acceleratorType": pool.accelerator.name,
            "zone": pool.zone,
            "provisioning": pool.provisioning,
            "nodePools": specs.node_pool_names(pool),
            "slices": pool.slices,
            "topology": self.shape.topology,
            "machineType": self.shape.machine_type,
            "vmsPerSlice": self.shape.vms_per_slice,
            "chips": self.shape.chips,
            "workloadPolicy": policy_name,
        }
        self.register_outputs(self.outputs)
