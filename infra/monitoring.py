"""Alerts and a dashboard for the environment's TPUs, sent to its notification channels.

- TPU idle: TensorCore idle time above the configured limit (chips billed while doing nothing);
- TPU VM not reporting: no metrics for 10 minutes from a worker of a VM that is meant to run all
  the time: no schedule and `onCompletion: keep`. An alert policy has no calendar and cannot read
  the completion marker, so a VM that a schedule stops every evening or that stops when its run is
  complete would raise it every time it is off as intended; such VMs are not in its filter.
- TPU VM preempted and not recovered: a VM that is meant to run cannot. Cloud TPU reports a
  preemption only as the node's state PREEMPTED (tpu/docs/preemptible, "Detecting if a TPU has been
  preempted": list the nodes; the state turns from READY to PREEMPTED). The Admin Activity audit log
  records API calls (tpu/docs/audit-logs), and we found no documented metric or audit entry for the
  transition; the guard reads the state and logs a
  structured event, and this alert matches it. Without recovery, the morning's scheduled start
  finds the node PREEMPTED, does not start it (a spot node cannot be restarted, tpu/docs/spot) and
  logs `tpu-preempted-not-started`; with recovery, the guard re-creates it and the alert fires only
  when it gives up (`tpu-recovery-gave-up`).
- the budget's thresholds arrive through the same channels (the budget notifies them directly).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.apis import ProjectApis
from infra.config import Env, TpuVmSettings
from run_contract import metrics

TPU_WORKER = 'resource.type = "tpu_worker"'
IDLE = "tpu.googleapis.com/tpu/tensorcore/idle_duration"
MXU = "tpu.googleapis.com/tpu/mxu/utilization"
HOST_MEMORY = "tpu.googleapis.com/memory/usage"
CPU = "tpu.googleapis.com/cpu/utilization"
# The guard's structured log events (functions/tpu_guard/decisions.py): the same strings.
PREEMPTED_EVENT = "tpu-preempted-not-started"
GAVE_UP_EVENT = "tpu-recovery-gave-up"
# 2nd-gen functions run as Cloud Run services: their stdout lands on this monitored resource, and a
# JSON line becomes the entry's jsonPayload, its `severity` the entry's (Cloud Run, "Writing
# structured logs"). A log-match alert notifies at most once per period (monitoring.v3
# NotificationRateLimit; the API requires one for log-based policies).
FUNCTION_LOGS = 'resource.type = "cloud_run_revision"'
# Cloud Run writes a service's stdout to this log ("Logging and viewing logs": run.googleapis.com/stdout).
# The alert names it and the guard's own function, so nothing a run can write matches it: a run's output
# reaches Logging only through the agent, in the stack's `tpu-workload` log or a researcher's own log, and
# its own token (downscoped, Cloud Storage only) writes no entry at all (vm_agent/credentials.py).
FUNCTION_STDOUT = "run.googleapis.com%2Fstdout"
LOG_ALERT_PERIOD = "3600s"
# What the VM agent ships (vm_agent/telemetry.py, the same names): each run's
# output lines in this log, labelled with the stack, and its training metrics as custom metrics on
# `generic_node` resources whose namespace is the stack (declared in run_contract/metrics.py).
WORKLOAD_LOG = "tpu-workload"
TRAINING_METRICS = tuple((metric.display_name, metric.type) for metric in metrics.TRAINING)

# Alert policies, channels and the dashboard; the log-match alert and the logs panel read Cloud Logging.
MONITORING_APIS = ("monitoring.googleapis.com", "logging.googleapis.com")


@dataclass(frozen=True)
class TpuMonitoringArgs:
    idle_minutes: int  # alert when a TPU's TensorCores idle longer than this
    vms: tuple[TpuVmSettings, ...]
    recovery: bool  # the guard re-creates preempted VMs (automation.recovery)


def always_on(vm: TpuVmSettings) -> bool:
    """Meant to run whenever it exists: no schedule stops it, no completed run stops or deletes it."""
    return vm.schedule is None and vm.on_completion == "keep"


def not_reporting_filter(vms: tuple[TpuVmSettings, ...]) -> str | None:
    """The absence condition's filter: CPU metrics of the always-on VMs' workers; None when there are none.

    `tpu_worker` carries the node's name as `node_id` (Google's TPU test harness, ml-auto-solutions,
    selects a node's workers by `resource.labels.node_id`); `monitoring.regex.full_match` is the
    Monitoring filter syntax for "one of" (monitoring/api/v3/filters). VM names are [a-z0-9-]: no escaping.
    """
    names = sorted(vm.name for vm in vms if always_on(vm))
    if not names:
        return None
    return (
        f'metric.type = "{CPU}" AND {TPU_WORKER} AND '
        # A multislice's nodes are `<vm>-0` … `<vm>-n` (infra/tpu/queued_api.py node_ids).
        f'resource.labels.node_id = monitoring.regex.full_match("({"|".join(names)})(-[0-9]+)?")'
    )


def preempted_filter(env: Env, args: TpuMonitoringArgs) -> str | None:
    """The log filter of "preempted and not recovered"; None when no VM of the stack can be preempted.

    With recovery on, a preempted node is re-created within minutes: only the guard giving up is news.
    Without it, the scheduled start is what finds the node PREEMPTED (an unscheduled spot VM that
    is always on raises "not reporting" instead).
    """
    if not any(vm.reclaimable for vm in args.vms):
        return None
    event, function = (GAVE_UP_EVENT, "recovery") if args.recovery else (PREEMPTED_EVENT, "scheduled-start")
    return (
        f'logName = "projects/{env.project}/logs/{FUNCTION_STDOUT}" AND {FUNCTION_LOGS} AND '
        f'resource.labels.service_name = "{naming.function_name(function, env.stack)}" AND '
        f'jsonPayload.event = "{event}" AND jsonPayload.environment = "{env.stack}"'
    )


def _chart(title: str, metric: str, aligner: str, resource: str = TPU_WORKER) -> dict:
    return {
        "title": title,
        "xyChart": {
            "dataSets": [
                {
                    "timeSeriesQuery": {
                        "timeSeriesFilter": {
                            "filter": f'metric.type = "{metric}" AND {resource}',
                            "aggregation": {"alignmentPeriod": "60s", "perSeriesAligner": aligner},
                        }
                    },
                    "plotType": "LINE",
                }
            ]
        },
    }


def workload_logs_filter(env: Env) -> str:
    """The stack's workload output in Logging's query language (logging/docs/view/logging-query-language)."""
    return f'logName = "projects/{env.project}/logs/{WORKLOAD_LOG}" AND labels.stack = "{env.stack}"'


def dashboard_json(env: Env) -> str:
    tiles = [
        _chart("TPU MXU utilization (duty cycle)", MXU, "ALIGN_MEAN"),
        _chart("TensorCore idle time", IDLE, "ALIGN_MAX"),
        _chart("TPU VM host memory", HOST_MEMORY, "ALIGN_MEAN"),
        {
            "title": "Workload logs (every run's output)",
            "logsPanel": {"filter": workload_logs_filter(env), "resourceNames": [f"projects/{env.project}"]},
        },
        # One line per run and worker (metric labels run_id, vm, worker); the stack's own nodes only.
        *(
            _chart(
                title,
                metric,
                "ALIGN_MEAN",
                f'resource.type = "generic_node" AND resource.labels.namespace = "{env.stack}"',
            )
            for title, metric in TRAINING_METRICS
        ),
    ]
    return json.dumps(
        {
            "displayName": f"TPU platform ({env.stack})",
            "mosaicLayout": {
                "columns": 12,
                "tiles": [
                    {"xPos": (i % 2) * 6, "yPos": (i // 2) * 4, "width": 6, "height": 4, "widget": w}
                    for i, w in enumerate(tiles)
                ],
            },
        },
        sort_keys=True,
    )


class TpuMonitoring(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: TpuMonitoringArgs,
        apis: ProjectApis,
        channels: list[gcp.monitoring.NotificationChannel],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:monitoring:TpuMonitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=apis.needs("monitoring"))

        def alert(
            suffix: str,
            title: str,
            severity: str,
            runbook: str,
            condition: gcp.monitoring.AlertPolicyConditionArgs,
            strategy: gcp.monitoring.AlertPolicyAlertStrategyArgs | None = None,
        ) -> gcp.monitoring.AlertPolicy:
            return gcp.monitoring.AlertPolicy(
                f"{name}-{suffix}",
                project=env.project,
                display_name=f"{title} ({env.stack})",
                severity=severity,
                documentation=gcp.monitoring.AlertPolicyDocumentationArgs(content=runbook, mime_type="text/markdown"),
                combiner="OR",
                conditions=[condition],
                notification_channels=[c.name for c in channels],
                alert_strategy=strategy,
                user_labels=env.labels,
                opts=child,
            )

        self.idle = alert(
            "idle",
            f"TPU idle > {args.idle_minutes} min",
            "WARNING",
            "A TPU is billed while idle. Stop it, let its schedule stop it, or set onCompletion.",
            gcp.monitoring.AlertPolicyConditionArgs(
                display_name="TensorCore idle",
                condition_threshold=gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
                    filter=f'metric.type = "{IDLE}" AND {TPU_WORKER}',
                    comparison="COMPARISON_GT",
                    threshold_value=args.idle_minutes * 60,
                    duration="0s",
                    aggregations=[
                        gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
                            alignment_period="300s", per_series_aligner="ALIGN_MAX"
                        )
                    ],
                ),
            ),
        )
        self.not_reporting = None
        if absent := not_reporting_filter(args.vms):
            self.not_reporting = alert(
                "not-reporting",
                "TPU VM not reporting",
                "ERROR",
                "No metrics from a worker of a TPU VM that is meant to run all the time (no schedule, "
                "onCompletion: keep) for 10 minutes: the node is not READY (stopped by hand, preempted, "
                "repairing) or its host is down. Check `gcloud compute tpus tpu-vm list`.",
                gcp.monitoring.AlertPolicyConditionArgs(
                    display_name="No CPU metrics from an always-on TPU VM",
                    condition_absent=gcp.monitoring.AlertPolicyConditionConditionAbsentArgs(
                        filter=absent,
                        duration="600s",
                        aggregations=[
                            gcp.monitoring.AlertPolicyConditionConditionAbsentAggregationArgs(
                                alignment_period="300s", per_series_aligner="ALIGN_MEAN"
                            )
                        ],
                    ),
                ),
            )
        self.preempted = None
        if preempted := preempted_filter(env, args):
            recovery = args.recovery
            self.preempted = alert(
                "preempted",
                "TPU VM preempted and not recovered",
                "ERROR",
                (
                    "The guard gave up re-creating a spot/preemptible TPU VM that keeps being preempted."
                    if recovery
                    else "A scheduled start found a spot/preemptible TPU VM PREEMPTED and did not start it "
                    "(a preempted node cannot be restarted). This stack has no recovery: delete the node "
                    "(`gcloud compute tpus tpu-vm delete`) and run `pulumi up` to re-create it, or turn on "
                    "automation.recovery."
                )
                + " The log entry names the node (jsonPayload.node).",
                gcp.monitoring.AlertPolicyConditionArgs(
                    display_name="The TPU guard reports a preempted node it did not recover",
                    condition_matched_log=gcp.monitoring.AlertPolicyConditionConditionMatchedLogArgs(
                        filter=preempted, label_extractors={"node": "EXTRACT(jsonPayload.node)"}
                    ),
                ),
                gcp.monitoring.AlertPolicyAlertStrategyArgs(
                    notification_rate_limit=gcp.monitoring.AlertPolicyAlertStrategyNotificationRateLimitArgs(
                        period=LOG_ALERT_PERIOD
                    ),
                    auto_close="86400s",
                ),
            )
        self.dashboard = gcp.monitoring.Dashboard(
            f"{name}-dashboard", project=env.project, dashboard_json=dashboard_json(env), opts=child
        )
        self.register_outputs({})
