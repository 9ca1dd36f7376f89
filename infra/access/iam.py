"""The one IAM vocabulary of the platform: which roles a workload identity may ever hold, and where.

Config is checked against these allow-lists, so a role outside them is refused before anything is
planned. Widening a list is a reviewed code change, never a stack-file edit.
"""

from __future__ import annotations

# Project-level roles a workload's service account may hold: write logs and metrics, nothing else.
ALLOWED_PROJECT_ROLES: frozenset[str] = frozenset(
    {
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
    }
)
DEFAULT_PROJECT_ROLES: tuple[str, ...] = ("roles/logging.logWriter", "roles/monitoring.metricWriter")

# Bucket-level access: objectViewer reads; objectUser reads, writes and overwrites (objectCreator
# cannot read back or overwrite, which breaks checkpoint resume and rotation).
BUCKET_ROLE_FOR_ACCESS: dict[str, str] = {
    "read": "roles/storage.objectViewer",
    "write": "roles/storage.objectUser",
}
ALLOWED_BUCKET_ROLES: frozenset[str] = frozenset(BUCKET_ROLE_FOR_ACCESS.values())

# A training VM reads its data and writes checkpoints and models.
DEFAULT_BUCKET_ACCESS: dict[str, str] = {"data": "read", "checkpoints": "write", "models": "write"}


def kubernetes_principal(project_number: str, project: str, namespace: str, account: str) -> str:
    """A GKE Kubernetes service account as an IAM principal, granted directly with no Google service account
    to impersonate (GKE, "Authenticate to Google Cloud APIs from GKE workloads": Workload Identity
    Federation for GKE; the pool is the project's `PROJECT_ID.svc.id.goog`)."""
    pool = f"projects/{project_number}/locations/global/workloadIdentityPools/{project}.svc.id.goog"
    return f"principal://iam.googleapis.com/{pool}/subject/ns/{namespace}/sa/{account}"


def service_account_member(email: str) -> str:
    return f"serviceAccount:{email}"
