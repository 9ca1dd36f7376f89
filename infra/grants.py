"""The platform's grant helpers: one way to give an account a role, at each level.

- Act-as on an attached account (a TPU VM's, a Scheduler job's, a function's) is checked on the account
  itself; the bootstrap, which makes the accounts, grants it there (`infra/access/accounts.py`).
- `bucket_access`: read or write on one bucket, under one prefix when given.
- `checked_storage_condition`: every condition the platform puts on a bucket grant passes through it,
  checked against Cloud Storage's support for conditions (`infra/access/conditions.py`).
- `view_reader`: one log view, read through roles/logging.viewAccessor under a condition naming it.
- `project_role`: a project-level role. Conditions on resource attributes are refused for services
  that ignore them (`infra/access/conditions.py`): such a grant would silently apply to every resource
  of the service.
- `propagation_wait`: what uses a grant made in the same deploy waits until it has taken effect.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

import pulumi
import pulumi_gcp as gcp
import pulumiverse_time as time

from infra.access import iam, iamdata
from infra.access.conditions import check_condition
from run_contract import cel
from run_contract.cel import cel_string

# The delimiter of every CEL literal these helpers have deployed: an expression that changed only its quotes would
# replace the grant (run_contract/cel.py).
QUOTE = '"'
STORAGE = "storage.googleapis.com"  # the service of a bucket grant, as conditions-resource-attributes names it


def prefix_condition(bucket: str, prefix: str, title: str) -> gcp.storage.BucketIAMMemberConditionArgs:
    """Objects under `prefix` only, listing included.

    Cloud Storage checks object reads and writes on the object, whose name in a condition is
    `projects/_/buckets/BUCKET/objects/NAME` (resource.name; Cloud Storage supports resource attributes),
    and `objects.list` on the bucket, where only the `storage.googleapis.com/objectListPrefix` API
    attribute narrows it (IAM, "Attribute reference for IAM Conditions": API attributes).
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9._/-]*/", prefix):
        raise ValueError(f"prefix {prefix!r}: lowercase letters, digits, '.', '_', '-' and '/', ending in '/'")
    return objects_in_any(bucket, [prefix], title, f"Only objects under {prefix}")


def bucket_access(
    name: str,
    bucket: str,
    bucket_ref: pulumi.Input[str],
    access: str,
    member: pulumi.Input[str],
    *,
    prefix: str | None,
    title: str,
    opts: pulumi.ResourceOptions,
) -> gcp.storage.BucketIAMMember:
    """`access` (read | write: iam.BUCKET_ROLE_FOR_ACCESS) on the bucket named `bucket` for `member`, only
    under `prefix` when one is given, with a condition Cloud Storage honours (checked, not assumed)."""
    role = iam.BUCKET_ROLE_FOR_ACCESS[access]
    condition = None
    if prefix is not None:
        condition = checked_storage_condition(
            prefix_condition(bucket, prefix, title), role, iamdata.role_permissions(role)
        )
    return gcp.storage.BucketIAMMember(
        name, bucket=bucket_ref, role=role, member=member, condition=condition, opts=opts
    )


def checked_storage_condition(
    condition: gcp.storage.BucketIAMMemberConditionArgs, what: str, permissions: Iterable[str]
) -> gcp.storage.BucketIAMMemberConditionArgs:
    """`condition`, for a grant on a bucket of `permissions` (`what`: the role or grant, for the error),
    once checked: a condition Cloud Storage cannot evaluate is refused (UnsupportedConditionError), where
    Cloud Storage would ignore it and the grant cover the whole bucket."""
    check_condition(what, frozenset(permissions), str(condition.expression), STORAGE)
    return condition


def objects_in_any(
    bucket: str, prefixes: Sequence[str], title: str, description: str
) -> gcp.storage.BucketIAMMemberConditionArgs:
    """Objects under any of `prefixes`, listing each included: `prefix_condition` for several prefixes
    (a researcher's own folders on each self-service VM), one condition so one binding per member."""
    # The literal is quoted whatever it holds (cel_string); the pattern is what keeps the grant narrow: a folder, never
    # empty (the whole bucket) and ending in '/' (`runs` would also match `runs-old/`), in the platform's names.
    for prefix in prefixes:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+/-]*/", prefix):
            raise ValueError(f"prefix {prefix!r}: letters, digits, '.', '_', '@', '+', '-' and '/', ending in '/'")
    expression = " || ".join(cel.objects_under(bucket, prefix, QUOTE) for prefix in prefixes)
    return gcp.storage.BucketIAMMemberConditionArgs(title=title[:100], description=description, expression=expression)


def object_condition(
    bucket: str, objects: Sequence[str], title: str, description: str
) -> gcp.storage.BucketIAMMemberConditionArgs:
    """Reads of exactly these objects. Cloud Storage names an object `projects/_/buckets/B/objects/NAME`
    in conditions (resource attributes supported: reference/gcp-iam/README.md); listing is checked on
    the bucket, so the holder cannot list at all and reads each object by its name."""
    names = " || ".join(_named(bucket, objects))
    return gcp.storage.BucketIAMMemberConditionArgs(title=title[:100], description=description, expression=names)


def _named(bucket: str, objects: Sequence[str]) -> list[str]:
    return [f"resource.name == {cel_string(cel.object_name(bucket, o), QUOTE)}" for o in sorted(set(objects))]


def reads_of(
    bucket: str, objects: Sequence[str], prefixes: Sequence[str], title: str, description: str
) -> gcp.storage.BucketIAMMemberConditionArgs:
    """Reads of exactly these objects and of any object under these prefixes, each by its name: no listing, which
    Cloud Storage checks on the bucket (`object_condition` and names under the prefixes together)."""
    names_under = (cel.named_under(bucket, prefix, QUOTE) for prefix in prefixes)
    expression = " || ".join([*_named(bucket, objects), *names_under])
    return gcp.storage.BucketIAMMemberConditionArgs(title=title[:100], description=description, expression=expression)


def project_role(
    name: str,
    project: str,
    role: str | pulumi.Output[str],
    member: pulumi.Input[str],
    *,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
    permissions: frozenset[str] | None = None,
    condition: gcp.projects.IAMMemberConditionArgs | None = None,
) -> gcp.projects.IAMMember:
    """`role` for `member` on `project`. Pass `permissions` for a custom role, so a condition can be checked."""
    if condition is not None:
        if not isinstance(condition.expression, str):
            raise TypeError(f"{name}: a condition's expression must be known at plan time, to be checked")
        held = permissions if permissions is not None else iamdata.role_permissions(str(role))
        check_condition(str(role), held, condition.expression)
    return gcp.projects.IAMMember(
        name,
        project=project,
        role=role,
        member=member,
        condition=condition,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on),
    )


VIEW_ACCESSOR = "roles/logging.viewAccessor"


def view_reader(
    name: str,
    project: str,
    member: str,
    view: str,
    title: str,
    description: str,
    *,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> gcp.projects.IAMMember:
    """Reading one log view (`projects/P/locations/L/buckets/B/views/V`) and no other: roles/logging.viewAccessor
    on the project under a condition naming the view (Logging, "Configure log views on a log bucket": a grant
    on the project "restricted by an IAM condition to a specific log view"; Logging honours resource.name)."""
    return project_role(
        name,
        project,
        VIEW_ACCESSOR,
        member,
        parent=parent,
        depends_on=depends_on,
        condition=view_condition(view, title, description),
    )


def view_condition(view: str, title: str, description: str) -> gcp.projects.IAMMemberConditionArgs:
    """The condition "this log view and no other", as `view_reader` puts it on its grant."""
    return gcp.projects.IAMMemberConditionArgs(
        title=title[:100], description=description, expression=f"resource.name == {cel_string(view, QUOTE)}"
    )


# IAM, "Access change propagation": allow-policy changes "typically propagate in 2 minutes, but could
# potentially take 7 minutes or longer". The provider retries only quota errors on a 403, never a
# denied act-as or a build that cannot read its source; pulumi-gcp's own V2Vm example sleeps 60 s after
# creating the account "to limit eventual consistency errors" (pulumiverse-time, as here).
PROPAGATION = "120s"


def propagation_wait(
    name: str, grants: Sequence[pulumi.Resource], parent: pulumi.Resource | None = None
) -> pulumi.Resource:
    """A wait after `grants` for whatever uses them: it runs when it is created, that is on the first
    deploy, and again whenever a grant is added (its trigger is the set of grants); later deploys go on
    at once. The deploy workflow installs its provider plugin (.github/workflows/deploy.yml)."""
    urns = pulumi.Output.all(*[g.urn for g in grants]).apply(
        lambda values: hashlib.sha256("\n".join(sorted(values)).encode()).hexdigest()[:16]
    )
    return time.Sleep(
        name,
        create_duration=PROPAGATION,
        triggers={"grants": urns},
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(grants)),
    )
