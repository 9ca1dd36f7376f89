"""The tpu-platform policies as plain functions, importable without starting a policy server.

Each validator has pulumi-policy's signature, `(args, report_violation)`, and reads `args.props` by
the provider's property names (camelCase). `__main__.py` assembles them into the pack that
`pulumi preview --policy-pack policy` runs; the offline plan (`tools/offline/policy_check.py`) runs
the very same functions over the planned resources.

Values a real preview does not know yet (e.g. a service account's email before it exists) arrive as
None, so every rule treats a missing value as "cannot tell", never as a violation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pulumi_policy import EnforcementLevel, PolicyResource, ResourceValidationArgs, StackValidationArgs

from infra.access.conditions import names_resource_attributes, services_ignoring_resource_attributes
from infra.access.escalation import escalations, is_service_agent

from .exceptions import EXCEPTIONS, ROLE_EXCEPTIONS, GrantException
from .permissions import denied
from .stack_grants import Grant, custom_role_name, custom_roles_declared, grants_of, role_permissions


class Report(Protocol):
    """pulumi-policy's `report_violation`: a message, and the URN at fault in stack policies."""

    def __call__(self, message: str, urn: str | None = None, /) -> None: ...


MANDATORY = EnforcementLevel.MANDATORY
ADVISORY = EnforcementLevel.ADVISORY

BUCKET = "gcp:storage/bucket:Bucket"
V2VM = "gcp:tpu/v2Vm:V2Vm"
BUDGET = "gcp:billing/budget:Budget"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
# The program marks a production stack's labelled resources so (its `tpu-platform:production` setting).
PRODUCTION_LABEL = ("environment-class", "production")
REQUIRED_LABELS = ("environment", "owner")
LABELS_PROPERTY = {
    BUCKET: "labels",
    V2VM: "labels",
    "gcp:pubsub/topic:Topic": "labels",
    "gcp:monitoring/notificationChannel:NotificationChannel": "userLabels",
    CLUSTER: "resourceLabels",
}
CHECKPOINT_WRITER_ROLES = {"roles/storage.objectUser", "roles/storage.objectAdmin"}
DEFAULT_COMPUTE_ACCOUNT = "-compute@developer.gserviceaccount.com"


@dataclass(frozen=True)
class Verdict:
    violations: tuple[str, ...] = ()  # mandatory
    cannot_tell: tuple[str, ...] = ()  # advisory: the pack lacks what it needs to judge


def _who(grant: Grant) -> str:
    return f"{grant.role or '(unknown role)'} for {grant.member or '(unknown member)'} on {grant.level} {grant.target}"


def _excused(grant: Grant, risky: Mapping[str, str], exception: GrantException, match: Any, custom_roles) -> Verdict:
    if exception.check and (problem := exception.check(grant, match, custom_roles)):
        return Verdict(violations=(f"{_who(grant)} matches exception '{exception.name}' except that {problem}",))
    rest = [p for p in risky if exception.may_hold is not None and p not in exception.may_hold]
    if rest:
        return Verdict(violations=(f"{_who(grant)} grants {', '.join(rest)}, beyond exception '{exception.name}'",))
    return Verdict()


def judge_grant(grant: Grant, custom_roles: Mapping[str, frozenset[str]]) -> Verdict:
    """Whether `grant` confers a deny-listed permission that no named exception covers."""
    if grant.role is None:
        return Verdict(cannot_tell=(f"{_who(grant)}: the role is not known yet, so the pack cannot judge it",))
    permissions = role_permissions(grant.role, custom_roles)
    if permissions is None:
        source = "Google's role data" if grant.role.startswith("roles/") else "this stack's custom roles"
        return Verdict(
            cannot_tell=(f"{_who(grant)}: {grant.role} is not in {source}, so the pack cannot tell what it grants",)
        )
    risky = denied(permissions)
    if not risky:
        return Verdict()
    for exception in EXCEPTIONS:
        if match := exception.matches(grant):
            return _excused(grant, risky, exception, match, custom_roles)
    if None in (grant.member, grant.target) and any(e.could_match(grant) for e in EXCEPTIONS):
        return Verdict(cannot_tell=(f"{_who(grant)}: an exception may apply once the member and target are known",))
    reasons = "; ".join(f"{p}: {why}" for p, why in risky.items())
    return Verdict(violations=(f"{_who(grant)} grants deny-listed permissions ({reasons})",))


def _grants(resources: Iterable[PolicyResource]) -> list[tuple[PolicyResource, Grant]]:
    return [(r, g) for r in resources for g in grants_of(r.resource_type, r.props)]


def _custom_roles(resources: Iterable[PolicyResource]) -> dict[str, frozenset[str]]:
    return custom_roles_declared((r.resource_type, r.props) for r in resources)


def no_dangerous_grants(args: StackValidationArgs, report: Report) -> None:
    """No role holding a deny-listed permission at project, folder, organisation, account or billing level."""
    custom_roles = _custom_roles(args.resources)
    for resource, grant in _grants(args.resources):
        for message in judge_grant(grant, custom_roles).violations:
            report(message, resource.urn)


def grants_judged(args: StackValidationArgs, report: Report) -> None:
    """The grants the pack cannot judge: roles it does not know, values a preview does not know yet."""
    custom_roles = _custom_roles(args.resources)
    for resource, grant in _grants(args.resources):
        for message in judge_grant(grant, custom_roles).cannot_tell:
            report(message, resource.urn)


def no_escalation_methods(args: StackValidationArgs, report: Report) -> None:
    """No member holds, on one project and with no condition, every permission of a public privilege-
    escalation method (reference/gcp-privesc), whatever its roles are and whoever it is: no exception,
    the deployer's included. Google's service agents hold what Google grants them."""
    custom_roles = _custom_roles(args.resources)
    held: dict[tuple[str, str], set[str]] = {}
    where: dict[tuple[str, str], list[str]] = {}
    for resource, grant in _grants(args.resources):
        if grant.level != "project" or grant.condition or None in (grant.member, grant.role, grant.target):
            continue
        if is_service_agent(grant.member or ""):
            continue
        key = (grant.member or "", grant.target or "")
        held.setdefault(key, set()).update(role_permissions(grant.role or "", custom_roles) or ())
        where.setdefault(key, []).append(resource.urn)
    for (member, project), permissions in sorted(held.items()):
        if found := escalations(permissions):
            message = (
                f"{member} holds on project {project}, unconditionally, every permission of the privilege-"
                f"escalation methods {', '.join(found)} (reference/gcp-privesc)"
            )
            report(message, where[(member, project)][-1])


def conditions_only_where_supported(args: StackValidationArgs, report: Report) -> None:
    """A project-level grant conditioned on resource attributes covers every resource of a service that
    ignores them (Cloud TPU among them): the condition would silently grant the whole service."""
    custom_roles = _custom_roles(args.resources)
    for resource, grant in _grants(args.resources):
        expression = (grant.condition or {}).get("expression") or ""
        if grant.level != "project" or not names_resource_attributes(expression) or grant.role is None:
            continue
        permissions = role_permissions(grant.role, custom_roles)
        ignored = services_ignoring_resource_attributes(permissions or ())
        if ignored:
            report(
                f"{grant.role} for {grant.member} is conditioned on resource attributes, which "
                f"{', '.join(ignored)} ignore (cloud.google.com/iam/docs/conditions-resource-attributes): "
                "it would apply to every resource of those services",
                resource.urn,
            )


def custom_roles_no_dangerous_permissions(args: ResourceValidationArgs, report: Report) -> None:
    """A custom role's own permission list holds nothing deny-listed beyond its named exception."""
    name = custom_role_name(args.resource_type, args.props)
    if name is None and args.resource_type not in (
        "gcp:projects/iAMCustomRole:IAMCustomRole",
        "gcp:organizations/iAMCustomRole:IAMCustomRole",
    ):
        return
    risky = denied(args.props.get("permissions") or ())
    allowed = next((may for pattern, may in ROLE_EXCEPTIONS.items() if name and re.fullmatch(pattern, name)), None)
    rest = [p for p in risky if not allowed or p not in allowed]
    if rest:
        report(f"custom role {name or args.name} holds {', '.join(f'{p} ({risky[p]})' for p in rest)}")


def no_service_account_keys(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == "gcp:serviceaccount/key:Key":
        report("service-account keys are long-lived secrets; use the VM's attached account or workload identity")


def tpu_vm_dedicated_service_account(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != V2VM:
        return
    account = args.props.get("serviceAccount") or {}
    if not account:
        report("a TPU VM without a service account runs as the default Compute Engine account (broad roles)")
    elif DEFAULT_COMPUTE_ACCOUNT in (account.get("email") or ""):
        report("TPU VMs must not use the default Compute Engine service account; give the workload its own")


def tpu_vm_no_external_ip(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != V2VM:
        return
    configs = [args.props.get("networkConfig") or {}, *(args.props.get("networkConfigs") or [])]
    if any(c.get("enableExternalIps") for c in configs):
        report("TPU VMs get no external IP; they reach the internet through Cloud NAT and SSH through IAP")


def bucket_uniform_access(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == BUCKET and args.props.get("uniformBucketLevelAccess") is not True:
        report("buckets use uniform bucket-level access (IAM only, no per-object ACLs)")


def bucket_public_access_prevention(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == BUCKET and args.props.get("publicAccessPrevention") != "enforced":
        report("buckets enforce public access prevention")


def bucket_no_public_members(args: ResourceValidationArgs, report: Report) -> None:
    members: list[Any] = []
    if args.resource_type in (BUCKET_MEMBER, "gcp:storage/bucketIAMBinding:BucketIAMBinding"):
        members = [args.props.get("member"), *(args.props.get("members") or [])]
    elif args.resource_type in (
        "gcp:storage/bucketAccessControl:BucketAccessControl",
        "gcp:storage/bucketACL:BucketACL",
    ):
        members = [args.props.get("entity"), *(args.props.get("roleEntities") or [])]
    public = sorted({m for m in members if isinstance(m, str) and any(p in m for p in PUBLIC_MEMBERS)})
    if public:
        report(f"bucket access for {', '.join(public)} makes its objects public")


def _opens_ssh_or_all_ports(allow: dict[str, Any]) -> bool:
    protocol = (allow.get("protocol") or "").lower()
    if protocol == "all":
        return True
    if protocol not in ("tcp", "6"):
        return False
    ports = allow.get("ports") or []
    if not ports:
        return True  # every port
    for port in ports:
        low, _, high = str(port).partition("-")
        if int(low) <= 22 <= int(high or low):
            return True
    return False


def firewall_no_open_ingress(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "gcp:compute/firewall:Firewall":
        return
    if (args.props.get("direction") or "INGRESS") != "INGRESS":
        return
    anywhere = {"0.0.0.0/0", "::/0"} & set(args.props.get("sourceRanges") or [])
    if anywhere and any(_opens_ssh_or_all_ports(a) for a in args.props.get("allows") or []):
        report(f"ingress from {', '.join(sorted(anywhere))} to SSH or all ports; admit IAP's 35.235.240.0/20 instead")


def _labels(resource: PolicyResource) -> Mapping[str, Any]:
    prop = LABELS_PROPERTY.get(resource.resource_type)
    return (resource.props.get(prop) if prop else None) or {}


def is_production(resources: Iterable[PolicyResource]) -> bool:
    """A stack is production when the program says so on its resources, whatever the stack is called."""
    key, value = PRODUCTION_LABEL
    return any(_labels(r).get(key) == value for r in resources)


def bucket_cmek_in_production(args: StackValidationArgs, report: Report) -> None:
    """Every bucket of a production stack, labelled or not, is encrypted with a customer-managed key."""
    if not is_production(args.resources):
        return
    for bucket in args.resources:
        if bucket.resource_type == BUCKET and not (bucket.props.get("encryption") or {}).get("defaultKmsKeyName"):
            report(f"bucket {bucket.name} of a production stack is encrypted with a customer-managed key", bucket.urn)


def required_labels(args: ResourceValidationArgs, report: Report) -> None:
    prop = LABELS_PROPERTY.get(args.resource_type)
    if prop is None:
        return
    labels = args.props.get(prop) or {}
    missing = [label for label in REQUIRED_LABELS if not labels.get(label)]
    if missing:
        report(f"missing labels {', '.join(missing)} (cost reports and clean-up group resources by them)")


# What runs up a bill: a stack declaring any of these needs a budget. The bootstrap (a bucket, a key,
# identities) declares none, and is judged by every other rule like any stack.
SPENDING_TYPES = {
    V2VM,
    "gcp:cloudfunctionsv2/function:Function",
    "gcp:tpu/v2QueuedResource:V2QueuedResource",
    CLUSTER,
    NODE_POOL,
}


def budget_in_every_stack(args: StackValidationArgs, report: Report) -> None:
    spends = any(r.resource_type in SPENDING_TYPES for r in args.resources)
    if spends and not any(r.resource_type == BUDGET for r in args.resources):
        report("every stack that runs TPUs or functions has a billing budget with alerts")


def spot_tpu_has_checkpoints(args: StackValidationArgs, report: Report) -> None:
    """A spot or preemptible TPU VM waits for a write grant on a checkpoints bucket (S19)."""
    checkpoint_buckets = {
        r.props.get("name")
        for r in args.resources
        if r.resource_type == BUCKET and (r.props.get("labels") or {}).get("purpose") == "checkpoints"
    }
    for vm in args.resources:
        scheduling = vm.props.get("schedulingConfig") or {}
        if vm.resource_type != V2VM or not (scheduling.get("spot") or scheduling.get("preemptible")):
            continue
        grants = [
            d
            for d in vm.dependencies
            if d.resource_type == BUCKET_MEMBER
            and d.props.get("role") in CHECKPOINT_WRITER_ROLES
            and d.props.get("bucket") in checkpoint_buckets
        ]
        if not grants:
            report(
                f"spot/preemptible TPU VM {vm.name} can be reclaimed at any time but cannot write checkpoints; "
                "grant its workload write access to the checkpoints bucket",
                vm.urn,
            )


# --- GKE: the cluster and its TPU slice node pools -----------------------------------------------------
# TPU machine types by family (GKE, "Plan TPUs in GKE"; xpk core/system_characteristics.py): the number
# before `t` is the node's chips. TPU7x slices refuse COMPACT placement and take a workload policy
# ("... with placement policy is not supported. Use workload policy instead.", vllm-project/ci-infra#547).
TPU_MACHINE = re.compile(r"(ct4p-hightpu|ct5lp-hightpu|ct5p-hightpu|ct6e-standard|tpu7x-standard)-(?P<chips>\d+)t")
WORKLOAD_POLICY_MACHINES = ("tpu7x-",)


def gke_private_nodes(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != CLUSTER:
        return
    private = (args.props.get("privateClusterConfig") or {}).get("enablePrivateNodes")
    if private is False or (private is None and "privateClusterConfig" not in args.props):
        report("GKE nodes get no external IP: set privateClusterConfig.enablePrivateNodes (egress through Cloud NAT)")


def gke_no_legacy_abac(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == CLUSTER and args.props.get("enableLegacyAbac") is True:
        report("legacy ABAC lets every service account act cluster-wide; authorise with RBAC only")


def gke_workload_identity(args: ResourceValidationArgs, report: Report) -> None:
    """Pods get their own identities, never the node's account: the cluster has a workload pool and no node
    pool exposes the metadata server's node credentials."""
    if args.resource_type == CLUSTER and "workloadIdentityConfig" not in args.props:
        report("GKE clusters enable Workload Identity (workloadIdentityConfig.workloadPool = PROJECT.svc.id.goog)")
    if args.resource_type in (CLUSTER, NODE_POOL):
        mode = ((args.props.get("nodeConfig") or {}).get("workloadMetadataConfig") or {}).get("mode")
        if mode == "GCE_METADATA":
            report("GCE_METADATA shows pods the node's account; use workloadMetadataConfig.mode GKE_METADATA")


def gke_nodes_dedicated_service_account(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in (CLUSTER, NODE_POOL):
        return
    account = (args.props.get("nodeConfig") or {}).get("serviceAccount") or ""  # unknown in a preview: fine
    if account == "default" or DEFAULT_COMPUTE_ACCOUNT in account:
        report("GKE nodes must not use the default Compute Engine service account; give them their own")


def _topology_chips(topology: str) -> int:
    chips = 1
    for side in topology.split("x"):
        chips *= int(side) if side.isdigit() else 1
    return chips


def gke_tpu_slices_placed(args: ResourceValidationArgs, report: Report) -> None:
    """A multi-host TPU slice's node pool is placed as one unit, and sized per zone as exactly its slice."""
    if args.resource_type != NODE_POOL:
        return
    machine = str((args.props.get("nodeConfig") or {}).get("machineType") or "")
    match = TPU_MACHINE.fullmatch(machine)
    placement = args.props.get("placementPolicy") or {}
    topology = str(placement.get("tpuTopology") or "")
    if match is None or not topology:
        return  # not a TPU pool, or single hosts without a slice topology
    vms = _topology_chips(topology) // int(match["chips"])
    if vms <= 1:
        return
    if machine.startswith(WORKLOAD_POLICY_MACHINES):
        if not placement.get("policyName") or placement.get("type"):
            report(
                f"a {machine} slice ({topology}) is placed by a named HIGH_THROUGHPUT workload policy, with no "
                "placement type: GKE refuses COMPACT for it, and stores no type"
            )
    elif placement.get("type") != "COMPACT" and not placement.get("policyName"):
        report(f"a multi-host TPU slice ({topology}, {vms} nodes) needs COMPACT placement or a placement policy")
    scaling = args.props.get("autoscaling") or {}
    if "totalMaxNodeCount" in scaling or "totalMinNodeCount" in scaling:
        report(
            "a multi-host TPU slice is sized per zone (minNodeCount/maxNodeCount): GKE refuses a total, "
            "'Maximum node count 0 is not a valid size of TPU pod slice'"
        )
    elif scaling.get("maxNodeCount") not in (None, vms):
        report(
            f"a multi-host TPU slice pool holds exactly its slice: maxNodeCount {vms}, not {scaling['maxNodeCount']}"
        )


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    enforcement: EnforcementLevel
    validate: Callable[[Any, Report], None]
    stack: bool = False


RULES: tuple[Rule, ...] = (
    Rule(
        "no-dangerous-grants",
        "No grant of a deny-listed permission outside the named exceptions",
        MANDATORY,
        no_dangerous_grants,
        stack=True,
    ),
    Rule(
        "no-escalation-method",
        "No member holds every permission of a privilege-escalation method",
        MANDATORY,
        no_escalation_methods,
        stack=True,
    ),
    Rule(
        "grants-judged",
        "Grants the pack cannot judge (unknown roles, values not known yet)",
        ADVISORY,
        grants_judged,
        stack=True,
    ),
    Rule(
        "iam-conditions-only-where-supported",
        "Resource conditions only on services that honour them",
        MANDATORY,
        conditions_only_where_supported,
        stack=True,
    ),
    Rule(
        "custom-roles-no-dangerous-permissions",
        "Custom roles hold no deny-listed permission",
        MANDATORY,
        custom_roles_no_dangerous_permissions,
    ),
    Rule("no-service-account-keys", "No service-account keys", MANDATORY, no_service_account_keys),
    Rule(
        "tpu-vm-dedicated-service-account",
        "TPU VMs never use the default compute account",
        MANDATORY,
        tpu_vm_dedicated_service_account,
    ),
    Rule("tpu-vm-no-external-ip", "TPU VMs have no external IP", MANDATORY, tpu_vm_no_external_ip),
    Rule("bucket-uniform-access", "Buckets use uniform bucket-level access", MANDATORY, bucket_uniform_access),
    Rule(
        "bucket-public-access-prevention",
        "Buckets enforce public access prevention",
        MANDATORY,
        bucket_public_access_prevention,
    ),
    Rule(
        "bucket-no-public-members",
        "No allUsers / allAuthenticatedUsers on buckets",
        MANDATORY,
        bucket_no_public_members,
    ),
    Rule("firewall-no-open-ingress", "No SSH or all-ports ingress from anywhere", MANDATORY, firewall_no_open_ingress),
    Rule("bucket-cmek-in-production", "Production buckets use CMEK", MANDATORY, bucket_cmek_in_production, stack=True),
    Rule("required-labels", "Labelled resources carry environment and owner", ADVISORY, required_labels),
    Rule("budget-in-every-stack", "Every stack has a budget", MANDATORY, budget_in_every_stack, stack=True),
    Rule(
        "spot-tpu-has-checkpoints",
        "Spot TPU VMs can write checkpoints",
        MANDATORY,
        spot_tpu_has_checkpoints,
        stack=True,
    ),
    Rule("gke-private-nodes", "GKE nodes have no external IP", MANDATORY, gke_private_nodes),
    Rule("gke-no-legacy-abac", "GKE clusters authorise with RBAC only", MANDATORY, gke_no_legacy_abac),
    Rule(
        "gke-workload-identity", "GKE pods get their own identities, not the node's", MANDATORY, gke_workload_identity
    ),
    Rule(
        "gke-nodes-dedicated-service-account",
        "GKE nodes never use the default compute account",
        MANDATORY,
        gke_nodes_dedicated_service_account,
    ),
    Rule(
        "gke-tpu-slices-placed",
        "Multi-host TPU slice pools are placed as one unit and sized per zone",
        MANDATORY,
        gke_tpu_slices_placed,
    ),
)
