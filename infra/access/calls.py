"""Which REST methods the provider calls for each resource type the program and the bootstrap declare.

pulumi-gcp is bridged from the Terraform google provider, whose resources call their API's
create / get / patch / delete (IAM members: getIamPolicy then setIamPolicy, a read-modify-write of the
whole policy). Source of each row: `terraform-provider-google`, `google/services/<service>/resource_<name>.go`
(generated from magic-modules `mmv1/products/<product>/<Resource>.yaml`), and the page named in its
comment where a row departs from that pattern. A type missing here fails the permission tests with its
name: nothing is granted by guess.

`act_as` lists the input paths that attach a service account: Google checks `iam.serviceAccounts.actAs`
on that account (reference/gcp-iam/README.md; methods.json lists it for `nodes.create`). `fields` lists
the other inputs whose value makes the API check a permission of the caller on the resource it names
(`FieldCheck`); `FIELD_REVIEW` says, per type, which fields were searched for such checks and where.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PHASES = ("create", "read", "update", "delete")


@dataclass(frozen=True)
class FieldCheck:
    """An input whose value makes the API check `methods`' permissions of the caller, on the resource
    the value names (`projects/P/...`: checked in project P), when the resource is created or updated."""

    path: str
    methods: tuple[str, ...]
    evidence: str


@dataclass(frozen=True)
class Calls:
    create: tuple[str, ...]
    read: tuple[str, ...]
    update: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    act_as: tuple[str, ...] = ()
    fields: tuple[FieldCheck, ...] = ()
    # Extra methods that depend on the inputs (e.g. force_destroy empties a bucket first).
    extra: Callable[[Mapping[str, Any]], dict[str, tuple[str, ...]]] | None = field(default=None, compare=False)

    def methods(self, phase: str, inputs: Mapping[str, Any]) -> tuple[str, ...]:
        base: tuple[str, ...] = getattr(self, phase)
        return base + ((self.extra(inputs).get(phase, ())) if self.extra else ())


def _crud(prefix: str, *, create: str = "create", update: str | None = "patch", operations: str | None = None) -> Calls:
    """The common shape: `<prefix>.create/get/patch/delete`, polling `operations` for long-running calls."""
    poll = (operations,) if operations else ()
    return Calls(
        create=(f"{prefix}.{create}", f"{prefix}.get", *poll),
        read=(f"{prefix}.get",),
        update=(f"{prefix}.{update}", *poll) if update else (),
        delete=(f"{prefix}.delete", *poll),
    )


def _iam_member(resource: str) -> Calls:
    """`google_*_iam_member`: read the whole policy, add or remove one binding, write it back."""
    get, set_ = f"{resource}.getIamPolicy", f"{resource}.setIamPolicy"
    return Calls(create=(get, set_), read=(get,), update=(get, set_), delete=(get, set_))


def _bucket_extra(inputs: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    # force_destroy: the provider lists and deletes every object before deleting the bucket.
    return {"delete": ("storage.objects.list", "storage.objects.delete")} if inputs.get("forceDestroy") else {}


def _service_extra(inputs: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    # disable_on_destroy: false (the platform's choice) means destroy leaves the API enabled.
    return {"delete": ("serviceusage.services.disable",)} if inputs.get("disableOnDestroy") else {}


COMPUTE_GLOBAL_OPS = "compute.globalOperations.get"
COMPUTE_REGION_OPS = "compute.regionOperations.get"
GKE_CLUSTERS = "container.projects.locations.clusters"
GKE_NODE_POOLS = f"{GKE_CLUSTERS}.nodePools"
GKE_OPS = "container.projects.locations.operations.get"
# A request to the Kubernetes API through the cluster's DNS endpoint (no REST method of its own:
# iamdata.METHOD_FIXES says what Google checks on it).
KUBERNETES_API = "container.dnsEndpoint.request"
_FUNCTION = _crud(
    "cloudfunctions.projects.locations.functions", operations="cloudfunctions.projects.locations.operations.get"
)

RESOURCE_CALLS: dict[str, Calls] = {
    # resource_google_project_service.go: enable, then read the enabled list (services.list filtered
    # on state:ENABLED); waits on the Service Usage operation.
    "gcp:projects/service:Service": Calls(
        create=("serviceusage.services.enable", "serviceusage.services.list", "serviceusage.operations.get"),
        read=("serviceusage.services.list",),
        extra=_service_extra,
    ),
    # resource_google_project_service_identity.go: generateServiceIdentity; no read or delete call.
    "gcp:projects/serviceIdentity:ServiceIdentity": Calls(
        create=("serviceusage.services.generateServiceIdentity",), read=()
    ),
    "gcp:projects/iAMMember:IAMMember": _iam_member("cloudresourcemanager.projects"),
    # Audit configs live in the project's IAM policy (resource_google_project_iam_audit_config.go).
    "gcp:projects/iAMAuditConfig:IAMAuditConfig": _iam_member("cloudresourcemanager.projects"),
    # resource_google_project_iam_custom_role.go: an id deleted less than 37 days ago is undeleted
    # and patched instead of created.
    "gcp:projects/iAMCustomRole:IAMCustomRole": Calls(
        create=(
            "iam.projects.roles.create",
            "iam.projects.roles.get",
            "iam.projects.roles.undelete",
            "iam.projects.roles.patch",
        ),
        read=("iam.projects.roles.get",),
        update=("iam.projects.roles.patch",),
        delete=("iam.projects.roles.delete",),
    ),
    "gcp:serviceaccount/account:Account": _crud("iam.projects.serviceAccounts"),
    "gcp:serviceaccount/iAMMember:IAMMember": _iam_member("iam.projects.serviceAccounts"),
    "gcp:storage/bucket:Bucket": Calls(
        create=("storage.buckets.insert", "storage.buckets.get"),
        read=("storage.buckets.get",),
        update=("storage.buckets.patch",),
        delete=("storage.buckets.delete",),
        extra=_bucket_extra,
    ),
    "gcp:storage/bucketIAMMember:BucketIAMMember": _iam_member("storage.buckets"),
    # resource_dns_managed_zone.go (magic-modules ManagedZone.yaml): create, get, patch, delete; a private zone
    # is bound to its network on create (dns.networks.bindPrivateDNSZone, in iamdata's METHOD_FIXES).
    "gcp:dns/managedZone:ManagedZone": _crud("dns.managedZones"),
    # resource_dns_record_set.go: every write is a change (changes.create, then changes.get until done); a read
    # lists the zone's record sets of that name and type.
    "gcp:dns/recordSet:RecordSet": Calls(
        create=("dns.changes.create", "dns.changes.get", "dns.resourceRecordSets.list"),
        read=("dns.resourceRecordSets.list",),
        update=("dns.changes.create", "dns.changes.get"),
        delete=("dns.changes.create", "dns.changes.get"),
    ),
    # resource_logging_log_view.go (magic-modules LogView.yaml: create POST .../views?viewId=, read GET,
    # update PATCH with an updateMask, delete DELETE): a researcher's own view of the _Default log bucket.
    "gcp:logging/logView:LogView": _crud("logging.projects.locations.buckets.views"),
    # resource_logging_project_bucket_config.go: create reads the bucket first (one that exists is acquired and
    # updated), else POST buckets:createAsync and polls the operation, then reads it; update PATCH with an
    # updateMask; delete (resource_logging_bucket_config.go) DELETE. A team's log bucket (infra/gke/team_access.py).
    "gcp:logging/projectBucketConfig:ProjectBucketConfig": Calls(
        create=(
            "logging.projects.locations.buckets.get",
            "logging.projects.locations.buckets.createAsync",
            "logging.projects.locations.operations.get",
        ),
        read=("logging.projects.locations.buckets.get",),
        update=("logging.projects.locations.buckets.patch",),
        delete=("logging.projects.locations.buckets.delete",),
    ),
    # resource_logging_project_sink.go: create gets the sink (one that exists is acquired: patched), else
    # sinks.create, then reads it; update sinks.patch with an updateMask; delete sinks.delete.
    "gcp:logging/projectSink:ProjectSink": Calls(
        create=("logging.projects.sinks.get", "logging.projects.sinks.create"),
        read=("logging.projects.sinks.get",),
        update=("logging.projects.sinks.patch",),
        delete=("logging.projects.sinks.delete",),
    ),
    # Updates never happen here: the platform's objects set only bucket, name and source, and a new
    # source (its md5) forces a new object (resource_storage_bucket_object.go: ForceNew).
    "gcp:storage/bucketObject:BucketObject": Calls(
        create=("storage.objects.insert", "storage.objects.get"),
        read=("storage.objects.get",),
        delete=("storage.objects.delete",),
        extra=lambda inputs: (
            {"update": ("storage.objects.patch",)} if set(inputs) - {"bucket", "name", "source"} else {}
        ),
    ),
    "gcp:compute/network:Network": _crud("compute.networks", create="insert", operations=COMPUTE_GLOBAL_OPS),
    # resource_compute_subnetwork.go: private Google access is its own call.
    "gcp:compute/subnetwork:Subnetwork": Calls(
        create=("compute.subnetworks.insert", "compute.subnetworks.get", COMPUTE_REGION_OPS),
        read=("compute.subnetworks.get",),
        update=("compute.subnetworks.patch", "compute.subnetworks.setPrivateIpGoogleAccess", COMPUTE_REGION_OPS),
        delete=("compute.subnetworks.delete", COMPUTE_REGION_OPS),
    ),
    "gcp:compute/firewall:Firewall": _crud("compute.firewalls", create="insert", operations=COMPUTE_GLOBAL_OPS),
    "gcp:compute/router:Router": _crud("compute.routers", create="insert", operations=COMPUTE_REGION_OPS),
    # resource_compute_router_nat.go: a NAT is a field of its router: get the router, patch it.
    "gcp:compute/routerNat:RouterNat": Calls(
        create=("compute.routers.get", "compute.routers.patch", COMPUTE_REGION_OPS),
        read=("compute.routers.get",),
        update=("compute.routers.get", "compute.routers.patch", COMPUTE_REGION_OPS),
        delete=("compute.routers.get", "compute.routers.patch", COMPUTE_REGION_OPS),
    ),
    "gcp:tpu/v2Vm:V2Vm": Calls(
        **{
            k: v
            for k, v in vars(
                _crud("tpu.projects.locations.nodes", operations="tpu.projects.locations.operations.get")
            ).items()
            if k in PHASES
        },
        act_as=("serviceAccount.email",),
    ),
    # The queued-capacity dynamic provider (infra/tpu/queued.py), run by the deployer: create POSTs
    # queuedResources and polls the operation and the request; a stock-out deletes what it made before
    # the next zone; refresh GETs; an update sends nothing (only fallback zones changed); delete is
    # DELETE ?force=true and polls its operation. The node spec attaches the workload's account, so
    # act-as on it as for nodes.create (methods.json lists tpu.nodes.create for queuedResources.create;
    # Google's predefined TPU roles in roles.json hold no separate tpu.queuedResources.* permission).
    "pulumi-python:dynamic/tpu:QueuedResource": Calls(
        create=(
            "tpu.projects.locations.queuedResources.create",
            "tpu.projects.locations.queuedResources.get",
            "tpu.projects.locations.queuedResources.delete",
            "tpu.projects.locations.operations.get",
        ),
        read=("tpu.projects.locations.queuedResources.get",),
        delete=("tpu.projects.locations.queuedResources.delete", "tpu.projects.locations.operations.get"),
        act_as=("serviceAccountEmail",),
    ),
    # resource_artifact_registry_repository.go (magic-modules mmv1/products/artifactregistry/Repository.yaml):
    # create, patch (with an update mask) and delete. Create and delete return operations the provider
    # polls (projects.locations.operations.get), which check no permission of their own: "Artifact
    # Registry roles and permissions" (cloud.google.com/iam/docs/roles-permissions/artifactregistry)
    # lists every artifactregistry.* permission, and none is for operations.
    "gcp:artifactregistry/repository:Repository": _crud("artifactregistry.projects.locations.repositories"),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": _iam_member(
        "artifactregistry.projects.locations.repositories"
    ),
    "gcp:billing/budget:Budget": Calls(
        **{k: v for k, v in vars(_crud("billingbudgets.billingAccounts.budgets")).items() if k in PHASES},
        fields=(
            FieldCheck(
                "allUpdatesRule.pubsubTopic",
                ("pubsub.projects.topics.setIamPolicy",),
                "billingbudgets.v1 NotificationsRule.pubsubTopic: 'Grant the API caller the "
                "pubsub.topics.setIamPolicy permission on the Pub/Sub topic. If not set, the API call fails "
                "with PERMISSION_DENIED.' (Billing then grants its own agent publish on the topic.)",
            ),
        ),
    ),
    "gcp:monitoring/alertPolicy:AlertPolicy": _crud("monitoring.projects.alertPolicies"),
    "gcp:monitoring/notificationChannel:NotificationChannel": _crud("monitoring.projects.notificationChannels"),
    "gcp:monitoring/dashboard:Dashboard": _crud("monitoring.projects.dashboards"),
    "gcp:pubsub/topic:Topic": _crud("pubsub.projects.topics"),
    "gcp:pubsub/topicIAMMember:TopicIAMMember": _iam_member("pubsub.projects.topics"),
    "gcp:cloudscheduler/job:Job": Calls(
        **{k: v for k, v in vars(_crud("cloudscheduler.projects.locations.jobs")).items() if k in PHASES},
        act_as=("httpTarget.oauthToken.serviceAccountEmail", "httpTarget.oidcToken.serviceAccountEmail"),
    ),
    # A 2nd-gen function with an event trigger: Cloud Functions creates the Eventarc trigger for the
    # caller, who needs Eventarc rights and act-as on the runtime, trigger and build accounts
    # (Eventarc, "Roles and permissions for Cloud Run functions targets").
    "gcp:cloudfunctionsv2/function:Function": Calls(
        create=_FUNCTION.create,
        read=_FUNCTION.read,
        update=_FUNCTION.update,
        delete=_FUNCTION.delete,
        act_as=("serviceConfig.serviceAccountEmail", "eventTrigger.serviceAccountEmail", "buildConfig.serviceAccount"),
        extra=lambda inputs: (
            {
                "create": ("eventarc.projects.locations.triggers.create", "eventarc.projects.locations.triggers.get"),
                "read": ("eventarc.projects.locations.triggers.get",),
                "update": ("eventarc.projects.locations.triggers.patch",),
                "delete": ("eventarc.projects.locations.triggers.delete",),
            }
            if inputs.get("eventTrigger")
            else {}
        ),
    ),
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": _iam_member("run.projects.locations.services"),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": _iam_member("cloudkms.projects.locations.keyRings.cryptoKeys"),
    # The bootstrap's own resources (run by a human project owner).
    # Key rings cannot be deleted: the provider only forgets them (resource_kms_key_ring.go).
    "gcp:kms/keyRing:KeyRing": Calls(
        create=("cloudkms.projects.locations.keyRings.create", "cloudkms.projects.locations.keyRings.get"),
        read=("cloudkms.projects.locations.keyRings.get",),
    ),
    # resource_kms_crypto_key.go: delete destroys every key version and clears the rotation.
    "gcp:kms/cryptoKey:CryptoKey": Calls(
        create=(
            "cloudkms.projects.locations.keyRings.cryptoKeys.create",
            "cloudkms.projects.locations.keyRings.cryptoKeys.get",
        ),
        read=("cloudkms.projects.locations.keyRings.cryptoKeys.get",),
        update=("cloudkms.projects.locations.keyRings.cryptoKeys.patch",),
        delete=(
            "cloudkms.projects.locations.keyRings.cryptoKeys.cryptoKeyVersions.list",
            "cloudkms.projects.locations.keyRings.cryptoKeys.cryptoKeyVersions.destroy",
            "cloudkms.projects.locations.keyRings.cryptoKeys.patch",
        ),
    ),
    "gcp:iam/workloadIdentityPool:WorkloadIdentityPool": _crud("iam.projects.locations.workloadIdentityPools"),
    "gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider": _crud(
        "iam.projects.locations.workloadIdentityPools.providers"
    ),
    "gcp:billing/accountIamMember:AccountIamMember": _iam_member("cloudbilling.billingAccounts"),
    # The GKE engine (infra/gke/). resource_container_cluster.go: create, then wait on the operation; with
    # remove_default_node_pool it deletes the default pool (nodePools.delete) before the first read; an
    # update goes through clusters.update and, for the fields the platform sets, setMaintenancePolicy,
    # setResourceLabels and setLegacyAbac; delete waits on its operation. Every one of these checks
    # container.clusters.* (methods.json). The nodes' account is attached: act-as on it (GKE creates the
    # node VMs as that account; a cluster or pool naming one the caller may not act as is refused).
    "gcp:container/cluster:Cluster": Calls(
        create=(f"{GKE_CLUSTERS}.create", f"{GKE_CLUSTERS}.get", GKE_OPS, f"{GKE_NODE_POOLS}.delete"),
        read=(f"{GKE_CLUSTERS}.get",),
        update=(
            f"{GKE_CLUSTERS}.update",
            f"{GKE_CLUSTERS}.setMaintenancePolicy",
            f"{GKE_CLUSTERS}.setResourceLabels",
            f"{GKE_CLUSTERS}.setLegacyAbac",
            GKE_OPS,
        ),
        delete=(f"{GKE_CLUSTERS}.delete", GKE_OPS),
        act_as=("nodeConfig.serviceAccount",),
    ),
    # resource_container_node_pool.go: nodePools.create/get/delete, waiting on the operation; an update
    # uses nodePools.update, setManagement, setAutoscaling and setSize. GKE checks container.clusters.update
    # for each change of a pool and container.clusters.get for its reads (methods.json).
    "gcp:container/nodePool:NodePool": Calls(
        create=(f"{GKE_NODE_POOLS}.create", f"{GKE_NODE_POOLS}.get", GKE_OPS),
        read=(f"{GKE_NODE_POOLS}.get",),
        update=(
            f"{GKE_NODE_POOLS}.update",
            f"{GKE_NODE_POOLS}.setManagement",
            f"{GKE_NODE_POOLS}.setAutoscaling",
            f"{GKE_NODE_POOLS}.setSize",
            GKE_OPS,
        ),
        delete=(f"{GKE_NODE_POOLS}.delete", GKE_OPS),
        act_as=("nodeConfig.serviceAccount",),
    ),
    # Kubernetes objects declared through the GKE engine's DNS endpoint (infra/gke/install.py): what the
    # provider may do inside the cluster is Kubernetes RBAC's to decide (infra/access/kubernetes.py); on
    # the GCP side every request through the DNS endpoint is an IAM check first. A provider only holds a
    # kubeconfig: it calls nothing itself.
    "pulumi:providers:kubernetes": Calls(create=(), read=()),
    "kubernetes:yaml/v2:ConfigGroup": Calls(
        create=(KUBERNETES_API,), read=(KUBERNETES_API,), update=(KUBERNETES_API,), delete=(KUBERNETES_API,)
    ),
    # magic-modules mmv1/products/compute/ResourcePolicy.yaml: insert, PATCH to update, delete, each an
    # operation of the region (a TPU7x slice's HIGH_THROUGHPUT workload policy).
    "gcp:compute/resourcePolicy:ResourcePolicy": _crud(
        "compute.resourcePolicies", create="insert", operations=COMPUTE_REGION_OPS
    ),
    # pulumiverse-time (the Terraform time provider, bridged): waits in the deploy process, calls no API.
    "time:index/sleep:Sleep": Calls(create=(), read=()),
}

# Which input fields of each declared type were searched for permission checks of the caller beyond
# the method's own (and act-as), and where: the field descriptions of Google's discovery documents
# (googleapiclient/discovery_cache/documents, searched for "permission", "actAs", "IAM", "service
# agent") and the provider's resource source. A type added to RESOURCE_CALLS is reviewed here too.
# Keys used by another project (CMEK) are checked on its service agent, never
# the caller: the bootstrap grants them (tools/offline/access.py cmek_keys).
FIELD_REVIEW: dict[str, str] = {
    "gcp:billing/budget:Budget": "billingbudgets.v1: notificationsRule.pubsubTopic checks pubsub.topics.setIamPolicy "
    "(a FieldCheck); monitoringNotificationChannels and budgetFilter.projects name no caller check",
    "gcp:cloudfunctionsv2/function:Function": "cloudfunctions.v2: serviceConfig.serviceAccountEmail, "
    "eventTrigger.serviceAccountEmail and buildConfig.serviceAccount are attachments (act_as); buildConfig."
    "workerPool (unused) names another project's pool; eventTrigger.pubsubTopic names no caller check",
    "gcp:cloudscheduler/job:Job": "cloudscheduler.v1: httpTarget.oauthToken/oidcToken.serviceAccountEmail: 'The caller "
    "must have iam.serviceAccounts.actAs permission for the service account' (act_as)",
    "gcp:tpu/v2Vm:V2Vm": "tpu.v2: serviceAccount.email is an attachment (act_as; methods.json for nodes.create); "
    "networkConfig.subnetwork says no caller permission",
    "pulumi-python:dynamic/tpu:QueuedResource": "tpu.v2/v2alpha1: the node spec's serviceAccount is an attachment "
    "(act_as); reservationName names a reservation of the same project",
    "gcp:pubsub/topic:Topic": "pubsub.v1: kmsKeyName is used by Pub/Sub's agent (the bootstrap grants the key); "
    "messageTransforms.aiInference.serviceAccountEmail would need actAs (unused)",
    "gcp:storage/bucket:Bucket": "storage.v1: encryption.defaultKmsKeyName is used by the Cloud Storage agent "
    "(bootstrap); acl/defaultObjectAcl unused (uniform access); forceDestroy lists and deletes objects (extra)",
    "gcp:storage/bucketObject:BucketObject": "storage.v1: no field names another resource",
    "gcp:artifactregistry/repository:Repository": "artifactregistry.v1: kmsKeyName is used by Artifact Registry's "
    "agent (bootstrap grants the key); no caller check named",
    "gcp:monitoring/alertPolicy:AlertPolicy": "monitoring.v3: notificationChannels names channels of the same "
    "project; no caller check named",
    "gcp:monitoring/notificationChannel:NotificationChannel": "monitoring.v3: no caller check named",
    "gcp:monitoring/dashboard:Dashboard": "monitoring.v1: no caller check named",
    "gcp:projects/iAMAuditConfig:IAMAuditConfig": "cloudresourcemanager.v1 AuditConfig: exemptedMembers only; the "
    "write is setIamPolicy (its own method)",
    "gcp:compute/network:Network": "compute.v1: no caller check named",
    "gcp:compute/subnetwork:Subnetwork": "compute.v1: privateIpGoogleAccess is its own call (update methods)",
    "gcp:compute/firewall:Firewall": "compute.v1: no caller check named",
    "gcp:compute/router:Router": "compute.v1: no caller check named",
    "gcp:compute/routerNat:RouterNat": "compute.v1: a field of its router (routers.patch)",
    "gcp:projects/service:Service": "serviceusage.v1: no caller check named",
    "gcp:projects/serviceIdentity:ServiceIdentity": "serviceusage: no field beyond the service",
    "gcp:projects/iAMMember:IAMMember": "a member resource: getIamPolicy/setIamPolicy only",
    "gcp:projects/iAMCustomRole:IAMCustomRole": "iam.v1 Role: includedPermissions are data, no caller check",
    "gcp:serviceaccount/account:Account": "iam.v1 ServiceAccount: no caller check named",
    "gcp:serviceaccount/iAMMember:IAMMember": "a member resource: getIamPolicy/setIamPolicy only",
    "gcp:storage/bucketIAMMember:BucketIAMMember": "a member resource: getIamPolicy/setIamPolicy only",
    "gcp:pubsub/topicIAMMember:TopicIAMMember": "a member resource: getIamPolicy/setIamPolicy only",
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": "a member resource",
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": "a member resource",
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": "a member resource",
    "gcp:billing/accountIamMember:AccountIamMember": "a member resource",
    "gcp:kms/keyRing:KeyRing": "cloudkms.v1: no caller check named",
    "gcp:kms/cryptoKey:CryptoKey": "cloudkms.v1: no caller check named",
    "gcp:iam/workloadIdentityPool:WorkloadIdentityPool": "iam.v1: no caller check named",
    "gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider": "iam.v1: no caller check named",
    "time:index/sleep:Sleep": "no API",
    "gcp:container/cluster:Cluster": "container.v1: nodeConfig.serviceAccount is an attachment (act_as); every "
    "field description of Cluster and what it nests searched for permission, actAs and IAM: only legacyAbac (off) "
    "and workloadIdentityConfig (the project's pool) mention IAM, neither a check of the caller; "
    "authenticatorGroupsConfig names a group, no caller check",
    "gcp:container/nodePool:NodePool": "container.v1: nodeConfig.serviceAccount is an attachment (act_as); every "
    "field description of NodePool and what it nests searched for permission, actAs and IAM: none",
    "pulumi:providers:kubernetes": "a kubeconfig (server and credential plugin): no API",
    "kubernetes:yaml/v2:ConfigGroup": "Kubernetes objects, authorized inside the cluster by RBAC "
    "(infra/access/kubernetes.py); on the GCP side only the DNS endpoint's IAM check (container.clusters.connect)",
    "gcp:compute/resourcePolicy:ResourcePolicy": "compute.v1: no caller check named in its description fields",
    "gcp:logging/logView:LogView": "logging.v2 LogView: filter is data (a log id), no caller check named",
    "gcp:logging/projectBucketConfig:ProjectBucketConfig": "logging.v2 LogBucket: cmekSettings.kmsKeyName (unused) "
    "is used by Logging's agent; no caller check named",
    "gcp:logging/projectSink:ProjectSink": "logging.v2 LogSink: the destination is written as the sink's writer "
    "identity, not the caller, and a log bucket of the same project needs none (writerIdentity); filter is data",
    "gcp:dns/managedZone:ManagedZone": "dns.v1 ManagedZone: privateVisibilityConfig.networks[].networkUrl binds the "
    "zone to a network of the same project, dns.networks.bindPrivateDNSZone (in iamdata's METHOD_FIXES for create "
    "and patch); peeringConfig, forwardingConfig unused",
    "gcp:dns/recordSet:RecordSet": "dns.v1 ResourceRecordSet: rrdatas are data; routingPolicy unused; no caller check",
}


# Data sources the program reads while it runs (in `preview` as in `up`). None asks Cloud Storage for
# ACLs: the provider sends no `projection`, and storage.v1 says of objects.get/list and buckets.list
# "Defaults to noAcl" (data_source_google_storage_bucket_objects.go: GET b/{bucket}/o with matchGlob
# and prefix only), so no storage.*.getIamPolicy.
INVOKE_CALLS: dict[str, tuple[str, ...]] = {
    "gcp:storage/getBuckets:getBuckets": ("storage.buckets.list",),
    "gcp:storage/getBucketObjects:getBucketObjects": ("storage.objects.list",),
    "gcp:storage/getBucketObjectContent:getBucketObjectContent": ("storage.objects.get",),
    "gcp:storage/getProjectServiceAccount:getProjectServiceAccount": ("storage.projects.serviceAccount.get",),
    "gcp:organizations/getProject:getProject": ("cloudresourcemanager.projects.get",),
    # The GKE admin phase looks its cluster up (data_source_google_container_cluster.go reads the cluster).
    "gcp:container/getCluster:getCluster": (f"{GKE_CLUSTERS}.get",),
}


def invoke_calls(token: str) -> tuple[str, ...]:
    try:
        return INVOKE_CALLS[token]
    except KeyError:
        raise KeyError(f"no permission mapping for the data source {token}: add it to INVOKE_CALLS") from None


def calls_for(resource_type: str) -> Calls:
    try:
        return RESOURCE_CALLS[resource_type]
    except KeyError:
        raise KeyError(
            f"no permission mapping for the resource type {resource_type}: add the methods its provider calls "
            "to infra/access/calls.py, with the provider source as evidence"
        ) from None
