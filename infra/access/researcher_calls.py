"""The REST methods the `tpu-runs` commands call, by where Google checks them: the researcher's rights.

One table, read twice: `infra/researchers.py` grants exactly the permissions these methods check, and the
tests compare it with every call the commands make, so a command that starts calling something new
fails a test before a researcher meets a 403.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.access import calls, iamdata

# scope -> methods. `requests` and `artifacts` writes are new objects only (ifGenerationMatch=0).
RESEARCHER_CALLS: dict[str, tuple[str, ...]] = {
    # list: the VMs' state (nodes.list per zone: a queued multislice's nodes carry suffixes).
    "project": ("tpu.projects.locations.nodes.list",),
    # list, logs, stop, report: the researcher's own runs' status.json and timeline.json under <vm>/runs/<member>/;
    # report: the guard's record of the VM's nodes' states (_tpu-guard/<env>/nodes/<node>.json).
    "status": ("storage.objects.list", "storage.objects.get"),
    # submit, stop: a request object under <vm>/requests/<member>/ of a self-service VM.
    "requests": ("storage.objects.insert",),
    # submit: is the packaged source there already (get), else upload it under sources/.
    "artifacts": ("storage.objects.get", "storage.objects.insert"),
    # fetch: the run's model and metrics.
    "models": ("storage.objects.list", "storage.objects.get"),
    # logs: Cloud Logging entries.list on the researcher's own log view (resourceNames names the view).
    "logs": ("logging.entries.list",),
}
# What reaching a GKE cluster's Kubernetes API calls on the GCP side, for a team member's kubectl and tpu-runs
# alike: the cluster's endpoint is read; every Kubernetes request goes through its DNS endpoint (iamdata says
# what Google checks on each).
CLUSTER_CALLS = (f"{calls.GKE_CLUSTERS}.get", calls.KUBERNETES_API)
# An operator's report of the whole stack (`tpu-runs report --all`), by scope: every VM's folder and the guard's
# record of its nodes' states in the status bucket; the GKE cluster's endpoint (then each team's JobSets and
# Workloads, Kubernetes RBAC: infra/gke/teams.py OPERATOR_REPORT_RULES). The stack names no operator, so no plan
# grants these; the predefined role of each scope holds them (tests/test_tpu_runs.py), docs/goodput.md says so.
OPERATOR_REPORT_CALLS: dict[str, tuple[str, ...]] = {
    "status": ("storage.objects.list", "storage.objects.get"),
    "project": CLUSTER_CALLS,
}
OPERATOR_REPORT_ROLES = {"status": "roles/storage.objectViewer", "project": "roles/container.clusterViewer"}
# Reading entries through a log view checks logging.views.access on the view, not logging.logEntries.list
# on the project: roles/logging.viewAccessor holds the one and not the other (reference/gcp-iam roles;
# Logging, "Configure log views on a log bucket": viewAccessor is what reading a view needs).
VIEW_PERMISSIONS = {"logging.entries.list": ("logging.views.access",)}
# `gcloud compute tpus tpu-vm ssh --tunnel-through-iap` reads the node first; only with researcherSsh.
SSH_CALLS: tuple[str, ...] = ("tpu.projects.locations.nodes.get",)
# IAP TCP forwarding and OS Login (cloud.google.com/iap/docs/using-tcp-forwarding,
# cloud.google.com/compute/docs/oslogin/set-up-oslogin): project-wide, as Cloud TPU has no per-node IAM.
SSH_ROLES: tuple[str, ...] = ("roles/iap.tunnelResourceAccessor", "roles/compute.osLogin")


def permissions(*scopes: str, ssh: bool = False) -> tuple[str, ...]:
    """What the methods of `scopes` check, sorted. Writes never overwrite, so no storage.objects.delete."""
    methods = [(s, m) for s in scopes for m in RESEARCHER_CALLS[s]] + [("project", m) for m in SSH_CALLS if ssh]

    def checked(scope: str, method: str) -> Iterable[str]:
        if scope == "logs":
            return VIEW_PERMISSIONS[method]
        return iamdata.method_permissions(method, acls=False, overwrite=False)

    return tuple(sorted({p for scope, method in methods for p in checked(scope, method)}))


# The three custom roles: one on the project, one to read a bucket, one to put new objects into a prefix;
# the logs are read through roles/logging.viewAccessor on one view (infra/researchers.py).
PROJECT_PERMISSIONS = permissions("project")
READ_PERMISSIONS = permissions("status")
SUBMIT_PERMISSIONS = permissions("artifacts", "requests")
