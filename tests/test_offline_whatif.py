"""`python -m tools.offline whatif`: the table, the JSON, inputs from a stack, and clear refusals."""

from __future__ import annotations

import json

import yaml

from infra.catalog import load_catalog
from infra.goodput.interval import Rate
from infra.goodput.whatif import Capacity, Job, what_if
from tests.support import FIXTURE_STACKS, offline_cli

JOB = [
    "--steps",
    "200000",
    "--step-seconds",
    "0.5",
    "--save-seconds",
    "20",
    "--commit-seconds",
    "60",
    "--restore-seconds",
    "40",
    "--first-step-seconds",
    "90",
    "--checkpoint-every-steps",
    "2000",
    "--checkpoint-every-minutes",
    "10",
]
SPOT = ["--accelerator", "v5litepod-8", "--zone", "us-central1-a", "--provisioning", "spot", "--preemption-hours", "6"]


def test_the_table_shows_both_intervals_by_category_with_prices():
    done = offline_cli("whatif", *SPOT, *JOB)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "What-if: v5litepod-8 (8 chips), spot in us-central1; preemptions: one every 6 h (given)" in out
    assert "Best interval: every 1,832 steps (916 s of steps), Young/Daly: a save takes 60 s to commit" in out
    assert "yours: every 1,200 steps" in out and "best: every 1,832 steps" in out
    for category in ("recoveryWait", "productive", "checkpointSave", "wastedProgress", "unattributed", "billed"):
        assert f"\n  {category} " in out
    assert "Prices of 2026-11 (skypilot-catalog v7 vms.csv @6f65ab5" in out and "0.3468 USD per chip-hour" in out
    assert "assumed, not measured: delete 60 s, create 240 s, boot 120 s, installs 60 s" in out


def test_json_is_the_models_answer():
    done = offline_cli("whatif", *SPOT, *JOB, "--json", "--boot-seconds", "200")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["best"]["everySteps"] == 1832 and data["yours"]["everySteps"] == 1200
    assert data["assumed"] == {"delete_s": 60.0, "create_s": 240.0, "installs_s": 60.0}  # boot was given
    assert data["yours"]["price"]["date"] == "2026-11" and data["yours"]["categories"]["productive"]["chipHours"]


def test_simulated_jobs_are_reported_beside_the_closed_form():
    done = offline_cli("whatif", *SPOT, *JOB, "--json", "--simulate", "3")
    assert done.returncode == 0, done.stderr
    simulated = json.loads(done.stdout)["simulated"]
    assert simulated["yours"]["jobs"] == 3 and simulated["yours"]["finished"] == 3
    assert simulated["best"]["billedPerUseful"] > 1


def test_a_record_of_preemptions_gives_the_rate(tmp_path):
    record = tmp_path / "preemptions.json"
    record.write_text(json.dumps({"preemptions": 4, "lostWithoutNotice": 0, "runningHours": 24.0}))
    spot = [*SPOT[:6], "--history", str(record)]
    done = offline_cli("whatif", *spot, *JOB, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)["capacity"]
    assert data["preemptions"] == {"perHour": 4 / 24, "source": "4 preemptions in 24 running hours"}
    assert data["lostWithoutNotice"]["source"].startswith("no losses without notice in 24 running hours")
    record.write_text(json.dumps({"preemptions": -1, "runningHours": 24.0}))
    bad = offline_cli("whatif", *spot, *JOB)
    assert bad.returncode == 2 and "preemptions: -1 is not a whole number ≥ 0" in bad.stderr


def test_a_stacks_vm_and_workload_fill_what_the_flags_leave(tmp_path):
    stack = yaml.safe_load((FIXTURE_STACKS / "Pulumi.scheduled.yaml").read_text())  # a spot v2-8
    stack["config"]["tpu-platform:workloads"]["mnist"] |= {"stepSeconds": 0.05, "checkpointSeconds": 60}
    stack["config"]["tpu-platform:tpuVms"][0]["hoursBetweenPreemptions"] = 8
    path = tmp_path / "Pulumi.scheduled.yaml"
    path.write_text(yaml.safe_dump(stack))
    done = offline_cli("whatif", "--stack-file", str(path), "--steps", "100000", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["capacity"]["acceleratorType"] == "v2-8" and data["capacity"]["provisioning"] == "spot"
    assert data["capacity"]["preemptions"]["source"] == "one every 8 h (the stack's hoursBetweenPreemptions)"
    assert data["job"]["checkpointEverySteps"] == 200 and data["job"]["stepSeconds"] == 0.05
    assert data["capacity"]["recoveryEveryMinutes"] is None  # the fixture has no automation.recovery
    assert any(n.startswith("no automation.recovery: nothing re-creates a preempted node") for n in data["notes"])
    v2 = load_catalog().accelerator("v2-8")
    assert not isinstance(v2, str)
    job = Job(steps=100000, step_s=0.05, save_s=60, restore_s=60, every_steps=200, every_minutes=10)
    expected = what_if(job, Capacity(v2, "spot", ("us-central1-b",), preemptions=Rate.every(8)))
    assert data["best"]["seconds"] == expected.best.seconds


def test_what_is_missing_or_wrong_is_said_not_a_traceback():
    small = str(FIXTURE_STACKS / "Pulumi.small.yaml")
    missing = offline_cli("whatif", "--stack-file", small, "--steps", "1000")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: give --step-seconds, --save-seconds (or --stack and --vm")
    no_vm = offline_cli("whatif", "--stack-file", small, "--vm", "nope", *JOB)
    assert no_vm.returncode == 2 and "stack 'small' has no TPU VM 'nope'; its TPU VMs: small-v2" in no_vm.stderr
    on_demand = offline_cli("whatif", *SPOT[:4], "--provisioning", "on-demand", "--preemption-hours", "3", *JOB)
    assert on_demand.returncode == 2 and "on-demand VMs are not preempted" in on_demand.stderr
    unknown = offline_cli("whatif", "--accelerator", "v9-8", "--zone", "us-central1-a", *JOB)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: --accelerator v9-8: unknown TPU type")
