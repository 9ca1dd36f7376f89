"""The README's main command: `python -m tools.offline plan`. The entry point runs as a real command
(the text plan, a bad stack file); the other cases run its `main` in-process (tests/support.py
offline_cli), which spares an interpreter start-up each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support import FIXTURE_STACKS, fixture_config, offline_cli, with_object
from tools.offline.mocks import GcpMocks, RecordingMonitor
from tools.offline.runner import run_program

ROOT = Path(__file__).resolve().parents[1]


def run_plan(*args: str, in_process: bool = True) -> subprocess.CompletedProcess[str]:
    return offline_cli("plan", *args, in_process=in_process)


def test_text_plan_of_dev():
    done = run_plan(in_process=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Offline plan of stack 'dev' in GCP project acme-ml-sandbox" in out
    for expected in (
        "+ buckets-data  (gcp:storage/bucket:Bucket)  [kept on destroy]",
        "publicAccessPrevention: enforced",
        "service: tpu.googleapis.com",
        "member: serviceAccount:tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com",
        "Who can do what in environment dev",
        "role: roles/storage.objectViewer",
        "thresholdRules[2].spendBasis: FORECASTED_SPEND",
        "labels.email_address: ml-platform-alerts@acme.example",
        "bucketUrls.data: gs://acme-ml-sandbox-dev-data",
    ):
        assert expected in out


def test_the_text_plan_runs_the_program_once(monkeypatch):
    """Who-can-do-what covers a later deploy too, from the one run's registrations (tools/offline/deploys.py):
    a second run of the program doubled the command's time at fleet scale."""
    import infra.platform

    runs = []
    build = infra.platform.build_platform
    monkeypatch.setattr(infra.platform, "build_platform", lambda *args: runs.append(args) or build(*args))
    done = run_plan("--stack-file", "tests/stacks/Pulumi.production.yaml")
    assert done.returncode == 0, done.stderr
    assert "Who can do what in environment production" in done.stdout
    assert len(runs) == 1


def test_json_plan_of_a_production_stack_matches_the_text():
    done = run_plan("--stack-file", "tests/stacks/Pulumi.production.yaml", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["stack"] == "production"
    text = run_plan("--stack-file", "tests/stacks/Pulumi.production.yaml")
    assert data["resourceCount"] == len(data["resources"])
    assert f"`pulumi up` on an empty stack would create {len(data['resources'])} resources" in text.stdout
    buckets = [r for r in data["resources"] if r["type"] == "gcp:storage/bucket:Bucket" and r["parent"] == "buckets"]
    assert all(b["options"] == {"protect": True, "retainOnDelete": True} for b in buckets)
    assert data["outputs"]["budgetAlertTopic"] == "projects/fixture-production/topics/production-budget-alerts"


def test_unknown_stack_names_the_available_ones():
    done = run_plan("--stack", "staging")
    assert done.returncode == 2
    assert "no stack file Pulumi.staging.yaml; stacks here: dev, prod" in done.stderr


def test_a_draft_stack_file_of_a_new_stack_plans_with_its_access():
    """A stack file for an environment not yet in the repository (here a fixture) plans, and the access
    section reads that file, not a missing Pulumi.<stack>.yaml at the root (was a traceback)."""
    result = run_plan("--stack-file", "tests/stacks/Pulumi.small.yaml")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "Who can do what" in result.stdout and "tpu-mnist-small" in result.stdout
    # The bootstrap has made none of its accounts yet: the plan says so.
    assert "stack small is not in bootstrap/access.json: the bootstrap makes none of its" in result.stdout


def test_bad_stack_file_fails_with_the_key_and_no_traceback(tmp_path):
    draft = tmp_path / "Pulumi.small.yaml"
    draft.write_text(
        (FIXTURE_STACKS / "Pulumi.small.yaml").read_text().replace("location: US-CENTRAL1", "location: MOON")
    )
    done = run_plan("--stack-file", str(draft), in_process=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "stack 'small': 1 invalid setting" in done.stderr
    assert "tpu-platform:buckets.location = 'MOON': must be one of" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.update(location="MOON"),
        lambda b: b.update(colour="blue"),
    ],
)
def test_bad_config_registers_nothing(edit):
    monitor = RecordingMonitor(GcpMocks("fixture-project"))
    with pytest.raises(Exception, match="tpu-platform:buckets"):
        run_program("small", with_object(fixture_config("small"), "buckets", edit), monitor=monitor)
    assert monitor.registrations == []


GUARDRAIL_CASES = {
    "tpu-missing-in-zone": (
        lambda c: c["tpu-platform:tpuVms"][0].update(
            acceleratorType="v4-8", zone="europe-west4-a", provisioning="on-demand"
        ),
        "v4-8 is not offered in europe-west4-a; zones that offer it: us-central2-b",
    ),
    "version-mismatch": (
        lambda c: c["tpu-platform:tpuVms"][0].update(runtimeVersion="tpu-vm-tf-2.13.0"),
        "set runtimeVersion: tpu-vm-tf-2.14.1, or set tpu-platform:workloads.mnist.frameworkVersion: 2.13.0",
    ),
    "spot-without-checkpoints": (
        lambda c: c["tpu-platform:workloads"]["mnist"].update(bucketAccess={"checkpoints": "none"}),
        "needs write access to the checkpoints bucket to resume; set "
        "tpu-platform:workloads.mnist.bucketAccess.checkpoints: write, or set provisioning: on-demand",
    ),
    "editor-role": (
        lambda c: c["tpu-platform:workloads"]["mnist"].update(projectRoles=["roles/editor"]),
        "storage access is granted per bucket with bucketAccess",
    ),
}


@pytest.mark.parametrize("case", sorted(GUARDRAIL_CASES))
def test_seed_troubleshooting_items_fail_the_plan_with_the_fix(case, tmp_path):
    import yaml

    edit, fix = GUARDRAIL_CASES[case]
    stack = yaml.safe_load((FIXTURE_STACKS / "Pulumi.scheduled.yaml").read_text())  # a spot VM
    edit(stack["config"])
    draft = tmp_path / "Pulumi.scheduled.yaml"
    draft.write_text(yaml.safe_dump(stack))
    done = run_plan("--stack-file", str(draft))
    assert done.returncode == 2
    assert fix in done.stderr
    assert "Traceback" not in done.stderr


def run_render(*args: str) -> subprocess.CompletedProcess[str]:
    return offline_cli("render", *args)


def test_render_prints_the_start_up_script_the_vm_will_run():
    from infra.config import parse_stack_config
    from infra.tpu.metadata import vm_metadata

    done = run_render("--stack-file", "tests/stacks/Pulumi.production.yaml", "--vm", "spot-v5e")
    assert done.returncode == 0, done.stderr
    expected = vm_metadata(parse_stack_config("production", fixture_config("production")))["spot-v5e"]["startup-script"]
    assert done.stdout == expected
    assert done.stdout.startswith("#!/bin/bash\n# tpu-platform start-up for TPU VM spot-v5e (stack production)")


def test_render_env_prints_the_agents_settings():
    done = run_render("--stack-file", "tests/stacks/Pulumi.small.yaml", "--env")
    assert done.returncode == 0, done.stderr
    assert "TPU_PLATFORM_VM=small-v2\n" in done.stdout
    assert "TPU_PLATFORM_ARTIFACTS=gs://fixture-project-small-artifacts\n" in done.stdout
    assert "EPOCHS" not in done.stdout  # the program's settings are its command line, in the run spec


def test_render_asks_which_vm_when_there_are_several():
    done = run_render("--stack-file", "tests/stacks/Pulumi.production.yaml")
    assert done.returncode == 2
    assert "pass --vm, one of on-demand-v5e, spot-v5e" in done.stderr
    assert "Traceback" not in done.stderr
