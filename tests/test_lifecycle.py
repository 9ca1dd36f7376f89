"""A TPU VM's life: scheduled stops through the TPU API, starts through the guard, run completion."""

from __future__ import annotations

import base64
import json

import pytest

from infra.access.identities import SCHEDULER_PERMISSIONS, scheduler_role
from infra.config import parse_stack_config
from infra.lifecycle import attempt_deadline
from infra.platform import stack_identities
from infra.tpu.metadata import run_id
from run_contract import completion_marker
from tests.support import fixture_config, plan, with_object
from tests.test_config import problems_of
from tests.test_config_tpu import vm_problems
from tools.offline.mocks import CloudState, GcpMocks, RecordingMonitor
from tools.offline.runner import run_program
from tools.standins.contracts import document


def test_jobs_stop_through_the_tpu_api_and_start_through_the_guard():
    result = plan(fixture_config("scheduled"), "scheduled")
    jobs = {j.inputs["name"]: j for j in result.of_type("gcp:cloudscheduler/job:Job")}
    assert set(jobs) == {"tpu-office-v2-start", "tpu-office-v2-stop"}
    stop = jobs["tpu-office-v2-stop"]
    assert stop.inputs["schedule"] == "0 20 * * 1-5" and stop.inputs["timeZone"] == "Europe/Berlin"
    assert stop.inputs["region"] == "us-central1"
    target = stop.inputs["httpTarget"]
    assert target["uri"] == (
        "https://tpu.googleapis.com/v2/projects/fixture-project/locations/us-central1-b/nodes/office-v2:stop"
    )
    assert target["httpMethod"] == "POST" and base64.b64decode(target["body"]) == b"{}"
    assert (
        target["oauthToken"]["serviceAccountEmail"] == "tpu-scheduler-scheduled@fixture-project.iam.gserviceaccount.com"
    )
    (node,) = result.of_type("gcp:tpu/v2Vm:V2Vm")
    assert node.urn in stop.dependencies
    start = jobs["tpu-office-v2-start"].inputs
    assert (
        start["httpTarget"]["uri"]
        == "https://us-central1-fixture-project.cloudfunctions.net/tpu-scheduled-start-scheduled"
    )
    assert json.loads(base64.b64decode(start["httpTarget"]["body"])) == {"node": "office-v2"}
    invoker = "tpu-guard-invoker-scheduled@fixture-project.iam.gserviceaccount.com"
    assert start["httpTarget"]["oidcToken"]["serviceAccountEmail"] == invoker


def test_the_custom_role_holds_only_stop_and_get():
    result = plan(fixture_config("scheduled"), "scheduled")
    role = scheduler_role("scheduled")  # made by the bootstrap; the stack grants it
    assert sorted(role.permissions) == sorted(SCHEDULER_PERMISSIONS)
    assert set(SCHEDULER_PERMISSIONS) == {"tpu.nodes.get", "tpu.nodes.stop"}
    grants = [g for g in result.of_type("gcp:projects/iAMMember:IAMMember") if "scheduler" in g.inputs["member"]]
    assert [g.inputs["role"] for g in grants] == [f"projects/fixture-project/roles/{role.role_id}"]


def test_no_schedule_no_scheduler():
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: vms[0].pop("schedule"))
    result = plan(with_object(raw, "budget", lambda b: b.update(amount=2000)), "scheduled")  # always on costs more
    assert not result.of_type("gcp:cloudscheduler/job:Job")
    assert "cloudscheduler.googleapis.com" not in result.outputs["enabledApis"]


def test_multi_host_schedules_are_refused():
    message = vm_problems(
        "scheduled", acceleratorType="v2-32", zone="us-central1-a", runtimeVersion="tpu-vm-tf-2.14.1-pod"
    )
    assert "v2-32 is a multi-host slice, which the TPU API cannot stop or start" in message


def scheduled(schedule: dict[str, str], **vm: object) -> dict[str, str]:
    """The small fixture stack with its one VM (small-v2, a v2-8 kept after its run) on `schedule`."""
    return with_object(fixture_config(), "tpuVms", lambda vms: vms[0].update(schedule=schedule, **vm))


def test_a_schedule_that_only_stops_makes_only_the_stop_job_and_no_guard():
    """ "Stop my dev TPUs at night": people start them. Nothing starts the VM, so nothing needs the guard."""
    raw = scheduled({"stop": "0 20 * * *", "timeZone": "Europe/Berlin"})
    result = plan(raw, "small")
    (job,) = result.of_type("gcp:cloudscheduler/job:Job")
    assert (job.inputs["name"], job.inputs["schedule"]) == ("tpu-small-v2-stop", "0 20 * * *")
    assert job.inputs["timeZone"] == "Europe/Berlin"
    assert job.inputs["httpTarget"]["uri"] == (
        "https://tpu.googleapis.com/v2/projects/fixture-project/locations/us-central1-b/nodes/small-v2:stop"
    )
    assert job.inputs["httpTarget"]["oauthToken"]["serviceAccountEmail"].startswith("tpu-scheduler-small@")
    assert not result.of_type("gcp:cloudfunctionsv2/function:Function")
    assert result.outputs["schedules"] == {"small-v2": {"stop": "0 20 * * *", "timeZone": "Europe/Berlin"}}
    made = {a.account_id for a in stack_identities(parse_stack_config("small", raw)).accounts}
    assert "tpu-scheduler-small" in made and not {a for a in made if a.startswith("tpu-guard")}


def test_a_schedule_that_only_starts_a_vm_whose_runs_stop_it_makes_only_the_start_job_through_the_guard():
    """Each run stops the VM when it is complete; the schedule boots the stack's next run at night, and the
    guard's scheduled start never boots a finished one (test_tpu_guard)."""
    raw = scheduled({"start": "0 22 * * *"}, onCompletion="stop")
    result = plan(raw, "small")
    (job,) = result.of_type("gcp:cloudscheduler/job:Job")
    assert (job.inputs["name"], job.inputs["schedule"]) == ("tpu-small-v2-start", "0 22 * * *")
    assert job.inputs["httpTarget"]["uri"] == (
        "https://us-central1-fixture-project.cloudfunctions.net/tpu-scheduled-start-small"
    )
    assert json.loads(base64.b64decode(job.inputs["httpTarget"]["body"])) == {"node": "small-v2"}
    functions = {f.inputs["name"] for f in result.of_type("gcp:cloudfunctionsv2/function:Function")}
    assert functions == {"tpu-scheduled-start-small", "tpu-complete-small"}
    assert result.outputs["schedules"] == {"small-v2": {"start": "0 22 * * *", "timeZone": "Etc/UTC"}}
    # Nothing is stopped by a job: no scheduler account, role or grant.
    assert not [g for g in result.of_type("gcp:projects/iAMMember:IAMMember") if "scheduler" in g.inputs["member"]]
    made = {a.account_id for a in stack_identities(parse_stack_config("small", raw)).accounts}
    assert "tpu-scheduler-small" not in made and "tpu-guard-invoker-small" in made


def test_a_schedule_gives_at_least_one_side():
    message = problems_of(scheduled({"timeZone": "Europe/Berlin"}), "small")
    assert "tpuVms[small-v2].schedule = {'timeZone': 'Europe/Berlin'}: give start or stop, or both" in message


def test_a_schedule_that_only_starts_a_vm_nothing_stops_is_refused():
    """A TPU VM is created running: with onCompletion keep, a start with no stop is an always-on VM."""
    message = problems_of(scheduled({"start": "0 8 * * 1-5"}), "small")
    assert (
        "tpuVms[small-v2].schedule = {'start': '0 8 * * 1-5'}: "
        "only starts it, and with onCompletion keep nothing stops "
        "it: it would run, and bill, every hour from its first start; set onCompletion: stop, or remove schedule, "
        "or give it a stop too"
    ) in message


@pytest.mark.parametrize("side", ["start", "stop"])
def test_one_side_of_a_schedule_is_checked_like_both(side):
    message = problems_of(scheduled({side: "8am"}, onCompletion="stop"), "small")
    assert f"tpuVms[small-v2].schedule.{side} = '8am': not a unix-cron schedule: needs 5 fields" in message
    multi_host = {"acceleratorType": "v2-32", "zone": "us-central1-a", "runtimeVersion": "tpu-vm-tf-2.14.1-pod"}
    message = problems_of(scheduled({side: "0 20 * * *"}, onCompletion="delete", **multi_host), "small")
    assert (
        f"tpuVms[small-v2].schedule = {{'{side}': '0 20 * * *'}}: v2-32 is a multi-host slice, which the TPU API"
        in message
    )


def test_a_job_attempt_waits_within_cloud_schedulers_limits():
    """cloudscheduler.v1 Job.attemptDeadline: "For HTTP targets ... in the interval [15 seconds, 30 minutes]"."""
    assert attempt_deadline(1800) == "1800s" and attempt_deadline(15) == "15s"
    for outside in (14, 1801):
        with pytest.raises(ValueError, match="waits 15 s to 1800 s"):
            attempt_deadline(outside)
    assert "attemptDeadline" in document("cloudscheduler.v1")["schemas"]["Job"]["properties"]
    assert (
        "[15 seconds, 30 minutes]"
        in document("cloudscheduler.v1")["schemas"]["Job"]["properties"]["attemptDeadline"]["description"]
    )


def test_bad_schedules():
    message = vm_problems(schedule={"start": "8am", "stop": "0 20 * * 1-5", "timeZone": "Mars/Olympus"})
    assert "tpuVms[small-v2].schedule.start = '8am': not a unix-cron schedule: needs 5 fields" in message
    assert "tpuVms[small-v2].schedule.timeZone = 'Mars/Olympus': an IANA time zone" in message


def test_a_schedule_with_a_trailing_newline_is_refused_not_sent_to_cloud_scheduler():
    """A YAML block scalar (`stop: |`) ends in a newline, which the job's `schedule` would carry as written."""
    message = vm_problems(schedule={"start": "0 8 * * 1-5", "stop": "0 20 * * 1-5\n", "timeZone": "Europe/Berlin"})
    assert "tpuVms[small-v2].schedule.stop = '0 20 * * 1-5\\n': not a unix-cron schedule" in message
    assert "separated by single spaces" in message


def test_a_finished_run_holds_no_tpu_right_and_writes_only_its_own_status():
    result = plan(fixture_config("scheduled"), "scheduled")
    roles = {r.role_id for r in stack_identities(parse_stack_config("scheduled", fixture_config("scheduled"))).roles}
    assert roles == {"tpuPlatformSchedulerScheduled", "tpuPlatformGuardScheduled"}
    workload = "serviceAccount:tpu-mnist-scheduled@fixture-project.iam.gserviceaccount.com"
    assert not [
        g
        for g in result.of_type("gcp:projects/iAMMember:IAMMember")
        if g.inputs["member"] == workload and g.inputs["role"].startswith("projects/")
    ]
    (status,) = [
        g for g in result.of_type("gcp:storage/bucketIAMMember:BucketIAMMember") if g.name.startswith("run-status")
    ]
    assert status.inputs["member"] == workload
    # Its own objects, and listing its own prefix (the agent lists <vm>/requests/): see test_researchers.py.
    assert status.inputs["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/fixture-project-scheduled-status/objects/office-v2/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("office-v2/")'
    )


def test_the_guard_acts_on_completion_as_the_stack_says_never_as_the_marker_says():
    result = plan(fixture_config("scheduled"), "scheduled")
    (complete,) = [f for f in result.of_type("gcp:cloudfunctionsv2/function:Function") if f.name == "guard-complete"]
    env = complete.inputs["serviceConfig"]["environmentVariables"]
    assert json.loads(env["TPU_VMS"]) == {
        "office-v2": {"nodes": ["office-v2"], "zones": ["us-central1-b"], "onCompletion": "stop"}
    }
    trigger = complete.inputs["eventTrigger"]
    assert trigger["eventType"] == "google.cloud.storage.object.v1.finalized"
    assert trigger["eventFilters"] == [{"attribute": "bucket", "value": "fixture-project-scheduled-status"}]


def test_the_status_bucket_survives_destroy():
    (bucket,) = [
        b
        for b in plan(fixture_config("scheduled"), "scheduled").of_type("gcp:storage/bucket:Bucket")
        if b.name == "run-status-bucket"
    ]
    assert bucket.retain_on_delete and bucket.inputs["versioning"] == {"enabled": True}


def completed_plan(raw: dict[str, str], *markers: str, run: str | None = None, content: str | None = None):
    """A plan whose status bucket holds `markers`; each names `run` (default: the VM's current run id), or
    holds `content` when given."""
    bucket = "fixture-project-scheduled-status"
    state = CloudState()
    cfg = parse_stack_config("scheduled", raw)
    runs = {vm.name: run_id(cfg, vm) for vm in cfg.tpu_vms}
    for marker in markers:
        vm = marker.split("/")[0]
        made = completion_marker.marker(run or runs.get(vm, "?"), "vm-agent", "2026-12-01T12:00:00Z")
        state.put(bucket, marker, content if content is not None else json.dumps(made))
    return run_program("scheduled", raw, state=state)


def test_a_vm_deleted_on_completion_is_no_longer_declared():
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: vms[0].update(onCompletion="delete"))
    assert plan(raw, "scheduled").of_type("gcp:tpu/v2Vm:V2Vm")
    result = completed_plan(raw, "office-v2/COMPLETE", "other-vm/COMPLETE")
    assert not result.of_type("gcp:tpu/v2Vm:V2Vm")
    assert not result.of_type("gcp:cloudscheduler/job:Job")  # nothing left to stop or start
    assert any("office-v2 completed its run and was deleted" in w for w in result.warnings)
    assert (
        "gcp:storage/getBucketObjects:getBucketObjects",
        {"bucket": "fixture-project-scheduled-status", "matchGlob": "*/COMPLETE"},
    ) in result.invokes


def test_a_marker_of_an_earlier_run_does_not_remove_the_vm():
    """A new `run` id trains again: the VM is declared once more, whatever an old run left behind."""
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: vms[0].update(onCompletion="delete"))
    result = completed_plan(raw, "office-v2/COMPLETE", run="scheduled/mnist/office-v2/an-older-run")
    assert result.of_type("gcp:tpu/v2Vm:V2Vm")


def test_content_that_is_not_a_completion_marker_does_not_remove_the_vm():
    """Strict: the marker's schema (run_contract/completion_marker.py), not any object that names the run."""
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: vms[0].update(onCompletion="delete"))
    current = run_id(parse_stack_config("scheduled", raw), parse_stack_config("scheduled", raw).tpu_vms[0])
    for content in ("not json", json.dumps({"runId": current}), json.dumps([current])):
        assert completed_plan(raw, "office-v2/COMPLETE", content=content).of_type("gcp:tpu/v2Vm:V2Vm"), content


def test_a_stopped_vm_stays_declared_when_complete():
    result = completed_plan(fixture_config("scheduled"), "office-v2/COMPLETE")
    assert result.of_type("gcp:tpu/v2Vm:V2Vm")  # stop keeps the node (and its disk); the guard refuses starts


def test_before_the_first_deploy_the_status_bucket_is_asked_for_not_listed():
    """A fresh project has no status bucket: the program checks it exists before listing it."""
    raw = with_object(fixture_config("scheduled"), "tpuVms", lambda vms: vms[0].update(onCompletion="delete"))
    result = run_program("scheduled", raw, monitor=RecordingMonitor(GcpMocks("fixture-project")))  # no bucket yet
    assert result.of_type("gcp:tpu/v2Vm:V2Vm")
    tokens = [token for token, _ in result.invokes]
    assert "gcp:storage/getBuckets:getBuckets" in tokens
    assert "gcp:storage/getBucketObjects:getBucketObjects" not in tokens
