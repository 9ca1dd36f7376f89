"""Idle and health alerts to the environment's channels, and the TPU dashboard; alerts that know
which VMs are meant to be off (a schedule, a completed run) and report a preempted node instead."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from infra.monitoring import CPU, GAVE_UP_EVENT, IDLE, MXU, PREEMPTED_EVENT, TRAINING_METRICS, WORKLOAD_LOG
from tests.support import NS, fixture_config, plan, with_object, with_scalar
from vm_agent import telemetry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "functions" / "tpu_guard"))
import decisions


def policies(stack="scheduled", raw=None):
    result = plan(raw or fixture_config(stack), stack)
    return result, {p.name.split("-", 1)[-1]: p for p in result.of_type("gcp:monitoring/alertPolicy:AlertPolicy")}


def with_vms(raw: dict[str, str], edit) -> dict[str, str]:
    vms = json.loads(raw[f"{NS}:tpuVms"])
    for vm in vms:
        edit(vm)
    return with_scalar(raw, "tpuVms", json.dumps(vms))


def absent_nodes(policy) -> set[str]:
    """The node names the absence condition's `node_id = monitoring.regex.full_match("a|b")` selects."""
    condition = policy.inputs["conditions"][0]["conditionAbsent"]
    selector = r'resource\.labels\.node_id = monitoring\.regex\.full_match\("([^"]*)"\)'
    (pattern,) = re.findall(selector, condition["filter"])
    # `(a|b)(-[0-9]+)?`: the VMs, and a multislice's nodes `<vm>-<i>`.
    assert pattern.endswith(")(-[0-9]+)?") and pattern.startswith("("), pattern
    return set(pattern.removeprefix("(").removesuffix(")(-[0-9]+)?").split("|"))


def test_idle_alert_uses_the_configured_limit_and_the_channels():
    result, by_kind = policies(
        raw=with_object(fixture_config("scheduled"), "monitoring", lambda m: m.update(idleMinutes=30))
    )
    idle = by_kind["idle"]
    condition = idle.inputs["conditions"][0]["conditionThreshold"]
    assert IDLE in condition["filter"] and 'resource.type = "tpu_worker"' in condition["filter"]
    assert condition["thresholdValue"] == 30 * 60
    channels = {c.urn for c in result.of_type("gcp:monitoring/notificationChannel:NotificationChannel")}
    assert len(idle.inputs["notificationChannels"]) == len(channels) == 1


def test_not_reporting_alert_fires_on_absent_metrics_of_always_on_vms_only():
    _, by_kind = policies("production")
    absent = by_kind["not-reporting"].inputs["conditions"][0]["conditionAbsent"]
    assert CPU in absent["filter"] and absent["duration"] == "600s"
    assert len(by_kind["not-reporting"].inputs["notificationChannels"]) == 2
    # on-demand-v5e runs all the time; spot-v5e is deleted when its run completes.
    assert absent_nodes(by_kind["not-reporting"]) == {"on-demand-v5e"}


def test_a_scheduled_stop_raises_no_not_reporting_alert():
    """The fixture's only VM is stopped every evening by its schedule: an absence alert would fire every night."""
    _, by_kind = policies("scheduled")
    assert "not-reporting" not in by_kind
    # Without its schedule and its completion action, the same VM is always on, and watched.
    raw = with_vms(fixture_config("scheduled"), lambda vm: (vm.pop("schedule"), vm.update(onCompletion="keep")))
    raw = with_object(raw, "budget", lambda budget: budget.update(failOverBudget=False))  # 720 h, not 257
    _, by_kind = policies("scheduled", raw)
    assert absent_nodes(by_kind["not-reporting"]) == {"office-v2"}


def test_a_completed_run_raises_no_not_reporting_alert():
    """A VM that stops (or is deleted) when its run completes is off as intended afterwards."""
    raw = with_vms(fixture_config("production"), lambda vm: vm.update(onCompletion="stop"))
    _, by_kind = policies("production", raw)
    assert "not-reporting" not in by_kind


def test_a_preempted_node_is_reported_by_the_scheduled_start_in_a_stack_without_recovery():
    _, by_kind = policies("scheduled")  # a scheduled spot VM, no recovery
    condition = by_kind["preempted"].inputs["conditions"][0]["conditionMatchedLog"]
    assert f'jsonPayload.event = "{PREEMPTED_EVENT}"' in condition["filter"]
    assert 'jsonPayload.environment = "scheduled"' in condition["filter"]
    assert by_kind["preempted"].inputs["alertStrategy"]["notificationRateLimit"]["period"] == "3600s"


def test_with_recovery_only_a_recovery_that_gives_up_is_reported():
    _, by_kind = policies("production")  # recovery every 10 minutes
    condition = by_kind["preempted"].inputs["conditions"][0]["conditionMatchedLog"]
    assert f'jsonPayload.event = "{GAVE_UP_EVENT}"' in condition["filter"]


def test_no_preemption_alert_without_a_spot_or_preemptible_vm():
    raw = with_vms(fixture_config("scheduled"), lambda vm: vm.update(provisioning="on-demand"))
    raw = with_object(raw, "budget", lambda budget: budget.update(failOverBudget=False))
    _, by_kind = policies("scheduled", raw)
    assert "preempted" not in by_kind


def test_the_alerts_match_the_events_the_guard_logs():
    """The event names are the guard's own: a rename on either side fails here."""
    assert (PREEMPTED_EVENT, GAVE_UP_EVENT) == (decisions.PREEMPTED_EVENT, decisions.GAVE_UP_EVENT)


def test_dashboard_shows_duty_cycle_memory_and_throughput():
    (dashboard,) = plan(fixture_config("small"), "small").of_type("gcp:monitoring/dashboard:Dashboard")
    layout = json.loads(dashboard.inputs["dashboardJson"])
    titles = [t["widget"]["title"] for t in layout["mosaicLayout"]["tiles"]]
    assert titles == [
        "TPU MXU utilization (duty cycle)",
        "TensorCore idle time",
        "TPU VM host memory",
        "Workload logs (every run's output)",
        "Training loss",
        "Training steps per second",
        "Training examples per second",
    ]
    assert MXU in json.dumps(layout)


def test_the_dashboard_shows_what_the_vm_agent_ships():
    """The log panel and the training charts select exactly what vm_agent/telemetry.py writes: its log
    name and stack label, its metric types on generic_node resources named by the stack."""
    assert WORKLOAD_LOG == telemetry.LOG_ID
    assert [m for _, m in TRAINING_METRICS] == [telemetry.METRIC_PREFIX + name for name in telemetry.METRICS]
    (dashboard,) = plan(fixture_config("small"), "small").of_type("gcp:monitoring/dashboard:Dashboard")
    widgets = {
        t["widget"]["title"]: t["widget"]
        for t in json.loads(dashboard.inputs["dashboardJson"])["mosaicLayout"]["tiles"]
    }
    origin = telemetry.Origin(project="fixture-project", stack="small", vm="small-v2", worker="0")
    entry = telemetry.log_entry('{"message": "training", "step": 1}', "exp-1", origin, 0.0)
    logs = widgets["Workload logs (every run's output)"]["logsPanel"]["filter"]
    assert logs == (
        f'logName = "projects/fixture-project/logs/{telemetry.LOG_ID}" AND labels.stack = "{entry["labels"]["stack"]}"'
    )
    resource = telemetry.resource(origin, "us-central2-b")
    for title, metric in TRAINING_METRICS:
        chart = widgets[title]["xyChart"]["dataSets"][0]["timeSeriesQuery"]["timeSeriesFilter"]["filter"]
        assert chart == (
            f'metric.type = "{metric}" AND resource.type = "{resource["type"]}" '
            f'AND resource.labels.namespace = "{resource["labels"]["namespace"]}"'
        )
