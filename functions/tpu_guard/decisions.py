"""What the TPU guard does, as pure functions over TPU API node listings (no I/O here).

- Budget action: when a budget notification reports spend at or above the threshold, stop (or
  delete) every TPU node of the environment that is still running.
- Preemption recovery: a spot/preemptible node of the environment in state PREEMPTED is deleted
  and re-created with the same name and spec, so Pulumi's state stays valid and the workload
  resumes from its checkpoint; after `max_attempts` recoveries of one node it gives up (and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUNNING = {"READY", "CREATING", "STARTING", "RESTARTING", "REPAIRING"}
GONE = {"DELETING"}
# Fields of a node the TPU API computes; everything else is the spec used to re-create it.
OUTPUT_ONLY = {
    "name", "state", "healthDescription", "health", "createTime", "networkEndpoints", "apiVersion",
    "id", "symptoms", "queuedResource", "multisliceNode", "upcomingMaintenance", "cidrBlock",
}  # fmt: skip


@dataclass(frozen=True)
class Action:
    kind: str  # stop | delete | recreate | give-up
    node: str  # projects/P/locations/Z/nodes/N
    reason: str
    dry_run: bool = False


def managed(node: dict[str, Any], environment: str) -> bool:
    """A node this platform created for this environment (by its labels)."""
    labels = node.get("labels") or {}
    return labels.get("environment") == environment and labels.get("managed-by") == "pulumi"


def multi_host(node: dict[str, Any]) -> bool:
    return len(node.get("networkEndpoints") or []) > 1


def budget_actions(
    notification: dict[str, Any],
    nodes: list[dict[str, Any]],
    *,
    environment: str,
    at_percent: float,
    action: str,
    dry_run: bool,
) -> list[Action]:
    """The nodes to stop or delete for one budget notification (schema 1.0 of Cloud Billing)."""
    budget = float(notification.get("budgetAmount") or 0)
    cost = float(notification.get("costAmount") or 0)
    if budget <= 0 or 100 * cost / budget < at_percent:
        return []
    spent = f"spend {cost:,.2f} is {100 * cost / budget:.0f}% of the budget {budget:,.2f} (action at {at_percent:g}%)"
    actions = []
    for node in nodes:
        state = node.get("state", "")
        if not managed(node, environment) or state in GONE:
            continue
        if action == "delete":
            actions.append(Action("delete", node["name"], spent, dry_run))
        elif state in RUNNING:
            if multi_host(node):
                # The TPU API cannot stop a multi-host slice; deleting it is the only way to stop paying.
                actions.append(Action("delete", node["name"], f"{spent}; multi-host slices cannot stop", dry_run))
            else:
                actions.append(Action("stop", node["name"], spent, dry_run))
    return actions


def recovery_actions(
    nodes: list[dict[str, Any]], *, environment: str, attempts: dict[str, int], max_attempts: int
) -> list[Action]:
    """Preempted spot/preemptible nodes of the environment to re-create, or to give up on."""
    actions = []
    for node in nodes:
        scheduling = node.get("schedulingConfig") or {}
        if not managed(node, environment) or node.get("state") != "PREEMPTED":
            continue
        if not (scheduling.get("spot") or scheduling.get("preemptible")):
            continue
        done = attempts.get(node["name"], 0)
        if done >= max_attempts:
            actions.append(Action("give-up", node["name"], f"preempted again after {done} recoveries"))
        else:
            actions.append(Action("recreate", node["name"], f"preempted; recovery {done + 1} of {max_attempts}"))
    return actions


def recreate_body(node: dict[str, Any]) -> dict[str, Any]:
    """The create request for a node like `node`: its spec without the fields the API computes."""
    return {k: v for k, v in node.items() if k not in OUTPUT_ONLY}
