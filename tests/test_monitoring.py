"""Idle and health alerts to the environment's channels, and the TPU dashboard."""

from __future__ import annotations

import json

from infra.monitoring import CPU, IDLE, MXU
from tests.support import plan, stack_config


def policies(stack="dev"):
    result = plan(stack_config(stack), stack)
    return result, {p.name.rsplit("-", 1)[-1]: p for p in result.of_type("gcp:monitoring/alertPolicy:AlertPolicy")}


def test_idle_alert_uses_the_configured_limit_and_the_channels():
    result, by_kind = policies()
    idle = by_kind["idle"]
    condition = idle.inputs["conditions"][0]["conditionThreshold"]
    assert IDLE in condition["filter"] and 'resource.type = "tpu_worker"' in condition["filter"]
    assert condition["thresholdValue"] == 30 * 60  # dev: idleMinutes 30
    channels = {c.urn for c in result.of_type("gcp:monitoring/notificationChannel:NotificationChannel")}
    assert len(idle.inputs["notificationChannels"]) == len(channels) == 1


def test_not_reporting_alert_fires_on_absent_metrics():
    _, by_kind = policies("prod")
    absent = by_kind["reporting"].inputs["conditions"][0]["conditionAbsent"]
    assert CPU in absent["filter"] and absent["duration"] == "600s"
    assert len(by_kind["reporting"].inputs["notificationChannels"]) == 2


def test_dashboard_shows_duty_cycle_memory_and_throughput():
    (dashboard,) = plan(stack_config()).of_type("gcp:monitoring/dashboard:Dashboard")
    layout = json.loads(dashboard.inputs["dashboardJson"])
    titles = [t["widget"]["title"] for t in layout["mosaicLayout"]["tiles"]]
    assert titles == [
        "TPU MXU utilization (duty cycle)",
        "TensorCore idle time",
        "TPU VM host memory",
        "Workload progress (training log lines)",
    ]
    assert MXU in json.dumps(layout)
