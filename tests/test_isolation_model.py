"""What a run's token can reach, as a model: the plan's IAM grants of the VM's account, narrowed by the run's
Credential Access Boundary, both evaluated with a real CEL implementation as Cloud Storage evaluates them.

Cloud Storage allows a downscoped token's call when both the account's IAM policy and the boundary allow it
(https://cloud.google.com/iam/docs/downscoping-short-lived-credentials). The grants are the fixture
self-service stack's (tests/stacks/Pulumi.self-service.yaml), the boundaries are what the agent asks STS for
(vm_agent/credentials.py boundary, with the places vm_agent/run_requests.py gives a request). The storage
emulator enforces no IAM: this is the tier that says what Google would; tests/test_vm_agent_isolation.py
runs the same rules for real against hostile programs.
"""

from __future__ import annotations

from functools import cache

import pytest
from google.auth.downscoped import CredentialAccessBoundary

from infra.config.stackfile import ROOT
from run_contract import paths
from run_contract.request import RunPlaces
from tests.iam_standins import Grant, account_grants, boundary_grants, check_boundary, vm_account
from tools.offline.runner import PlanResult, plan_stack
from vm_agent.credentials import boundary

EXAMPLE = ROOT / "tests" / "stacks" / "Pulumi.self-service.yaml"
STATUS, CKPT, MODELS, DATA = (f"acme-ml-research-self-service-{p}" for p in ("status", "checkpoints", "models", "data"))
SHARED, REVIEWED = "shared-v5e-8", "reviewed-v5e-8"
ALICE, BOB = "user:alice@acme.example", "user:bob@acme.example"
A, B = paths.member_key(ALICE), paths.member_key(BOB)
CREATE, GET, LIST, DELETE = (
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
)


@cache
def example_plan() -> PlanResult:
    return plan_stack("self-service", EXAMPLE)


def account(vm: str) -> list[Grant]:
    resources = example_plan().resources
    return account_grants(resources, vm_account(resources, vm))


def sent(within: CredentialAccessBoundary | None) -> list[dict]:
    """The rules as the agent sends them to STS (google-auth's JSON of the boundary)."""
    assert within is not None
    return within.to_json()["accessBoundary"]["accessBoundaryRules"]


def stack_run_boundary() -> list[Grant]:
    run = f"mnist/{SHARED}/r1"
    return boundary_grants(sent(boundary(f"gs://{CKPT}/{run}", f"gs://{MODELS}/{run}", f"gs://{DATA}/mnist/mnist.npz")))


def request_boundary(member: str = ALICE, run_id: str = "exp-1") -> list[Grant]:
    places = RunPlaces(f"gs://{CKPT}", f"gs://{MODELS}", "mnist", SHARED).of(f"{paths.member_key(member)}/{run_id}")
    return boundary_grants(sent(boundary(places["checkpoint_dir"], places["model_dir"], "")))


def allowed(
    grants: list[Grant],
    permission: str,
    bucket: str,
    name: str | None = None,
    prefix: str | None = None,
    within: list[Grant] | None = None,
) -> bool:
    """IAM's answer for one call: the account's grants, and the token's boundary when it has one."""
    resource = f"projects/_/buckets/{bucket}" + (f"/objects/{name}" if name is not None else "")

    def any_allows(found: list[Grant]) -> bool:
        return any(g.allows(permission, bucket, resource, prefix) for g in found)

    return any_allows(grants) and (within is None or any_allows(within))


# --- the self-service VM's own account -----------------------------------------------------------------------


def test_a_self_service_vm_never_shares_an_account_with_a_reviewed_vm():
    resources = example_plan().resources
    assert vm_account(resources, SHARED) != vm_account(resources, REVIEWED)


@pytest.mark.parametrize(
    ("permission", "bucket", "name", "reachable"),
    [
        (CREATE, STATUS, f"{SHARED}/runs/{A}/exp-1/status.json", True),  # the agent records runs
        (CREATE, STATUS, f"{SHARED}/COMPLETE", True),  # the agent's marker of the stack's run
        (CREATE, STATUS, f"{REVIEWED}/COMPLETE", False),  # the reviewed VM's: the guard would act on it
        (CREATE, CKPT, f"mnist/{SHARED}/r1/ckpt-0000000100/state", True),
        (CREATE, CKPT, f"mnist/{REVIEWED}/r1/ckpt-0000000100/state", False),
        (DELETE, MODELS, f"mnist/{REVIEWED}/r1/model.keras", False),
        (GET, CKPT, f"mnist/{REVIEWED}/r1/ckpt-0000000100/state", False),
    ],
)
def test_the_self_service_vms_account_reaches_only_its_own_vms_prefixes(permission, bucket, name, reachable):
    assert allowed(account(SHARED), permission, bucket, name) is reachable


def test_the_reviewed_vms_account_cannot_mark_the_self_service_vm_complete():
    """Status grants are per VM. (The workload account still reaches its workload's whole prefix `mnist/` of
    the checkpoints and models buckets, the self-service VM's folder within it included: its runs' tokens
    reach their own run's prefix only, so no run can read there; narrowing the account itself to its VMs'
    prefixes is left to the account's own module, infra/identity.py.)"""
    reviewed = account(REVIEWED)
    assert not allowed(reviewed, CREATE, STATUS, f"{SHARED}/COMPLETE")
    assert not allowed(reviewed, GET, STATUS, f"{SHARED}/runs/{A}/exp-1/status.json")


# --- a run's token: the account's grants within the run's boundary ----------------------------------------------


def test_a_boundary_is_within_cloud_storages_limit_and_names_buckets_only():
    for within in (boundary("gs://c/a", "gs://m/a", "gs://d/x"), boundary("gs://c/a", "", "")):
        assert check_boundary(sent(within)) == []  # 1 to 10 rules, buckets, inRole: storage roles, CEL
    assert boundary("", "", "") is None  # a run that touches no object gets no token at all


@pytest.mark.parametrize(
    ("permission", "bucket", "name", "reachable"),
    [
        (CREATE, CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-0000000100/state", True),  # its own checkpoints
        (GET, CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-0000000100/state", True),
        (DELETE, CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-0000000001/state", True),  # rotation
        (CREATE, MODELS, f"mnist/{SHARED}/{A}/exp-1/model.keras", True),
        (GET, CKPT, f"mnist/{SHARED}/r1/ckpt-0000000100/state", False),  # the stack run's: no resuming from it
        (CREATE, CKPT, f"mnist/{SHARED}/r1/ckpt-0000000200/state", False),
        (GET, CKPT, f"mnist/{SHARED}/{A}/exp-10/ckpt-0000000100/state", False),  # her other run
        (GET, CKPT, f"mnist/{SHARED}/{B}/exp-1/ckpt-0000000100/state", False),  # Bob's run of that name
        (CREATE, STATUS, f"{SHARED}/COMPLETE", False),  # the guard's marker
        (CREATE, STATUS, f"{SHARED}/runs/{A}/exp-1/status.json", False),  # its own state: the agent's
        (CREATE, STATUS, f"{SHARED}/requests/{B}/20261130T050000Z-stop-exp-1.json", False),  # a forged stop
        (GET, DATA, "mnist/mnist.npz", False),  # a request names no data
    ],
)
def test_a_researchers_run_reaches_only_its_own_objects(permission, bucket, name, reachable):
    assert allowed(account(SHARED), permission, bucket, name, within=request_boundary()) is reachable


@pytest.mark.parametrize(
    "key",
    [
        "user-o'brien@acme.example",  # an apostrophe ends an unescaped CEL literal
        "user-a\\b@acme.example",  # a backslash escapes what follows in one
        "user-x')||true||('@evil.example",  # an address as an injection: closes the literal, ORs in true
        "user-a\nb@acme.example",  # a line break may not stand unescaped in a quoted literal
        "user-a\rb@acme.example",
    ],
)
def test_a_prefix_is_a_literal_in_the_boundary_never_part_of_the_expression(key):
    """A run's prefixes hold its member's key. The platform takes no address with these characters (below), and
    the boundary quotes what it is given all the same: it compiles, reaches the run's own objects and no one
    else's."""
    places = RunPlaces(f"gs://{CKPT}", f"gs://{MODELS}", "mnist", SHARED).of(f"{key}/exp-1")
    rules = sent(boundary(places["checkpoint_dir"], places["model_dir"], ""))
    assert check_boundary(rules) == []
    within = boundary_grants(rules)
    assert allowed(account(SHARED), CREATE, CKPT, f"mnist/{SHARED}/{key}/exp-1/ckpt-0000000100/state", within=within)
    assert allowed(account(SHARED), LIST, CKPT, prefix=f"mnist/{SHARED}/{key}/exp-1/", within=within)
    assert not allowed(account(SHARED), GET, CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-0000000100/state", within=within)
    assert not allowed(account(SHARED), LIST, CKPT, prefix=f"mnist/{SHARED}/", within=within)


@pytest.mark.parametrize("member", ["user:o'brien@acme.example", "user:x')||true||('@evil.example"])
def test_no_member_key_holds_what_a_condition_would_read_as_code(member):
    """The run contract's one pattern of a researcher (run_contract/names.py) refuses them: the stack's
    researchers setting (tests/test_config.py), a request's requester and a member's folders alike."""
    with pytest.raises(ValueError, match="not a researcher member"):
        paths.member_key(member)
    assert paths.member_of_key(member.replace(":", "-", 1)) is None


@pytest.mark.parametrize(
    ("bucket", "prefix", "reachable"),
    [
        (CKPT, f"mnist/{SHARED}/{A}/exp-1/", True),  # runlib lists its own checkpoints
        (CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-", True),
        (CKPT, f"mnist/{SHARED}/{A}/", False),  # her other runs
        (CKPT, f"mnist/{SHARED}/", False),
        (CKPT, "", False),
    ],
)
def test_a_researchers_run_lists_only_its_own_prefix(bucket, prefix, reachable):
    assert allowed(account(SHARED), LIST, bucket, prefix=prefix, within=request_boundary()) is reachable


@pytest.mark.parametrize(
    ("permission", "bucket", "name", "reachable"),
    [
        (CREATE, CKPT, f"mnist/{SHARED}/r1/ckpt-0000000100/state", True),
        (GET, DATA, "mnist/mnist.npz", True),  # its data, read-only
        (CREATE, DATA, "mnist/mnist.npz", False),
        (CREATE, CKPT, f"mnist/{SHARED}/{A}/exp-1/ckpt-0000000100/state", False),  # a researcher's run
        (CREATE, STATUS, f"{SHARED}/COMPLETE", False),  # even the stack's own run: the agent writes it
        (CREATE, CKPT, f"mnist/{REVIEWED}/r1/ckpt-0000000100/state", False),
    ],
)
def test_the_stack_runs_token_reaches_only_its_own_objects_too(permission, bucket, name, reachable):
    assert allowed(account(SHARED), permission, bucket, name, within=stack_run_boundary()) is reachable
