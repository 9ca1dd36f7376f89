"""The permission model over the GKE engine: every container.* and compute.resourcePolicies.* call the
deployer makes is mapped from the provider's source to Google's method data, and a bootstrap that plans an
environment running the engine gives that environment's deployer exactly those permissions, act-as on the
nodes' account (which the bootstrap makes), and the node role to grant, nothing more."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from functools import cache

import pytest

import bootstrap.program
import infra.platform
import infra.tpu.metadata
from bootstrap.program import PROJECT_IAM_ADMIN, read_access
from infra import naming
from infra.access import iamdata, researcher_calls
from infra.access.environment import (
    RETIRED_PROJECT_ROLES,
    AccessError,
    Plan,
    environment_access,
    log_names_condition,
)
from infra.access.model import (
    DEPLOY,
    PREVIEW,
    Declared,
    Target,
    custom_roles,
    missing,
    missing_act_as,
    needs_of,
    role_permissions,
    unneeded,
)
from infra.config import parse_stack_config
from infra.gke.cluster import NODE_ROLE
from infra.gke.jobsets import FETCH_CONTAINER, FolderRun, run_jobset
from infra.startup import Artifact
from infra.tpu.metadata import agent_package
from run_contract import paths
from run_contract.spec import FolderSource, RunSpec
from tests.gke_objects import FOLDER_IMAGE, V5E_16_SPOT
from tests.iam_conditions import allows
from tests.support import deploys, fixture_config, plan
from tests.test_access import ADMIN, deployer, held_by
from tests.test_bootstrap import bootstrap_config
from tests.test_bootstrap import plan as plan_bootstrap
from tools.offline.access import access_of, declared
from tools.offline.mocks import project_number
from tools.offline.policy_check import check_policies
from tools.offline.runner import PlanResult, run_program

STACK, PROJECT = "gke", "fixture-gke"
HOME = f"projects/{PROJECT}"
GKE_PERMISSIONS = {
    "container.clusters.create",
    "container.clusters.get",
    "container.clusters.update",
    "container.clusters.delete",
    "container.clusters.connect",
    "container.operations.get",
    "compute.resourcePolicies.create",
    "compute.resourcePolicies.get",
    "compute.resourcePolicies.update",
    "compute.resourcePolicies.delete",
    "compute.regionOperations.get",
}


@cache
def gke_plan() -> PlanResult:
    """The GKE fixture stack, deployed by CI: its deployer is the bootstrap's."""
    raw = {**fixture_config(STACK), "tpu-platform:deployer": f"tpu-deployer-{STACK}@{ADMIN}.iam.gserviceaccount.com"}
    return plan(raw, STACK)


def gke_needs(phases: tuple[str, ...] = DEPLOY):
    result = gke_plan()
    return needs_of(declared(result), result.project, phases, invokes=result.invokes)


@cache
def gke_boot() -> PlanResult:
    """The bootstrap, planning the GKE environment next to dev and prod, from that environment's access."""
    plans = deploys(gke_plan().config, STACK)
    access = {**read_access(), STACK: {**access_of(STACK, plans).as_json(), "cmekKeys": []}}
    patch = pytest.MonkeyPatch()
    patch.setattr(bootstrap.program, "read_access", lambda: access)
    try:
        environments = '{"dev": "acme-ml-sandbox", "prod": "acme-ml-production", "gke": "fixture-gke"}'
        return plan_bootstrap(bootstrap_config(environments=environments))
    finally:
        patch.undo()


def test_the_deployer_needs_exactly_the_engines_gke_calls():
    needed = {p for p in gke_needs().in_scope(HOME) if p.startswith(("container.", "compute.resourcePolicies."))}
    assert needed | {"compute.regionOperations.get"} == GKE_PERMISSIONS
    why = gke_needs().permissions[HOME]
    assert any("gke-cluster" in w for w in why["container.clusters.create"])
    assert any("slices-ironwood-0" in w for w in why["container.clusters.update"])  # a node pool is a cluster update
    assert any("slices-ironwood-workload-policy" in w for w in why["compute.resourcePolicies.create"])
    # The teams' queues go through the cluster's DNS endpoint, which IAM guards; inside, RBAC decides
    # (tests/test_gke_teams.py).
    assert why["container.clusters.connect"] == [
        f"{phase} queues-objects (kubernetes:yaml/v2:ConfigGroup)" for phase in ("create", "read", "update", "delete")
    ]


def test_the_cluster_and_every_pool_attach_the_nodes_account():
    nodes = f"tpu-gke-nodes-{STACK}@{PROJECT}.iam.gserviceaccount.com"
    attached = gke_needs().act_as[nodes]
    assert {a.split(" ")[0] for a in attached} == {"gke-cluster", "gke-system", "slices-v5e-0", "slices-ironwood-0"}


def test_a_refresh_reads_clusters_pools_and_policies_and_connects_for_the_queues():
    reads = {p for p in gke_needs(PREVIEW).in_scope(HOME) if p.startswith(("container.", "compute.resourcePolicies."))}
    assert reads == {"container.clusters.get", "compute.resourcePolicies.get", "container.clusters.connect"}


def test_the_bootstraps_deployer_of_a_gke_environment_holds_what_its_plan_needs_and_nothing_more():
    held = held_by(deployer(STACK), gke_boot())
    assert missing(gke_needs(), held, [HOME], evaluate=allows) == []
    (role,) = [g for g in held if g.role == f"{HOME}/roles/tpuPlatformDeployerGke"]
    (logs,) = [g for g in held if g.role == f"{HOME}/roles/tpuPlatformDeployerLogsGke"]
    assert role.permissions >= GKE_PERMISSIONS
    assert unneeded(gke_needs(), HOME, role.permissions | logs.permissions) == []
    (limited,) = [g for g in held if g.role == PROJECT_IAM_ADMIN]
    assert NODE_ROLE in (limited.grantable_roles or ())
    assert limited.grantable_roles == gke_needs().project_grants[PROJECT] | set(RETIRED_PROJECT_ROLES)


def test_the_bootstrap_with_a_gke_environment_passes_the_policy_pack():
    """No mandatory rule fails (the state bucket's missing labels are advisory, as in every bootstrap)."""
    assert [v for v in check_policies(gke_boot()) if v.enforcement == "mandatory"] == []


def test_the_bootstrap_makes_the_nodes_account_and_grants_the_deployer_act_as_on_it_only_there():
    resources = declared(gke_boot())
    nodes = f"tpu-gke-nodes-{STACK}"
    assert any(r.inputs.get("accountId") == nodes for r in resources if r.type == "gcp:serviceaccount/account:Account")
    assert not gke_plan().of_type("gcp:serviceaccount/account:Account")  # the stack only names it
    assert missing_act_as(gke_needs(), deployer(STACK), resources, custom_roles(resources, PROJECT)) == []
    without = [r for r in resources if r.name != f"{STACK}-deployer-acts-as-{nodes}"]
    problems = missing_act_as(gke_needs(), deployer(STACK), without, custom_roles(without, PROJECT))
    assert problems and all(p.startswith(f"iam.serviceAccounts.actAs on {nodes}@") for p in problems)


def test_dev_and_prods_deployers_gain_nothing_from_the_engine():
    """The shipped stacks run no GKE: their deployers hold no container or resource-policy permission."""
    for stack in ("dev", "prod"):
        held = {p for g in held_by(deployer(stack)) for p in g.permissions}
        assert not {p for p in held if p.startswith(("container.", "compute.resourcePolicies."))}


# --- the teams (infra/gke/team_access.py) ----------------------------------------------------------------

BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
NUMBER = project_number(PROJECT)


def principal(namespace: str) -> str:
    pool = f"projects/{NUMBER}/locations/global/workloadIdentityPools/{PROJECT}.svc.id.goog"
    return f"principal://iam.googleapis.com/{pool}/subject/ns/{namespace}/sa/tpu-workloads"


def object_in(purpose: str, name: str) -> Target:
    return (f"projects/_/buckets/{PROJECT}-{STACK}-{purpose}/objects/{name}", None)


@cache
def boot_roles() -> dict[str, frozenset[str]]:
    """The custom roles the bootstrap makes for the GKE environment, by name."""
    return custom_roles(declared(gke_boot()), PROJECT)


def boot_role(role_id: str):
    """The custom role the bootstrap makes for the GKE environment by this id."""
    (made,) = [
        r
        for r in declared(gke_boot())
        if r.type == "gcp:projects/iAMCustomRole:IAMCustomRole" and r.inputs["roleId"] == role_id
    ]
    return made


def can(member: str, purpose: str, target: Target, permission: str, result: PlanResult | None = None) -> bool:
    """Whether a bucket grant of the plan (`result`, the fixture stack's by default) lets `member` do `permission`
    on `target`, its condition evaluated; a custom role holds what the bootstrap makes it with."""
    custom = boot_roles()
    for grant in (result or gke_plan()).of_type(BUCKET_GRANT):
        inputs = grant.inputs
        if inputs["member"] != member or inputs["bucket"] != f"{PROJECT}-{STACK}-{purpose}":
            continue
        if permission not in role_permissions(inputs["role"], custom):
            continue
        condition = inputs.get("condition")
        if condition is None or allows(condition["expression"], target):
            return True
    return False


def test_a_teams_code_reads_data_and_writes_its_own_prefixes_only_as_its_kubernetes_account():
    vision, nlp = principal("team-vision"), principal("team-nlp")
    assert can(vision, "data", object_in("data", "imagenet/train-0001"), "storage.objects.get")
    assert not can(vision, "data", object_in("data", "x"), "storage.objects.create")
    for purpose in ("checkpoints", "models"):
        assert can(vision, purpose, object_in(purpose, "teams/vision/run-1/ckpt"), "storage.objects.create")
        assert can(
            vision,
            purpose,
            (f"projects/_/buckets/{PROJECT}-{STACK}-{purpose}", "teams/vision/"),
            "storage.objects.list",
        )
        for elsewhere in ("teams/nlp/run-1/ckpt", "mnist/r1/ckpt", "teams/vision-b/x", "teams/"):
            assert not can(vision, purpose, object_in(purpose, elsewhere), "storage.objects.get"), elsewhere
        assert not can(
            vision, purpose, (f"projects/_/buckets/{PROJECT}-{STACK}-{purpose}", "teams/"), "storage.objects.list"
        )
        assert can(nlp, purpose, object_in(purpose, "teams/nlp/x"), "storage.objects.delete")


def test_a_teams_account_holds_nothing_else_and_no_google_account_stands_in_for_it():
    members = {
        r.inputs["member"] for r in gke_plan().resources if r.type in (BUCKET_GRANT, "gcp:projects/iAMMember:IAMMember")
    }
    principals = {m for m in members if m.startswith("principal://")}
    assert principals == {principal("team-vision"), principal("team-nlp")}
    project_grants = gke_plan().of_type("gcp:projects/iAMMember:IAMMember")
    assert not any(g.inputs["member"].startswith("principal://") for g in project_grants)
    assert not [a for a in gke_needs().act_as if "team" in a]  # nothing to act as, nothing to impersonate


def test_members_reach_the_cluster_with_the_bootstraps_team_role_and_nothing_inside_it():
    role = f"{HOME}/roles/tpuPlatformGkeTeamGke"
    granted = {(g.inputs["member"], g.inputs["role"]) for g in gke_plan().of_type("gcp:projects/iAMMember:IAMMember")}
    assert {("user:ada@example.com", role), ("user:grace@example.com", role)} <= granted
    made = boot_role("tpuPlatformGkeTeamGke")
    assert sorted(made.inputs["permissions"]) == ["container.clusters.connect", "container.clusters.get"]


# --- the teams' run output (tpu-runs logs --team) ---------------------------------------------------------

LOG_BUCKET = "gcp:logging/projectBucketConfig:ProjectBucketConfig"
LOG_SINK = "gcp:logging/projectSink:ProjectSink"
LOG_VIEW = "gcp:logging/logView:LogView"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"


def test_each_team_has_a_log_bucket_filled_by_a_sink_of_its_namespace_and_one_view():
    buckets = {b.inputs["bucketId"]: b for b in gke_plan().of_type(LOG_BUCKET)}
    assert set(buckets) == {"tpu-gke-team-vision", "tpu-gke-team-nlp"}
    assert {b.inputs["location"] for b in buckets.values()} == {"global"}
    sinks = {s.inputs["name"]: s.inputs for s in gke_plan().of_type(LOG_SINK)}
    assert sinks["tpu-gke-team-vision"]["destination"] == (
        f"logging.googleapis.com/{HOME}/locations/global/buckets/tpu-gke-team-vision"
    )
    assert sinks["tpu-gke-team-vision"]["filter"] == (
        f'resource.type="k8s_container" AND resource.labels.project_id="{PROJECT}" AND '
        'resource.labels.cluster_name="tpu-gke" AND resource.labels.namespace_name="team-vision"'
    )
    assert 'namespace_name="team-nlp"' in sinks["tpu-gke-team-nlp"]["filter"]
    views = {v.inputs["bucket"]: v.inputs for v in gke_plan().of_type(LOG_VIEW)}
    assert set(views) == {f"{HOME}/locations/global/buckets/tpu-gke-team-{t}" for t in ("vision", "nlp")}
    assert {v["name"] for v in views.values()} == {"runs"}
    # A view's filter takes only SOURCE(), resource.type and LOG_ID() (logging.v2 LogView.filter): the bucket,
    # not the view, is what keeps one team's output from another.
    assert {v["filter"] for v in views.values()} == {f'SOURCE("{HOME}") AND resource.type = "k8s_container"'}


def test_a_teams_logs_outlive_a_destroy():
    for bucket in gke_plan().of_type(LOG_BUCKET):
        assert bucket.retain_on_delete, bucket.name


def test_no_one_is_granted_to_write_the_team_log_buckets():
    """A sink into a log bucket of its own project has no writer identity and needs no grant (logging.v2
    LogSink.writerIdentity): nothing grants bucketWriter, and nothing names a sink's writer identity."""
    roles = {g.inputs["role"] for g in gke_plan().resources if "role" in g.inputs}
    assert "roles/logging.bucketWriter" not in roles
    # Nothing of a team may write logs as the platform: its members and its code hold no log-writing role.
    team = {"user:ada@example.com", "user:grace@example.com", principal("team-vision"), principal("team-nlp")}
    assert not [
        g for g in gke_plan().of_type(PROJECT_GRANT) if g.inputs["member"] in team and "Writer" in g.inputs["role"]
    ]
    assert not [s for s in gke_plan().of_type(LOG_SINK) if s.inputs.get("uniqueWriterIdentity") is False]


def team_view(team: str) -> str:
    return f"{HOME}/locations/global/buckets/tpu-gke-team-{team}/views/runs"


def view_grants(member: str) -> list:
    return [
        g
        for g in gke_plan().of_type(PROJECT_GRANT)
        if g.inputs["member"] == member and g.inputs["role"] == "roles/logging.viewAccessor"
    ]


def test_a_member_reads_her_teams_log_view_and_no_other():
    (grant,) = view_grants("user:ada@example.com")
    expression = grant.inputs["condition"]["expression"]

    def reads(view: str) -> bool:
        return allows(expression, (view, None))

    assert reads(team_view("vision"))
    assert not reads(team_view("nlp"))
    assert not reads(f"{HOME}/locations/global/buckets/tpu-gke-team-vision/views/_AllLogs")  # the bucket's own view
    assert not reads(f"{HOME}/locations/global/buckets/_Default/views/_AllLogs")  # every log of the project
    assert not reads(f"{HOME}/locations/global/buckets/_Default/views/{team_view('vision').rsplit('/', 1)[1]}")
    (grace,) = view_grants("user:grace@example.com")
    assert allows(grace.inputs["condition"]["expression"], (team_view("nlp"), None))


def test_a_members_project_grants_are_the_cluster_role_and_her_teams_view_nothing_more():
    """Least privilege, by permissions: reading entries through a view checks logging.views.access on the view
    (infra/access/researcher_calls.py VIEW_PERMISSIONS), which viewAccessor holds and no other logging read."""
    for member in ("user:ada@example.com", "user:grace@example.com"):
        granted = [g.inputs for g in gke_plan().of_type(PROJECT_GRANT) if g.inputs["member"] == member]
        assert sorted((g["role"], bool(g.get("condition"))) for g in granted) == [
            (f"{HOME}/roles/tpuPlatformGkeTeamGke", False),
            ("roles/logging.viewAccessor", True),
        ]
    held = iamdata.role_permissions("roles/logging.viewAccessor")
    assert "logging.views.access" in held and "logging.logEntries.list" not in held


def test_the_deployer_needs_the_team_log_calls_and_the_bootstrap_gives_them():
    why = gke_needs().permissions[HOME]
    assert any("team-access-vision-log-bucket" in w for w in why["logging.buckets.create"])
    assert any("team-access-vision-log-sink" in w for w in why["logging.sinks.create"])
    assert any("team-access-vision-log-view" in w for w in why["logging.views.create"])
    held = held_by(deployer(STACK), gke_boot())
    assert missing(gke_needs(), held, [HOME], evaluate=allows) == []
    (limited,) = [g for g in held if g.role == PROJECT_IAM_ADMIN]
    assert "roles/logging.viewAccessor" in (limited.grantable_roles or ())


NAMED_LOG_CALLS = {
    "logging.buckets.get",
    "logging.buckets.update",
    "logging.buckets.delete",
    "logging.views.get",
    "logging.views.update",
    "logging.views.delete",
}


def test_the_deployer_edits_the_platforms_log_buckets_and_views_only_under_a_condition_naming_them():
    """Logging sees log buckets and views by name in a condition (conditions-resource-attributes: LogBucket and
    LogView). Unconditioned, the deployer could shorten `_Default`'s retention, delete a security team's log
    bucket, or rewrite another stack's views."""
    held = held_by(deployer(STACK), gke_boot())
    unconditioned = {p for g in held if g.condition is None for p in g.permissions}
    assert not unconditioned & NAMED_LOG_CALLS
    (logs,) = [g for g in held if g.permissions & NAMED_LOG_CALLS]
    assert logs.permissions == NAMED_LOG_CALLS and logs.condition
    # Every one of those calls names its bucket or view, and the condition admits each (the proof above).
    targets = {t for p in NAMED_LOG_CALLS for t in gke_needs().targets[HOME][p]}
    assert {name for name, _ in targets} == {
        f"{HOME}/locations/global/buckets/tpu-gke-team-{team}{view}"
        for team in ("vision", "nlp")
        for view in ("", "/views/runs")
    }
    admitted = [
        f"{HOME}/locations/global/buckets/tpu-gke-team-vision",
        team_view("nlp"),
        f"{HOME}/locations/global/buckets/_Default/views/tpu-runs-0123456789abcdef",  # a researcher's view
    ]
    refused = [
        f"{HOME}/locations/global/buckets/_Default",
        f"{HOME}/locations/global/buckets/_Required",
        f"{HOME}/locations/global/buckets/_Default/views/_AllLogs",
        f"{HOME}/locations/global/buckets/_Default/views/_Default",
        f"{HOME}/locations/global/buckets/security-audit",
        f"{HOME}/locations/global/buckets/security-audit/views/tpu-runs-0123456789abcdef",
        f"{HOME}/locations/global/buckets/tpu-gke-prod-team-vision",  # another stack's
        f"{HOME}/locations/eu/buckets/tpu-gke-team-vision",
        "projects/other-project/locations/global/buckets/tpu-gke-team-vision",
    ]
    assert [n for n in admitted if not allows(logs.condition, (n, None))] == []
    assert [n for n in refused if allows(logs.condition, (n, None))] == []


def test_what_no_condition_can_narrow_stays_in_the_deployers_role():
    """A create is checked on its parent, and a sink (or an operation) is no resource a condition sees: those
    calls name no target, so a conditioned grant never counts for them (docs/ci-and-bootstrap.md says what they
    leave the deployer)."""
    untargeted = gke_needs().untargeted[HOME]
    assert {
        "logging.buckets.create",
        "logging.views.create",
        "logging.operations.get",
        "logging.sinks.create",
        "logging.sinks.get",
        "logging.sinks.update",
        "logging.sinks.delete",
    } <= untargeted
    assert not untargeted & NAMED_LOG_CALLS


def test_a_plan_naming_a_log_bucket_outside_the_platforms_names_is_refused():
    audit = Declared(
        "gcp:logging/projectBucketConfig:ProjectBucketConfig",
        "audit",
        {"project": "p", "location": "global", "bucketId": "security-audit"},
    )
    outside = "logging.buckets.delete on projects/p/locations/global/buckets/security-audit, outside"
    with pytest.raises(AccessError, match=re.escape(outside)):
        environment_access(STACK, "p", [Plan([audit])], log_prefixes=naming.platform_log_prefixes("p", STACK))


def test_the_researchers_views_start_as_the_deployer_may_edit_them():
    assert paths.researcher_log("user:ada@example.com").startswith(naming.RESEARCHER_LOG_PREFIX)
    assert naming.researcher_log_view(PROJECT, "user:ada@example.com").startswith(
        naming.platform_log_prefixes(PROJECT, STACK)[1]
    )


def test_no_stacks_deployer_edits_another_stacks_team_log_buckets_or_views():
    """Two stacks may share a project (the bootstrap's `environments`). A team's bucket is `tpu-<stack>-team-<team>`,
    and a team may be named `x-team-a`: were `dev-team-x` a stack, its team `a`'s bucket would start as `dev`'s
    deployer may edit. No stack has a `team` part after its first (naming.stack_problem), so every other stack's
    team buckets and views fall outside each stack's condition, as IAM evaluates it."""
    assert naming.stack_problem("dev-team-x") is not None and naming.stack_problem("dev-team") is not None
    assert naming.stack_problem("team-a") is None
    names = ["a", "team"]
    names += [f"{x}-{y}" for x in names for y in names]
    names += [f"{x}-{y}" for x in names[:2] for y in names[2:]]
    stacks = [n for n in names if naming.stack_problem(n) is None]
    assert stacks == ["a", "team", "a-a", "team-a", "a-a-a", "team-a-a"]
    for stack in stacks:
        condition = log_names_condition(naming.platform_log_prefixes(PROJECT, stack))
        for other in stacks:
            for team in names:
                bucket = naming.team_log_bucket_path(PROJECT, other, team)
                for name in (bucket, naming.team_log_view(PROJECT, other, team)):
                    assert allows(condition, (name, None)) == (other == stack), (stack, name)


def test_stacks_sharing_a_project_share_their_researchers_views():
    """What the condition does not separate (docs/ci-and-bootstrap.md): a researcher's view of `_Default` is named
    by the member alone, one per project, so each stack's deployer in a shared project may edit every stack's."""
    view = naming.researcher_log_view(PROJECT, "user:ada@example.com")
    for stack in ("dev", "prod"):
        assert allows(log_names_condition(naming.platform_log_prefixes(PROJECT, stack)), (view, None))


# --- the teams' results (tpu-runs fetch --team) ------------------------------------------------------------


def test_a_member_reads_her_teams_runs_results_and_nothing_else_with_exactly_fetchs_calls():
    made = boot_role("tpuPlatformGkeTeamReadGke")
    assert sorted(made.inputs["permissions"]) == sorted(researcher_calls.permissions("models"))
    assert sorted(made.inputs["permissions"]) == ["storage.objects.get", "storage.objects.list"]
    ada, grace = "user:ada@example.com", "user:grace@example.com"
    models = f"projects/_/buckets/{PROJECT}-{STACK}-models"
    assert can(ada, "models", object_in("models", "teams/vision/exp-1/model.keras"), "storage.objects.get")
    assert can(ada, "models", (models, "teams/vision/exp-1/"), "storage.objects.list")
    for elsewhere in ("teams/nlp/exp-1/model.keras", "teams/vision-b/x", "mnist/r1/model.keras"):
        assert not can(ada, "models", object_in("models", elsewhere), "storage.objects.get"), elsewhere
    assert not can(ada, "models", (models, "teams/"), "storage.objects.list")
    assert not can(ada, "models", object_in("models", "teams/vision/x"), "storage.objects.create")
    assert can(grace, "models", object_in("models", "teams/nlp/exp-1/model.keras"), "storage.objects.get")
    for purpose in ("data", "checkpoints"):  # a member reads nothing else of the stack's
        assert not can(ada, purpose, object_in(purpose, "teams/vision/exp-1/x"), "storage.objects.get")


# --- the teams' folder sources (tpu-runs submit --team --folder) -------------------------------------------

RUNNER = paths.source_object(agent_package().sha256, paths.RUNNERS_PREFIX)
SHA = "a" * 64


def test_a_teams_pods_read_the_runner_and_their_teams_sources_by_name_and_nothing_else_of_the_artifacts():
    vision, nlp = principal("team-vision"), principal("team-nlp")
    assert can(vision, "artifacts", object_in("artifacts", RUNNER), "storage.objects.get")
    assert can(vision, "artifacts", object_in("artifacts", f"teams/vision/sources/{SHA}.tar.gz"), "storage.objects.get")
    assert can(nlp, "artifacts", object_in("artifacts", f"teams/nlp/sources/{SHA}.tar.gz"), "storage.objects.get")
    for elsewhere in (
        f"teams/nlp/sources/{SHA}.tar.gz",  # another team's code
        f"sources/{SHA}.tar.gz",  # a workload's or a self-service researcher's
        f"teams/vision-b/sources/{SHA}.tar.gz",
        f"teams/vision/{SHA}.tar.gz",
    ):
        assert not can(vision, "artifacts", object_in("artifacts", elsewhere), "storage.objects.get"), elsewhere
    artifacts = f"projects/_/buckets/{PROJECT}-{STACK}-artifacts"
    for prefix in ("teams/vision/sources/", "sources/", ""):  # no listing: each archive is read by its name
        assert not can(vision, "artifacts", (artifacts, prefix), "storage.objects.list"), prefix
    for write in ("storage.objects.create", "storage.objects.delete"):  # the program cannot swap its own source
        assert not can(vision, "artifacts", object_in("artifacts", f"teams/vision/sources/{SHA}.tar.gz"), write)


def test_a_run_submitted_against_one_runner_still_fetches_after_a_deploy_of_another(monkeypatch):
    """A JobSet pins the runner it was submitted with. A later `pulumi up` that uploads another runner (a changed
    vm_agent/ or run_contract/) must leave that run's fetch step readable: a run still queued in Kueue, or
    restarted after a spot node's loss, fetches the runner it pinned, and a refused read fails it for good (78)."""
    artifacts = f"{PROJECT}-{STACK}-artifacts"
    first = agent_package()
    source = FolderSource(f"gs://{artifacts}/teams/vision/sources/{SHA}.tar.gz", SHA)
    spec = RunSpec(run_id="exp-1", source=source, command=("python3", "main.py"), requester="user:ada@example.com")
    gke = parse_stack_config(STACK, gke_plan().config).gke
    assert gke is not None
    (team,) = [t for t in gke.teams if t.name == "vision"]
    folder = FolderRun(FOLDER_IMAGE, Artifact(artifacts, first.object_name, first.sha256))
    jobset = run_jobset(spec, team, V5E_16_SPOT, checkpoints="ckpt", models="models", folder=folder)
    pods = [job["template"]["spec"]["template"]["spec"] for job in jobset["spec"]["replicatedJobs"]]
    scripts = [c["command"][2] for pod in pods for c in pod["initContainers"] if c["name"] == FETCH_CONTAINER]
    assert scripts
    fetched = {
        (bucket, urllib.parse.unquote(name))
        for script in scripts
        for bucket, name in re.findall(r"/storage/v1/b/([^/]+)/o/([^?]+)\?alt=media", script)
    }
    assert fetched == {(artifacts, first.object_name), (artifacts, f"teams/vision/sources/{SHA}.tar.gz")}

    # The stack planned again with another runner, as `pulumi up` after a change to the runner's folders.
    second = dataclasses.replace(first, data=first.data + b"\0", sha256="b" * 64)
    for module in (infra.platform, infra.tpu.metadata):
        monkeypatch.setattr(module, "agent_package", lambda: second)
    later = run_program(STACK, gke_plan().config)
    uploaded = {o.inputs["name"] for o in later.of_type("gcp:storage/bucketObject:BucketObject")}
    assert second.object_name in uploaded and first.object_name not in uploaded
    for _, name in sorted(fetched):
        assert can(principal("team-vision"), "artifacts", object_in("artifacts", name), "storage.objects.get", later)
    # And what the runner's prefix lets the pods read is the deployer's alone: no one the plan grants anything on
    # the artifacts bucket (members, teams' pods, workloads, the platform's own accounts) writes there.
    granted = {g.inputs["member"] for g in later.of_type(BUCKET_GRANT) if g.inputs["bucket"] == artifacts}
    assert {"user:ada@example.com", "user:grace@example.com", principal("team-vision")} <= granted
    for member in sorted(granted):
        for write in ("storage.objects.create", "storage.objects.delete"):
            assert not can(member, "artifacts", object_in("artifacts", second.object_name), write, later), member


def test_a_member_uploads_her_teams_folder_sources_only_with_exactly_the_uploads_calls():
    made = boot_role("tpuPlatformGkeTeamSubmitGke")
    assert sorted(made.inputs["permissions"]) == sorted(researcher_calls.permissions("artifacts"))
    assert sorted(made.inputs["permissions"]) == ["storage.objects.create", "storage.objects.get"]
    ada, grace = "user:ada@example.com", "user:grace@example.com"
    mine = object_in("artifacts", f"teams/vision/sources/{SHA}.tar.gz")
    assert can(ada, "artifacts", mine, "storage.objects.create") and can(ada, "artifacts", mine, "storage.objects.get")
    assert not can(ada, "artifacts", mine, "storage.objects.delete")  # never replaced: a new object or none
    for elsewhere in (f"teams/nlp/sources/{SHA}.tar.gz", RUNNER, f"sources/{SHA}.tar.gz"):
        assert not can(ada, "artifacts", object_in("artifacts", elsewhere), "storage.objects.create"), elsewhere
    assert can(grace, "artifacts", object_in("artifacts", f"teams/nlp/sources/{SHA}.tar.gz"), "storage.objects.create")
    # She looks the runner up by its name (submit refuses a checkout the stack was not deployed from), and reads
    # nothing else of the bucket: no listing, no other object, no write.
    assert can(ada, "artifacts", object_in("artifacts", RUNNER), "storage.objects.get")
    artifacts = f"projects/_/buckets/{PROJECT}-{STACK}-artifacts"
    assert not can(ada, "artifacts", (artifacts, "sources/"), "storage.objects.list")
    assert not can(ada, "artifacts", object_in("artifacts", f"sources/{SHA}.tar.gz"), "storage.objects.get")
    assert not can(ada, "artifacts", object_in("artifacts", f"teams/nlp/sources/{SHA}.tar.gz"), "storage.objects.get")
