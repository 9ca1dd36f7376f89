"""The accounts and custom roles a stack uses, which the bootstrap makes (`infra/access/accounts.py`), and the
REST methods each calls: the scheduler's, which stops TPU VMs on a schedule (infra/lifecycle.py), and the TPU
guard's (infra/tpu_guard.py). Each role holds exactly the permissions Google's method table gives for them."""

from __future__ import annotations

from infra import naming
from infra.access import iamdata
from infra.access.accounts import AccountSpec, RoleSpec, StackIdentities

# The REST methods the scheduler account calls, and so the exact permissions of its role.
SCHEDULER_METHODS = ("tpu.projects.locations.nodes.get", "tpu.projects.locations.nodes.stop")
SCHEDULER_PERMISSIONS = iamdata.permissions_for(SCHEDULER_METHODS)


def scheduler_account(stack: str) -> AccountSpec:
    return AccountSpec(naming.platform_account_id("scheduler", stack), f"TPU stop schedules ({stack})")


def scheduler_role(stack: str) -> RoleSpec:
    return RoleSpec.of("scheduler", stack, "TPU scheduler", "Stop and read TPU nodes; nothing else.",
                       SCHEDULER_PERMISSIONS)  # fmt: skip


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
