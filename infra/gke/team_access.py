"""What each team's code and people may do on the GCP side (the in-cluster side is RBAC: infra/gke/teams.py).

- The team's code runs as its namespace's Kubernetes service account (`tpu-workloads`), granted directly as
  a Workload Identity Federation principal (infra/access/iam.py, `kubernetes_principal`), never through a Google
  service account it could impersonate: it reads the data bucket, and reads and writes the checkpoints
  and models buckets under `teams/<team>/` only (conditions Cloud Storage honours: infra/grants.py),
  as a workload does under its own prefix (infra/identity.py). Its logs are the nodes' to write.
- The team's members reach the cluster: a custom role (the bootstrap's to make, infra/access/accounts.py)
  holding what `gcloud container clusters get-credentials --dns-endpoint` and kubectl through the DNS
  endpoint check, and nothing inside the cluster, which RBAC decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import iam
from infra.access.identities import member_role
from infra.apis import ProjectApis
from infra.config import Env
from infra.config.model import TeamSettings

# Where a team's code reads and writes (by bucket purpose), as a workload's default access.
TEAM_BUCKET_ACCESS: tuple[tuple[str, str], ...] = tuple(iam.DEFAULT_BUCKET_ACCESS.items())


@dataclass(frozen=True)
class TeamAccessArgs:
    teams: tuple[TeamSettings, ...]


class TeamAccess(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: TeamAccessArgs,
        buckets: Mapping[str, gcp.storage.Bucket],
        apis: ProjectApis,
        cluster: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:gke:TeamAccess", name, None, opts)
        # The pool PROJECT_ID.svc.id.goog exists once the cluster has Workload Identity on.
        after = pulumi.ResourceOptions(parent=self, depends_on=list(cluster))
        number = gcp.organizations.get_project_output(project_id=env.project).number
        role = member_role(env.stack)
        self.grants: list[pulumi.Resource] = []
        for team in args.teams:
            principal = number.apply(
                lambda n, t=team: iam.kubernetes_principal(n, env.project, t.namespace, naming.TEAM_SERVICE_ACCOUNT)
            )
            for purpose, access in TEAM_BUCKET_ACCESS:
                # Data is shared input; checkpoints and models are each team's own, under its prefix.
                self.grants.append(
                    grants.bucket_access(
                        f"{name}-{team.name}-{purpose}-{access}",
                        env.bucket_name(purpose),
                        buckets[purpose].name,
                        access,
                        principal,
                        prefix=None if purpose == "data" else naming.team_prefix(team.name),
                        title=f"team-{team.name}-only",
                        opts=after,
                    )
                )
            for member in team.members:
                self.grants.append(
                    grants.project_role(
                        f"{name}-{team.name}-{member.replace(':', '-')}",
                        env.project,
                        role.name(env.project),
                        member,
                        parent=self,
                        depends_on=apis.needs("cloudresourcemanager"),
                        permissions=frozenset(role.permissions),
                    )
                )
        self.register_outputs({})
