"""A platform team adopts the shipped stacks: the tests that read them still pass once they are theirs.

In a copy of the repository, Pulumi.dev.yaml gets a second TPU VM and a bigger budget, and a `staging`
copy of it its own project and deployer (and its place in the bootstrap's environments). Then what the
docs say to regenerate is regenerated, with the commands they give: the golden plans
(docs/development.md), the bootstrap's access.json and the CI identities (docs/ci-and-bootstrap.md).
The test modules that read the shipped stacks run on the copy, as `make test` would run them there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The modules that read the shipped stack files (the rest use tests/stacks/ fixtures).
SHIPPED_STACK_TESTS = (
    "tests/test_golden.py",
    "tests/test_ci_identities.py",
    "tests/test_access.py",
    "tests/test_bootstrap.py",
    "tests/test_config.py",
    "tests/test_stackfile.py",
    "tests/test_readme_examples.py",
)


def a_copy_of_the_repository(target: Path) -> Path:
    """Its files as a clone would have them (tracked and new, not ignored), beside the shared virtualenvs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
        elif source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).symlink_to(os.readlink(source))
    return target


def edit_stack(path: Path, edit) -> None:
    data = yaml.safe_load(path.read_text())
    edit(data["config"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def adopt(repo: Path) -> None:
    def grow(config: dict) -> None:
        config["tpu-platform:budget"]["amount"] = 2000
        second = {**config["tpu-platform:tpuVms"][0], "name": "mnist-v2-second"}
        config["tpu-platform:tpuVms"].append(second)

    edit_stack(repo / "Pulumi.dev.yaml", grow)
    shutil.copy2(repo / "Pulumi.dev.yaml", repo / "Pulumi.staging.yaml")

    def stage(config: dict) -> None:
        config["gcp:project"] = config["gcp:billingProject"] = "acme-ml-staging"
        config["tpu-platform:deployer"] = "tpu-deployer-staging@acme-ml-admin.iam.gserviceaccount.com"

    edit_stack(repo / "Pulumi.staging.yaml", stage)
    bootstrap = repo / "bootstrap" / "Pulumi.acme.yaml"
    data = yaml.safe_load(bootstrap.read_text())
    data["config"]["tpu-platform-bootstrap:environments"]["staging"] = "acme-ml-staging"
    bootstrap.write_text(yaml.safe_dump(data, sort_keys=False))


def bootstrap_outputs(repo: Path) -> dict:
    """What `pulumi stack output --json` of the bootstrap gives once it made staging's deployer and key."""
    committed = json.loads((repo / ".github" / "ci-identities.json").read_text())
    stacks = {s["stack"]: s for s in committed["stacks"]}
    key = stacks["dev"]["secretsProvider"].replace("-dev", "-staging")
    return {
        **{k: v for k, v in committed.items() if k not in ("$comment", "stacks")},
        "deployServiceAccounts": {
            **{s: e["deployServiceAccount"] for s, e in stacks.items()},
            "staging": "tpu-deployer-staging@acme-ml-admin.iam.gserviceaccount.com",
        },
        "secretsProviders": {**{s: e["secretsProvider"] for s, e in stacks.items()}, "staging": key},
    }


@pytest.mark.slow  # plans every shipped stack several times, then runs the modules that read them
def test_an_adopted_dev_stack_and_a_staging_copy_pass_the_tests_that_read_the_shipped_stacks(tmp_path: Path):
    repo = a_copy_of_the_repository(tmp_path / "repo")
    adopt(repo)
    env = {**os.environ, "PYTHONPATH": str(repo)}

    def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, *argv], cwd=repo, env=env, input=stdin, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done

    run("-m", "tools.offline", "golden", "--write")
    run("-m", "tools.offline", "access", "--write")
    run("-m", "tools.ci_identities", "-", stdin=json.dumps(bootstrap_outputs(repo)))
    assert (repo / "tests" / "golden" / "staging.json").is_file()
    assert "staging" in json.loads((repo / "bootstrap" / "access.json").read_text())

    tested = run(
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *SHIPPED_STACK_TESTS,
    )
    assert " passed" in tested.stdout and " failed" not in tested.stdout, tested.stdout[-4000:]
