"""Alerts and a dashboard for the environment's TPUs (S23), sent to its notification channels.

- TPU idle: TensorCore idle time above the configured limit (chips billed while doing nothing);
- TPU VM not reporting: no metrics from a worker for 10 minutes (not READY, preempted, stopped);
- the budget's thresholds arrive through the same channels (the budget notifies them directly).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_gcp as gcp

from infra.apis import ProjectApis
from infra.config import PlatformConfig

TPU_WORKER = 'resource.type = "tpu_worker"'
IDLE = "tpu.googleapis.com/tpu/tensorcore/idle_duration"
MXU = "tpu.googleapis.com/tpu/mxu/utilization"
HOST_MEMORY = "tpu.googleapis.com/memory/usage"
CPU = "tpu.googleapis.com/cpu/utilization"


def _chart(title: str, metric: str, aligner: str) -> dict:
    return {
        "title": title,
        "xyChart": {
            "dataSets": [
                {
                    "timeSeriesQuery": {
                        "timeSeriesFilter": {
                            "filter": f'metric.type = "{metric}" AND {TPU_WORKER}',
                            "aggregation": {"alignmentPeriod": "60s", "perSeriesAligner": aligner},
                        }
                    },
                    "plotType": "LINE",
                }
            ]
        },
    }


def dashboard_json(cfg: PlatformConfig) -> str:
    tiles = [
        _chart("TPU MXU utilization (duty cycle)", MXU, "ALIGN_MEAN"),
        _chart("TensorCore idle time", IDLE, "ALIGN_MAX"),
        _chart("TPU VM host memory", HOST_MEMORY, "ALIGN_MEAN"),
        {
            "title": "Workload progress (training log lines)",
            "logsPanel": {"filter": 'jsonPayload.message="training"', "resourceNames": [f"projects/{cfg.project}"]},
        },
    ]
    return json.dumps(
        {
            "displayName": f"TPU platform ({cfg.stack})",
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
        cfg: PlatformConfig,
        apis: ProjectApis,
        channels: list[gcp.monitoring.NotificationChannel],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:monitoring:TpuMonitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=apis.needs("monitoring"))

        def alert(
            suffix: str, title: str, severity: str, runbook: str, condition: gcp.monitoring.AlertPolicyConditionArgs
        ) -> gcp.monitoring.AlertPolicy:
            return gcp.monitoring.AlertPolicy(
                f"{name}-{suffix}",
                project=cfg.project,
                display_name=f"{title} ({cfg.stack})",
                severity=severity,
                documentation=gcp.monitoring.AlertPolicyDocumentationArgs(content=runbook, mime_type="text/markdown"),
                combiner="OR",
                conditions=[condition],
                notification_channels=[c.name for c in channels],
                user_labels=cfg.labels,
                opts=child,
            )

        self.idle = alert(
            "idle",
            f"TPU idle > {cfg.monitoring.idle_minutes} min",
            "WARNING",
            "A TPU is billed while idle. Stop it, let its schedule stop it, or set onCompletion.",
            gcp.monitoring.AlertPolicyConditionArgs(
                display_name="TensorCore idle",
                condition_threshold=gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
                    filter=f'metric.type = "{IDLE}" AND {TPU_WORKER}',
                    comparison="COMPARISON_GT",
                    threshold_value=cfg.monitoring.idle_minutes * 60,
                    duration="0s",
                    aggregations=[
                        gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
                            alignment_period="300s", per_series_aligner="ALIGN_MAX"
                        )
                    ],
                ),
            ),
        )
        self.not_reporting = alert(
            "not-reporting",
            "TPU VM not reporting",
            "ERROR",
            "No metrics from a TPU worker for 10 minutes: the node is not READY (stopped, preempted, "
            "repairing) or its host is down. Check `gcloud compute tpus tpu-vm list`.",
            gcp.monitoring.AlertPolicyConditionArgs(
                display_name="No CPU metrics from a TPU worker",
                condition_absent=gcp.monitoring.AlertPolicyConditionConditionAbsentArgs(
                    filter=f'metric.type = "{CPU}" AND {TPU_WORKER}',
                    duration="600s",
                    aggregations=[
                        gcp.monitoring.AlertPolicyConditionConditionAbsentAggregationArgs(
                            alignment_period="300s", per_series_aligner="ALIGN_MEAN"
                        )
                    ],
                ),
            ),
        )
        self.dashboard = gcp.monitoring.Dashboard(
            f"{name}-dashboard", project=cfg.project, dashboard_json=dashboard_json(cfg), opts=child
        )
        self.register_outputs({})
