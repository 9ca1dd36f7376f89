"""Which input changes make Pulumi replace a resource instead of updating it, from the provider's schema.

pulumi-gcp is bridged from the Terraform provider google-beta: an input whose Terraform schema says
`ForceNew: true` (or which a `CustomizeDiff` forces new under a condition) is replaced, not updated.
The SDK's docstrings do not say which inputs these are, so the table is extracted from the provider's
Go source and kept as data in `force_new.json`, with the repository, commit and files it came from.

Refresh it from a clone of hashicorp/terraform-provider-google-beta at the release pulumi-gcp bridges:

    python -m tools.offline.force_new /path/to/terraform-provider-google-beta [--commit REV]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("force_new.json")
_IAM_MEMBER = "google-beta/tpgiamresource/resource_iam_member.go"
# Pulumi type token -> the provider files that declare its schema (for IAM members: the generic
# member schema plus the parent's IAM schema, whose id fields are ForceNew too).
SOURCES: dict[str, tuple[str, ...]] = {
    "gcp:artifactregistry/repository:Repository": (
        "google-beta/services/artifactregistry/resource_artifact_registry_repository.go",
    ),
    "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember": (
        _IAM_MEMBER,
        "google-beta/services/artifactregistry/iam_artifact_registry_repository.go",
    ),
    "gcp:projects/iAMAuditConfig:IAMAuditConfig": (
        "google-beta/tpgiamresource/resource_iam_audit_config.go",
        "google-beta/services/resourcemanager/iam_project.go",
    ),
    "gcp:billing/budget:Budget": ("google-beta/services/billingbudgets/resource_billing_budget.go",),
    "gcp:cloudfunctionsv2/function:Function": (
        "google-beta/services/cloudfunctions2/resource_cloudfunctions2_function.go",
    ),
    "gcp:cloudfunctionsv2/functionIamMember:FunctionIamMember": (
        _IAM_MEMBER,
        "google-beta/services/cloudfunctions2/iam_cloudfunctions2_function.go",
    ),
    "gcp:cloudrunv2/serviceIamMember:ServiceIamMember": (
        _IAM_MEMBER,
        "google-beta/services/cloudrunv2/iam_cloud_run_v2_service.go",
    ),
    "gcp:cloudscheduler/job:Job": ("google-beta/services/cloudscheduler/resource_cloud_scheduler_job.go",),
    "gcp:compute/firewall:Firewall": ("google-beta/services/compute/resource_compute_firewall.go",),
    "gcp:compute/network:Network": ("google-beta/services/compute/resource_compute_network.go",),
    "gcp:compute/projectMetadataItem:ProjectMetadataItem": (
        "google-beta/services/compute/resource_compute_project_metadata_item.go",
    ),
    "gcp:compute/router:Router": ("google-beta/services/compute/resource_compute_router.go",),
    "gcp:compute/routerNat:RouterNat": ("google-beta/services/compute/resource_compute_router_nat.go",),
    "gcp:compute/subnetwork:Subnetwork": ("google-beta/services/compute/resource_compute_subnetwork.go",),
    "gcp:iam/workloadIdentityPool:WorkloadIdentityPool": (
        "google-beta/services/iambeta/resource_iam_workload_identity_pool.go",
    ),
    "gcp:iam/workloadIdentityPoolProvider:WorkloadIdentityPoolProvider": (
        "google-beta/services/iambeta/resource_iam_workload_identity_pool_provider.go",
    ),
    "gcp:kms/cryptoKey:CryptoKey": ("google-beta/services/kms/resource_kms_crypto_key.go",),
    "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember": (_IAM_MEMBER, "google-beta/services/kms/iam_kms_crypto_key.go"),
    "gcp:kms/keyRing:KeyRing": ("google-beta/services/kms/resource_kms_key_ring.go",),
    "gcp:monitoring/alertPolicy:AlertPolicy": ("google-beta/services/monitoring/resource_monitoring_alert_policy.go",),
    "gcp:monitoring/dashboard:Dashboard": ("google-beta/services/monitoring/resource_monitoring_dashboard.go",),
    "gcp:monitoring/notificationChannel:NotificationChannel": (
        "google-beta/services/monitoring/resource_monitoring_notification_channel.go",
    ),
    "gcp:projects/iAMCustomRole:IAMCustomRole": (
        "google-beta/services/resourcemanager/resource_google_project_iam_custom_role.go",
    ),
    "gcp:projects/iAMMember:IAMMember": (_IAM_MEMBER, "google-beta/services/resourcemanager/iam_project.go"),
    "gcp:projects/service:Service": ("google-beta/services/resourcemanager/resource_google_project_service.go",),
    "gcp:pubsub/topic:Topic": ("google-beta/services/pubsub/resource_pubsub_topic.go",),
    "gcp:serviceaccount/account:Account": ("google-beta/services/resourcemanager/resource_google_service_account.go",),
    "gcp:serviceaccount/iAMMember:IAMMember": (
        _IAM_MEMBER,
        "google-beta/services/resourcemanager/iam_service_account.go",
    ),
    "gcp:storage/bucket:Bucket": ("google-beta/services/storage/resource_storage_bucket.go",),
    "gcp:storage/bucketIAMMember:BucketIAMMember": (_IAM_MEMBER, "google-beta/services/storage/iam_storage_bucket.go"),
    "gcp:storage/bucketObject:BucketObject": ("google-beta/services/storage/resource_storage_bucket_object.go",),
    "gcp:tpu/v2Vm:V2Vm": ("google-beta/services/tpuv2/resource_tpu_v2_vm.go",),
}

_KEY = re.compile(r'^\s*"([a-z0-9_]+)":\s*\{')
_FORCE_NEW = re.compile(r"\bForceNew:\s*true\b")
# customdiff.ForceNewIfChange("retention_policy.0.is_locked", ...) / diff.ForceNew("field")
_CONDITIONAL = re.compile(r'(?:ForceNewIfChange|ForceNew)\(\s*"([a-z0-9_.]+)"')


def force_new_paths(go_source: str) -> tuple[set[str], set[str]]:
    """(always, conditional) ForceNew attribute paths (`network_config.network`) declared in Go source.

    Reads the nested `"key": {` blocks of the schema literals by brace depth: a `ForceNew: true`
    belongs to the innermost open key. Conditional ones are those a CustomizeDiff forces new.
    """
    always: set[str] = set()
    stack: list[tuple[str, int]] = []  # (key, depth at which its block opened)
    depth = 0
    for line in go_source.splitlines():
        code = line.split("//", 1)[0]
        if match := _KEY.match(code):
            stack.append((match[1], depth))
        if _FORCE_NEW.search(code) and stack:
            always.add(".".join(key for key, _ in stack))
        depth += code.count("{") - code.count("}")
        while stack and depth <= stack[-1][1]:
            stack.pop()
    conditional = {re.sub(r"\.\d+", "", m) for m in _CONDITIONAL.findall(go_source)} - always
    return always, conditional


def _iam_parent_schema(go_source: str) -> str:
    """Only the `…IamSchema = map[…]{…}` literal of an IAM parent file."""
    start = re.search(r"\w*Iam\w*Schema\s*=\s*map\[string\]\*schema\.Schema\{", go_source)
    if start is None:
        raise ValueError("no IamSchema literal")
    depth, end = 0, start.end() - 1
    for end in range(start.end() - 1, len(go_source)):
        depth += {"{": 1, "}": -1}.get(go_source[end], 0)
        if depth == 0:
            break
    return go_source[start.start() : end + 1]


def extract(repo: Path, commit: str) -> dict[str, object]:
    def show(path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
        ).stdout

    resolved = subprocess.run(
        ["git", "--git-dir", str(repo), "rev-parse", commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    resources: dict[str, dict[str, list[str]]] = {}
    for token, paths in sorted(SOURCES.items()):
        always: set[str] = set()
        conditional: set[str] = set()
        for path in paths:
            text = show(path)
            if "/iam_" in path:
                text = _iam_parent_schema(text)
            a, c = force_new_paths(text)
            always |= a
            conditional |= c
        resources[token] = {"forceNew": sorted(always), "forceNewIf": sorted(conditional - always)}
    return {
        "source": {
            "repository": "hashicorp/terraform-provider-google-beta",
            "commit": resolved,
            "files": sorted({p for paths in SOURCES.values() for p in paths}),
            "note": "pulumi-gcp 10.x bridges terraform-provider-google-beta 8.x; see tools/offline/force_new.py",
        },
        "resources": resources,
    }


def _segment(name: str) -> str:
    """One path segment compared loosely: Pulumi camel-cases and pluralises list names (`allow` -> `allows`)."""
    return name.replace("_", "").lower().removesuffix("s")


def _normalised(path: Iterable[str]) -> tuple[str, ...]:
    return tuple(_segment(p) for p in path)


@dataclass(frozen=True)
class ReplaceRule:
    always: frozenset[tuple[str, ...]]
    conditional: frozenset[tuple[str, ...]]


# Types of other bridged providers, by hand with their source. The time provider's docs ("Resource
# Triggers"): when `triggers` change, the resource is re-created (and a `time_sleep` sleeps again);
# `create_duration` alone is an update (pulumiverse-time's docstring: "Updating this value by itself will
# not trigger a delay").
OTHER_PROVIDERS: dict[str, dict[str, list[str]]] = {
    "time:index/sleep:Sleep": {"forceNew": ["triggers"], "forceNewIf": []},
}


@cache
def _rules() -> tuple[dict[str, ReplaceRule], dict[str, object]]:
    data = json.loads(TABLE.read_text())
    data["resources"] = {**data["resources"], **OTHER_PROVIDERS}
    rules = {
        token: ReplaceRule(
            frozenset(_normalised(p.split(".")) for p in entry["forceNew"]),
            frozenset(_normalised(p.split(".")) for p in entry["forceNewIf"]),
        )
        for token, entry in data["resources"].items()
    }
    return rules, data["source"]


def source() -> dict[str, object]:
    return _rules()[1]


def known(token: str) -> bool:
    return token in _rules()[0]


def effect(token: str, input_path: str) -> str:
    """`replace`, `replace?` (forced new only under a condition) or `update` for a change of one input.

    `input_path` is a flattened plan key like `networkConfig.network` or `lifecycleRules[0].action.type`.
    """
    rule = _rules()[0].get(token)
    if rule is None:
        return "update"
    path = _normalised(p for p in re.sub(r"\[\d+\]", "", input_path).split(".") if p)
    prefixes = {path[:n] for n in range(1, len(path) + 1)}
    if prefixes & rule.always:
        return "replace"
    if prefixes & rule.conditional:
        return "replace?"
    return "update"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.offline.force_new", description=__doc__)
    parser.add_argument("repo", type=Path, help="git directory of hashicorp/terraform-provider-google-beta")
    parser.add_argument("--commit", default="HEAD")
    args = parser.parse_args(argv)
    TABLE.write_text(json.dumps(extract(args.repo, args.commit), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
