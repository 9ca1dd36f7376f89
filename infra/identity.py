"""One dedicated service account per workload, holding only allow-listed roles (S25).

Never the default Compute Engine account and never a key. The account is the bootstrap's to make
(`infra/access/accounts.py`): the stack names it and grants it its roles. Project roles come from the
workload's config (already checked against `iam.ALLOWED_PROJECT_ROLES`); storage roles are granted on
each bucket the workload uses, not on the project.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants
from infra.access.identities import self_service_account, workload_account
from infra.apis import ProjectApis
from infra.config import Env, WorkloadSettings
from run_contract import paths

# Accounts and their grants; the project APIs its program writes logs and metrics through; and the Security
# Token Service, through which the VM agent narrows its account's token to each run's objects (vm_agent/
# credentials.py; "Create a downscoped short-lived credential": "Enable the IAM and Security Token Service APIs").
IDENTITY_APIS = (
    "iam.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "sts.googleapis.com",
)


@dataclass(frozen=True)
class WorkloadIdentityArgs:
    workload: WorkloadSettings
    # A self-service VM's name: the identity is then that VM's own account, with the workload's rights
    # narrowed to the VM's prefix `<workload>/<vm>/` of the checkpoints and models buckets.
    vm: str = ""


class WorkloadIdentity(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: WorkloadIdentityArgs,
        buckets: dict[str, gcp.storage.Bucket],
        apis: ProjectApis,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:iam:WorkloadIdentity", name, None, opts)
        workload = args.workload
        child = pulumi.ResourceOptions(parent=self)
        account = (
            self_service_account(args.vm, env.stack)
            if args.vm
            else workload_account(workload.name, workload.description, env.stack)
        )
        own = paths.vm_objects_prefix(workload.name, args.vm) if args.vm else f"{workload.name}/"
        self.email = account.email(env.project)
        member = account.member(env.project)

        self.grants: list[pulumi.Resource] = []
        for role in workload.project_roles:
            grant = grants.project_role(
                f"{name}-{role.removeprefix('roles/').replace('.', '-')}",
                env.project,
                role,
                member,
                parent=self,
                depends_on=apis.needs("cloudresourcemanager"),
            )
            self.grants.append(grant)
        for purpose, access in workload.bucket_access:
            # Data is shared input; checkpoints and models are each workload's own, under its prefix.
            self.grants.append(
                grants.bucket_access(
                    f"{name}-{purpose}-{access}",
                    env.bucket_name(purpose),
                    buckets[purpose].name,
                    access,
                    member,
                    prefix=None if purpose == "data" else own,
                    title=f"{args.vm or workload.name}-only",
                    opts=child,
                )
            )
        self.register_outputs({"email": self.email})
