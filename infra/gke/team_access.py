"""What each team's code and people may do on the GCP side (the in-cluster side is RBAC: infra/gke/teams.py).

- The team's code runs as its namespace's Kubernetes service account (`tpu-workloads`), granted directly as
  a Workload Identity Federation principal (infra/access/iam.py, `kubernetes_principal`), never through a Google
  service account it could impersonate: it reads the data bucket, and reads and writes the checkpoints
  and models buckets under `teams/<team>/` only (conditions Cloud Storage honours: infra/grants.py),
  as a workload does under its own prefix (infra/identity.py). Its logs are the nodes' to write.
- The team's members reach the cluster: a custom role (the bootstrap's to make, infra/access/accounts.py)
  holding what `gcloud container clusters get-credentials --dns-endpoint` and kubectl through the DNS
  endpoint check, and nothing inside the cluster, which RBAC decides.
- A folder source runs in a pod as the team's code (infra/gke/jobsets.py FolderRun): its fetch step reads the
  runner's archive (`runners/<sha256>.tar.gz` of the artifacts bucket) and the team's folder archives
  (`teams/<team>/sources/`), each by its name (no listing), nothing else of that bucket. Every runner is
  readable, not the current deploy's alone: a JobSet pins the runner it was submitted with, and still fetches it
  while queued or after a restart, when a later `pulumi up` may have uploaded another. Only `pulumi up` writes
  under `runners/` (run_contract/paths.py RUNNERS_PREFIX), and the fetch step checks the archive's digest. Its
  members upload the team's archives: a custom role of exactly the upload's calls (infra/access/identities.py
  member_submit_role), under the team's sources prefix only; an archive is a new object, named by its sha256,
  never replaced.
- The team's members read the team's runs' models and metrics (`tpu-runs fetch --team`): a custom role of
  exactly the command's calls (infra/access/identities.py member_read_role) on the models bucket, under the
  team's prefix only, with the prefix condition Cloud Storage honours.
- The team's run output, for `tpu-runs logs --team`: a log view cannot select a namespace (logging.v2
  LogView.filter takes SOURCE(), resource.type and LOG_ID() only), so each team has a log bucket of its own
  (infra/naming.py team_log_bucket), a sink that routes its namespace's container logs there, and one view on
  that bucket; each member reads that view and no other (grants.view_reader). The sink needs no grant: "Sinks
  that have a destination that is a log bucket in the same project as the sink cannot have a writer_identity
  and no additional permissions are required" (logging.v2 LogSink.writerIdentity; a grant to its empty writer
  identity is refused, terraform-google-log-export #116). The entries stay in `_Default` as well, where no
  member may read them. The bucket outlives a `pulumi destroy` (retain_on_delete): its logs are the team's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import iam, iamdata
from infra.access.identities import member_read_role, member_role, member_submit_role
from infra.apis import ProjectApis
from infra.artifacts import OBJECT_READER
from infra.config import Env
from infra.config.model import TeamSettings
from run_contract import paths

# Where a team's code reads and writes (by bucket purpose), as a workload's default access.
TEAM_BUCKET_ACCESS: tuple[tuple[str, str], ...] = tuple(iam.DEFAULT_BUCKET_ACCESS.items())
# Cloud Logging's own default retention for a bucket (logging.v2 LogBucket.retentionDays: 30 when 0 is given).
TEAM_LOG_RETENTION_DAYS = 30
# The monitored resource GKE writes a container's stdout and stderr under (Cloud Logging, GKE queries:
# resource.type "k8s_container" with the labels cluster_name, namespace_name, pod_name, container_name).
CONTAINER_LOGS = "k8s_container"


def team_log_filter(project: str, cluster: str, namespace: str) -> str:
    """What a team's sink routes to its log bucket: the containers of its namespace in the stack's cluster."""
    return (
        f'resource.type="{CONTAINER_LOGS}" AND resource.labels.project_id="{project}" AND '
        f'resource.labels.cluster_name="{cluster}" AND resource.labels.namespace_name="{namespace}"'
    )


def team_view_filter(project: str) -> str:
    """The team's view shows what the sink routed: the project's container logs."""
    return f'SOURCE("projects/{project}") AND resource.type = "{CONTAINER_LOGS}"'


def _grant(
    name: str,
    bucket: gcp.storage.Bucket,
    role: tuple[str, Iterable[str]],
    member: pulumi.Input[str],
    condition: gcp.storage.BucketIAMMemberConditionArgs,
    opts: pulumi.ResourceOptions,
) -> gcp.storage.BucketIAMMember:
    """`role` (its name, its permissions) on `bucket` for `member`, under `condition` once it is checked."""
    role_name, permissions = role
    checked = grants.checked_storage_condition(condition, role_name, permissions)
    return gcp.storage.BucketIAMMember(
        name, bucket=bucket.name, role=role_name, member=member, condition=checked, opts=opts
    )


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
        read = member_read_role(env.stack)
        submit = member_submit_role(env.stack)
        models = env.bucket_name("models")
        artifacts = env.bucket_name(naming.ARTIFACTS)
        logging_apis = apis.needs("logging")
        self.grants: list[pulumi.Resource] = []
        self.views: dict[str, gcp.logging.LogView] = {}
        for team in args.teams:
            self.views[team.name] = self._team_logs(name, env, team, logging_apis)
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
            sources = naming.team_sources_prefix(team.name)
            fetch = grants.reads_of(
                artifacts,
                [],
                [paths.RUNNERS_PREFIX, sources],
                f"team-{team.name}-fetch",
                "The runners and the team's sources",
            )
            reader = (OBJECT_READER, iamdata.role_permissions(OBJECT_READER))
            self.grants.append(
                _grant(f"{name}-{team.name}-sources-read", buckets[naming.ARTIFACTS], reader, principal, fetch, after)
            )
            for member in team.members:
                key = f"{name}-{team.name}-{member.replace(':', '-')}"
                # `tpu-runs submit --team --folder` first reads the runner's object (by its name only), so a
                # checkout whose runner no deploy uploaded is refused in words, not at each pod's fetch step.
                runner = grants.reads_of(
                    artifacts, [], [paths.RUNNERS_PREFIX], f"team-{team.name}-runner", "The runners"
                )
                upload = grants.prefix_condition(artifacts, sources, f"team-{team.name}-sources")
                results = grants.prefix_condition(models, naming.team_prefix(team.name), f"team-{team.name}-results")
                reads, submits = (
                    (read.name(env.project), read.permissions),
                    (submit.name(env.project), submit.permissions),
                )
                self.grants += [
                    _grant(f"{key}-runner", buckets[naming.ARTIFACTS], reads, member, runner, after),
                    _grant(f"{key}-sources", buckets[naming.ARTIFACTS], submits, member, upload, after),
                    _grant(f"{key}-results", buckets["models"], reads, member, results, after),
                ]
                self.grants.append(
                    grants.project_role(
                        key,
                        env.project,
                        role.name(env.project),
                        member,
                        parent=self,
                        depends_on=apis.needs("cloudresourcemanager"),
                        permissions=frozenset(role.permissions),
                    )
                )
                self.grants.append(
                    grants.view_reader(
                        f"{key}-logs",
                        env.project,
                        member,
                        naming.team_log_view(env.project, env.stack, team.name),
                        f"team-{team.name}-run-logs",
                        f"Only the log view of team {team.name}'s runs",
                        parent=self,
                        depends_on=[*apis.needs("cloudresourcemanager"), self.views[team.name]],
                    )
                )
        self.register_outputs({})

    def _team_logs(
        self, name: str, env: Env, team: TeamSettings, logging_apis: list[pulumi.Resource]
    ) -> gcp.logging.LogView:
        """The team's log bucket, the sink that fills it and the view its members read."""
        bucket_id = naming.team_log_bucket(env.stack, team.name)
        bucket = gcp.logging.ProjectBucketConfig(
            f"{name}-{team.name}-log-bucket",
            project=env.project,
            location=naming.TEAM_LOG_LOCATION,
            bucket_id=bucket_id,
            retention_days=TEAM_LOG_RETENTION_DAYS,
            description=f"The output of team {team.name}'s runs on the GKE engine (tpu-runs logs --team)",
            opts=pulumi.ResourceOptions(parent=self, depends_on=logging_apis, retain_on_delete=True),
        )
        path = naming.team_log_bucket_path(env.project, env.stack, team.name)
        gcp.logging.ProjectSink(
            f"{name}-{team.name}-log-sink",
            project=env.project,
            name=bucket_id,
            destination=f"logging.googleapis.com/{path}",
            filter=team_log_filter(env.project, naming.gke_cluster(env.stack), team.namespace),
            description=f"Team {team.name}'s container logs, to its own log bucket",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[bucket]),
        )
        return gcp.logging.LogView(
            f"{name}-{team.name}-log-view",
            bucket=path,
            name=naming.TEAM_LOG_VIEW,
            description=f"The output of team {team.name}'s runs (tpu-runs logs --team)",
            filter=team_view_filter(env.project),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[bucket]),
        )
