"""A private network per environment for TPU VMs.

No external IPs anywhere: Private Google Access reaches Google APIs (Cloud Storage, Logging) and a
Cloud NAT per region reaches package indexes. Ingress is closed except SSH from Google's IAP range
and, per job, traffic between the hosts of one multi-host slice and the slices of one multislice job:
each such VM carries a network tag of its own (`naming.job_tag`; a multislice's slices are one VM entry,
so they share it), and one firewall rule lets that tag reach that tag only. Two jobs never reach each
other, nor does a single-host VM reach any other VM. OS Login is on for the project.

`egress: google-only` denies every egress of the TPU VMs but Google's APIs through
private.googleapis.com (199.36.153.8/30, "Private Google Access", domain options), the stack's own
subnets (a job's hosts) and the metadata server (always reachable: firewall rules do not apply to it),
with private DNS zones that resolve `*.googleapis.com`, `*.pkg.dev` and `*.gcr.io` to that range (Private
Google Access, "DNS configuration"). A package index is reached only as an Artifact Registry Python
repository (`packageIndex`, a Google API). A VPC firewall rule matches addresses, not names: a rule by
name (pypi.org) needs Cloud NGFW's FQDN objects in a network firewall policy, and VPC Service Controls
(restricted.googleapis.com and a perimeter around the project's services) is the stronger option,
which also stops a run from copying data to a bucket of another project. Neither is made here.
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
# private.googleapis.com ("Private Google Access", domain options): the VIP range, and what resolves to it.
PRIVATE_GOOGLE_ACCESS = ("199.36.153.8", "199.36.153.9", "199.36.153.10", "199.36.153.11")
PRIVATE_GOOGLE_ACCESS_RANGE = "199.36.153.8/30"
PRIVATE_DOMAINS = ("googleapis.com", "pkg.dev", "gcr.io")


def network_apis(args: NetworkSettings) -> tuple[str, ...]:
    """Compute Engine, and Cloud DNS for the private zones of `egress: google-only`."""
    return (*NETWORK_APIS, *(("dns.googleapis.com",) if args.egress == "google-only" else ()))


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
        jobs: tuple[str, ...] = (),  # the TPU VMs of more than one host (a slice, a multislice)
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
        everything = [gcp.compute.FirewallAllowArgs(protocol=p) for p in ("tcp", "udp", "icmp")]
        for vm in jobs:
            # The hosts of one slice, and the slices of one multislice job, reach each other: nothing else.
            tag = naming.job_tag(env.stack, vm)
            gcp.compute.Firewall(
                f"{name}-job-{vm}",
                name=tag,
                project=env.project,
                network=self.network.id,
                direction="INGRESS",
                source_tags=[tag],
                target_tags=[tag],
                allows=everything,
                description=f"Traffic between the hosts and slices of TPU VM {vm} only",
                opts=child,
            )
        self.private_zones: list[gcp.dns.ManagedZone] = []
        if args.egress == "google-only":
            self._google_only(name, env, args, apis, child)
        # OS Login is switched on in each TPU VM's own metadata (infra/tpu/metadata.py), not project-wide:
        # project metadata (setCommonInstanceMetadata) would also need act-as on the Compute default account
        # (reference/gcp-iam/methods.json), and would change every VM of the project.
        self.register_outputs({"network": self.network.self_link})

    def _google_only(
        self, name: str, env: Env, args: NetworkSettings, apis: ProjectApis, child: pulumi.ResourceOptions
    ) -> None:
        """Egress for TPU VMs: Google's APIs through private.googleapis.com and the stack's subnets, nothing else."""
        base = f"tpu-{env.stack}"
        rules = (
            (
                "egress-google",
                "ALLOW",
                1000,
                [PRIVATE_GOOGLE_ACCESS_RANGE],
                [("tcp", ["443"])],
                "Google APIs through private.googleapis.com only",
            ),
            (
                "egress-jobs",
                "ALLOW",
                1000,
                [cidr for _, cidr in args.subnets],
                [("tcp", []), ("udp", []), ("icmp", [])],
                "The hosts of a job (each VM's ingress rule admits its own job only)",
            ),
            ("egress-deny", "DENY", 65000, ["0.0.0.0/0"], [("all", [])], "Nothing else (egress: google-only)"),
        )
        for suffix, action, priority, ranges, protocols, description in rules:
            allow = action == "ALLOW"
            gcp.compute.Firewall(
                f"{name}-{suffix}",
                name=f"{base}-{suffix}",
                project=env.project,
                network=self.network.id,
                direction="EGRESS",
                priority=priority,
                destination_ranges=ranges,
                target_tags=[TPU_VM_TAG],
                log_config=gcp.compute.FirewallLogConfigArgs(metadata="INCLUDE_ALL_METADATA"),
                description=description,
                opts=child,
                allows=[gcp.compute.FirewallAllowArgs(protocol=p, ports=ports or None) for p, ports in protocols]
                if allow
                else None,
                denies=None
                if allow
                else [gcp.compute.FirewallDenyArgs(protocol=p, ports=ports or None) for p, ports in protocols],
            )
        dns = pulumi.ResourceOptions(parent=self, depends_on=apis.needs("dns"))
        for domain in PRIVATE_DOMAINS:
            key = domain.replace(".", "-")
            zone = gcp.dns.ManagedZone(
                f"{name}-{key}",
                name=f"{base}-{key}",
                project=env.project,
                dns_name=f"{domain}.",
                visibility="private",
                description=f"{domain} through private.googleapis.com (egress: google-only)",
                private_visibility_config=gcp.dns.ManagedZonePrivateVisibilityConfigArgs(
                    networks=[gcp.dns.ManagedZonePrivateVisibilityConfigNetworkArgs(network_url=self.network.id)]
                ),
                opts=dns,
            )
            self.private_zones.append(zone)
            after = pulumi.ResourceOptions(parent=self, depends_on=[zone])
            # The domain's names to the private.googleapis.com addresses (Private Google Access, DNS configuration).
            apex = "private.googleapis.com." if domain == "googleapis.com" else f"{domain}."
            for suffix, record, kind, data in (
                ("apex", apex, "A", list(PRIVATE_GOOGLE_ACCESS)),
                ("any", f"*.{domain}.", "CNAME", [apex]),
            ):
                gcp.dns.RecordSet(
                    f"{name}-{key}-{suffix}",
                    name=record,
                    managed_zone=zone.name,
                    type=kind,
                    ttl=300,
                    rrdatas=data,
                    project=env.project,
                    opts=after,
                )

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
            f"{name}-gke-router",
            name=base,
            project=env.project,
            region=ranges.region,
            network=self.network.id,
            opts=child,
        )
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
