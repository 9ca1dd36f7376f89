"""The tpu-platform policies as plain functions, importable without starting a policy server.

Each validator has pulumi-policy's signature, `(args, report_violation)`, and reads `args.props` by
the provider's property names (camelCase). `__main__.py` assembles them into the pack that
`pulumi preview --policy-pack policy` runs; the offline plan (`infra/offline/policy_check.py`) runs
the very same functions over the planned resources.

Values a real preview does not know yet (e.g. a service account's email before it exists) arrive as
None, so every rule treats a missing value as "cannot tell", never as a violation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, StackValidationArgs


class Report(Protocol):
    """pulumi-policy's `report_violation`: a message, and the URN at fault in stack policies."""

    def __call__(self, message: str, urn: str | None = None, /) -> None: ...


MANDATORY = EnforcementLevel.MANDATORY
ADVISORY = EnforcementLevel.ADVISORY

BUCKET = "gcp:storage/bucket:Bucket"
V2VM = "gcp:tpu/v2Vm:V2Vm"
BUDGET = "gcp:billing/budget:Budget"
BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
PROJECT_IAM = {"gcp:projects/iAMMember:IAMMember", "gcp:projects/iAMBinding:IAMBinding"}
PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
BASIC_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
IMPERSONATION_ROLES = {
    "roles/iam.serviceAccountUser",
    "roles/iam.serviceAccountTokenCreator",
    "roles/iam.serviceAccountKeyAdmin",
    "roles/iam.workloadIdentityUser",
}
PRODUCTION_ENVIRONMENTS = {"prod", "production"}
REQUIRED_LABELS = ("environment", "owner")
LABELS_PROPERTY = {
    BUCKET: "labels",
    V2VM: "labels",
    "gcp:pubsub/topic:Topic": "labels",
    "gcp:monitoring/notificationChannel:NotificationChannel": "userLabels",
}
CHECKPOINT_WRITER_ROLES = {"roles/storage.objectUser", "roles/storage.objectAdmin"}
DEFAULT_COMPUTE_ACCOUNT = "-compute@developer.gserviceaccount.com"


def _is_admin_role(role: str) -> bool:
    return role.endswith("Admin") or role.endswith(".admin")


def no_broad_project_roles(args: ResourceValidationArgs, report: Report) -> None:
    """No basic or admin roles, and nothing that can impersonate service accounts, at project level."""
    if args.resource_type in PROJECT_IAM:
        roles = [args.props.get("role")]
    elif args.resource_type == "gcp:projects/iAMPolicy:IAMPolicy" and args.props.get("policyData"):
        roles = [b.get("role") for b in json.loads(args.props["policyData"]).get("bindings", [])]
    else:
        return
    for role in filter(None, roles):
        if role in BASIC_ROLES or _is_admin_role(role):
            report(f"project-level {role} is a basic or admin role; grant a narrow role on the resource instead")
        elif role in IMPERSONATION_ROLES:
            report(f"project-level {role} lets the member act as every service account; grant it on one account")


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


def bucket_cmek_in_production(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != BUCKET:
        return
    environment = (args.props.get("labels") or {}).get("environment")
    if environment in PRODUCTION_ENVIRONMENTS and not (args.props.get("encryption") or {}).get("defaultKmsKeyName"):
        report(f"buckets of the {environment} environment are encrypted with a customer-managed key")


def required_labels(args: ResourceValidationArgs, report: Report) -> None:
    prop = LABELS_PROPERTY.get(args.resource_type)
    if prop is None:
        return
    labels = args.props.get(prop) or {}
    missing = [label for label in REQUIRED_LABELS if not labels.get(label)]
    if missing:
        report(f"missing labels {', '.join(missing)} (cost reports and clean-up group resources by them)")


def budget_in_every_stack(args: StackValidationArgs, report: Report) -> None:
    if not any(r.resource_type == BUDGET for r in args.resources):
        report("every stack has a billing budget with alerts")


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


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    enforcement: EnforcementLevel
    validate: Callable[[Any, Report], None]
    stack: bool = False


RULES: tuple[Rule, ...] = (
    Rule("no-broad-project-roles", "No basic, admin or impersonation roles at project level", MANDATORY,
         no_broad_project_roles),
    Rule("no-service-account-keys", "No service-account keys", MANDATORY, no_service_account_keys),
    Rule("tpu-vm-dedicated-service-account", "TPU VMs never use the default compute account", MANDATORY,
         tpu_vm_dedicated_service_account),
    Rule("tpu-vm-no-external-ip", "TPU VMs have no external IP", MANDATORY, tpu_vm_no_external_ip),
    Rule("bucket-uniform-access", "Buckets use uniform bucket-level access", MANDATORY, bucket_uniform_access),
    Rule("bucket-public-access-prevention", "Buckets enforce public access prevention", MANDATORY,
         bucket_public_access_prevention),
    Rule("bucket-no-public-members", "No allUsers / allAuthenticatedUsers on buckets", MANDATORY,
         bucket_no_public_members),
    Rule("firewall-no-open-ingress", "No SSH or all-ports ingress from anywhere", MANDATORY, firewall_no_open_ingress),
    Rule("bucket-cmek-in-production", "Production buckets use CMEK", MANDATORY, bucket_cmek_in_production),
    Rule("required-labels", "Labelled resources carry environment and owner", ADVISORY, required_labels),
    Rule("budget-in-every-stack", "Every stack has a budget", MANDATORY, budget_in_every_stack, stack=True),
    Rule("spot-tpu-has-checkpoints", "Spot TPU VMs can write checkpoints", MANDATORY, spot_tpu_has_checkpoints,
         stack=True),
)  # fmt: skip
