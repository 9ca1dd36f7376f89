"""Scheduled stop/start: Cloud Scheduler jobs calling the TPU API as a narrowly scoped account."""

from __future__ import annotations

import base64

from infra.lifecycle import SCHEDULER_PERMISSIONS, SELF_STOP_PERMISSIONS
from tests.support import plan, stack_config, with_object
from tests.test_config_tpu import vm_problems


def test_jobs_stop_and_start_the_node_through_the_tpu_api():
    result = plan(stack_config())
    jobs = {j.inputs["name"]: j for j in result.of_type("gcp:cloudscheduler/job:Job")}
    assert set(jobs) == {"tpu-mnist-v2-spot-start", "tpu-mnist-v2-spot-stop"}
    stop = jobs["tpu-mnist-v2-spot-stop"]
    assert stop.inputs["schedule"] == "0 20 * * 1-5" and stop.inputs["timeZone"] == "Europe/Berlin"
    assert stop.inputs["region"] == "us-central1"
    target = stop.inputs["httpTarget"]
    assert target["uri"] == (
        "https://tpu.googleapis.com/v2/projects/acme-ml-sandbox/locations/us-central1-b/nodes/mnist-v2-spot:stop"
    )
    assert target["httpMethod"] == "POST" and base64.b64decode(target["body"]) == b"{}"
    assert target["oauthToken"]["serviceAccountEmail"] == "tpu-scheduler-dev@acme-ml-sandbox.iam.gserviceaccount.com"
    (node,) = result.of_type("gcp:tpu/v2Vm:V2Vm")
    assert node.urn in stop.dependencies


def test_the_custom_role_holds_only_start_stop_and_get():
    result = plan(stack_config())
    (role,) = [
        r for r in result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole") if "Scheduler" in r.inputs["roleId"]
    ]
    assert sorted(role.inputs["permissions"]) == sorted(SCHEDULER_PERMISSIONS)
    assert set(SCHEDULER_PERMISSIONS) == {"tpu.nodes.get", "tpu.nodes.start", "tpu.nodes.stop"}
    grants = [g for g in result.of_type("gcp:projects/iAMMember:IAMMember") if "scheduler" in g.inputs["member"]]
    assert [g.inputs["role"] for g in grants] == [f"projects/acme-ml-sandbox/roles/{role.inputs['roleId']}"]


def test_no_schedule_no_scheduler():
    raw = with_object(stack_config(), "tpuVms", lambda vms: vms[0].pop("schedule"))
    result = plan(with_object(raw, "budget", lambda b: b.update(amount=2000)))  # always on costs more
    assert not result.of_type("gcp:cloudscheduler/job:Job")
    assert "cloudscheduler.googleapis.com" not in result.outputs["enabledApis"]


def test_multi_host_schedules_are_refused():
    message = vm_problems(acceleratorType="v2-32", zone="us-central1-a", runtimeVersion="tpu-vm-tf-2.14.1-pod")
    assert "v2-32 is a multi-host slice, which the TPU API cannot stop or start" in message


def test_bad_schedules():
    message = vm_problems(schedule={"start": "8am", "stop": "0 20 * * 1-5", "timeZone": "Mars/Olympus"})
    assert "tpuVms[0].schedule.start = '8am': not a unix-cron schedule: needs 5 fields" in message
    assert "tpuVms[0].schedule.timeZone = 'Mars/Olympus': an IANA time zone" in message


def test_a_finished_run_may_stop_only_its_own_node():
    result = plan(stack_config())
    (role,) = [
        r for r in result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole") if "SelfStop" in r.inputs["roleId"]
    ]
    assert sorted(role.inputs["permissions"]) == sorted(SELF_STOP_PERMISSIONS)
    (grant,) = [g for g in result.of_type("gcp:projects/iAMMember:IAMMember") if g.name.startswith("run-to-completion")]
    assert grant.inputs["member"] == "serviceAccount:tpu-mnist-dev@acme-ml-sandbox.iam.gserviceaccount.com"
    assert grant.inputs["condition"]["expression"] == (
        'resource.name == "projects/acme-ml-sandbox/locations/us-central1-b/nodes/mnist-v2-spot"'
    )
    env = result.of_type("gcp:tpu/v2Vm:V2Vm")[0].inputs["metadata"]["tpu-platform-env"]
    assert "TPU_PLATFORM_ON_COMPLETION=stop\n" in env


def test_keep_grants_nothing():
    raw = with_object(stack_config(), "tpuVms", lambda vms: vms[0].update(onCompletion="keep"))
    roles = plan(raw).of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert [r.inputs["roleId"] for r in roles] == ["tpuPlatformSchedulerDev"]
