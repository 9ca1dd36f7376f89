"""The GKE engine's cluster: regional, private, Workload Identity, Dataplane V2, on a release channel.

- **No default node pool.** GKE cannot create a cluster without one: it is created with one node per
  zone and removed at once (`remove_default_node_pool`), on the platform's node account, never the
  Compute Engine default account, which often holds Editor (and the deployer may not act as it). That
  account is the cluster's `node_config` only for this first pool, so later drift there is ignored
  (as GoogleCloudPlatform/cloud-foundation-fabric's gke-cluster-standard does; a set `node_config`
  otherwise replaces the cluster on every apply, hashicorp/terraform-provider-google#12070).
- **A small system pool** for the cluster's own pods, one node per zone of the slice pools.
- **Private nodes and no IP endpoint**: the control plane is reached only through its DNS endpoint,
  which IAM guards (`kubectl` and pulumi-kubernetes with `gke-gcloud-auth-plugin`); no client certificate,
  no legacy ABAC.
- **Upgrades on purpose**: on a release channel node auto-upgrade cannot be off (container.v1
  ReleaseChannel: "Node auto-upgrade defaults to true and cannot be disabled"), so upgrades happen in a
  weekly maintenance window, and TPU pools by default carry an exclusion until their version's end of
  support (infra/gke/specs.py), because an upgrade recreates a slice's nodes and kills its jobs.
- **The node account** holds `roles/container.defaultNodeServiceAccount` only (GKE, "Configure node
  service accounts": logs, metrics, autoscaling metrics); pods get their own identities through
  Workload Identity, never the node's. The bootstrap makes it and grants the deployer act-as on it
  (`gke_node_account`, infra/access/accounts.py); the stack grants it its role.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access.identities import gke_node_account
from infra.apis import ProjectApis
from infra.config import Env
from infra.config.model import GkeSettings
from infra.gke import specs
from infra.network import PrivateNetwork

GKE_APIS = (
    "container.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
)
NODE_ROLE = "roles/container.defaultNodeServiceAccount"


@dataclass(frozen=True)
class GkeClusterArgs:
    gke: GkeSettings


class GkeCluster(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: GkeClusterArgs,
        network: PrivateNetwork,
        apis: ProjectApis,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:gke:GkeCluster", name, None, opts)
        gke = args.gke
        if network.cluster_subnet is None or network.cluster_nat is None:
            raise ValueError("the network was declared without the cluster's subnet (ClusterRanges)")
        node_account = gke_node_account(env.stack)
        self.node_email = node_account.email(env.project)
        # Everything that attaches the node account waits for these grants (act-as is the bootstrap's).
        self.grants: list[pulumi.Resource] = [
            grants.project_role(
                f"{name}-nodes-{NODE_ROLE.removeprefix('roles/').replace('.', '-')}",
                env.project,
                NODE_ROLE,
                node_account.member(env.project),
                parent=self,
                depends_on=apis.needs("cloudresourcemanager"),
            )
        ]

        scopes = [specs.CLOUD_PLATFORM_SCOPE]
        self.cluster = gcp.container.Cluster(
            f"{name}-cluster",
            name=naming.gke_cluster(env.stack),
            project=env.project,
            location=gke.region,
            node_locations=list(gke.zones),
            network=network.network.id,
            subnetwork=network.cluster_subnet.id,
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config=gcp.container.ClusterNodeConfigArgs(
                service_account=self.node_email,
                oauth_scopes=scopes,
                workload_metadata_config=gcp.container.ClusterNodeConfigWorkloadMetadataConfigArgs(mode="GKE_METADATA"),
            ),
            datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2: eBPF networking, network policy built in
            ip_allocation_policy={
                "cluster_secondary_range_name": naming.GKE_POD_RANGE,
                "services_secondary_range_name": naming.GKE_SERVICE_RANGE,
            },
            # With no IP endpoint GKE reports the private endpoint as on: say so, or it diffs (Fabric).
            private_cluster_config={"enable_private_nodes": True, "enable_private_endpoint": True},
            control_plane_endpoints_config={
                "dns_endpoint_config": {"allow_external_traffic": True},
                "ip_endpoints_config": {"enabled": False},
            },
            master_auth={"client_certificate_config": {"issue_client_certificate": False}},
            # Google Groups for RBAC (container.v1 AuthenticatorGroupsConfig): the teams' group members are RBAC
            # subjects only when GKE looks them up in this group of groups; an update, not a replacement
            # (ClusterUpdate.desiredAuthenticatorGroupsConfig).
            authenticator_groups_config=(
                {"security_group": gke.rbac_security_group} if gke.rbac_security_group else None
            ),
            enable_legacy_abac=False,
            enable_shielded_nodes=True,
            workload_identity_config={"workload_pool": f"{env.project}.svc.id.goog"},
            release_channel={"channel": gke.release_channel},
            maintenance_policy=gcp.container.ClusterMaintenancePolicyArgs(
                recurring_window=gcp.container.ClusterMaintenancePolicyRecurringWindowArgs(
                    **specs.recurring_window(gke.maintenance)
                )
            ),
            resource_labels=env.labels,
            # A production cluster is kept from `pulumi destroy` twice: by GKE and by Pulumi.
            deletion_protection=env.production,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*apis.needs("container"), *self.grants, network.cluster_nat],
                ignore_changes=["nodeConfig"],
                protect=env.production,
            ),
        )
        self.system_pool = gcp.container.NodePool(
            f"{name}-system",
            name=naming.GKE_SYSTEM_POOL,
            project=env.project,
            cluster=self.cluster.name,
            location=gke.region,
            node_locations=list(gke.zones),
            node_count=gke.system_nodes_per_zone,  # per zone
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=gke.system_machine_type,
                service_account=self.node_email,
                oauth_scopes=scopes,
                workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
                    enable_secure_boot=True, enable_integrity_monitoring=True
                ),
                resource_labels={**env.labels, "gke-pool": naming.GKE_SYSTEM_POOL},
            ),
            management={"auto_repair": True, "auto_upgrade": True},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.endpoint = self.cluster.control_plane_endpoints_config.apply(
            lambda c: c.dns_endpoint_config.endpoint if c and c.dns_endpoint_config else None
        )
        self.outputs = {
            "name": self.cluster.name,
            "location": gke.region,
            "dnsEndpoint": self.endpoint,
            "nodeServiceAccount": self.node_email,
            "releaseChannel": gke.release_channel,
            "credentialsCommand": (
                f"gcloud container clusters get-credentials {naming.gke_cluster(env.stack)} --location {gke.region}"
                f" --project {env.project} --dns-endpoint"
            ),
        }
        self.register_outputs(self.outputs)
