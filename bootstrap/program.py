"""The bootstrap's resources: what CI needs to run `pulumi preview/up` with no key anywhere.

- a GCS bucket for Pulumi state: versioned, uniform access, public access prevented, protected;
- a KMS key (rotated at most every 90 days, protected) for the `gcpkms://` secrets provider;
- a Workload Identity pool and GitHub OIDC provider that only accepts the configured repository;
- two service accounts, each impersonable only through that pool: a previewer (read-only roles on
  the environment projects) and a deployer (the admin roles the platform's resources need), whose
  principal also pins the deploy ref. `roles/iam.workloadIdentityUser` is granted on each account,
  never at project level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.config import BILLING_ACCOUNT, GCP_PROJECT_ID
from infra.schema import Node, Problems, decode_objects
from infra.stack import raw_stack_config

NAMESPACE = "tpu-platform-bootstrap"
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
KEY_ROTATION = "7776000s"  # 90 days
APIS = (
    "cloudresourcemanager.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",  # short-lived tokens for the service accounts
    "sts.googleapis.com",  # token exchange for workload identity federation
    "storage.googleapis.com",
    "cloudkms.googleapis.com",
)
# Enough for `pulumi preview --refresh`: read every resource type the platform declares, nothing more.
PREVIEW_ROLES = (
    "roles/browser",
    "roles/iam.securityReviewer",
    "roles/serviceusage.serviceUsageViewer",
    "roles/compute.viewer",
    "roles/tpu.viewer",
    "roles/storage.bucketViewer",
    "roles/monitoring.viewer",
    "roles/pubsub.viewer",
    "roles/cloudscheduler.viewer",
    "roles/workflows.viewer",
    "roles/eventarc.viewer",
)
# What `pulumi up` of the platform creates, and nothing that impersonates service accounts at project
# level. serviceAccountAdmin lets the deploy grant itself use of each workload account it creates.
DEPLOY_ROLES = (
    "roles/serviceusage.serviceUsageAdmin",
    "roles/resourcemanager.projectIamAdmin",
    "roles/iam.serviceAccountAdmin",
    "roles/iam.roleAdmin",
    "roles/storage.admin",
    "roles/compute.networkAdmin",
    "roles/compute.securityAdmin",
    "roles/tpu.admin",
    "roles/monitoring.editor",
    "roles/pubsub.admin",
    "roles/cloudscheduler.admin",
    "roles/workflows.admin",
    "roles/eventarc.admin",
)


KEYS = ("githubRepository", "deployRef", "stateBucket", "location", "billingAccount", "environmentProjects")


@dataclass(frozen=True)
class BootstrapConfig:
    project: str
    repository: str
    deploy_ref: str
    state_bucket: str
    location: str
    billing_account: str | None
    environment_projects: tuple[str, ...]


def parse_bootstrap_config(stack: str, raw: dict[str, str]) -> BootstrapConfig:
    problems = Problems()
    projects_key = f"{NAMESPACE}:environmentProjects"
    own = decode_objects({k: v for k, v in raw.items() if k.startswith(f"{NAMESPACE}:")}, [projects_key], problems)
    root = Node(own, "", problems)
    project = Node(raw, "", problems).str("gcp:project", pattern=GCP_PROJECT_ID, allowed="a GCP project id")
    config = BootstrapConfig(
        project=project,
        repository=root.str(f"{NAMESPACE}:githubRepository", pattern=r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+",
                            allowed="owner/name of a GitHub repository"),
        deploy_ref=root.str(f"{NAMESPACE}:deployRef", "refs/heads/main", pattern=r"refs/(heads|tags)/[A-Za-z0-9_./-]+",
                            allowed="a full git ref like refs/heads/main"),
        state_bucket=root.str(f"{NAMESPACE}:stateBucket", check=naming.bucket_name_problem),
        location=root.str(f"{NAMESPACE}:location", "us-central1", pattern=r"[a-z]+-[a-z]+\d+",
                          allowed="a region like us-central1"),
        billing_account=root.str(f"{NAMESPACE}:billingAccount", None, pattern=BILLING_ACCOUNT,
                                 allowed="a billing account id like 012345-6789AB-CDEF01"),
        environment_projects=tuple(root.str_list(projects_key, pattern=GCP_PROJECT_ID,
                                                 allowed="GCP project ids") or ()),
    )  # fmt: skip
    root.done([f"{NAMESPACE}:{k}" for k in KEYS])
    problems.raise_if_any(stack)
    return config


def load_bootstrap_config() -> BootstrapConfig:
    return parse_bootstrap_config(pulumi.get_stack(), raw_stack_config())


def _principal_set(pool: gcp.iam.WorkloadIdentityPool, attribute: str, value: str) -> pulumi.Output[str]:
    return pool.name.apply(lambda name: f"principalSet://iam.googleapis.com/{name}/attribute.{attribute}/{value}")


def build_bootstrap(cfg: BootstrapConfig) -> dict[str, Any]:
    services = [
        gcp.projects.Service(f"api-{api.split('.')[0]}", project=cfg.project, service=api, disable_on_destroy=False)
        for api in APIS
    ]
    after_apis = pulumi.ResourceOptions(depends_on=services)
    kept = pulumi.ResourceOptions(depends_on=services, protect=True, retain_on_delete=True)

    state = gcp.storage.Bucket(
        "state",
        name=cfg.state_bucket,
        project=cfg.project,
        location=cfg.location.upper(),
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        versioning=gcp.storage.BucketVersioningArgs(enabled=True),
        lifecycle_rules=[
            gcp.storage.BucketLifecycleRuleArgs(
                action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                condition=gcp.storage.BucketLifecycleRuleConditionArgs(num_newer_versions=50, with_state="ARCHIVED"),
            )
        ],
        labels={"purpose": "pulumi-state", "managed-by": "pulumi"},
        opts=kept,
    )
    key_ring = gcp.kms.KeyRing("secrets", name="pulumi", project=cfg.project, location=cfg.location, opts=kept)
    key = gcp.kms.CryptoKey(
        "secrets-key",
        name="pulumi-secrets",
        key_ring=key_ring.id,
        purpose="ENCRYPT_DECRYPT",
        rotation_period=KEY_ROTATION,
        opts=kept,
    )

    pool = gcp.iam.WorkloadIdentityPool(
        "github",
        project=cfg.project,
        workload_identity_pool_id="github",
        display_name="GitHub Actions",
        opts=after_apis,
    )
    provider = gcp.iam.WorkloadIdentityPoolProvider(
        "github-actions",
        project=cfg.project,
        workload_identity_pool_id=pool.workload_identity_pool_id,
        workload_identity_pool_provider_id="github-actions",
        display_name=cfg.repository[:32],
        oidc=gcp.iam.WorkloadIdentityPoolProviderOidcArgs(issuer_uri=GITHUB_ISSUER),
        attribute_mapping={
            "google.subject": "assertion.sub",
            "attribute.repository": "assertion.repository",
            "attribute.ref": "assertion.ref",
            "attribute.repository_ref": "assertion.repository + '@' + assertion.ref",
        },
        # Tokens from any other repository are refused by the provider itself.
        attribute_condition=f"assertion.repository == '{cfg.repository}'",
        opts=after_apis,
    )

    accounts: dict[str, gcp.serviceaccount.Account] = {}
    for role_name, who, roles in (
        ("previewer", _principal_set(pool, "repository", cfg.repository), PREVIEW_ROLES),
        ("deployer", _principal_set(pool, "repository_ref", f"{cfg.repository}@{cfg.deploy_ref}"), DEPLOY_ROLES),
    ):
        account = gcp.serviceaccount.Account(
            f"ci-{role_name}",
            account_id=f"tpu-platform-ci-{role_name}",
            display_name=f"tpu-platform CI {role_name} (GitHub {cfg.repository})",
            project=cfg.project,
            opts=after_apis,
        )
        accounts[role_name] = account
        member = account.email.apply(lambda email: f"serviceAccount:{email}")
        gcp.serviceaccount.IAMMember(
            f"ci-{role_name}-federated",
            service_account_id=account.name,
            role="roles/iam.workloadIdentityUser",
            member=who,
        )
        gcp.storage.BucketIAMMember(
            f"ci-{role_name}-state", bucket=state.name, role="roles/storage.objectUser", member=member
        )
        gcp.kms.CryptoKeyIAMMember(
            f"ci-{role_name}-secrets",
            crypto_key_id=key.id,
            role="roles/cloudkms.cryptoKeyEncrypterDecrypter",
            member=member,
        )
        for project in cfg.environment_projects:
            for role in roles:
                gcp.projects.IAMMember(
                    f"ci-{role_name}-{project}-{re.sub(r'[^a-zA-Z0-9]+', '-', role.removeprefix('roles/'))}",
                    project=project,
                    role=role,
                    member=member,
                )
        if cfg.billing_account:
            gcp.billing.AccountIamMember(
                f"ci-{role_name}-billing",
                billing_account_id=cfg.billing_account,
                role="roles/billing.viewer" if role_name == "previewer" else "roles/billing.costsManager",
                member=member,
            )

    return {
        "stateBackend": state.name.apply(lambda name: f"gs://{name}"),
        "secretsProvider": key.id.apply(lambda key_id: f"gcpkms://{key_id}"),
        "workloadIdentityProvider": provider.name,
        "previewServiceAccount": accounts["previewer"].email,
        "deployServiceAccount": accounts["deployer"].email,
    }
