"""Researcher rights: exactly what the `tpu-runs` commands call (infra/access/researchers.py), no more.

- On the project, a custom role with `tpu.nodes.list` (the VMs' state) and `logging.logEntries.list`
  (follow a run's log); with `researcherSsh`, also `tpu.nodes.get` and IAP tunnelling plus OS Login.
  Cloud TPU supports no per-node IAM and no resource conditions (reference/gcp-iam/README.md), so
  these are project-wide: off unless the stack turns SSH on.
- On the run-status and models buckets, a custom role to get and list objects (runs' state, results).
- A custom role to create new objects (and read them), granted on the status bucket under
  `<vm>/requests/` of each selfService VM only, and on the artifacts bucket under `sources/` (only
  when some VM is self-service). Cloud Storage recognises `resource.name` in conditions, an object's
  name being `projects/_/buckets/B/objects/NAME` (conditions-resource-attributes); creating a new
  object needs no `storage.objects.delete`, so nothing a researcher did not write can be replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import researchers as calls
from infra.access.accounts import RoleSpec, StackIdentities
from infra.apis import ProjectApis
from infra.config import Env

REQUIRED_APIS = ("iam", "cloudresourcemanager", "storage")
SSH_APIS = ("iap", "oslogin")


@dataclass(frozen=True)
class ResearcherArgs:
    members: tuple[str, ...]  # user:/group: members, validated by the config reader
    self_service_vms: tuple[str, ...]  # VM names researchers may submit runs to
    status_bucket: str
    models_bucket: str
    artifacts_bucket: str
    ssh: bool


def researcher_apis(args: ResearcherArgs) -> tuple[str, ...]:
    """The APIs this component needs: IAP TCP forwarding and OS Login only when researchers may SSH."""
    return tuple(f"{api}.googleapis.com" for api in (*REQUIRED_APIS, *(SSH_APIS if args.ssh else ())))


def researcher_roles(stack: str, ssh: bool) -> dict[str, RoleSpec]:
    """The three custom roles (made by the bootstrap): on the project, to read a bucket, to submit."""
    return {
        "project": RoleSpec.of("researcher", stack, "researcher", "List TPU VMs and read logs for tpu-runs.",
                               calls.permissions("project", ssh=ssh)),
        "read": RoleSpec.of("researcher-read", stack, "researcher read", "Read run state and results for tpu-runs.",
                            calls.READ_PERMISSIONS),
        "submit": RoleSpec.of("researcher-submit", stack, "researcher submit",
                              "Put new run requests and sources for tpu-runs.", calls.SUBMIT_PERMISSIONS),
    }  # fmt: skip


def researcher_identities(stack: str, args: ResearcherArgs) -> StackIdentities:
    return StackIdentities(roles=tuple(researcher_roles(stack, args.ssh).values()))


def _condition(title: str, description: str, expression: str) -> gcp.storage.BucketIAMMemberConditionArgs:
    grants.check_condition(
        "researcher submit", frozenset(calls.SUBMIT_PERMISSIONS), expression, "storage.googleapis.com"
    )
    return gcp.storage.BucketIAMMemberConditionArgs(title=title[:100], description=description, expression=expression)


def _member_key(member: str) -> str:
    return member.replace(":", "-")


class ResearcherAccess(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: ResearcherArgs,
        apis: ProjectApis,
        buckets: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:iam:ResearcherAccess", name, None, opts)

        roles = researcher_roles(env.stack, args.ssh)
        project_role, read_role, submit_role = (roles[k].name(env.project) for k in ("project", "read", "submit"))
        after = pulumi.ResourceOptions(parent=self, depends_on=list(buckets))
        # Where researchers may put new objects: each self-service VM's requests, and (when there is one)
        # the packaged sources. (grant name suffix, bucket, condition title, its description, object prefix)
        submit_places = [
            (f"{vm}-requests", args.status_bucket, f"run-requests-{vm}",
             f"Only new run and stop requests for TPU VM {vm}", naming.requests_prefix(vm))
            for vm in args.self_service_vms
        ]  # fmt: skip
        if args.self_service_vms:
            submit_places.append(
                ("sources", args.artifacts_bucket, "workload-sources", "Only packaged workload sources",
                 naming.SOURCES_PREFIX)
            )  # fmt: skip
        self.grants: list[pulumi.Resource] = []
        for member in args.members:
            key = f"{name}-{_member_key(member)}"
            self.grants.append(
                grants.project_role(
                    f"{key}-project",
                    env.project,
                    project_role,
                    member,
                    parent=self,
                    depends_on=apis.needs("cloudresourcemanager"),
                    permissions=frozenset(roles["project"].permissions),
                )
            )
            for purpose, bucket in (("status", args.status_bucket), ("models", args.models_bucket)):
                self.grants.append(
                    gcp.storage.BucketIAMMember(
                        f"{key}-{purpose}-read", bucket=bucket, role=read_role, member=member, opts=after
                    )
                )
            for suffix, bucket, title, description, prefix in submit_places:
                self.grants.append(
                    gcp.storage.BucketIAMMember(
                        f"{key}-{suffix}",
                        bucket=bucket,
                        role=submit_role,
                        member=member,
                        condition=_condition(title, description, grants.objects_under(bucket, prefix)),
                        opts=after,
                    )
                )
            if args.ssh:
                for ssh_role in calls.SSH_ROLES:
                    self.grants.append(
                        grants.project_role(
                            f"{key}-{ssh_role.removeprefix('roles/').replace('.', '-')}",
                            env.project,
                            ssh_role,
                            member,
                            parent=self,
                            depends_on=apis.needs("cloudresourcemanager", *SSH_APIS),
                        )
                    )
        self.register_outputs({"members": list(args.members)})
