"""The bootstrap program under mocks: keyless CI identities, a safe state bucket, a rotated key."""

from __future__ import annotations

import ast
import json
import runpy
from pathlib import Path

import pytest
import yaml
from celpy import celtypes

from bootstrap import PROJECT
from bootstrap.program import (
    modified_grants_condition,
    parse_bootstrap_config,
    state_paths_condition,
    state_reads_condition,
)
from infra.access import iamdata
from infra.access.model import Grant
from infra.config.problems import ConfigError
from infra.config.stackfile import read_stack_config
from tests.iam_conditions import HOSTILE_NAMES, allows, evaluate
from tools.offline.runner import PlanResult, run_program

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "bootstrap"


def program_directory() -> Path:
    """Where Pulumi runs the bootstrap: `main` in bootstrap/Pulumi.yaml, relative to that file
    (https://www.pulumi.com/docs/iac/concepts/projects/project-file/); the language host calls
    `runpy.run_path` on it, which puts that directory first on the import path."""
    project = yaml.safe_load((BOOTSTRAP / "Pulumi.yaml").read_text())
    return (BOOTSTRAP / project.get("main", ".")).resolve()


def bootstrap_config(**overrides: str) -> dict[str, str]:
    raw = read_stack_config("acme", BOOTSTRAP)
    return {**raw, **{f"tpu-platform-bootstrap:{k}": v for k, v in overrides.items()}}


def environments() -> dict[str, str]:
    """The bootstrap's environments (stack -> project), as the acme stack file lists them."""
    return json.loads(bootstrap_config()["tpu-platform-bootstrap:environments"])


def plan(raw: dict[str, str] | None = None) -> PlanResult:
    return run_program(
        "acme",
        raw or bootstrap_config(),
        program=lambda: runpy.run_path(str(program_directory()), run_name="__main__"),  # as Pulumi runs it
        project=PROJECT,
    )


def test_oidc_provider_accepts_only_the_repository():
    (provider,) = plan().of_type("gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider")
    assert provider.inputs["oidc"] == {"issuerUri": "https://token.actions.githubusercontent.com"}
    assert "assertion.repository_id == '812345678'" in provider.inputs["attributeCondition"]
    assert provider.inputs["attributeMapping"]["attribute.repository_id"] == "assertion.repository_id"


def test_accounts_are_federated_on_the_account_not_the_project():
    result = plan()
    federated = {
        g.name: g
        for g in result.of_type("gcp:serviceaccount/iAMMember:IAMMember")
        if g.inputs["role"] == "roles/iam.workloadIdentityUser"
    }
    pool = "principalSet://iam.googleapis.com/projects/"
    assert set(federated) == {"ci-previewer-federated", *(f"deployer-{stack}-federated" for stack in environments())}
    assert federated["ci-previewer-federated"].inputs["member"].startswith(pool)
    assert federated["ci-previewer-federated"].inputs["member"].endswith("/attribute.repository_id/812345678")
    # Every other grant on an account is act-as on a platform account, for the deployer or the guard.
    others = [g for g in result.of_type("gcp:serviceaccount/iAMMember:IAMMember") if g.name not in federated]
    assert others and all(g.inputs["role"] == "roles/iam.serviceAccountUser" for g in others)


def test_no_project_role_can_impersonate_service_accounts():
    grants = plan().of_type("gcp:projects/iAMMember:IAMMember")
    roles = {g.inputs["role"] for g in grants if "@gcp-sa-" not in g.inputs["member"]}  # less Google's own agents
    # Predefined roles by their permissions (Google's role data): none acts as, or mints tokens or keys for, an account.
    impersonating = {"iam.serviceAccounts.actAs", "iam.serviceAccountKeys.create"}
    impersonating |= {f"iam.serviceAccounts.{verb}" for verb in iamdata.TOKEN_VERBS}
    assert not {r for r in roles if r.startswith("roles/") and iamdata.role_permissions(r) & impersonating}
    assert not roles & {"roles/owner", "roles/editor"}
    # Each environment project gets its deployer's and the previewer's roles.
    projects = {g.inputs["project"] for g in grants}
    assert projects == set(environments().values())


def test_state_bucket_is_versioned_private_and_kept():
    (bucket,) = plan().of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["versioning"] == {"enabled": True}
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"
    assert bucket.protect and bucket.retain_on_delete


def test_each_environments_secrets_key_rotates_within_90_days_and_is_protected():
    result = plan()
    keys = {k.inputs["name"]: k for k in result.of_type("gcp:kms/cryptoKey:CryptoKey")}
    # One per environment; the one all stacks used before is kept, for the state history it encrypted.
    assert set(keys) == {"pulumi-secrets", *(f"pulumi-secrets-{stack}" for stack in environments())}
    for key in keys.values():
        assert int(key.inputs["rotationPeriod"].removesuffix("s")) <= 90 * 24 * 3600
        assert key.protect
    assert result.outputs["secretsProviders"] == {
        stack: f"gcpkms://projects/acme-ml-admin/locations/us-central1/keyRings/pulumi/cryptoKeys/pulumi-secrets-{stack}"
        for stack in environments()
    }
    legacy = keys["pulumi-secrets"].urn
    assert not [g for g in result.of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember") if legacy in g.dependencies]


def test_no_keys_anywhere():
    assert not plan().of_type("gcp:serviceaccount/key:Key")


def test_outputs_are_what_ci_needs():
    outputs = plan().outputs
    assert outputs["stateBackend"] == "gs://acme-ml-pulumi-state"
    assert outputs["workloadIdentityProvider"].endswith("/workloadIdentityPools/github/providers/github-actions")
    assert outputs["deployServiceAccounts"] == {
        stack: f"tpu-deployer-{stack}@acme-ml-admin.iam.gserviceaccount.com" for stack in environments()
    }


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("githubRepository", "not a repo", "owner/name of a GitHub repository"),
        ("deployRef", "main", "a full git ref like refs/heads/main"),
        ("stateBucket", "Bad_Bucket", "3-63 characters"),
        ("environments", json.dumps({"dev": "Bad Project"}), "a GCP project id"),
        ("environments", json.dumps({"nowhere": "acme-ml-nowhere"}), "a stack planned in access.json"),
        ("environments", json.dumps({"dev": "acme-ml-other"}), "the project of Pulumi.dev.yaml"),
        ("githubRepositoryId", "acme", "numeric id"),
        ("environments", json.dumps({"dev-": "acme-ml-sandbox"}), "a stack name of 1-12"),  # invalid account id
        ("environments", json.dumps({"a--b": "acme-ml-sandbox"}), "a stack name of 1-12"),  # role id of `a-b`
        # A name the program refuses to plan (the config reader's limit) gets no accounts either.
        ("environments", json.dumps({"production-eu": "acme-ml-sandbox"}), "a stack name of 1-12"),
    ],
)
def test_bad_bootstrap_settings(key, value, expected):
    with pytest.raises(ConfigError, match=expected):
        parse_bootstrap_config("acme", bootstrap_config(**{key: value}))


def test_the_bootstraps_settings_are_refused_all_at_once_in_the_platforms_words():
    """The bootstrap's keys are read as the platform's (a model): every problem at once, each with its key and
    value, a misspelt key with the one it misspells in full, a type named in words."""
    raw = {k: v for k, v in bootstrap_config().items() if k != "tpu-platform-bootstrap:stateBucket"}
    raw |= {"tpu-platform-bootstrap:stateBuckt": "acme-state", "tpu-platform-bootstrap:adopt": '{"dev": 1}'}
    with pytest.raises(ConfigError) as error:
        parse_bootstrap_config("acme", raw)
    assert [str(p) for p in error.value.problems] == [
        "tpu-platform-bootstrap:stateBucket = (not set): required",
        "tpu-platform-bootstrap:adopt = {'dev': 1}: must be a list, not a mapping",
        "tpu-platform-bootstrap:stateBuckt = 'acme-state': unknown key; known keys: "
        + ", ".join(
            f"tpu-platform-bootstrap:{k}"
            for k in (
                *("adopt", "billingAccount", "deployRef", "environments", "githubRepository", "githubRepositoryId"),
                *("githubRepositoryOwnerId", "location", "stateBucket"),
            )
        )
        + "; remove tpu-platform-bootstrap:stateBuckt and set tpu-platform-bootstrap:stateBucket: acme-state",
    ]


def test_pulumi_runs_the_bootstrap_from_the_repository_root():
    """The bootstrap imports infra/ as a package: Pulumi runs it with the root on the import path."""
    assert program_directory() == ROOT
    project = yaml.safe_load((BOOTSTRAP / "Pulumi.yaml").read_text())
    assert project["name"] == PROJECT
    # The virtualenv is resolved against the project file's folder, not `main`.
    assert (BOOTSTRAP / project["runtime"]["options"]["virtualenv"]).resolve() == (ROOT / ".venv").resolve()


def test_no_bootstrap_module_edits_the_import_path():
    for module in BOOTSTRAP.glob("*.py"):
        tree = ast.parse(module.read_text(), str(module))
        edits = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ]
        assert not edits, f"{module.name}:{edits} changes sys.path; import shared code as a package"


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_stack_name_names_that_stacks_state_and_no_other(hostile):
    """A stack's name reaches the state conditions as a literal, however the stack file spells it."""
    writes, reads = state_paths_condition("state", hostile), state_reads_condition("state", hostile)
    objects = "projects/_/buckets/state/objects/.pulumi/"
    assert allows(writes, (f"{objects}stacks/tpu-platform/{hostile}.json", None))
    assert allows(writes, (f"{objects}history/tpu-platform/{hostile}/1.json", None))
    assert not allows(writes, (f"{objects}stacks/tpu-platform/dev.json", None))
    assert not allows(writes, (f"{objects}meta.yaml", None))
    assert allows(reads, (f"{objects}meta.yaml", None))
    assert allows(reads, ("projects/_/buckets/state", f".pulumi/locks/tpu-platform/{hostile}/"))
    assert not allows(reads, ("projects/_/buckets/state", ".pulumi/locks/tpu-platform/dev/"))


@pytest.mark.parametrize("hostile", HOSTILE_NAMES)
def test_a_hostile_role_is_one_role_of_the_grantable_list(hostile):
    """The condition with cel-python; `hasOnly` is IAM's own, as its page says it: true when the roles a policy
    change grants or revokes are all in the list (cloud.google.com/iam/docs/setting-limits-on-granting-roles)."""

    def grants_of(roles: list[str]) -> bool:
        expression = modified_grants_condition([hostile, "roles/viewer"])
        modified = celtypes.ListType([celtypes.StringType(r) for r in roles])
        api = celtypes.MapType({"iam.googleapis.com/modifiedGrantsByRole": modified})
        has_only = {"hasOnly": lambda found, listed: celtypes.BoolType(all(r in listed for r in found))}
        return bool(evaluate(expression, {"api": api}, has_only))

    assert grants_of([hostile]) and grants_of(["roles/viewer", hostile])
    assert not grants_of(["roles/owner"]) and not grants_of([hostile, "roles/owner"])
    # And the platform's own reader of the condition, which the escalation proof asks (infra/access/model.py):
    # the same two roles, read as written.
    read = Grant(
        "project",
        "roles/resourcemanager.projectIamAdmin",
        frozenset(),
        modified_grants_condition([hostile, "roles/viewer"]),
    )
    assert read.grantable_roles == {hostile, "roles/viewer"}
