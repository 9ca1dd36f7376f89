"""GCP naming rules, checked against the documented grammar with generated names."""

from __future__ import annotations

import re
import string

from hypothesis import given
from hypothesis import strategies as st

from infra import naming
from infra.config import parse_stack_config, service_account_id
from infra.config.problems import ConfigError
from tests.support import fixture_config, replace_object, workload_settings

LOWER = string.ascii_lowercase + string.digits + "-_"


@given(st.text(alphabet=LOWER + "A.é ", max_size=70))
def test_bucket_names_follow_the_documented_rule(name):
    ok = naming.bucket_name_problem(name) is None
    documented = (
        3 <= len(name) <= 63
        and re.fullmatch(r"[a-z0-9_-]+", name) is not None
        and name[0].isalnum()
        and name[-1].isalnum()
        and not name.startswith("goog")
        and "google" not in name
        and "g00gle" not in name
    )
    assert ok == documented


@given(st.text(alphabet=LOWER, max_size=40))
def test_service_account_ids(account_id):
    ok = naming.service_account_id_problem(account_id) is None
    documented = (
        6 <= len(account_id) <= 30
        and account_id[:1].isalpha()
        and set(account_id) <= set(string.ascii_lowercase + string.digits + "-")
        and not account_id.endswith("-")
    )
    assert ok == documented


@given(st.text(alphabet=LOWER + "A", max_size=70))
def test_label_values(value):
    assert (naming.label_value_problem(value) is None) == (len(value) <= 63 and "A" not in value)


@given(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True), st.from_regex(r"[a-z][a-z0-9]{0,11}", fullmatch=True))
def test_a_workload_is_accepted_exactly_when_its_names_are_valid(workload, stack):
    raw = replace_object(fixture_config("small"), "workloads", {workload: workload_settings(fixture_config("small"))})
    raw = replace_object(raw, "tpuVms", [])
    names_ok = (
        naming.resource_id_problem(workload, 16) is None
        and naming.service_account_id_problem(service_account_id(workload, stack)) is None
        and all(naming.bucket_name_problem(f"fixture-project-{stack}-{p}") is None for p in ("data", "models"))
    )
    try:
        parse_stack_config(stack, raw)
        accepted = True
    except ConfigError as error:
        accepted = False
        assert f"stack '{stack}'" in str(error)
    assert accepted == names_ok


# --- every derived name at the longest legal inputs (as Fabric's check_names.py does) -------------------

LONGEST_PROJECT = "a" * 30  # project ids are 6-30 characters, and the default bucket prefix
LONGEST_STACK = "s" * naming.MAX_STACK
LONGEST_VM = "v" * 40  # TPU node ids: the config reader's limit for tpuVms[].name


def test_every_name_is_legal_at_the_longest_stack_and_prefix():
    for purpose in ("data", "checkpoints", "models", "status", "functions", "artifacts"):
        assert naming.bucket_name_problem(naming.bucket(LONGEST_PROJECT, LONGEST_STACK, purpose)) is None, purpose
    for kind in naming.PLATFORM_ACCOUNT_KINDS:
        assert naming.service_account_id_problem(naming.platform_account_id(kind, LONGEST_STACK)) is None, kind
    assert naming.service_account_id_problem(naming.deployer_account_id(LONGEST_STACK)) is None
    for kind in naming.GUARD_FUNCTIONS:
        # Cloud Run functions: RFC 1035, at most 63 characters.
        assert naming.resource_id_problem(naming.function_name(kind, LONGEST_STACK)) is None, kind
    for kind in ("scheduler", "guard", "deployer", "previewer", "researcher", "researcher-read", "researcher-submit"):
        # Custom role ids: letters, digits, '_' and '.', at most 64 (IAM roles.create).
        role = naming.custom_role_id(kind, "a-b-" + "c" * (naming.MAX_STACK - 4))
        assert len(role) <= 64 and role.replace("_", "").replace(".", "").isalnum(), role
    # Artifact Registry repository ids: RFC 1035-like, at most 63 ("Create standard repositories").
    assert naming.resource_id_problem(naming.artifact_repository(LONGEST_STACK)) is None
    # Cloud Scheduler job ids: letters, digits, '-' and '_', at most 500 (cloudscheduler v1 Job.name).
    assert len(naming.scheduler_job(LONGEST_VM, "start")) <= 500


def test_the_platform_builds_its_names_through_naming():
    """One place: the components call these helpers (the names in the plan are the helpers' output)."""
    from infra.config import parse_stack_config
    from infra.platform import stack_identities
    from tests.support import fixture_config, plan

    result = plan(fixture_config("scheduled"), "scheduled")
    identities = stack_identities(parse_stack_config("scheduled", fixture_config("scheduled")))  # the bootstrap's
    accounts = {a.account_id for a in identities.accounts}
    assert {
        naming.platform_account_id(k, "scheduled") for k in ("scheduler", "guard", "guard-invoker", "guard-build")
    } <= accounts
    buckets = {b.inputs["name"] for b in result.of_type("gcp:storage/bucket:Bucket")}
    assert naming.bucket("fixture-project", "scheduled", "status") in buckets
    roles = {r.role_id for r in identities.roles}
    assert roles == {naming.custom_role_id("scheduler", "scheduled"), naming.custom_role_id("guard", "scheduled")}


def test_the_policy_pack_names_the_deployer_role_as_the_platform_does():
    """The pack imports nothing from infra/, so it spells the name itself: the two must agree."""
    from policy.exceptions import DEPLOYER_ROLE_PREFIX, role_suffix

    for stack in ("dev", "prod", "eu-prod", "a-b-c"):
        assert DEPLOYER_ROLE_PREFIX + role_suffix(stack) == naming.custom_role_id("deployer", stack)


def test_kubernetes_names_at_their_limits():
    assert naming.dns1123_label_problem("a" * 63) is None
    assert naming.dns1123_label_problem("a" * 64)
    assert naming.dns1123_label_problem("team-a") is None
    for bad in ("Team", "-a", "a-", "a.b", ""):
        assert naming.dns1123_label_problem(bad), bad
    assert naming.dns1123_subdomain_problem(".".join(["a" * 63] * 3) + "." + "a" * 61) is None  # 253
    assert naming.dns1123_subdomain_problem(".".join(["a" * 63] * 4))  # 255
    assert naming.dns1123_subdomain_problem("jobsets.jobset.x-k8s.io") is None


def test_kubernetes_labels():
    assert naming.kubernetes_label_problem("cloud.google.com/gke-tpu-topology", "2x2x2") is None
    assert naming.kubernetes_label_problem("app.kubernetes.io/managed-by", "") is None
    assert naming.kubernetes_label_problem("tpu-platform/team", "A_b.c") is None
    assert naming.kubernetes_label_problem("k" * 64, "v")
    assert naming.kubernetes_label_problem("Bad_Prefix/x", "v")
    assert naming.kubernetes_label_problem("k", "v" * 64)
    assert naming.kubernetes_label_problem("k", "a b")
    assert naming.kubernetes_label_problem("k", "-a")
