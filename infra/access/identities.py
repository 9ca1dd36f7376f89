"""The accounts and custom roles a stack uses, which the bootstrap makes (`infra/access/accounts.py`), and the
REST methods each calls: the scheduler's (infra/lifecycle.py), the TPU guard's (infra/tpu_guard.py), the
workloads' and self-service VMs' (infra/identity.py), the researchers' (infra/researchers.py), the GKE nodes'
(infra/gke/cluster.py) and GKE team members' (infra/gke/team_access.py). Each custom role holds exactly the
permissions Google's method table gives for the methods it is for; the components only grant them."""

from __future__ import annotations

from infra import naming
from infra.access import iamdata
from infra.access import researcher_calls as researcher
from infra.access.accounts import AccountSpec, RoleSpec, StackIdentities

# The REST methods the scheduler account calls, and so the exact permissions of its role.
SCHEDULER_METHODS = ("tpu.projects.locations.nodes.get", "tpu.projects.locations.nodes.stop")
SCHEDULER_PERMISSIONS = iamdata.permissions_for(SCHEDULER_METHODS)


def scheduler_account(stack: str) -> AccountSpec:
    return AccountSpec(naming.platform_account_id("scheduler", stack), f"TPU stop schedules ({stack})")


def scheduler_role(stack: str) -> RoleSpec:
    return RoleSpec.of(
        "scheduler", stack, "TPU scheduler", "Stop and read TPU nodes; nothing else.", SCHEDULER_PERMISSIONS
    )


def scheduler_identities(stack: str) -> StackIdentities:
    return StackIdentities((scheduler_account(stack),), (scheduler_role(stack),))


# The REST methods the guard's code calls (functions/tpu_guard/main.py; the tests record them on the TPU API
# stand-in), and so its role: the permissions Google's method table gives for them.
GUARD_METHODS = (
    "tpu.projects.locations.nodes.list",
    "tpu.projects.locations.nodes.stop",
    "tpu.projects.locations.nodes.start",
    "tpu.projects.locations.nodes.delete",
    "tpu.projects.locations.nodes.create",
    "tpu.projects.locations.operations.get",
    # A queued VM's TPUs are deleted through their request (force=true deletes its nodes first,
    # tpu.v2.json queuedResources.delete); Google's method table asks tpu.nodes.delete for it.
    "tpu.projects.locations.queuedResources.delete",
)
GUARD_PERMISSIONS = iamdata.permissions_for(GUARD_METHODS)


def guard_accounts(stack: str) -> dict[str, AccountSpec]:
    """The guard's runtime account, the invoker Cloud Scheduler calls it as, and its build account."""
    return {
        "guard": AccountSpec(naming.platform_account_id("guard", stack), f"TPU guard ({stack})"),
        "invoker": AccountSpec(naming.platform_account_id("guard-invoker", stack), f"Invokes the TPU guard ({stack})"),
        "builder": AccountSpec(naming.platform_account_id("guard-build", stack), f"Builds the TPU guard ({stack})"),
    }


def guard_role(stack: str) -> RoleSpec:
    what = "List, stop, start, delete and re-create TPU nodes (queued: through their request); no more."
    return RoleSpec.of("guard", stack, "TPU guard", what, GUARD_PERMISSIONS)


def guard_identities(stack: str, workload_accounts: tuple[str, ...]) -> StackIdentities:
    """Made by the bootstrap, with act-as for the guard on each workload account (a node it re-creates
    runs as its workload's account, and nodes.create checks act-as on it)."""
    guard = guard_accounts(stack)["guard"].account_id
    return StackIdentities(
        tuple(guard_accounts(stack).values()), (guard_role(stack),), tuple((guard, a) for a in workload_accounts)
    )


# The REST methods a workload's program calls (workloads/runlib.py) and the VM agent calls for it
# with the same account (vm_agent/telemetry.py: entries:write and timeSeries.create; its TensorBoard
# event file: an upload to the models bucket), by where they are granted: it reads data, reads and
# writes checkpoints and models, and writes logs and metrics. No TPU method.
WORKLOAD_METHODS: dict[str, tuple[str, ...]] = {
    "data": ("storage.objects.get", "storage.objects.list"),
    "checkpoints": ("storage.objects.get", "storage.objects.list", "storage.objects.insert", "storage.objects.delete"),
    "models": ("storage.objects.get", "storage.objects.list", "storage.objects.insert", "storage.objects.delete"),
    "project": ("logging.entries.write", "monitoring.projects.timeSeries.create"),
}


def workload_account(workload: str, description: str, stack: str) -> AccountSpec:
    """A workload's own account (infra/identity.py grants it the workload's roles), never Compute Engine's default."""
    return AccountSpec(naming.workload_account_id(workload, stack), f"TPU workload {workload} ({stack})", description)


def self_service_account(vm: str, stack: str) -> AccountSpec:
    """A self-service VM's own account (infra/researchers.py): it shares no account with a VM that runs
    reviewed work, and the bootstrap makes it like the workloads'."""
    return AccountSpec(
        naming.self_service_account_id(vm, stack),
        f"TPU self-service VM {vm} ({stack})",
        f"Runs the reviewed run and researchers' runs of TPU VM {vm}, and nothing else",
    )


def researcher_roles(stack: str, ssh: bool) -> dict[str, RoleSpec]:
    """The three custom roles (made by the bootstrap): on the project, to read a bucket, to submit."""
    return {
        "project": RoleSpec.of(
            "researcher", stack, "researcher", "List TPU VMs for tpu-runs.", researcher.permissions("project", ssh=ssh)
        ),
        "read": RoleSpec.of(
            "researcher-read",
            stack,
            "researcher read",
            "Read one's own runs' state and results for tpu-runs.",
            researcher.READ_PERMISSIONS,
        ),
        "submit": RoleSpec.of(
            "researcher-submit",
            stack,
            "researcher submit",
            "Put new run requests and sources for tpu-runs.",
            researcher.SUBMIT_PERMISSIONS,
        ),
    }


def gke_node_account(stack: str) -> AccountSpec:
    return AccountSpec(
        naming.platform_account_id("gke-nodes", stack),
        f"GKE nodes ({stack})",
        "The GKE cluster's nodes: logs, metrics and autoscaling metrics; pods use their own.",
    )


# The calls a member's kubectl makes on the GCP side: get-credentials reads the cluster, then the DNS endpoint.
MEMBER_METHODS = researcher.CLUSTER_CALLS


def member_role(stack: str) -> RoleSpec:
    permissions = sorted({p for m in MEMBER_METHODS for p in iamdata.method_permissions(m)})
    return RoleSpec.of(
        "gke-team",
        stack,
        "GKE team member",
        "Reach the GKE cluster with kubectl; what it may do inside is RBAC's.",
        permissions,
    )


def member_read_role(stack: str) -> RoleSpec:
    """Reading the team's runs' models and metrics (`tpu-runs fetch --team`): granted on the models bucket under
    the team's prefix only (infra/gke/team_access.py); the same calls as a researcher's `fetch`. Also granted on
    the runner's one object of the artifacts bucket, which `submit --team --folder` looks for by its name."""
    return RoleSpec.of(
        "gke-team-read",
        stack,
        "GKE team member read",
        "Read the team's runs' models and metrics for tpu-runs fetch --team.",
        researcher.permissions("models"),
    )


def member_submit_role(stack: str) -> RoleSpec:
    """Uploading a folder source for the team's runs (`tpu-runs submit --team --folder`): granted on the artifacts
    bucket under the team's sources prefix only (infra/gke/team_access.py); the same calls as a researcher's
    upload of a folder source."""
    return RoleSpec.of(
        "gke-team-submit",
        stack,
        "GKE team member submit",
        "Put new folder sources for the team's runs for tpu-runs submit --team.",
        researcher.permissions("artifacts"),
    )


def team_identities(stack: str) -> StackIdentities:
    return StackIdentities(roles=(member_role(stack), member_read_role(stack), member_submit_role(stack)))
