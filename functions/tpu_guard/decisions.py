"""What the TPU guard does, as pure functions over TPU API node listings and stored state (no I/O here).

- Budget action: when an authentic budget notification reports spend at or above the threshold,
  stop (or delete) every TPU node of the environment that is still running.
- Preemption recovery: a spot/preemptible node of the environment in state PREEMPTED is deleted
  and re-created with the same name and spec, so Pulumi's state stays valid and the workload
  resumes from its checkpoint. Its spec is recorded before the delete, so a create that fails is
  retried from the record; after `max_attempts` recoveries of one node within a window the guard
  gives up on it (and says so), and the count starts again in the next window.
- Run to completion: the marker `gs://<status-bucket>/<vm>/COMPLETE` (its schema: run_contract/completion_marker.py)
  makes the guard stop or delete that VM's node, as the stack says (never as the marker says); a
  scheduled start of a VM whose run is complete does nothing; content that is not a marker is neither.
  A node still running `maxRunHours` after it was created is stopped or deleted the same way by the
  periodic check: the run's expected hours are its bound.
- Which nodes are a VM's: its node ids in its zones, as the stack lists them (TPU_VMS, `owner`), never the
  configured zone alone: a queued VM may have landed in a fallback zone, a multislice has `<vm>-<i>`.
  A queued VM's TPUs are deleted through their request, with all its nodes (`removal`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from run_contract import completion_marker
from run_contract.timeline import NOT_LISTED

RUNNING = {"READY", "CREATING", "STARTING", "RESTARTING", "REPAIRING"}
GONE = {"DELETING"}
STOPPED = {"STOPPED", "STOPPING"}
COMPLETE_MARKER = completion_marker.NAME
# Structured log events the platform's alert policies match (infra/monitoring.py): Cloud TPU reports a
# preemption only as the node's state (tpu/docs/preemptible: a preempted TPU's state turns from READY
# to PREEMPTED), so the guard, which reads that state, reports it.
PREEMPTED_EVENT = "tpu-preempted-not-started"  # a scheduled start found its node PREEMPTED
GAVE_UP_EVENT = "tpu-recovery-gave-up"  # recovery stopped re-creating a node preempted again and again

# The fields of a Node that a create request may set: the Node schema of tpu.v2's discovery document
# without its output-only ("readOnly") fields, and without `health`, which the document leaves
# writable but the Terraform provider (magic-modules tpuv2/Vm.yaml) marks `output: true`.
NODE_CREATE_FIELDS = frozenset(
    {
        "acceleratorConfig",
        "acceleratorType",
        "bootDiskConfig",
        "cidrBlock",
        "dataDisks",
        "description",
        "labels",
        "metadata",
        "networkConfig",
        "networkConfigs",
        "runtimeVersion",
        "schedulingConfig",
        "serviceAccount",
        "shieldedInstanceConfig",
        "tags",
    }
)
# Pairs a create request must not carry together (the provider's `conflicts`; the API returns both on
# GET): the first of each pair is what the platform declares (infra/tpu/cloud_tpu.py), so it wins.
EXCLUSIVE = (("acceleratorType", "acceleratorConfig"), ("networkConfig", "networkConfigs"))
# Chosen by the API when the platform does not set it (the provider's `default_from_api`), and the
# platform never does: a re-created node is the node Pulumi declared, so the API chooses it again.
CHOSEN_BY_API = frozenset({"cidrBlock"})


@dataclass(frozen=True)
class Action:
    kind: str  # stop | delete | delete-request | start | recreate | create | forget | give-up
    node: str  # projects/P/locations/Z/nodes/N; for delete-request, projects/P/locations/Z/queuedResources/Q
    reason: str
    dry_run: bool = False
    api: str = "v2"  # the TPU API version of the call (a flex-start request is made through v2alpha1)


def managed(node: dict[str, Any], environment: str) -> bool:
    """A node this platform created for this environment (by its labels)."""
    labels = node.get("labels") or {}
    return labels.get("environment") == environment and labels.get("managed-by") == "pulumi"


def multi_host(node: dict[str, Any]) -> bool:
    return len(node.get("networkEndpoints") or []) > 1


def short_name(node_name: str) -> str:
    return node_name.rsplit("/", 1)[-1]


def zone_of(node_name: str) -> str:
    return node_name.split("/")[3]  # projects/P/locations/ZONE/nodes/N


def owner(node: dict[str, Any], vms: dict[str, dict[str, Any]]) -> str | None:
    """The VM (TPU_VMS) a node belongs to: one of its node ids in one of its zones, else None.

    A queued VM may have landed in any of its fallback zones, and a multislice's nodes are `<vm>-<i>`
    (tpu.v2 MultisliceParams.nodeIdPrefix); both are in the VM's entry, so a node is never taken for
    another VM's by the look of its name."""
    name = node["name"]
    for vm, entry in vms.items():
        if short_name(name) in entry.get("nodes", ()) and zone_of(name) in entry.get("zones", ()):
            return vm
    return None


def node_states(nodes: list[dict[str, Any]], vms: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each of the stack's nodes (TPU_VMS' node ids) by its state in this listing of every zone: NOT_LISTED when
    no zone lists it. The guard keeps their changes (run_contract/timeline.py NodeStates): billed time."""
    states = {node_id: NOT_LISTED for entry in vms.values() for node_id in entry.get("nodes", ())}
    for node in nodes:
        if owner(node, vms) is not None:
            states[short_name(node["name"])] = node.get("state") or "STATE_UNSPECIFIED"
    return states


def removal(
    node: dict[str, Any], kind: str, reason: str, vms: dict[str, dict[str, Any]], dry_run: bool = False
) -> Action | str:
    """The call that stops or deletes (`kind`) a listed node, or why there is none.

    A node a queued request made (tpu.v2 Node.queuedResource) is deleted through its request with
    force=true, which deletes every node of the request first (tpu.v2 queuedResources.delete `force`):
    deleting the node alone would leave the request to fail or be re-provisioned. Such a node is never
    stopped: the API has no stop for a request, and the plan refuses stop for queued VMs.
    """
    request = node.get("queuedResource")
    if not request:
        return Action(kind, node["name"], reason, dry_run)
    if kind == "stop":
        return f"{short_name(node['name'])} was made by the queued request {request}, which cannot be stopped"
    vm = owner(node, vms)
    api = (vms.get(vm or "") or {}).get("queuedApi", "v2")
    return Action("delete-request", request, f"{reason} (the queued request and all its nodes)", dry_run, api)


def _once(actions: list[Action]) -> list[Action]:
    """Each call once: the slices of one request are deleted by one delete of the request."""
    seen: set[tuple[str, str]] = set()
    out = []
    for action in actions:
        if (action.kind, action.node) not in seen:
            seen.add((action.kind, action.node))
            out.append(action)
    return out


# --- budget --------------------------------------------------------------------------------------


def budget_message_problem(attributes: dict[str, str], *, billing_account: str, budget_id: str) -> str | None:
    """Why a Pub/Sub message is not a notification of this environment's budget, or None.

    Cloud Billing sets the attributes `billingAccountId` and `budgetId` on every notification
    (cloud.google.com/billing/docs/how-to/budgets-programmatic-notifications#notification_format).
    """
    if not billing_account or not budget_id:
        return "the guard has no BILLING_ACCOUNT or BUDGET_ID to compare with; refusing every message"
    want_budget = budget_id.rsplit("/", 1)[-1]  # a full name billingAccounts/A/budgets/B or the bare id
    got_account, got_budget = attributes.get("billingAccountId", ""), attributes.get("budgetId", "")
    if got_account != billing_account.removeprefix("billingAccounts/"):
        return f"billingAccountId {got_account!r} is not this environment's billing account"
    if got_budget != want_budget:
        return f"budgetId {got_budget!r} is not this environment's budget"
    return None


def budget_actions(
    notification: dict[str, Any],
    nodes: list[dict[str, Any]],
    *,
    environment: str,
    at_percent: float,
    action: str,
    dry_run: bool,
    vms: dict[str, dict[str, Any]] | None = None,
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
            step = removal(node, "delete", spent, vms or {}, dry_run)
        elif state not in RUNNING:
            continue
        elif node.get("queuedResource"):
            # A queued request's TPUs are not stopped (removal): deleting them is how their cost stops.
            step = removal(node, "delete", f"{spent}; a queued request's TPUs cannot stop", vms or {}, dry_run)
        elif multi_host(node):
            # The TPU API cannot stop a multi-host slice; deleting it is the only way to stop paying.
            step = removal(node, "delete", f"{spent}; multi-host slices cannot stop", vms or {}, dry_run)
        else:
            step = removal(node, "stop", spent, vms or {}, dry_run)
        if isinstance(step, Action):
            actions.append(step)
    return _once(actions)


def worth_redelivery(event_time: str | None, now: datetime, window: timedelta) -> bool:
    """Whether a failed event should be handed back for redelivery (the function raises).

    Pub/Sub and Eventarc retry a failing event for up to 7 days; a guard that keeps failing on one
    node must not keep them busy that long. Within `window` a retry is worth it; after it the event
    is acknowledged and the failure logged (Cloud Billing sends a fresh notification several times a
    day, and the next completion or schedule tries again).
    """
    if not event_time:
        return False
    try:
        sent = datetime.fromisoformat(event_time.replace("Z", "+00:00"))
    except ValueError:
        return False
    return now - sent < window


# --- recovery ------------------------------------------------------------------------------------


class StateError(ValueError):
    """The recovery state object exists but cannot be understood: the guard does nothing (fails closed)."""


@dataclass(frozen=True)
class RecoveryState:
    """What the guard keeps in the state bucket between runs."""

    window_start: str  # ISO time the counting window began
    attempts: dict[str, int] = field(default_factory=dict)  # node name -> recoveries in this window
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)  # node name -> create body, until created

    def to_json(self) -> bytes:
        return json.dumps(
            {"windowStart": self.window_start, "attempts": self.attempts, "pending": self.pending}, sort_keys=True
        ).encode()


def recovery_state(stored: bytes | None, now: datetime, window: timedelta) -> RecoveryState:
    """The state to act on: the stored one, with its counts reset when its window has passed.

    `stored` None means no object yet (a first run). Anything unreadable raises StateError.
    """
    if stored is None:
        return RecoveryState(now.isoformat())
    try:
        data = json.loads(stored)
        start = datetime.fromisoformat(data["windowStart"])
        attempts = {str(k): int(v) for k, v in data["attempts"].items()}
        pending = {str(k): dict(v) for k, v in data["pending"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise StateError(f"the recovery state is not readable ({error!r}); not recovering anything") from error
    if now - start >= window:
        return RecoveryState(now.isoformat(), {}, pending)  # a pending create is never forgotten
    return RecoveryState(data["windowStart"], attempts, pending)


def recovery_actions(
    nodes: list[dict[str, Any]], *, environment: str, state: RecoveryState, max_attempts: int
) -> list[Action]:
    """Preempted spot/preemptible nodes of the environment to re-create or give up on, and nodes
    deleted by an earlier run whose create did not happen (re-created from the recorded spec)."""
    actions = []
    present = {node["name"]: node for node in nodes}
    for name in sorted(state.pending):
        node = present.get(name)
        if node is None:
            actions.append(Action("create", name, "deleted by an earlier recovery that did not re-create it"))
        elif node.get("state") in GONE:
            continue  # still being deleted (a delete that outlived its wait): keep the spec for the create
        elif node.get("state") != "PREEMPTED":
            actions.append(Action("forget", name, f"re-created (now {node.get('state')})"))
    for node in nodes:
        scheduling = node.get("schedulingConfig") or {}
        if not managed(node, environment) or node.get("state") != "PREEMPTED":
            continue
        if node.get("queuedResource"):
            continue  # part of a queued request: Pulumi replaces the request (infra/tpu/queued.py), not the guard
        if not (scheduling.get("spot") or scheduling.get("preemptible")):
            continue
        done = state.attempts.get(node["name"], 0)
        if done >= max_attempts:
            actions.append(Action("give-up", node["name"], f"preempted again after {done} recoveries in this window"))
        else:
            actions.append(Action("recreate", node["name"], f"preempted; recovery {done + 1} of {max_attempts}"))
    return actions


def recreate_body(node: dict[str, Any]) -> dict[str, Any]:
    """The create request for a node like `node`: the fields a create may set, one of each exclusive pair."""
    body = {k: v for k, v in node.items() if k in NODE_CREATE_FIELDS - CHOSEN_BY_API}
    for keep, drop in EXCLUSIVE:
        if keep in body:
            body.pop(drop, None)
    return body


# --- run to completion ---------------------------------------------------------------------------


def completion_target(
    bucket: str, object_name: str, *, status_bucket: str, vms: dict[str, dict[str, Any]]
) -> tuple[str, dict[str, Any]] | str:
    """(vm, its TPU_VMS entry) for a finalized object that is a VM's completion marker, else why not.

    The action comes from the stack (the entry's `onCompletion`), never from the object: anyone who can
    write the marker can only ask for what the stack already says.
    """
    if bucket != status_bucket:
        return f"gs://{bucket}/{object_name} is not in the status bucket {status_bucket}"
    vm, _, leaf = object_name.partition("/")
    if leaf != COMPLETE_MARKER or not vm:
        return f"{object_name} is not a completion marker (<vm>/{COMPLETE_MARKER})"
    entry = vms.get(vm)
    if entry is None:
        return f"{vm} is not a TPU VM of this stack"
    action = entry.get("onCompletion", "keep")
    if action not in ("stop", "delete"):
        return f"{vm} has no completion action in this stack (onCompletion: {action})"
    if not entry.get("nodes") or not entry.get("zones"):
        return f"{vm}: its entry {entry!r} names no nodes or zones"
    return vm, entry


def marker_problem(vm: str, marker: bytes | None, current_runs: dict[str, str]) -> str | None:
    """Why a VM's stored marker is not its *current* run's completion (CURRENT_RUNS: the stack's run
    ids), or None when it is.

    A new `run` id trains again, so an older run's marker must neither stop the node nor block a
    scheduled start; content that is not a marker (run_contract/completion_marker.py) is no completion at all.
    """
    found, why = completion_marker.decode(marker)
    if found is None:
        return f"{vm}/{COMPLETE_MARKER} is not a completion marker: {why}"
    wanted = current_runs.get(vm)
    if wanted is not None and found["runId"] != wanted:
        return f"{vm}/{COMPLETE_MARKER} completes run {found['runId']!r}, not the current run {wanted!r}"
    return None


def completion_step(action: str, name: str, node: dict[str, Any] | None) -> Action | str:
    """What to do to the node `name` (None: it does not exist) so that its completion action holds.

    Idempotent: a redelivered marker event, or one for a node already stopped or gone, does nothing.
    """
    if node is None:
        return f"{short_name(name)} does not exist; nothing to {action}"
    state = node.get("state", "")
    if state in GONE:
        return f"{short_name(name)} is already being deleted"
    if action == "stop" and state in STOPPED:
        return f"{short_name(name)} is already {state}"
    return Action(action, name, f"its run is complete (onCompletion: {action})")


def completion_steps(
    vm: str, nodes: list[dict[str, Any]], *, vms: dict[str, dict[str, Any]], environment: str
) -> list[Action] | str:
    """What carries out `vm`'s completion action on the nodes listed in its zones, or why nothing does.

    Every node of the VM, wherever it landed: a queued VM in a fallback zone, each slice of a multislice."""
    action = vms[vm]["onCompletion"]
    mine = [n for n in nodes if owner(n, vms) == vm and managed(n, environment)]
    if not mine:
        return f"{vm} has no node in {', '.join(vms[vm]['zones'])}; nothing to {action}"
    steps, skipped = [], []
    for node in mine:
        step = completion_step(action, node["name"], node)
        if isinstance(step, Action):
            step = removal(node, action, step.reason, vms)
        (steps if isinstance(step, Action) else skipped).append(step)
    return _once(steps) or "; ".join(skipped)


def created_at(node: dict[str, Any]) -> datetime | None:
    """The node's tpu.v2 Node.createTime (RFC 3339, "Z"), or None when it has none that reads as a time."""
    try:
        return datetime.fromisoformat(str(node["createTime"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None


def overrun_actions(
    nodes: list[dict[str, Any]], *, environment: str, vms: dict[str, dict[str, Any]], now: datetime
) -> list[Action]:
    """Running nodes of the environment past their VM's `maxRunHours` (counted from the node's
    createTime, tpu.v2 Node.createTime), to stop or delete as the VM's onCompletion says.

    A node is its VM's by the VM's node ids and zones (`owner`): a multislice's `<vm>-<i>`, a queued VM
    in any zone it may have landed in.
    """
    out = []
    for node in nodes:
        if not managed(node, environment) or node.get("state") not in RUNNING:
            continue
        entry = vms.get(owner(node, vms) or "") or {}
        limit, action = entry.get("maxRunHours"), entry.get("onCompletion")
        created = created_at(node)
        if limit is None or action not in ("stop", "delete") or created is None:
            continue
        age = now - created
        if age > timedelta(hours=float(limit)):
            hours = age.total_seconds() / 3600
            step = removal(node, action, f"running {hours:.1f} h, past maxRunHours {float(limit):g}", vms)
            if isinstance(step, Action):
                out.append(step)
    return _once(out)


def start_step(name: str, node: dict[str, Any] | None, *, complete: bool, environment: str) -> Action | str:
    """Whether a scheduled start may start `name`: only a STOPPED node of this environment whose run
    is not complete (a finished run is never restarted by a schedule)."""
    if complete:
        return f"{short_name(name)} completed its run; a schedule does not start it again"
    if node is None:
        return f"{short_name(name)} does not exist"
    if not managed(node, environment):
        return f"{short_name(name)} is not a node of environment {environment}"
    if node.get("state") == "PREEMPTED":
        # tpu/docs/spot: "You can't restart TPU Spot VMs, and you must recreate them after preemption."
        return (
            f"{short_name(name)} is PREEMPTED: a preempted node cannot be started, only re-created "
            "(by the guard's recovery, or by `pulumi up` after deleting it); not starting it"
        )
    if node.get("state") != "STOPPED":
        return f"{short_name(name)} is {node.get('state')}, not STOPPED"
    return Action("start", name, "scheduled start")


def start_event(node: dict[str, Any] | None, *, complete: bool) -> str | None:
    """The alert event a scheduled start that does nothing must log, or None (nothing to report).

    A completed run is meant to be off; a PREEMPTED node is not, and nothing but this call looks at it
    every day in a stack without recovery.
    """
    if complete or node is None or node.get("state") != "PREEMPTED":
        return None
    return PREEMPTED_EVENT
