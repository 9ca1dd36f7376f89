"""The permission model: what a plan needs, what an identity holds, and what is missing.

Inputs are plain data (`Declared`: a resource's type, name and inputs, as the offline plan records
them), so the model runs on any plan, the bootstrap's included, with no Pulumi import.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.access import iamdata
from infra.access.calls import PHASES, calls_for, invoke_calls
from run_contract.cel import LITERAL, literal_text

DEPLOY = PHASES  # create, read, update and delete: everything `pulumi up` and `destroy` may call
PREVIEW = ("read",)  # `pulumi preview --refresh` reads every resource, and writes nothing
ACT_AS = "iam.serviceAccounts.actAs"
SET_PROJECT_IAM = "resourcemanager.projects.setIamPolicy"
# `gcp:userProjectOverride` sends X-Goog-User-Project on every call: the caller needs this on the
# billing project (terraform-provider-google transport/config.go; Service Usage access control).
USE_QUOTA_PROJECT = "serviceusage.services.use"
# The roles are CEL literals (run_contract/cel.py), read as they were written: a `]` or a quote inside one is its text.
MODIFIED_GRANTS = re.compile(
    r"api\.getAttribute\(\s*'iam\.googleapis\.com/modifiedGrantsByRole'\s*,\s*\[\]\s*\)\.hasOnly\("
    rf"\s*\[(?P<roles>\s*(?:(?:{LITERAL})\s*,?\s*)*)\]\s*\)"
)


@dataclass(frozen=True)
class Declared:
    type: str
    name: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True)
class Grant:
    """One role held by one member on one resource (`scope`), with the permissions it brings."""

    scope: str
    role: str
    permissions: frozenset[str]
    condition: str | None = None

    @property
    def grantable_roles(self) -> frozenset[str] | None:
        """For a grant limited by `modifiedGrantsByRole`, the roles it may grant; None when unlimited."""
        if not self.condition:
            return None
        match = MODIFIED_GRANTS.search(self.condition)
        if not match:
            return frozenset()  # another condition: treat as granting nothing we can prove
        return frozenset(literal_text(literal) for literal in re.findall(LITERAL, match.group("roles")))


def _get(inputs: Mapping[str, Any], path: str) -> Any:
    value: Any = inputs
    for part in path.split("."):
        if isinstance(value, list):
            value = value[0] if value else None
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _project_of_name(name: str | None) -> str | None:
    match = re.match(r"projects/([^/]+)/", name or "")
    return match.group(1) if match else None


def scope_of(resource: Declared, default_project: str) -> str:
    """Where Google checks the permissions of a call on this resource."""
    inputs = resource.inputs
    if resource.type == "gcp:billing/budget:Budget":
        return f"billingAccounts/{inputs.get('billingAccount')}"
    if resource.type == "gcp:billing/accountIamMember:AccountIamMember":
        return f"billingAccounts/{inputs.get('billingAccountId')}"
    if resource.type == "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember":
        return f"projects/{_project_of_name(inputs.get('cryptoKeyId')) or default_project}"
    if resource.type == "gcp:serviceaccount/iAMMember:IAMMember":
        return f"projects/{_project_of_name(inputs.get('serviceAccountId')) or default_project}"
    if resource.type == "gcp:kms/cryptoKey:CryptoKey":
        return f"projects/{_project_of_name(inputs.get('keyRing')) or default_project}"
    return f"projects/{inputs.get('project') or default_project}"


# A resource a call names as an IAM condition sees it: `resource.name`, and for a listing the
# `storage.googleapis.com/objectListPrefix` API attribute (None: not a listing).
Target = tuple[str, "str | None"]


def object_target(bucket: str, name: str) -> Target:
    return (f"projects/_/buckets/{bucket}/objects/{name}", None)


def listing_target(bucket: str, prefix: str = "") -> Target:
    return (f"projects/_/buckets/{bucket}", prefix)


@dataclass
class Needs:
    """Permissions per scope, each with the resources that need it; and the accounts to act as.

    `targets`: for the calls that name one object or bucket (Cloud Storage, whose IAM conditions
    see `resource.name`), which ones, so that a grant limited by a condition can be judged."""

    permissions: dict[str, dict[str, list[str]]]
    act_as: dict[str, list[str]]
    project_grants: dict[str, set[str]]  # project -> roles the plan grants on it
    targets: dict[str, dict[str, set[Target]]] = field(default_factory=dict)
    untargeted: dict[str, set[str]] = field(default_factory=dict)  # needed by some call that names no target

    def in_scope(self, scope: str) -> frozenset[str]:
        return frozenset(self.permissions.get(scope, {}))

    def merged(self, other: Needs) -> Needs:
        """What two plans need together (a first deploy and a later one)."""
        out = Needs({}, {}, {}, {}, {})
        for needs in (self, other):
            for scope, perms in needs.permissions.items():
                for permission, why in perms.items():
                    out.permissions.setdefault(scope, {}).setdefault(permission, []).extend(why)
            for email, why in needs.act_as.items():
                out.act_as.setdefault(email, []).extend(why)
            for project, roles in needs.project_grants.items():
                out.project_grants.setdefault(project, set()).update(roles)
            for scope, perms in needs.targets.items():
                for permission, targets in perms.items():
                    out.targets.setdefault(scope, {}).setdefault(permission, set()).update(targets)
            for scope, untargeted in needs.untargeted.items():
                out.untargeted.setdefault(scope, set()).update(untargeted)
        return out


# Cloud Logging's resources that IAM Conditions see, by their full names: log buckets and log views
# (conditions-resource-attributes lists logging.googleapis.com/LogBucket and /LogView, named
# `projects/P/locations/L/buckets/B[/views/V]`, and no other Logging type: not a sink, a location or an
# operation). A get, patch or delete is checked on the bucket or view it names (logging.v2: `name`).
LOG_BUCKET_TYPE = "gcp:logging/projectBucketConfig:ProjectBucketConfig"
LOG_VIEW_TYPE = "gcp:logging/logView:LogView"
_NAMED_LOG_CALLS = {
    LOG_BUCKET_TYPE: "logging.projects.locations.buckets",
    LOG_VIEW_TYPE: "logging.projects.locations.buckets.views",
}


def _log_name(resource: Declared, default_project: str) -> str:
    """A log bucket's or log view's full name, as Logging names it."""
    inputs = resource.inputs
    if resource.type == LOG_VIEW_TYPE:
        return f"{inputs.get('bucket')}/views/{inputs.get('name')}"
    project = inputs.get("project") or default_project
    return f"projects/{project}/locations/{inputs.get('location')}/buckets/{inputs.get('bucketId')}"


def _targets(resource: Declared, method: str, default_project: str) -> list[Target]:
    """What one call of a resource names as a condition sees it: a Cloud Storage object its own name; a log
    bucket's or view's get, patch and delete the bucket or view. A create is checked on its parent, which
    Google does not document as a condition's resource.name: it names no target, and a grant under a
    condition never counts for it."""
    if resource.type == "gcp:storage/bucketObject:BucketObject":
        return [object_target(str(resource.inputs.get("bucket")), str(resource.inputs.get("name")))]
    collection, _, verb = method.rpartition(".")
    if verb in ("get", "patch", "delete") and _NAMED_LOG_CALLS.get(resource.type) == collection:
        return [(_log_name(resource, default_project), None)]
    return []


def _invoke_targets(token: str, args: Mapping[str, Any]) -> list[Target]:
    if token == "gcp:storage/getBucketObjectContent:getBucketObjectContent":
        return [object_target(str(args.get("bucket")), str(args.get("name")))]
    if token == "gcp:storage/getBucketObjects:getBucketObjects":
        return [listing_target(str(args.get("bucket")), str(args.get("prefix") or ""))]
    return []


def needs_of(
    resources: Iterable[Declared],
    default_project: str,
    phases: tuple[str, ...] = DEPLOY,
    *,
    invokes: Iterable[tuple[str, Mapping[str, Any]]] = (),
    quota_project: str | None = None,
) -> Needs:
    needs = Needs(defaultdict(lambda: defaultdict(list)), defaultdict(list), defaultdict(set), {}, {})
    permissions = needs.permissions

    def need(scope: str, method: str, why: str, targets: list[Target], *, acls: bool = False) -> None:
        # The provider never asks Cloud Storage for ACLs (projection=full): no object IAM reads.
        for permission in iamdata.method_permissions(method, acls=acls):
            if permission == ACT_AS:
                continue  # checked on the attached account, below
            permissions[scope][permission].append(why)
            if targets:
                needs.targets.setdefault(scope, {}).setdefault(permission, set()).update(targets)
            else:
                needs.untargeted.setdefault(scope, set()).add(permission)

    for resource in resources:
        calls = calls_for(resource.type)
        scope = scope_of(resource, default_project)
        for phase in phases:
            for method in calls.methods(phase, resource.inputs):
                targets = _targets(resource, method, default_project)
                need(scope, method, f"{phase} {resource.name} ({resource.type})", targets)
            if phase not in ("create", "update"):
                continue
            for check in calls.fields:
                value = _get(resource.inputs, check.path)
                if value:
                    where = f"projects/{_project_of_name(str(value)) or default_project}"
                    for method in check.methods:
                        need(where, method, f"{phase} {resource.name} ({resource.type}) with {check.path}", [])
        if "create" in phases or "update" in phases:
            for path in calls.act_as:
                email = _get(resource.inputs, path)
                if email:
                    needs.act_as[str(email).rsplit("/", 1)[-1]].append(f"{resource.name} ({resource.type}) attaches it")
        if resource.type == "gcp:projects/iAMMember:IAMMember" and resource.inputs.get("role"):
            needs.project_grants[str(resource.inputs.get("project") or default_project)].add(resource.inputs["role"])
    for token, args in invokes:  # data sources run in preview and up alike
        scope = f"projects/{args.get('project') or default_project}"
        for method in invoke_calls(token):
            need(scope, method, f"read the data source {token}", _invoke_targets(token, args))
    if quota_project:
        permissions[f"projects/{quota_project}"][USE_QUOTA_PROJECT].append("gcp:userProjectOverride bills calls to it")
    return Needs(
        {k: dict(v) for k, v in permissions.items()},
        dict(needs.act_as),
        dict(needs.project_grants),
        needs.targets,
        needs.untargeted,
    )


def custom_roles(resources: Iterable[Declared], default_project: str) -> dict[str, frozenset[str]]:
    """`projects/P/roles/ID` -> permissions, for every custom role a plan declares."""
    out: dict[str, frozenset[str]] = {}
    for r in resources:
        if r.type == "gcp:projects/iAMCustomRole:IAMCustomRole":
            project = r.inputs.get("project") or default_project
            out[f"projects/{project}/roles/{r.inputs['roleId']}"] = frozenset(r.inputs.get("permissions") or ())
    return out


def role_permissions(role: str, custom: Mapping[str, frozenset[str]]) -> frozenset[str]:
    return custom[role] if role in custom else iamdata.role_permissions(role)


_MEMBER_SCOPES: dict[str, tuple[str, str]] = {
    # type -> (input naming the resource, how its scope is written)
    "gcp:projects/iAMMember:IAMMember": ("project", "projects/{}"),
    "gcp:billing/accountIamMember:AccountIamMember": ("billingAccountId", "billingAccounts/{}"),
    "gcp:serviceaccount/iAMMember:IAMMember": ("serviceAccountId", "{}"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("bucket", "buckets/{}"),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": ("cryptoKeyId", "{}"),
    "gcp:pubsub/topicIAMMember:TopicIAMMember": ("topic", "{}"),
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": ("name", "runServices/{}"),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": ("repository", "repositories/{}"),
}


def grants_to(
    member: str, resources: Iterable[Declared], default_project: str, custom: Mapping[str, frozenset[str]]
) -> list[Grant]:
    """Every grant to `member` that the resources declare."""
    out: list[Grant] = []
    for r in resources:
        if r.type not in _MEMBER_SCOPES or r.inputs.get("member") != member:
            continue
        key, template = _MEMBER_SCOPES[r.type]
        target = r.inputs.get(key) or (default_project if key == "project" else None)
        condition = (r.inputs.get("condition") or {}).get("expression")
        role = r.inputs["role"]
        out.append(Grant(template.format(target), role, role_permissions(role, custom), condition))
    return out


# Whether a condition allows a call on one target: (expression, target) -> bool. The model itself
# does not evaluate CEL; callers pass an evaluator (the tests use cel-python, as IAM evaluates CEL).
Evaluate = Callable[[str, Target], bool]


def missing(
    needs: Needs, grants: Iterable[Grant], scopes: Iterable[str] | None = None, evaluate: Evaluate | None = None
) -> list[str]:
    """Each needed permission no grant provides, as 'permission on scope: needed to …'. Empty: all held.

    A grant under an IAM condition counts only with `evaluate`, and only where the plan names every
    target of the permission and the condition allows each one."""
    grants = list(grants)
    problems: list[str] = []
    wanted = set(scopes) if scopes is not None else set(needs.permissions)
    for scope in sorted(wanted):
        held = {p for g in grants if g.scope == scope and g.condition is None for p in g.permissions}
        for permission, why in sorted(needs.permissions.get(scope, {}).items()):
            if permission in held:
                continue
            if (
                permission == SET_PROJECT_IAM
                and scope.startswith("projects/")
                and _limited_admin_covers(
                    grants, scope, needs.project_grants.get(scope.removeprefix("projects/"), set())
                )
            ):
                continue
            if evaluate and _conditions_cover(needs, grants, scope, permission, evaluate):
                continue
            more = f" (and {len(why) - 1} more)" if len(why) > 1 else ""
            problems.append(f"{permission} on {scope}: needed to {why[0]}{more}")
    return problems


def _conditions_cover(needs: Needs, grants: list[Grant], scope: str, permission: str, evaluate: Evaluate) -> bool:
    targets = needs.targets.get(scope, {}).get(permission)
    if not targets or permission in needs.untargeted.get(scope, set()):
        return False  # some call of it names no target a condition could be judged on
    conditional = [g.condition for g in grants if g.scope == scope and g.condition and permission in g.permissions]
    return all(any(evaluate(expression, target) for expression in conditional) for target in targets)


def _limited_admin_covers(grants: list[Grant], scope: str, roles: set[str]) -> bool:
    for g in grants:
        allowed = g.grantable_roles
        if g.scope == scope and SET_PROJECT_IAM in g.permissions and allowed is not None and roles <= allowed:
            return True
    return False


def missing_act_as(
    needs: Needs, member: str, resources: Iterable[Declared], custom: Mapping[str, frozenset[str]]
) -> list[str]:
    """Each attached account `member` may not act as (act-as is granted on the account itself)."""
    held: set[str] = set()
    for r in resources:
        if (
            r.type == "gcp:serviceaccount/iAMMember:IAMMember"
            and r.inputs.get("member") == member
            and ACT_AS in role_permissions(r.inputs["role"], custom)
            and not r.inputs.get("condition")
        ):
            held.add(str(r.inputs.get("serviceAccountId", "")).rsplit("/", 1)[-1])
    return [f"{ACT_AS} on {email}: {why[0]}" for email, why in sorted(needs.act_as.items()) if email not in held]


def unneeded(needs: Needs, scope: str, permissions: Iterable[str]) -> list[str]:
    """Permissions granted on `scope` that the plan never uses: least privilege, checked."""
    return sorted(set(permissions) - needs.in_scope(scope))
