"""The permission model, proven on the shipped stacks, the examples and the bootstrap with Google's own data.

Every stack is planned as a first deploy and as a later one (tools/offline/deploys.py: the buckets it
looks up exist, with completion markers). Each environment's deployer and the previewer are read from
the bootstrap's plan; what they need is computed from both of the environment's plans (infra/access).
A removed role or permission fails with the missing permission named.
"""

from __future__ import annotations

import dataclasses
import json
import re
from functools import cache

import pytest

from bootstrap.program import BOOTSTRAP_ADMIN_ROLES, PROJECT_IAM_ADMIN, BootstrapConfig, build_bootstrap
from infra.access import iamdata
from infra.access.calls import FIELD_REVIEW, INVOKE_CALLS, RESOURCE_CALLS
from infra.access.conditions import UnsupportedConditionError, check_condition
from infra.access.environment import (
    RETIRED_PROJECT_ROLES,
    AccessError,
    ObjectReads,
    Plan,
    environment_access,
    log_names_condition,
    object_reads_condition,
)
from infra.access.identities import (
    GUARD_METHODS,
    GUARD_PERMISSIONS,
    SCHEDULER_METHODS,
    SCHEDULER_PERMISSIONS,
    WORKLOAD_METHODS,
)
from infra.access.model import (
    DEPLOY,
    PREVIEW,
    Declared,
    Grant,
    Needs,
    custom_roles,
    grants_to,
    missing,
    missing_act_as,
    needs_of,
    unneeded,
)
from infra.config.stackfile import ROOT, read_stack_config
from infra.platform import export_all
from tests.iam_conditions import HOSTILE_NAMES, allows
from tests.support import (
    FIXTURE_STACKS,
    depends_on,
    deploys,
    fixture_config,
    shipped_deploys,
    shipped_plan,
    stack_config,
)
from tests.test_bootstrap import plan as plan_bootstrap
from tools.offline.access import ACCESS_FILE, access_of, declared, generate, quota_project
from tools.offline.deploys import DEPLOYS, later_state, vm_names
from tools.offline.runner import PlanResult, run_program

STACKS = ("dev", "prod")
ADMIN = "acme-ml-admin"
PROJECTS = {"dev": "acme-ml-sandbox", "prod": "acme-ml-production"}
BILLING = "billingAccounts/01A2B3-C4D5E6-F7A8B9"
DANGEROUS = ("roles/owner", "roles/editor", "roles/iam.serviceAccountAdmin", "roles/iam.roleAdmin")
EXAMPLES = tuple(
    sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "examples").glob("*.yaml"))
)
FIXTURES = tuple(sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in FIXTURE_STACKS.glob("*.yaml")))


def env_plan(stack: str) -> PlanResult:
    return shipped_plan(stack)


@cache
def boot() -> PlanResult:
    return plan_bootstrap()


def deployer(stack: str) -> str:
    return f"serviceAccount:tpu-deployer-{stack}@{ADMIN}.iam.gserviceaccount.com"


PREVIEWER = f"serviceAccount:tpu-platform-ci-previewer@{ADMIN}.iam.gserviceaccount.com"


def boot_declared() -> list[Declared]:
    return declared(boot())


def held_by(member: str, result: PlanResult | None = None) -> list[Grant]:
    """Every grant to `member` in the bootstrap's plan, custom roles resolved in whichever project."""
    resources = declared(result or boot())
    return grants_to(member, resources, ADMIN, custom_roles(resources, ADMIN))


def needs(stack: str, phases: tuple[str, ...] = DEPLOY, deploy: str = "fresh") -> Needs:
    result = shipped_deploys(stack)[deploy]
    return needs_of(
        declared(result),
        result.project,
        phases,
        invokes=result.invokes,
        quota_project=quota_project(read_stack_config(stack)),
    )


# --- the model itself -------------------------------------------------------------------------


def test_every_type_the_plans_declare_has_a_mapping_and_a_field_review():
    for result in (*(d for s in STACKS for d in shipped_deploys(s).values()), boot()):
        types = {r.type for r in result.resources if r.custom}
        assert types <= set(RESOURCE_CALLS), types - set(RESOURCE_CALLS)
    # A type added to the model says which of its fields were searched for checks of the caller.
    assert set(FIELD_REVIEW) == set(RESOURCE_CALLS)


def test_a_type_with_no_mapping_fails_with_its_name():
    with pytest.raises(KeyError, match=r"gcp:compute/instance:Instance"):
        needs_of([Declared("gcp:compute/instance:Instance", "vm", {})], "p")


def test_every_mapped_method_is_in_googles_method_data():
    for resource_type, calls in RESOURCE_CALLS.items():
        for phase in DEPLOY:
            for method in calls.methods(phase, {"eventTrigger": {}, "forceDestroy": True, "disableOnDestroy": True}):
                assert iamdata.method_permissions(method), (resource_type, method)
        for check in calls.fields:
            for method in check.methods:
                assert iamdata.method_permissions(method), (resource_type, check.path, method)
    for token, methods in INVOKE_CALLS.items():
        assert all(iamdata.method_permissions(m) for m in methods), token


def test_access_file_is_computed_from_the_current_plans():
    """bootstrap/access.json drifts the moment a plan needs another permission, account or role
    (regenerate with `python -m tools.offline access --write`, then apply the bootstrap before deploying)."""
    assert json.loads(ACCESS_FILE.read_text()) == generate(deploys=shipped_deploys)


# --- every deploy, not just the first --------------------------------------------------------


def test_a_later_deploy_runs_every_lookup_a_first_one_skips():
    """A stack that deletes a VM once its run completes: the program asks for the status bucket, and once it
    exists lists its markers and reads each one. A first deploy only asks."""
    planned = deploys(fixture_config("production"), "production")
    tokens = {deploy: [t for t, _ in planned[deploy].invokes] for deploy in DEPLOYS}
    listing = "gcp:storage/getBucketObjects:getBucketObjects"
    reading = "gcp:storage/getBucketObjectContent:getBucketObjectContent"
    assert listing not in tokens["fresh"] and reading not in tokens["fresh"]
    assert listing in tokens["later"] and reading in tokens["later"]
    # The markers are of an earlier run: the later plan declares the same VMs.
    assert len(planned["later"].of_type("gcp:tpu/v2Vm:V2Vm")) == 2


def _made_and_read(result: PlanResult) -> tuple[list[str], list[str]]:
    """What a plan declares and which data sources it reads, in no order (the SDK runs invokes on its loop)."""
    made = [[r.type, r.name, r.parent, r.inputs, r.dependencies] for r in result.resources]
    read = [json.dumps(i, sort_keys=True) for i in result.invokes]
    return sorted(json.dumps(m, sort_keys=True) for m in made), sorted(read)


@pytest.mark.parametrize(
    "stack, raw",
    [(s, stack_config(s)) for s in STACKS]
    + [(name, fixture_config(name)) for name in FIXTURES]
    + [(name, read_stack_config(name, ROOT, ROOT / "examples" / f"Pulumi.{name}.yaml")) for name in EXAMPLES],
    ids=[*STACKS, *FIXTURES, *EXAMPLES],
)
def test_a_later_deploys_plan_is_what_the_whole_program_plans_in_the_later_state(stack, raw):
    """The later plan reuses the first's registrations and makes only the status bucket's reads again
    (tools/offline/deploys.later_plan): the program run in full in that state declares and reads the same."""
    planned = deploys(raw, stack)
    whole = run_program(stack, raw, state=later_state(planned["fresh"], vm_names(planned["fresh"])))
    assert _made_and_read(planned["later"]) == _made_and_read(whole)
    assert planned["later"].warnings == whole.warnings


def test_a_later_deploy_needs_what_a_first_one_does_not():
    """The permissions a model of one fresh plan missed (prod's deployer could not list its status bucket)."""
    fresh, later = needs("prod"), needs("prod", deploy="later")
    home = f"projects/{PROJECTS['prod']}"
    assert "storage.objects.list" not in fresh.in_scope(home)
    assert "storage.objects.list" in later.in_scope(home)
    # The provider asks for no ACLs (no projection=full): no object IAM reads.
    assert "storage.objects.getIamPolicy" not in later.in_scope(home)


@pytest.mark.parametrize("deploy", DEPLOYS)
@pytest.mark.parametrize("stack", STACKS)
def test_deployer_holds_every_permission_each_deploy_needs(stack, deploy):
    scopes = [f"projects/{PROJECTS[stack]}", BILLING]
    assert missing(needs(stack, deploy=deploy), held_by(deployer(stack)), scopes) == []


@pytest.mark.parametrize("deploy", DEPLOYS)
@pytest.mark.parametrize("stack", STACKS)
def test_previewer_holds_every_read_each_refresh_makes(stack, deploy):
    scopes = [f"projects/{PROJECTS[stack]}", BILLING]
    assert missing(needs(stack, PREVIEW, deploy), held_by(PREVIEWER), scopes, evaluate=allows) == []


def test_a_budget_topic_needs_set_iam_policy_on_the_topic():
    """billingbudgets.v1 NotificationsRule.pubsubTopic: the caller needs pubsub.topics.setIamPolicy on it."""
    why = needs("prod").permissions[f"projects/{PROJECTS['prod']}"]["pubsub.topics.setIamPolicy"]
    assert any("allUpdatesRule.pubsubTopic" in reason for reason in why)
    assert "pubsub.topics.setIamPolicy" not in needs("dev").in_scope(f"projects/{PROJECTS['dev']}")  # no topic


# --- the examples: planned like the shipped stacks, with the bootstrap they would get -------------


@cache
def example_deploys(name: str) -> dict[str, PlanResult]:
    return deploys(read_stack_config(name, ROOT, ROOT / "examples" / f"Pulumi.{name}.yaml"), name)


@cache
def example_access() -> dict[str, dict]:
    out = {}
    for name in EXAMPLES:
        plans = example_deploys(name)
        out[name] = {**access_of(name, plans, plans["fresh"].config).as_json(), "cmekKeys": []}
    return out


@cache
def example_bootstrap() -> PlanResult:
    """The bootstrap, with each example as one more environment, as a team adopting it would run it."""
    raw = read_stack_config("acme", ROOT / "bootstrap")
    access = example_access()
    cfg = BootstrapConfig(
        project=ADMIN,
        repository="acme/tpu-platform",
        repository_id="812345678",
        repository_owner_id="98765432",
        deploy_ref="refs/heads/main",
        state_bucket="acme-ml-pulumi-state",
        location="us-central1",
        billing_account="01A2B3-C4D5E6-F7A8B9",
        environments=tuple((n, e["project"]) for n, e in access.items()),
    )
    return run_program(
        "acme", raw, program=lambda: export_all(build_bootstrap(cfg, access)), project="tpu-platform-bootstrap"
    )


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_examples_deployer_and_the_previewer_hold_what_both_its_deploys_need(name):
    boot_plan = example_bootstrap()
    for result in example_deploys(name).values():
        project = result.project
        for who, phases in ((deployer(name), DEPLOY), (PREVIEWER, PREVIEW)):
            need = needs_of(declared(result), project, phases, invokes=result.invokes)
            assert missing(need, held_by(who, boot_plan), [f"projects/{project}", BILLING], evaluate=allows) == []
        need = needs_of(declared(result), project, DEPLOY, invokes=result.invokes)
        assert missing_act_as(need, deployer(name), declared(boot_plan), {}) == []


# --- the deployer -------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_may_act_as_every_account_its_plan_attaches(stack):
    attached = needs(stack).act_as
    assert any("tpu-mnist" in email for email in attached)  # the TPU VM's account is among them
    # Granted by the bootstrap, on each account.
    assert missing_act_as(needs(stack), deployer(stack), boot_declared(), {}) == []


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_holds_nothing_its_plans_do_not_need(stack):
    project = PROJECTS[stack]
    custom = [g for g in held_by(deployer(stack)) if g.role.startswith(f"projects/{project}/roles/tpuPlatformDeployer")]
    assert len(custom) == 1
    both = needs(stack).merged(needs(stack, deploy="later"))
    assert unneeded(both, f"projects/{project}", custom[0].permissions) == []
    (limited,) = [g for g in held_by(deployer(stack)) if g.role == PROJECT_IAM_ADMIN]
    # What the plans grant, and what an earlier version granted and this one revokes.
    assert limited.grantable_roles == needs(stack).project_grants[project] | set(RETIRED_PROJECT_ROLES)


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_cannot_make_or_change_accounts_roles_or_their_iam(stack):
    """Those are the bootstrap's: a deployer that could change a role it may grant, or set IAM on an
    account, could widen itself."""
    held = {p for g in held_by(deployer(stack)) if g.scope == f"projects/{PROJECTS[stack]}" for p in g.permissions}
    assert not {p for p in held if p.startswith("iam.roles.")}
    assert not held & {
        "iam.serviceAccounts.create",
        "iam.serviceAccounts.delete",
        "iam.serviceAccounts.setIamPolicy",
        "iam.serviceAccounts.update",
        "iam.serviceAccountKeys.create",
    }
    plan = shipped_plan(stack)
    assert not plan.of_type("gcp:serviceaccount/account:Account")
    assert not plan.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert not plan.of_type("gcp:serviceaccount/iAMMember:IAMMember")


def test_a_plan_that_makes_an_account_is_refused():
    account = Declared("gcp:serviceaccount/account:Account", "sneaky", {"accountId": "sneaky-sa"})
    with pytest.raises(AccessError, match=r"sneaky .*bootstrap's to make"):
        environment_access("dev", "p", [Plan([account])])


def test_a_plan_attaching_an_account_the_stack_does_not_name_is_refused():
    vm = Declared("gcp:tpu/v2Vm:V2Vm", "vm", {"serviceAccount": {"email": "other-sa@p.iam.gserviceaccount.com"}})
    with pytest.raises(AccessError, match="attaches other-sa"):
        environment_access("dev", "p", [Plan([vm])])


@pytest.mark.parametrize("stack", STACKS)
def test_removing_a_permission_fails_with_it_named(stack):
    crippled = [
        Grant(g.scope, g.role, g.permissions - {"tpu.nodes.create"}, g.condition) if "Deployer" in g.role else g
        for g in held_by(deployer(stack))
    ]
    problems = missing(needs(stack), crippled, [f"projects/{PROJECTS[stack]}"])
    assert len(problems) == 1
    assert problems[0].startswith(f"tpu.nodes.create on projects/{PROJECTS[stack]}: needed to create ")


def test_removing_the_billing_role_fails_with_the_budget_permissions_named():
    grants = [g for g in held_by(deployer("dev")) if g.role != "roles/billing.costsManager"]
    problems = missing(needs("dev"), grants, [BILLING])
    assert any(p.startswith(f"billing.budgets.create on {BILLING}: needed to create budget") for p in problems)


def test_the_limited_iam_admin_cannot_grant_a_role_the_plan_does_not():
    project = PROJECTS["dev"]
    rogue = {"project": project, "role": "roles/owner", "member": "user:x"}
    resources = [*declared(env_plan("dev")), Declared("gcp:projects/iAMMember:IAMMember", "rogue", rogue)]
    problems = missing(needs_of(resources, project), held_by(deployer("dev")), [f"projects/{project}"])
    assert [p.split(":")[0] for p in problems] == [f"resourcemanager.projects.setIamPolicy on projects/{project}"]


def test_removing_an_act_as_grant_fails_with_the_account_named():
    resources = [r for r in boot_declared() if r.name != "dev-deployer-acts-as-tpu-mnist-dev"]
    problems = missing_act_as(needs("dev"), deployer("dev"), resources, {})
    account = "tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com"
    # Whichever of dev's TPU VMs runs as the account is named (a team that adopts dev may add VMs).
    attaching = {
        f"{r.name} (gcp:tpu/v2Vm:V2Vm) attaches it"
        for r in declared(env_plan("dev"))
        if r.type == "gcp:tpu/v2Vm:V2Vm" and r.inputs["serviceAccount"]["email"] == account
    }
    assert len(problems) == 1 and attaching, problems
    named, _, attached = problems[0].partition(": ")
    assert named == f"iam.serviceAccounts.actAs on {account}" and attached in attaching, problems


def test_each_deployer_is_federated_for_its_environment_and_the_deploy_workflow_only():
    federated = {r.name: r.inputs["member"] for r in boot().of_type("gcp:serviceaccount/iAMMember:IAMMember")}
    for stack in STACKS:
        assert federated[f"deployer-{stack}-federated"].endswith(
            f"/attribute.deploy/{stack}@acme/tpu-platform/.github/workflows/deploy.yml@refs/heads/main"
        )
    (provider,) = boot().of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    mapping = provider.inputs["attributeMapping"]["attribute.deploy"]
    assert "assertion.environment" in mapping and "assertion.job_workflow_ref" in mapping


def test_the_provider_pins_the_repository_and_its_owner_by_numeric_id():
    (provider,) = boot().of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    condition = provider.inputs["attributeCondition"]
    assert condition == "assertion.repository_id == '812345678' && assertion.repository_owner_id == '98765432'"
    assert "assertion.repository ==" not in condition


@pytest.mark.parametrize("stack", STACKS)
def test_the_stack_file_names_the_deployer_the_bootstrap_declares(stack):
    assert "serviceAccount:" + read_stack_config(stack)["tpu-platform:deployer"] == deployer(stack)


# --- each environment's identities reach only that environment -----------------------------------


def test_each_deployer_holds_only_its_own_environments_secrets_key():
    keys = {r.name: r for r in boot().of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")}
    for stack in STACKS:
        own = [r for r in keys.values() if r.inputs["member"] == deployer(stack)]
        assert [r.inputs["cryptoKeyId"].rsplit("/", 1)[1] for r in own] == [f"pulumi-secrets-{stack}"]


def test_each_deployer_writes_only_its_own_stacks_state_and_never_the_backend_layout():
    grants = {g.role: g for g in held_by(deployer("dev")) if g.scope == "buckets/acme-ml-pulumi-state"}
    assert set(grants) == {"roles/storage.objectUser", "roles/storage.objectViewer"}
    writes, reads = grants["roles/storage.objectUser"].condition, grants["roles/storage.objectViewer"].condition
    assert writes is not None and reads is not None
    objects = "projects/_/buckets/acme-ml-pulumi-state/objects/"

    def can(expression: str, name: str) -> bool:
        return allows(expression, (objects + name, None))

    assert can(writes, ".pulumi/stacks/tpu-platform/dev.json")
    assert can(writes, ".pulumi/history/tpu-platform/dev/dev-1.checkpoint.json")
    assert not can(writes, ".pulumi/stacks/tpu-platform/prod.json")
    assert not can(writes, ".pulumi/stacks/tpu-platform/dev-eu.json")  # whole names
    # The backend's layout (pulumi/pulumi#12437): read, never written.
    assert not can(writes, ".pulumi/meta.yaml") and can(reads, ".pulumi/meta.yaml")
    bucket = "projects/_/buckets/acme-ml-pulumi-state"
    assert allows(reads, (bucket, ".pulumi/history/tpu-platform/dev/"))
    assert not allows(reads, (bucket, ".pulumi/history/tpu-platform/prod/"))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_log_name_is_refused_before_any_grant(hostile):
    for prefix in (
        f"projects/p/locations/global/buckets/{hostile}",
        f"projects/p/locations/global/buckets/b/views/{hostile}",
    ):
        with pytest.raises(ValueError, match="not the start of a log bucket's or view's name"):
            log_names_condition([prefix])


# --- the previewer ----------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_object_name_a_refresh_reads_is_read_as_that_name(hostile):
    """The previewer's reads are the plan's object names, which no pattern checks: each is a literal of its own."""
    condition = object_reads_condition(ObjectReads((f"b/{hostile}", f"b/dir/{hostile}-*.json"), (hostile,)))
    objects = "projects/_/buckets/b/objects/"
    assert allows(condition, (objects + hostile, None))
    assert allows(condition, (f"{objects}dir/{hostile}-0123.json", None))
    assert allows(condition, (f"projects/_/buckets/{hostile}", "any/"))
    for other in ("other", f"dir/{hostile}-0123.txt", "dir/other-0123.json"):
        assert not allows(condition, (objects + other, None)), other
    assert not allows(condition, ("projects/_/buckets/b", ""))


NOT_WRITES = {
    "serviceusage.services.use",  # the quota-project header of gcp:userProjectOverride
    "cloudkms.cryptoKeyVersions.useToDecrypt",  # reading the state's secrets
    # In roles/billing.viewer ("Billing Account Viewer"): a consent lookup and a cost summary, no writes.
    "consumerprocurement.consents.check",
    "recommender.costRecommendations.summarizeAll",
}


def test_previewer_can_write_nothing():
    grants = held_by(PREVIEWER)
    assert {g.role for g in grants} >= {"roles/storage.objectViewer", "roles/cloudkms.cryptoKeyDecrypter"}
    writes = sorted({p for g in grants for p in g.permissions if not iamdata.is_read(p)} - NOT_WRITES)
    assert writes == []


def test_previewer_reads_state_but_cannot_rewrite_it():
    state = [g for g in held_by(PREVIEWER) if g.scope == "buckets/acme-ml-pulumi-state"]
    assert [g.role for g in state] == ["roles/storage.objectViewer"]


@pytest.mark.parametrize("stack", STACKS)
def test_previewer_reads_only_the_objects_a_refresh_reads(stack):
    """Any branch runs the previewer: it reads the platform's own objects, never data, checkpoints or models."""
    project = PROJECTS[stack]
    project_wide = {
        p for g in held_by(PREVIEWER) if g.scope == f"projects/{project}" and not g.condition for p in g.permissions
    }
    assert not project_wide & {"storage.objects.get", "storage.objects.list"}
    (condition,) = [g.condition for g in held_by(PREVIEWER) if g.scope == f"projects/{project}" and g.condition]
    bucket = f"projects/_/buckets/{project}-{stack}"
    for readable in (
        "artifacts/objects/sources/" + "0" * 64 + ".tar.gz",
        "functions/objects/tpu-guard-0123456789abcdef.zip",
    ):
        assert allows(condition, (f"{bucket}-{readable}", None)), readable
    for secret in ("data/objects/mnist/mnist.npz", "checkpoints/objects/mnist/x/ckpt", "models/objects/mnist/model"):
        assert not allows(condition, (f"{bucket}-{secret}", None)), secret
    if stack == "prod":  # the completion markers of the VMs it deletes on completion
        assert allows(condition, (f"{bucket}-status/objects/mnist-v5e-spot/COMPLETE", None))
        assert not allows(condition, (f"{bucket}-status/objects/mnist-v5e-spot/runs/r/status.json", None))


def test_state_bucket_keeps_deleted_state_recoverable():
    (state,) = boot().of_type("gcp:storage/bucket:Bucket")
    assert state.inputs["softDeletePolicy"]["retentionDurationSeconds"] >= 7 * 86400
    assert state.inputs["versioning"] == {"enabled": True}


# --- every identity ---------------------------------------------------------------------------


def all_grants() -> list[tuple[str, Declared]]:
    out = []
    for result in (*map(env_plan, STACKS), boot()):
        for r in declared(result):
            if r.inputs.get("role") and r.inputs.get("member"):
                out.append((result.stack, r))
    return out


def test_no_identity_holds_a_basic_role_an_unconditioned_iam_admin_or_account_admin():
    for stack, r in all_grants():
        role = r.inputs["role"]
        assert role not in DANGEROUS, (stack, r.name)
        if role == PROJECT_IAM_ADMIN:
            assert "modifiedGrantsByRole" in (r.inputs.get("condition") or {}).get("expression", ""), (stack, r.name)


def bootstrap_roles() -> dict[str, frozenset[str]]:
    return custom_roles(boot_declared(), ADMIN)  # each role in its own project


def test_no_grant_conditions_on_resource_attributes_of_a_service_that_ignores_them():
    custom = bootstrap_roles()
    for _, r in all_grants():
        expression = (r.inputs.get("condition") or {}).get("expression")
        role = r.inputs["role"]
        perms = custom.get(role) or iamdata.role_permissions(role)
        on_service = None if r.type == "gcp:projects/iAMMember:IAMMember" else RESOURCE_SERVICE.get(r.type, "?")
        check_condition(role, perms, expression, on_service)


RESOURCE_SERVICE = {
    "gcp:storage/bucketIAMMember:BucketIAMMember": "storage.googleapis.com",
    "gcp:serviceaccount/iAMMember:IAMMember": "iam.googleapis.com",
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": "cloudkms.googleapis.com",
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": "run.googleapis.com",
    "gcp:billing/accountIamMember:AccountIamMember": "cloudbilling.googleapis.com",
}


def test_a_tpu_grant_conditioned_on_a_node_name_cannot_be_declared():
    # Cloud TPU is not among the services that recognise resource attributes.
    with pytest.raises(UnsupportedConditionError, match=r"tpu\.googleapis\.com"):
        check_condition("custom", frozenset({"tpu.nodes.stop"}), 'resource.name == "projects/p/locations/z/nodes/n"')
    object_user = iamdata.role_permissions("roles/storage.objectUser")
    prefix = 'resource.name.startsWith("projects/_/buckets/b/objects/x/")'
    check_condition("roles/storage.objectUser", object_user, prefix, "storage.googleapis.com")


# --- runtime accounts hold exactly what their code calls --------------------------------------


def permissions_of(methods: tuple[str, ...]) -> set[str]:
    """What the calls check; runtime code never asks Cloud Storage for ACLs."""
    return {p for m in methods for p in iamdata.method_permissions(m, acls=False)} - {"iam.serviceAccounts.actAs"}


def test_scheduler_role_is_exactly_what_its_jobs_call():
    assert set(SCHEDULER_PERMISSIONS) == permissions_of(SCHEDULER_METHODS) == {"tpu.nodes.get", "tpu.nodes.stop"}
    jobs = env_plan("dev").of_type("gcp:cloudscheduler/job:Job")
    direct = {
        j.inputs["httpTarget"]["uri"].rsplit(":", 1)[1]
        for j in jobs
        if "tpu.googleapis.com" in j.inputs["httpTarget"]["uri"]
    }
    assert direct == {"stop"}  # starts go through the guard
    assert bootstrap_roles()["projects/acme-ml-sandbox/roles/tpuPlatformSchedulerDev"] == set(SCHEDULER_PERMISSIONS)


def test_guard_role_is_exactly_what_its_code_calls():
    assert set(GUARD_PERMISSIONS) == permissions_of(GUARD_METHODS)
    assert "iam.serviceAccounts.actAs" not in GUARD_PERMISSIONS  # granted per workload account instead
    assert bootstrap_roles()["projects/acme-ml-production/roles/tpuPlatformGuardProd"] == set(GUARD_PERMISSIONS)


def workload_grants(stack: str = "dev") -> dict[str, set[str]]:
    result = env_plan(stack)
    member = f"serviceAccount:tpu-mnist-{stack}@{result.project}.iam.gserviceaccount.com"
    by_scope: dict[str, set[str]] = {}
    for g in grants_to(member, declared(result), result.project, bootstrap_roles()):
        by_scope.setdefault(g.scope, set()).update(g.permissions)
    return by_scope


def test_workload_account_holds_what_its_program_calls_and_no_tpu_right():
    by_scope = workload_grants()
    for scope, methods in WORKLOAD_METHODS.items():
        target = "projects/acme-ml-sandbox" if scope == "project" else f"buckets/acme-ml-sandbox-dev-{scope}"
        lacking = permissions_of(methods) - by_scope.get(target, set())
        assert not lacking, (scope, lacking)
    assert not any(p.startswith("tpu.") for perms in by_scope.values() for p in perms)


def test_workload_account_holds_what_the_vm_agents_telemetry_calls():
    """The agent ships logs, metrics and the TensorBoard event file with the VM's (workload) account:
    the methods its code declares (and tests/test_telemetry.py, test_tensorboard.py see it call) are
    in WORKLOAD_METHODS and granted on the project and the models bucket."""
    from vm_agent import telemetry, tensorboard

    assert set(telemetry.METHODS) <= set(WORKLOAD_METHODS["project"])
    assert set(tensorboard.METHODS) <= set(WORKLOAD_METHODS["models"])
    by_scope = workload_grants()
    assert permissions_of(telemetry.METHODS) == {"logging.logEntries.create", "monitoring.timeSeries.create"}
    assert permissions_of(telemetry.METHODS) <= by_scope["projects/acme-ml-sandbox"]
    # An upload that replaces the object checks create and delete (methods.json).
    assert permissions_of(tensorboard.METHODS) == {"storage.objects.create", "storage.objects.delete"}
    assert permissions_of(tensorboard.METHODS) <= by_scope["buckets/acme-ml-sandbox-dev-models"]


# --- ordering: nothing uses a grant before it applies ------------------------------------------


SLEEP = "time:index/sleep:Sleep"


def waits_for_grants(result: PlanResult, resource) -> bool:
    """Whether `resource` waits on a propagation wait (pulumiverse-time) that follows grants."""
    return any(depends_on(result, resource, s.urn) for s in result.of_type(SLEEP) if s.dependencies)


@pytest.mark.parametrize("stack", STACKS)
def test_what_uses_a_fresh_grant_waits_until_it_applies(stack):
    """VMs (their agent reads its package with the account's fresh grants) and functions (built by the
    build account, triggered as the guard) wait; the wait follows every grant they use."""
    result = env_plan(stack)
    users = [*result.of_type("gcp:tpu/v2Vm:V2Vm"), *result.of_type("gcp:cloudfunctionsv2/function:Function")]
    assert users and all(waits_for_grants(result, r) for r in users)
    by_urn = result.by_urn()
    for sleep in result.of_type(SLEEP):
        assert sleep.inputs["createDuration"] == "120s"
        assert all(by_urn[d].type.endswith(("IAMMember", "IamMember")) for d in sleep.dependencies), sleep.name


def test_the_bootstrap_waits_after_the_grants_a_deploy_uses():
    (sleep,) = boot().of_type(SLEEP)
    by_urn = boot().by_urn()
    waited = {by_urn[d].name for d in sleep.dependencies}
    for stack in STACKS:
        assert {f"deployer-{stack}-grant", f"{stack}-deployer-acts-as-tpu-mnist-{stack}"} <= waited


def test_functions_build_with_their_own_account_which_reaches_only_what_a_build_uses():
    """Not Cloud Run Builder on the project (it reads every bucket and writes every repository): logs on
    the project, its source bucket, the functions' own image repository."""
    result = env_plan("prod")
    functions = result.of_type("gcp:cloudfunctionsv2/function:Function")
    assert len(functions) == 3  # budget, recovery, completion
    builder = "tpu-guard-build-prod@acme-ml-production.iam.gserviceaccount.com"
    images = "projects/acme-ml-production/locations/us-central1/repositories/tpu-functions-prod"
    for fn in functions:
        assert fn.inputs["buildConfig"]["serviceAccount"].endswith(builder)
        assert fn.inputs["buildConfig"]["dockerRepository"] == images
    grants = {
        (g.scope, g.role) for g in grants_to(f"serviceAccount:{builder}", declared(result), "acme-ml-production", {})
    }
    assert grants == {
        ("projects/acme-ml-production", "roles/logging.logWriter"),
        ("buckets/acme-ml-production-prod-functions", "roles/storage.objectViewer"),
        ("repositories/tpu-functions-prod", "roles/artifactregistry.writer"),
    }
    held = {
        p
        for g in grants_to(f"serviceAccount:{builder}", declared(result), "x", {})
        for p in g.permissions
        if g.scope == "projects/acme-ml-production"
    }
    assert not {p for p in held if p.startswith(("storage.", "artifactregistry."))}


def test_google_agents_are_provisioned_and_granted_by_the_bootstrap_before_any_trigger():
    """Their roles hold act-as and token rights: the deployer may not grant them."""
    identities = {
        (r.inputs["project"], r.inputs["service"])
        for r in boot().of_type("gcp:projects/serviceIdentity:ServiceIdentity")
    }
    grants = {(r.inputs["project"], r.inputs["role"]) for r in boot().of_type("gcp:projects/iAMMember:IAMMember")}
    for stack, project in PROJECTS.items():
        assert (project, "eventarc.googleapis.com") in identities
        assert {(project, "roles/eventarc.serviceAgent"), (project, "roles/pubsub.publisher")} <= grants
        assert "roles/eventarc.serviceAgent" not in needs(stack).project_grants[project]


def test_scheduler_calls_the_recovery_with_run_invoker_on_its_run_service():
    result = env_plan("prod")
    assert not result.of_type("gcp:cloudfunctionsv2/functionIamMember:FunctionIamMember")
    invokers = {
        r.inputs["name"]
        for r in result.of_type("gcp:cloudrunv2/serviceIamMember:ServiceIamMember")
        if r.inputs["role"] == "roles/run.invoker" and "invoker" in r.inputs["member"]
    }
    assert "tpu-recovery-prod" in invokers


# --- a fresh project --------------------------------------------------------------------------


def test_bootstrap_enables_resource_manager_service_usage_and_iam_in_every_environment():
    enabled = {(r.inputs["project"], r.inputs["service"]) for r in boot().of_type("gcp:projects/service:Service")}
    for project in PROJECTS.values():
        wanted = ("cloudresourcemanager.googleapis.com", "serviceusage.googleapis.com", "iam.googleapis.com")
        assert {(project, api) for api in wanted} <= enabled


def test_bootstrap_grants_the_prod_cmek_key_so_the_deployer_needs_no_right_on_it():
    grants = boot().of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")
    keys = [r for r in grants if "acme-security-keys" in r.inputs["cryptoKeyId"]]
    number = _number("acme-ml-production")
    assert sorted(k.inputs["member"] for k in keys) == [
        # the image repository (Artifact Registry, "Enable customer-managed encryption keys")
        f"serviceAccount:service-{number}@gcp-sa-artifactregistry.iam.gserviceaccount.com",
        f"serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com",  # the budget topic
        f"serviceAccount:service-{number}@gs-project-accounts.iam.gserviceaccount.com",  # the buckets
    ]
    assert not env_plan("prod").of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember")


def _number(project: str) -> str:
    from tools.offline.mocks import project_number

    return project_number(project)


def test_bootstrap_admin_roles_cover_the_bootstrap_plan():
    """The roles asked of whoever runs the bootstrap, checked against Google's role data."""
    resources = boot_declared()
    need = needs_of(resources, ADMIN, DEPLOY, invokes=boot().invokes)
    for scope, permissions in need.permissions.items():
        kind = "billing" if scope.startswith("billingAccounts/") else ("kms" if "security" in scope else "project")
        held = {p for role in BOOTSTRAP_ADMIN_ROLES[kind] for p in iamdata.role_permissions(role)}
        lacking = sorted(set(permissions) - held)
        assert not lacking, (scope, lacking)
    assert re.search(r"roles/owner", " ".join(r for rs in BOOTSTRAP_ADMIN_ROLES.values() for r in rs)) is None


def test_a_stack_the_bootstrap_has_not_made_accounts_for_is_said_so():
    from infra.config import parse_stack_config
    from infra.platform import stack_identities
    from tools.offline.access import not_made

    committed = json.loads(ACCESS_FILE.read_text())
    identities = stack_identities(parse_stack_config("dev", read_stack_config("dev")))
    assert not_made("dev", identities, committed) == []
    extra = dataclasses.replace(
        identities,
        accounts=(*identities.accounts, dataclasses.replace(identities.accounts[0], account_id="tpu-new-dev")),
    )
    (problem,) = not_made("dev", extra, committed)
    assert problem.startswith("account tpu-new-dev is not made by the bootstrap")
    (problem,) = not_made("self-service", identities, committed)
    assert "not in bootstrap/access.json" in problem
