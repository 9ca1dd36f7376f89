"""Self-service: each self-service VM's own account, and researcher rights that reach only their own runs.

What a submitted program can reach, the researcher can; what a researcher can reach, another must not
(docs/design-isolation.md, the threat model). So:

- **A self-service VM has an account of its own** (infra/access/identities.py `self_service_account`, made by the
  bootstrap; a WorkloadIdentity with the VM's name): never the workload account of a VM that runs reviewed
  work. It has the workload's rights narrowed to that VM: its folder of the run-status bucket
  (infra/lifecycle.py RunStatus grants it), its own prefix `<workload>/<vm>/` of the checkpoints and models
  buckets (its stack run's and its researchers' runs'), the data bucket read-only when the workload reads
  data, any packaged source under `sources/` and the image repository (it runs what researchers submit:
  infra/artifacts.py), and the workload's project roles (logs, metrics). Within the VM each run holds only
  a token narrowed to its own objects (vm_agent/credentials.py).
- **Researchers, per member** (`user:`/`group:`): on the project a custom role with `tpu.nodes.list` (and
  the SSH rights with `researcherSsh`: project-wide, Cloud TPU has no per-node IAM); on the status
  bucket, new objects under their own `<vm>/requests/<member>/`, reading their own runs' states
  `<vm>/runs/<member>/` and the guard's record of the self-service VMs' nodes' states
  (`_tpu-guard/<env>/nodes/<node>.json`: when the node ran, which `tpu-runs report` bills from; not the
  guard's recovery record beside it); on the models bucket, reading their own runs' results `<workload>/<vm>/<member>/`;
  on the artifacts bucket, new archives under `sources/`; and their own runs' logs only: a log view of
  the `_Default` log bucket that shows the one log the agent writes their runs' output to
  (`run_contract.paths.researcher_log`), with `roles/logging.viewAccessor` granted on the project under a condition
  naming that view (Logging, "Configure log views on a log bucket": a view filter may name a LOG_ID; a
  grant on the project "restricted by an IAM condition to a specific log view").
  Cloud Storage and Logging recognise `resource.name` in conditions (conditions-resource-attributes).
  No researcher may delete or replace an object: requests are new objects only (ifGenerationMatch=0).
  A stop request under one member's prefix stops only that member's runs (vm_agent/run_requests.py): the
  prefix, which IAM holds to the member, says who asks. A group's members share the group's prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import researcher_calls as calls
from infra.access.accounts import StackIdentities
from infra.access.identities import researcher_roles
from infra.apis import ProjectApis
from infra.config import Env
from run_contract import paths

REQUIRED_APIS = ("iam", "cloudresourcemanager", "storage", "logging")
SSH_APIS = ("iap", "oslogin")


@dataclass(frozen=True)
class SelfServiceVm:
    vm: str
    workload: str
    data: bool  # the workload reads the data bucket
    checkpoints: bool  # the workload writes checkpoints
    models: bool  # and models
    nodes: tuple[str, ...] = ()  # its TPU nodes (infra/naming.py node_ids): `tpu-runs report` reads their states


@dataclass(frozen=True)
class ResearcherArgs:
    members: tuple[str, ...]  # user:/group: members, validated by the config reader
    vms: tuple[SelfServiceVm, ...]  # the VMs researchers may submit runs to
    status_bucket: str
    models_bucket: str
    artifacts_bucket: str
    ssh: bool


def researcher_apis(args: ResearcherArgs) -> tuple[str, ...]:
    """The APIs this component needs: IAP TCP forwarding and OS Login only when researchers may SSH."""
    return tuple(f"{api}.googleapis.com" for api in (*REQUIRED_APIS, *(SSH_APIS if args.ssh else ())))


def researcher_identities(stack: str, args: ResearcherArgs) -> StackIdentities:
    """The researchers' roles (each self-service VM's own account: infra/platform.py stack_identities)."""
    return StackIdentities(roles=tuple(researcher_roles(stack, args.ssh).values()))


def _member_key(member: str) -> str:
    return member.replace(":", "-")


def _storage_condition(
    title: str, description: str, bucket: str, prefixes: Sequence[str], permissions: Sequence[str]
) -> gcp.storage.BucketIAMMemberConditionArgs:
    return grants.checked_storage_condition(
        grants.objects_in_any(bucket, prefixes, title, description), title, permissions
    )


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
        project_permissions = roles["project"].permissions
        after = pulumi.ResourceOptions(parent=self, depends_on=list(buckets))
        logging_apis = apis.needs("logging")
        self.grants: list[pulumi.Resource] = []
        self.views: dict[str, gcp.logging.LogView] = {}
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
                    permissions=frozenset(project_permissions),
                )
            )
            # (grant name suffix, role, its permissions, bucket, condition title, description, prefixes)
            places = [
                (
                    "runs",
                    read_role,
                    calls.READ_PERMISSIONS,
                    args.status_bucket,
                    "own-run-states",
                    f"Only {member}'s runs' states",
                    [paths.member_runs_prefix(v.vm, member) for v in args.vms],
                ),
                (
                    "requests",
                    submit_role,
                    calls.SUBMIT_PERMISSIONS,
                    args.status_bucket,
                    "own-requests",
                    f"Only {member}'s new run and stop requests",
                    [paths.member_requests_prefix(v.vm, member) for v in args.vms],
                ),
                (
                    "results",
                    read_role,
                    calls.READ_PERMISSIONS,
                    args.models_bucket,
                    "own-run-results",
                    f"Only {member}'s runs' models and metrics",
                    [paths.member_objects_prefix(v.workload, v.vm, member) for v in args.vms if v.models],
                ),
            ]
            if args.vms:
                sources = (
                    "sources",
                    submit_role,
                    calls.SUBMIT_PERMISSIONS,
                    args.artifacts_bucket,
                    "workload-sources",
                    "Only packaged workload sources",
                    [paths.SOURCES_PREFIX],
                )
                places.append(sources)
            for suffix, role_name, permissions, bucket, title, description, prefixes in places:
                if not prefixes:
                    continue
                self.grants.append(
                    gcp.storage.BucketIAMMember(
                        f"{key}-{suffix}",
                        bucket=bucket,
                        role=role_name,
                        member=member,
                        condition=_storage_condition(title, description, bucket, prefixes, permissions),
                        opts=after,
                    )
                )
            nodes = [paths.node_states_name(env.stack, node) for v in args.vms for node in v.nodes]
            if nodes:  # the guard's record of the VMs' nodes' states: her report's billed time runs from READY
                title = "vm-node-states"
                condition = grants.checked_storage_condition(
                    grants.object_condition(
                        args.status_bucket, nodes, title, "Only the self-service VMs' nodes' states"
                    ),
                    title,
                    calls.READ_PERMISSIONS,
                )
                self.grants.append(
                    gcp.storage.BucketIAMMember(
                        f"{key}-node-states",
                        bucket=args.status_bucket,
                        role=read_role,
                        member=member,
                        condition=condition,
                        opts=after,
                    )
                )
            if args.vms:
                view_id = paths.researcher_log(member)
                self.views[member] = gcp.logging.LogView(
                    f"{key}-log-view",
                    bucket=f"projects/{env.project}/locations/global/buckets/{naming.LOG_BUCKET}",
                    name=view_id,
                    description=f"The output of {member}'s self-service runs (tpu-runs logs)",
                    filter=f'SOURCE("projects/{env.project}") AND LOG_ID("{view_id}")',
                    opts=pulumi.ResourceOptions(parent=self, depends_on=logging_apis),
                )
                self.grants.append(
                    grants.view_reader(
                        f"{key}-logs",
                        env.project,
                        member,
                        naming.researcher_log_view(env.project, member),
                        f"own-run-logs-{view_id}",
                        f"Only the log view of {member}'s runs",
                        parent=self,
                        depends_on=[*apis.needs("cloudresourcemanager"), self.views[member]],
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
