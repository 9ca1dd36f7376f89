"""What one environment's CI identities must hold, computed from that environment's plans.

Every plan counts: a first deploy and a later one (`tools/offline/deploys.py`), whose data sources
read what earlier deploys left. What the identities hold is the union of both plans' needs.

- The deployer: one custom role on the environment project with every permission the plans' create,
  read, update and delete calls check there, except setting the project's IAM policy, which it gets
  from `roles/resourcemanager.projectIamAdmin` only under a `modifiedGrantsByRole` condition listing
  the roles the plan grants (cloud.google.com/iam/docs/setting-limits-on-granting-roles); act-as on
  each account the plan attaches; budgets through `roles/billing.costsManager` on the billing account
  (billing-account roles cannot be custom at project level). It holds no `iam.roles.*` and no right on
  service accounts themselves: the accounts and custom roles are the bootstrap's to make
  (`infra/access/accounts.py`), and a plan that would create one is refused here.
  Its calls on a log bucket or log view by name (get, update, delete: the two Logging resources IAM
  Conditions see) come from a second custom role, under a condition admitting only the platform's own
  log names (`log_names_condition`); a create, an operation and every sink call name nothing a condition sees
  (conditions-resource-attributes), so they stay in the first role: docs/ci-and-bootstrap.md says what that leaves.
- The previewer: one custom role of the reads `pulumi preview --refresh` makes, except object reads,
  which it holds only for the objects a refresh reads (`ObjectReads`: by name, under a condition).
A permission needed anywhere else (another project, say a KMS key's) is an error: such grants are
the bootstrap's to make, on behalf of the plan, never rights of the deployer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.access import iamdata
from infra.access.accounts import StackIdentities
from infra.access.model import DEPLOY, PREVIEW, SET_PROJECT_IAM, USE_QUOTA_PROJECT, Declared, Needs, needs_of
from run_contract.cel import cel_string

BILLING_DEPLOY_ROLE = "roles/billing.costsManager"
BILLING_PREVIEW_ROLE = "roles/billing.viewer"


class AccessError(ValueError):
    pass


# Google's agents that the plan's features need, with the role each needs, granted by the bootstrap
# (Eventarc, "Roles and permissions for Cloud Run functions targets"): Eventarc's agent for any
# event trigger; the Cloud Storage agent publishes direct Cloud Storage events to Pub/Sub.
EVENTARC_AGENT = {"agent": "eventarc.googleapis.com", "role": "roles/eventarc.serviceAgent"}
STORAGE_AGENT_PUBLISHER = {"agent": "storage.googleapis.com", "role": "roles/pubsub.publisher"}


def agent_grants(resources: Iterable[Declared]) -> list[dict[str, str]]:
    triggers = [
        r.inputs["eventTrigger"]
        for r in resources
        if r.type == "gcp:cloudfunctionsv2/function:Function" and r.inputs.get("eventTrigger")
    ]
    out = [EVENTARC_AGENT] if triggers else []
    if any(str(t.get("eventType", "")).startswith("google.cloud.storage.") for t in triggers):
        out.append(STORAGE_AGENT_PUBLISHER)
    return out


# What the bootstrap makes: a plan that declares one of these has a deployer that could widen itself.
BOOTSTRAP_TYPES = (
    "gcp:serviceaccount/account:Account",
    "gcp:projects/iAMCustomRole:IAMCustomRole",
    "gcp:serviceaccount/iAMMember:IAMMember",
)
OBJECT_READS = ("storage.objects.get", "storage.objects.list")
# Project roles an earlier version of the program granted and this one revokes. Revoking is a change of
# the project's policy too, which the deployer's `modifiedGrantsByRole` condition must list, or the first
# deploy of this version fails. Remove an entry once every stack has deployed without it.
RETIRED_PROJECT_ROLES: dict[str, str] = {
    "roles/run.builder": "the guard's build account held it project-wide; now its parts, each on its resource",
}
# A content digest in an object name (a packaged source, the guard's archive): any version is read.
_DIGEST = re.compile(r"[0-9a-f]{16,}")


@dataclass(frozen=True)
class Plan:
    """One plan of the environment's program: what it declares and which data sources it reads."""

    resources: Sequence[Declared]
    invokes: Sequence[tuple[str, Mapping[str, Any]]] = ()


@dataclass(frozen=True)
class ObjectReads:
    """The Cloud Storage objects a refresh reads, as `bucket/glob` (`*` within a name, as Cloud Storage's
    matchGlob), and the buckets it lists."""

    objects: tuple[str, ...] = ()
    listings: tuple[str, ...] = ()

    def as_json(self) -> dict[str, list[str]]:
        return {"objects": list(self.objects), "listings": list(self.listings)}


def object_reads(plans: Iterable[Plan]) -> ObjectReads:
    objects: set[str] = set()
    listings: dict[str, set[str]] = {}
    plans = list(plans)
    for plan in plans:
        for token, args in plan.invokes:
            if token == "gcp:storage/getBucketObjects:getBucketObjects":
                glob = str(args.get("prefix") or "") + str(args.get("matchGlob") or "*")
                listings.setdefault(str(args["bucket"]), set()).add(glob)
    for plan in plans:
        read = [
            (str(r.inputs["bucket"]), str(r.inputs["name"]))
            for r in plan.resources
            if r.type == "gcp:storage/bucketObject:BucketObject"
        ]
        read += [
            (str(a["bucket"]), str(a["name"]))
            for t, a in plan.invokes
            if t == "gcp:storage/getBucketObjectContent:getBucketObjectContent"
        ]
        for bucket, name in read:
            globs = [g for g in listings.get(bucket, ()) if _glob(g).fullmatch(name)]
            objects.add(f"{bucket}/{globs[0] if globs else _DIGEST.sub('*', name)}")
    objects.update(f"{bucket}/{glob}" for bucket, globs in listings.items() for glob in globs)
    return ObjectReads(tuple(sorted(objects)), tuple(sorted(listings)))


def _glob(glob: str) -> re.Pattern[str]:
    return re.compile("[^/]*".join(re.escape(part) for part in glob.split("*")))


# The deployer's permissions that a condition on resource.name can narrow: Logging's on log buckets and views
# (conditions-resource-attributes: logging.googleapis.com/LogBucket and /LogView), each held under the condition
# only where every call of it names its bucket or view (infra/access/model.py: a get, patch or delete).
NAMED_LOG_PERMISSIONS = ("logging.buckets.", "logging.views.")


def log_names_condition(prefixes: Sequence[str]) -> str:
    """An IAM condition (CEL) admitting the log buckets and views whose full names
    (`projects/P/locations/L/buckets/B[/views/V]`, conditions-resource-attributes) start with one of `prefixes`."""
    if not prefixes:
        raise ValueError("a log names condition needs at least one prefix")
    for prefix in prefixes:
        if not re.fullmatch(
            r"projects/[a-z0-9-]+/locations/[a-z0-9-]+/buckets/[A-Za-z0-9_.-]+(/views/[A-Za-z0-9_.-]*)?", prefix
        ):
            raise ValueError(f"{prefix!r}: not the start of a log bucket's or view's name")
    return " || ".join(f"resource.name.startsWith({cel_string(prefix)})" for prefix in prefixes)


def object_reads_condition(reads: ObjectReads) -> str:
    """An IAM condition (CEL) allowing object reads of exactly `reads`: Cloud Storage names an object
    `projects/_/buckets/B/objects/NAME` and checks a listing on the bucket, `projects/_/buckets/B`
    (conditions-resource-attributes). One `*` per glob: a name prefix and a suffix."""
    terms = [f"resource.name == {cel_string(f'projects/_/buckets/{bucket}')}" for bucket in reads.listings]
    for entry in reads.objects:
        bucket, glob = entry.split("/", 1)
        head, star, tail = glob.partition("*")
        if "*" in tail:
            raise ValueError(f"{entry}: one '*' at most in a read the previewer is limited to")
        base = f"projects/_/buckets/{bucket}/objects/{head}"
        terms.append(
            f"(resource.name.startsWith({cel_string(base)}) && resource.name.endsWith({cel_string(tail)}))"
            if star
            else f"resource.name == {cel_string(base)}"
        )
    return " || ".join(terms) or "false"


@dataclass(frozen=True)
class EnvironmentAccess:
    stack: str
    project: str
    deployer_permissions: tuple[str, ...]
    grantable_roles: tuple[str, ...]
    previewer_permissions: tuple[str, ...]
    billing_accounts: tuple[str, ...]
    agent_grants: tuple[dict[str, str], ...] = ()
    deployer_acts_as: tuple[str, ...] = ()  # account ids the plans attach
    previewer_object_reads: ObjectReads = ObjectReads()
    identities: StackIdentities = field(default_factory=StackIdentities)
    # Held under `log_names_condition(deployer_log_prefixes)`: see NAMED_LOG_PERMISSIONS.
    deployer_log_permissions: tuple[str, ...] = ()
    deployer_log_prefixes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "agentGrants": list(self.agent_grants),
            "project": self.project,
            "deployerPermissions": list(self.deployer_permissions),
            "deployerActsAs": list(self.deployer_acts_as),
            "deployerLogPermissions": list(self.deployer_log_permissions),
            "deployerLogPrefixes": list(self.deployer_log_prefixes),
            "grantableRoles": list(self.grantable_roles),
            "previewerPermissions": list(self.previewer_permissions),
            "previewerObjectReads": self.previewer_object_reads.as_json(),
            "billingAccounts": list(self.billing_accounts),
            **self.identities.as_json(),
        }


def plans_needs(project: str, plans: Sequence[Plan], phases: tuple[str, ...], quota_project: str | None) -> Needs:
    """What the plans need together."""
    needs = [needs_of(p.resources, project, phases, invokes=p.invokes, quota_project=quota_project) for p in plans]
    out = needs[0]
    for more in needs[1:]:
        out = out.merged(more)
    return out


def environment_access(
    stack: str,
    project: str,
    plans: Sequence[Plan],
    quota_project: str | None = None,
    identities: StackIdentities | None = None,
    log_prefixes: Sequence[str] = (),
) -> EnvironmentAccess:
    """`log_prefixes`: where the platform's log buckets and views are named (infra/naming.py platform_log_prefixes)."""
    identities = identities or StackIdentities()
    for plan in plans:
        made = sorted(f"{r.name} ({r.type})" for r in plan.resources if r.type in BOOTSTRAP_TYPES)
        if made:
            raise AccessError(
                f"stack {stack!r} declares {', '.join(made)}: service accounts, custom roles and grants on accounts "
                "are the bootstrap's to make (infra/access/accounts.py); name them in the stack's identities instead"
            )
    deploy = plans_needs(project, plans, DEPLOY, quota_project)
    preview = plans_needs(project, plans, PREVIEW, quota_project)
    home = f"projects/{project}"
    billing: list[str] = []
    for scope, permissions in deploy.permissions.items():
        if scope == home:
            continue
        if scope.startswith("billingAccounts/"):
            lacking = set(permissions) - iamdata.role_permissions(BILLING_DEPLOY_ROLE)
            if lacking:
                raise AccessError(f"stack {stack!r}: {BILLING_DEPLOY_ROLE} lacks {sorted(lacking)} on {scope}")
            billing.append(scope.removeprefix("billingAccounts/"))
            continue
        first = sorted(permissions)[0]
        raise AccessError(
            f"stack {stack!r}: the plan needs {first} on {scope} ({permissions[first][0]}), outside its project "
            f"{project}; make that grant in the bootstrap instead"
        )
    reads = {p for p in preview.in_scope(home) if iamdata.is_read(p)} | (
        {USE_QUOTA_PROJECT} if quota_project == project else set()
    )
    # Object reads by name only, where every read names its object (a condition can judge it).
    by_name = {p for p in OBJECT_READS if p in reads and p not in preview.untargeted.get(home, set())}
    made = {a.account_id for a in identities.accounts}
    attached = sorted(
        {email.split("@")[0] for email in deploy.act_as if email.endswith(f"@{project}.iam.gserviceaccount.com")}
    )
    unmade = [a for a in attached if a not in made] + sorted(
        e for e in deploy.act_as if not e.endswith(f"@{project}.iam.gserviceaccount.com")
    )
    if unmade:
        raise AccessError(
            f"stack {stack!r}: the plan attaches {', '.join(unmade)}, which the stack's identities do not name "
            "(infra/platform.py stack_identities): the bootstrap would not make them or grant act-as on them"
        )
    resources = [r for plan in plans for r in plan.resources]
    agents = list({json_key(g): g for g in agent_grants(resources)}.values())
    named_logs = {
        p
        for p in deploy.in_scope(home)
        if p.startswith(NAMED_LOG_PERMISSIONS) and p not in deploy.untargeted.get(home, set())
    }
    for permission in sorted(named_logs):
        outside = sorted(
            name for name, _ in deploy.targets[home][permission] if not name.startswith(tuple(log_prefixes))
        )
        if outside:
            raise AccessError(
                f"stack {stack!r}: the plan needs {permission} on {', '.join(outside)}, outside the platform's log "
                f"names ({', '.join(log_prefixes) or 'none given'}): name it with infra/naming.py"
            )
    return EnvironmentAccess(
        stack=stack,
        project=project,
        deployer_permissions=tuple(sorted(deploy.in_scope(home) - {SET_PROJECT_IAM} - named_logs)),
        deployer_log_permissions=tuple(sorted(named_logs)),
        deployer_log_prefixes=tuple(log_prefixes) if named_logs else (),
        grantable_roles=tuple(sorted(deploy.project_grants.get(project, set()) | set(RETIRED_PROJECT_ROLES))),
        previewer_permissions=tuple(sorted(reads - by_name)),
        billing_accounts=tuple(sorted(billing)),
        agent_grants=tuple(agents),
        deployer_acts_as=tuple(attached),
        previewer_object_reads=object_reads(plans) if by_name else ObjectReads(),
        identities=identities,
    )


def json_key(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(value.items()))
