"""`.github/ci-identities.json`: generated from the bootstrap's outputs, one entry per stack file, in deploy order."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tools import ci_identities
from tools.ci_identities import IdentitiesError, StackFile, generate, read_stack_files

ROOT = Path(__file__).resolve().parents[1]
STACK_FILES = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in ROOT.glob("Pulumi.*.yaml"))


def committed() -> dict:
    return json.loads(ci_identities.DEFAULT_FILE.read_text())


def outputs_of(content: dict) -> dict:
    """What `pulumi stack output --json` of the bootstrap printed to produce `content`."""
    return {
        **{key: content[key] for key in ci_identities.OUTPUTS},
        "deployServiceAccounts": {s["stack"]: s["deployServiceAccount"] for s in content["stacks"]},
        "secretsProviders": {s["stack"]: s["secretsProvider"] for s in content["stacks"]},
    }


BOOTSTRAP = outputs_of(committed())


def test_every_stack_file_has_an_entry_and_every_entry_a_stack_file():
    assert STACK_FILES, "no Pulumi.<stack>.yaml at the repository root"
    assert sorted(s["stack"] for s in committed()["stacks"]) == STACK_FILES


def test_committed_file_is_what_the_tool_generates_from_the_same_outputs():
    # Catches a hand edit, a stack file whose gcp:project or production switch changed since, and a stale order.
    content, shared = generate(BOOTSTRAP, read_stack_files())
    assert ci_identities.DEFAULT_FILE.read_text() == ci_identities.render(content)
    for warning in shared:  # two shipped stacks on one project: shown in pytest's summary, as the tool prints it
        warnings.warn(warning, stacklevel=1)


def test_committed_file_shape():
    content = committed()
    assert set(content) == {"$comment", *ci_identities.OUTPUTS, "stacks"}
    for key, (pattern, _) in ci_identities.OUTPUTS.items():
        assert re.fullmatch(pattern, content[key]), key
    for entry in content["stacks"]:
        assert set(entry) == {"stack", "project", "production", "deployServiceAccount", "secretsProvider"}
        assert re.fullmatch(ci_identities.SECRETS_PROVIDER[0], entry["secretsProvider"])
        assert re.fullmatch(ci_identities.STACK_NAME, entry["stack"])
        assert re.fullmatch(ci_identities.PROJECT_ID, entry["project"])
        assert re.fullmatch(ci_identities.SERVICE_ACCOUNT, entry["deployServiceAccount"])
        assert isinstance(entry["production"], bool)
    deployers = [entry["deployServiceAccount"] for entry in content["stacks"]]
    assert len(set(deployers)) == len(deployers), "one deployer per environment"
    assert content["previewServiceAccount"] not in deployers


STACKS = {
    "prod": StackFile("acme-ml-production", production=True),
    "dev": StackFile("acme-ml-sandbox", production=False),
    "staging": StackFile("acme-ml-staging", production=False),
}


def outputs_for(stacks: dict[str, StackFile]) -> dict:
    return {
        **BOOTSTRAP,
        "deployServiceAccounts": {s: f"tpu-ci-deploy-{s}@acme-ml-admin.iam.gserviceaccount.com" for s in stacks},
        "secretsProviders": {
            s: f"gcpkms://projects/acme-ml-admin/locations/x/keyRings/p/cryptoKeys/{s}" for s in stacks
        },
    }


def test_non_production_stacks_deploy_first():
    content, warnings = generate(outputs_for(STACKS), STACKS)
    assert [s["stack"] for s in content["stacks"]] == ["dev", "staging", "prod"]
    assert warnings == []


def test_a_stack_file_without_a_deployer_and_a_deployer_without_a_stack_file_are_refused():
    outputs = outputs_for({"dev": STACKS["dev"], "qa": STACKS["dev"]})
    with pytest.raises(IdentitiesError) as error:
        generate(outputs, STACKS)
    message = str(error.value)
    assert "stack prod (Pulumi.prod.yaml) has no deployer" in message
    assert "stack staging (Pulumi.staging.yaml) has no deployer" in message
    assert "bootstrap deployer for stack qa has no Pulumi.qa.yaml" in message


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (
            "stateBackend",
            "acme-ml-pulumi-state",
            "bootstrap output stateBackend is 'acme-ml-pulumi-state'; expected a gs://",
        ),
        (
            "workloadIdentityProvider",
            None,
            "bootstrap output workloadIdentityProvider is None; expected projects/NUMBER",
        ),
        ("previewServiceAccount", "me@example.com", "bootstrap output previewServiceAccount is 'me@example.com'"),
        # The bootstrap before one deployer per environment: a single account, not a map.
        ("deployServiceAccounts", "x@acme-ml-admin.iam.gserviceaccount.com", "expected a map of stack name"),
        ("deployServiceAccounts", {"dev": "root"}, "bootstrap output deployServiceAccounts.dev is 'root'"),
    ],
)
def test_bad_outputs_are_named_with_their_value(key, value, expected):
    with pytest.raises(IdentitiesError, match=re.escape(expected)):
        generate({**outputs_for({"dev": STACKS["dev"]}), key: value}, {"dev": STACKS["dev"]})


def test_two_stacks_on_one_project_warn():
    shared = {"dev": STACKS["dev"], "qa": StackFile("acme-ml-sandbox", production=False), "prod": STACKS["prod"]}
    _, warnings = generate(outputs_for(shared), shared)
    assert warnings == [
        "stacks dev, qa share the GCP project acme-ml-sandbox: their deployers can change each other's resources "
        "and their budgets overlap; give each environment its own project"
    ]


def run_tool(tmp_path: Path, outputs: str, stack_files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for stack, text in stack_files.items():
        (tmp_path / f"Pulumi.{stack}.yaml").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "tools.ci_identities", "-", "--root", str(tmp_path), "--out", str(tmp_path / "ci.json")],
        input=outputs,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_cli_writes_the_file_and_warns_on_a_shared_project(tmp_path):
    stack_files = {
        "dev": "config:\n  gcp:project: acme-ml-sandbox\n",
        "qa": "config:\n  gcp:project: acme-ml-sandbox\n  tpu-platform:production: false\n",
    }
    done = run_tool(tmp_path, json.dumps(outputs_for({"dev": STACKS["dev"], "qa": STACKS["dev"]})), stack_files)
    assert done.returncode == 0, done.stderr
    assert "warning: stacks dev, qa share the GCP project acme-ml-sandbox" in done.stderr
    assert [s["stack"] for s in json.loads((tmp_path / "ci.json").read_text())["stacks"]] == ["dev", "qa"]


@pytest.mark.parametrize(
    ("outputs", "stack_file", "expected"),
    [
        ("not json", "config:\n  gcp:project: acme-ml-sandbox\n", "error: - is not JSON"),
        ("[]", "config:\n  gcp:project: acme-ml-sandbox\n", "error: the bootstrap outputs are a JSON list"),
        (None, "config:\n  gcp:project: Acme\n", "error: Pulumi.dev.yaml: gcp:project is 'Acme'; expected"),
        (
            None,
            "config:\n  gcp:project: acme-ml-sandbox\n  tpu-platform:production: yes please\n",
            "error: Pulumi.dev.yaml: tpu-platform:production is 'yes please'; expected true or false",
        ),
    ],
)
def test_cli_refuses_bad_input_without_a_traceback(tmp_path, outputs, stack_file, expected):
    text = json.dumps(outputs_for({"dev": STACKS["dev"]})) if outputs is None else outputs
    done = run_tool(tmp_path, text, {"dev": stack_file})
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "ci.json").exists()


def test_the_committed_identities_are_the_bootstraps_planned_outputs():
    """The file names the deployers the bootstrap declares and the stack files expect."""
    from infra.config.stackfile import read_stack_config
    from tests.test_bootstrap import plan

    outputs = plan().outputs
    committed = json.loads(ci_identities.DEFAULT_FILE.read_text())
    assert committed["previewServiceAccount"] == outputs["previewServiceAccount"]
    for entry in committed["stacks"]:
        assert entry["deployServiceAccount"] == outputs["deployServiceAccounts"][entry["stack"]]
        assert entry["deployServiceAccount"] == read_stack_config(entry["stack"])["tpu-platform:deployer"]
        assert entry["secretsProvider"] == outputs["secretsProviders"][entry["stack"]]  # each its own key
