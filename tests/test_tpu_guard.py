"""The TPU guard's decisions on recorded node listings, and the guard's resources and identity."""

from __future__ import annotations

import sys
from pathlib import Path

from infra.automation import GUARD_PERMISSIONS
from tests.support import plan, stack_config, with_object

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"))
from decisions import budget_actions, recovery_actions, recreate_body

PARENT = "projects/acme-ml-production/locations/us-central1-a/nodes"


def node(name: str, state: str, *, env: str = "prod", spot: bool = False, hosts: int = 1) -> dict:
    """A node as `GET …/nodes` lists it (fields as the TPU API v2 returns them)."""
    return {
        "name": f"{PARENT}/{name}",
        "acceleratorType": "v5litepod-4" if hosts == 1 else "v5litepod-16",
        "runtimeVersion": "tpu-vm-tf-2.15.0-pjrt",
        "state": state,
        "health": "HEALTHY",
        "createTime": "2026-11-29T08:00:00Z",
        "networkEndpoints": [{"ipAddress": f"10.30.0.{i + 2}", "port": 8470} for i in range(hosts)],
        "networkConfig": {"network": "projects/p/global/networks/tpu-prod", "enableExternalIps": False},
        "serviceAccount": {"email": "tpu-mnist-prod@acme-ml-production.iam.gserviceaccount.com"},
        "schedulingConfig": {"spot": True} if spot else {},
        "labels": {"environment": env, "managed-by": "pulumi", "workload": "mnist"},
        "metadata": {"startup-script": "#!/bin/bash"},
        "apiVersion": "V2",
        "id": "123",
    }


LISTING = [
    node("trainer", "READY"),
    node("spot-a", "PREEMPTED", spot=True),
    node("slice", "READY", hosts=4),
    node("stopped", "STOPPED"),
    node("going", "DELETING"),
    node("other-env", "READY", env="dev"),
    {**node("hand-made", "READY"), "labels": {"environment": "prod"}},  # not created by this platform
]
OVER = {"budgetAmount": 20000, "costAmount": 20500, "schemaVersion": "1.0", "budgetDisplayName": "prod"}


def kinds(actions):
    return [(a.kind, a.node.rsplit("/", 1)[-1]) for a in actions]


def test_below_the_threshold_nothing_happens():
    under = {**OVER, "costAmount": 15000}
    assert budget_actions(under, LISTING, environment="prod", at_percent=100, action="stop", dry_run=False) == []


def test_over_budget_stops_running_nodes_of_the_environment_only():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=100, action="stop", dry_run=False)
    # Multi-host slices cannot be stopped: deleting is the only way to stop their cost.
    assert kinds(actions) == [("stop", "trainer"), ("delete", "slice")]
    assert "102% of the budget" in actions[0].reason


def test_delete_mode_deletes_everything_of_the_environment_not_already_going():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=100, action="delete", dry_run=False)
    assert kinds(actions) == [("delete", "trainer"), ("delete", "spot-a"), ("delete", "slice"), ("delete", "stopped")]


def test_dry_run_marks_every_action():
    actions = budget_actions(OVER, LISTING, environment="prod", at_percent=50, action="stop", dry_run=True)
    assert actions and all(a.dry_run for a in actions)


def test_recovery_recreates_preempted_spot_nodes_until_the_cap():
    assert kinds(recovery_actions(LISTING, environment="prod", attempts={}, max_attempts=3)) == [("recreate", "spot-a")]
    capped = recovery_actions(LISTING, environment="prod", attempts={f"{PARENT}/spot-a": 3}, max_attempts=3)
    assert kinds(capped) == [("give-up", "spot-a")]
    on_demand_preempted = [node("trainer", "PREEMPTED")]
    assert recovery_actions(on_demand_preempted, environment="prod", attempts={}, max_attempts=3) == []


def test_recreated_node_keeps_its_spec_and_drops_computed_fields():
    body = recreate_body(node("spot-a", "PREEMPTED", spot=True))
    assert {"name", "state", "health", "createTime", "networkEndpoints", "apiVersion", "id"}.isdisjoint(body)
    assert body["acceleratorType"] == "v5litepod-4" and body["schedulingConfig"] == {"spot": True}
    assert body["serviceAccount"]["email"].startswith("tpu-mnist-prod@")
    assert body["labels"]["managed-by"] == "pulumi" and body["metadata"]


def test_guard_resources_in_prod():
    result = plan(stack_config("prod"), "prod")
    functions = {f.inputs["name"]: f for f in result.of_type("gcp:cloudfunctionsv2/function:Function")}
    assert set(functions) == {"tpu-budget-guard-prod", "tpu-recovery-prod", "tpu-complete-prod"}
    budget = functions["tpu-budget-guard-prod"]
    assert budget.inputs["eventTrigger"]["pubsubTopic"] == "projects/acme-ml-production/topics/prod-budget-alerts"
    assert budget.inputs["serviceConfig"]["environmentVariables"]["BUDGET_ACTION"] == "stop"
    assert budget.inputs["serviceConfig"]["ingressSettings"] == "ALLOW_INTERNAL_ONLY"
    (schedule,) = [j for j in result.of_type("gcp:cloudscheduler/job:Job") if j.inputs["name"] == "tpu-recovery-prod"]
    assert schedule.inputs["schedule"] == "*/10 * * * *"
    assert schedule.inputs["httpTarget"]["oidcToken"]["serviceAccountEmail"].startswith("tpu-guard-invoker-prod@")
    (role,) = [r for r in result.of_type("gcp:projects/iAMCustomRole:IAMCustomRole") if "Guard" in r.inputs["roleId"]]
    assert role.inputs["permissions"] == list(GUARD_PERMISSIONS)
    archive = result.of_type("gcp:storage/bucketObject:BucketObject")[0].inputs["source"]["archive"]
    assert sorted(archive) == ["decisions.py", "main.py", "requirements.txt"]


def test_guard_identity_is_narrow():
    result = plan(stack_config("prod"), "prod")
    guard = "serviceAccount:tpu-guard-prod@acme-ml-production.iam.gserviceaccount.com"
    project_roles = [
        g.inputs["role"] for g in result.of_type("gcp:projects/iAMMember:IAMMember") if g.inputs["member"] == guard
    ]
    # Its TPU role, and Eventarc's event receiver (direct Cloud Storage events need it on the trigger's account).
    assert project_roles == ["projects/acme-ml-production/roles/tpuPlatformGuardProd", "roles/eventarc.eventReceiver"]
    acts_as = [g for g in result.of_type("gcp:serviceaccount/iAMMember:IAMMember") if g.inputs["member"] == guard]
    assert [g.inputs["role"] for g in acts_as] == ["roles/iam.serviceAccountUser"]  # on the workload account only


def test_no_guard_without_a_feature_that_needs_it():
    raw = with_object(stack_config("dev"), "tpuVms", lambda vms: [vm.pop("schedule") for vm in vms])
    raw = with_object(raw, "tpuVms", lambda vms: [vm.update(onCompletion="keep") for vm in vms])
    result = plan(with_object(raw, "budget", lambda b: b.update(amount=2000)))
    assert not result.of_type("gcp:cloudfunctionsv2/function:Function")
    assert "cloudfunctions.googleapis.com" not in result.outputs["enabledApis"]


def test_budget_action_needs_the_budget_topic():
    from tests.support import with_object
    from tests.test_config import problems_of

    raw = with_object(stack_config(), "automation", lambda a: a.update(budgetAction={"action": "stop"}))
    assert "tpu-platform:automation.budgetAction" in problems_of(raw)
    assert "needs tpu-platform:budget.pubsubTopic: true" in problems_of(raw)
    bad = with_object(stack_config("prod"), "automation", lambda a: a["budgetAction"].update(action="pause"))
    assert "automation.budgetAction.action = 'pause': must be one of delete, stop" in problems_of(bad, "prod")


def test_every_api_call_of_the_guard_is_allowed_to_its_identity():
    """Read main.py's HTTP calls and check each against the permissions the guard's role holds."""
    import ast

    source = Path(__file__).resolve().parents[1] / "functions" / "tpu_guard" / "main.py"
    calls = []
    for call in ast.walk(ast.parse(source.read_text())):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "session"
            and call.args
        ):
            calls.append((call.func.attr, ast.unparse(call.args[0])))
    needed = set()
    for method, url in calls:
        if "{TPU}" in url:
            if url.endswith(":stop'") or url.endswith(':stop"'):
                needed.add("tpu.nodes.stop")
            elif "operation" in url:
                needed.add("tpu.operations.get")
            elif url.rstrip("'\"").endswith("/nodes"):
                needed.add("tpu.nodes.list" if method == "get" else "tpu.nodes.create")
            elif method == "delete":
                needed.add("tpu.nodes.delete")
            else:
                raise AssertionError(f"unclassified TPU call: {method} {url}")
        else:
            assert "STORAGE" in url or "_attempts_url" in url or "upload" in url, url  # the counters object
    assert needed == {"tpu.nodes.list", "tpu.nodes.stop", "tpu.nodes.delete", "tpu.nodes.create", "tpu.operations.get"}
    # Until the scheduled-start entry point lands, get and start are held for it (GUARD_METHODS).
    assert needed <= set(GUARD_PERMISSIONS)
