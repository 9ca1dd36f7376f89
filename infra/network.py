"""A private network per environment for TPU VMs (S17, S25).

No external IPs anywhere: Private Google Access reaches Google APIs (Cloud Storage, Logging) and a
Cloud NAT per region reaches package indexes. Ingress is closed except SSH from Google's IAP range
and traffic between the workers of a multi-host slice. OS Login is on for the project.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.apis import ProjectApis
from infra.config import Env, NetworkSettings

# Google's IAP TCP-forwarding range (https://cloud.google.com/iap/docs/using-tcp-forwarding).
IAP_SSH_RANGE = "35.235.240.0/20"
TPU_VM_TAG = "tpu-vm"
NETWORK_APIS = ("compute.googleapis.com",)


@dataclass(frozen=True)
class ClusterRanges:
    """The GKE cluster's own subnet: its nodes' range, and its pods' and services' secondary ranges."""

    region: str
    nodes: str
    pods: str
    services: str


class PrivateNetwork(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: NetworkSettings,
        apis: ProjectApis,
        opts: pulumi.ResourceOptions | None = None,
        *,
        cluster: ClusterRanges | None = None,
    ):
        super().__init__("tpu-platform:network:PrivateNetwork", name, None, opts)
        base = f"tpu-{env.stack}"
        compute = pulumi.ResourceOptions(parent=self, depends_on=apis.needs("compute"))
        self.network = gcp.compute.Network(
            f"{name}-vpc",
            name=base,
            project=env.project,
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            description=f"TPU VMs of stack {env.stack}",
            opts=compute,
        )
        child = pulumi.ResourceOptions(parent=self)
        self.subnets: dict[str, gcp.compute.Subnetwork] = {}
        self.nats: dict[str, gcp.compute.RouterNat] = {}
        for region, cidr in args.subnets:
            subnet = gcp.compute.Subnetwork(
                f"{name}-{region}",
                name=f"{base}-{region}",
                project=env.project,
                region=region,
                network=self.network.id,
                ip_cidr_range=cidr,
                private_ip_google_access=True,
                log_config=gcp.compute.SubnetworkLogConfigArgs(
                    aggregation_interval="INTERVAL_5_SEC",
                    flow_sampling=args.flow_log_sampling,
                    metadata="INCLUDE_ALL_METADATA",
                ),
                opts=child,
            )
            router = gcp.compute.Router(
                f"{name}-{region}-router",
                name=f"{base}-{region}",
                project=env.project,
                region=region,
                network=self.network.id,
                opts=child,
            )
            self.subnets[region] = subnet
            self.nats[region] = gcp.compute.RouterNat(
                f"{name}-{region}-nat",
                name=f"{base}-{region}",
                project=env.project,
                region=region,
                router=router.name,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
                subnetworks=[
                    gcp.compute.RouterNatSubnetworkArgs(name=subnet.id, source_ip_ranges_to_nats=["ALL_IP_RANGES"])
                ],
                log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
                opts=child,
            )

        self.cluster_subnet: gcp.compute.Subnetwork | None = None
        self.cluster_nat: gcp.compute.RouterNat | None = None
        if cluster is not None:
            self._cluster_subnet(name, env, cluster, args.flow_log_sampling, child)

        gcp.compute.Firewall(
            f"{name}-ssh-from-iap",
            name=f"{base}-ssh-from-iap",
            project=env.project,
            network=self.network.id,
            direction="INGRESS",
            source_ranges=[IAP_SSH_RANGE],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            target_tags=[TPU_VM_TAG],
            log_config=gcp.compute.FirewallLogConfigArgs(metadata="INCLUDE_ALL_METADATA"),
            description="SSH only through Identity-Aware Proxy",
            opts=child,
        )
        if args.subnets:
            # Workers of a multi-host slice exchange data with each other.
            gcp.compute.Firewall(
                f"{name}-between-tpu-workers",
                name=f"{base}-between-tpu-workers",
                project=env.project,
                network=self.network.id,
                direction="INGRESS",
                source_tags=[TPU_VM_TAG],
                target_tags=[TPU_VM_TAG],
                allows=[
                    gcp.compute.FirewallAllowArgs(protocol="tcp"),
                    gcp.compute.FirewallAllowArgs(protocol="udp"),
                    gcp.compute.FirewallAllowArgs(protocol="icmp"),
                ],
                description="Traffic between the workers of TPU slices",
                opts=child,
            )
        # OS Login is switched on in each TPU VM's own metadata (infra/tpu/metadata.py), not project-wide:
        # project metadata (setCommonInstanceMetadata) would also need act-as on the Compute default account
        # (reference/gcp-iam/methods.json), and would change every VM of the project.
        self.register_outputs({"network": self.network.self_link})

    def _cluster_subnet(
        self, name: str, env: Env, ranges: ClusterRanges, sampling: float, child: pulumi.ResourceOptions
    ) -> None:
        """The GKE cluster's subnet, with its own router and NAT: private nodes reach Google's APIs through
        Private Google Access and every other registry (registry.k8s.io serves JobSet and Kueue) through the
        NAT. Its own router, so the VMs' subnet in the same region keeps its NAT unchanged."""
        base = naming.gke_subnet(env.stack)
        self.cluster_subnet = gcp.compute.Subnetwork(
            f"{name}-gke",
            name=base,
            project=env.project,
            region=ranges.region,
            network=self.network.id,
            ip_cidr_range=ranges.nodes,
            secondary_ip_ranges=[
                gcp.compute.SubnetworkSecondaryIpRangeArgs(range_name=naming.GKE_POD_RANGE, ip_cidr_range=ranges.pods),
                gcp.compute.SubnetworkSecondaryIpRangeArgs(
                    range_name=naming.GKE_SERVICE_RANGE, ip_cidr_range=ranges.services
                ),
            ],
            private_ip_google_access=True,
            log_config=gcp.compute.SubnetworkLogConfigArgs(
                aggregation_interval="INTERVAL_5_SEC", flow_sampling=sampling, metadata="INCLUDE_ALL_METADATA"
            ),
            opts=child,
        )
        router = gcp.compute.Router(
            f"{name}-gke-router", name=base, project=env.project, region=ranges.region, network=self.network.id,
            opts=child,
        )  # fmt: skip
        self.cluster_nat = gcp.compute.RouterNat(
            f"{name}-gke-nat",
            name=base,
            project=env.project,
            region=ranges.region,
            router=router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
            # Pods' own addresses too: with Dataplane V2 a pod's egress leaves from its pod range.
            subnetworks=[
                gcp.compute.RouterNatSubnetworkArgs(
                    name=self.cluster_subnet.id, source_ip_ranges_to_nats=["ALL_IP_RANGES"]
                )
            ],
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=child,
        )
