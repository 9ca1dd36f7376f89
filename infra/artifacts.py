"""Where a run's code comes from: the artifacts bucket (packaged source folders) and the image repository.

- The artifacts bucket (`<prefix>-<stack>-artifacts`) is secured like every bucket of the stack
  (uniform access, public access prevention enforced, versioning, the stack's key) and kept by
  `pulumi destroy` unless the stack lists `artifacts` as destroyable. Each packaged folder is the
  object `sources/<sha256>.tar.gz` (infra/packaging.py), the agent `runners/<sha256>.tar.gz` (a prefix only
  `pulumi up` writes, run_contract/paths.py RUNNERS_PREFIX): a changed folder is a new object.
  Old objects are kept (retain_on_delete): an archive is a few hundred KB, and keeping each one lets a
  rollback, an audit of what a past run ran, and a VM re-created from an earlier recorded spec find
  their code; overwritten versions expire like the other buckets' (noncurrent rules).
- The image repository (`tpu-<stack>`, Docker, in the stack's region): tags immutable; cleanup keeps
  every image the stack runs (by digest) and the newest versions, and deletes old untagged ones;
  vulnerability scanning follows the project's Container Scanning API, which the stack enables
  (`enablementConfig: INHERITED`: "Scanning is Enabled, but dependent on API enablement",
  Artifact Registry v1 Repository.VulnerabilityScanningConfig); the stack's key when it has one.
- Each workload account may read only what it runs: its folder's object (and the VM agent's) by an
  IAM condition on the object name, or pull from the repository (`roles/artifactregistry.reader`
  on the repository, never the project).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from infra import grants, naming
from infra.access import iam, iamdata
from infra.buckets import lifecycle_rules, private_bucket
from infra.config import ArtifactSettings, Env
from infra.config.workload_code import registry
from infra.packaging import Package
from run_contract import paths

ARTIFACTS_APIS = ("storage.googleapis.com", "artifactregistry.googleapis.com", "containerscanning.googleapis.com")
# Where `pulumi up` writes the archives it uploads (ignored by git): the engine reads them after the
# program has declared them, so they must outlive the declaration.
BUILD_DIR = Path(__file__).resolve().parents[1] / "build" / "sources"
REGISTRY_READER = "roles/artifactregistry.reader"
OBJECT_READER = iam.BUCKET_ROLE_FOR_ACCESS["read"]
SECONDS_PER_DAY = 86_400
# What a workload's VM calls to fetch its code (the start-up script and the agent, docs/run-contract.md):
# a folder source's archive by name from the GCS JSON API (objects.get, never a listing) ...
SOURCE_METHODS = ("storage.objects.get",)
# ... or an image pulled with docker, which Artifact Registry checks as downloadArtifacts on the
# repository ("Artifact Registry roles and permissions": Reader, "read and download artifacts").
PULL_PERMISSIONS = ("artifactregistry.repositories.downloadArtifacts",)


@dataclass(frozen=True)
class WorkloadCode:
    """What one workload's account reads: source archives (by key of `ArtifactsArgs.packages`), images."""

    packages: tuple[str, ...] = ()
    pulls_images: bool = False
    # A VM of the workload takes researchers' requests (selfService): their archives are new objects
    # under sources/, so the account reads that prefix, not a list of names.
    any_source: bool = False


@dataclass(frozen=True)
class ArtifactsArgs:
    location: str  # of the bucket: the stack's bucket location
    kms_key_name: str | None  # the stack's key: bucket and repository
    destroyable: bool  # `pulumi destroy` may delete the bucket (objects included) and the repository
    noncurrent_versions_to_keep: int
    noncurrent_version_days: int
    packages: Mapping[str, Package]  # key (a source folder, "vm-agent", "vm-agent-wheelhouse") -> its archive
    workloads: Mapping[str, WorkloadCode]  # workload name -> what its account reads
    pinned_digests: tuple[str, ...] = ()  # sha256 hex of the images the stack runs: never cleaned up
    images: ArtifactSettings = field(
        default_factory=ArtifactSettings
    )  # the stack's image settings: what the cleanup keeps


def write_archive(package: Package) -> Path:
    """The archive as a file named by its hash (written once; the same hash is the same bytes); one built
    before the plan (the agent's wheelhouse) is uploaded from where it was built."""
    if package.built is not None:
        return package.built
    path = BUILD_DIR / f"{package.sha256}.tar.gz"
    if not path.exists():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(package.data)
        partial.replace(path)
    return path


def cleanup_policies(args: ArtifactsArgs) -> list[gcp.artifactregistry.RepositoryCleanupPolicyArgs]:
    """Keep what the stack runs and the newest versions; delete old untagged ones. "If an artifact version
    matches criteria in both a delete policy and a keep policy, Artifact Registry applies the keep policy"
    (https://cloud.google.com/artifact-registry/docs/repositories/cleanup-policy-overview); at most 10
    policies a repository (same page): this makes 3."""
    policies = [
        gcp.artifactregistry.RepositoryCleanupPolicyArgs(
            id="keep-newest",
            action="KEEP",
            most_recent_versions=gcp.artifactregistry.RepositoryCleanupPolicyMostRecentVersionsArgs(
                keep_count=args.images.keep_image_versions
            ),
        ),
        gcp.artifactregistry.RepositoryCleanupPolicyArgs(
            id="delete-old-untagged",
            action="DELETE",
            condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(
                tag_state="UNTAGGED", older_than=f"{args.images.untagged_image_days * SECONDS_PER_DAY}s"
            ),
        ),
    ]
    if args.pinned_digests:
        # A Docker version's name is its digest, `sha256:<hex>` (artifactregistry.v1 Tag.version:
        # `…/versions/sha256:…`).
        policies.insert(
            0,
            gcp.artifactregistry.RepositoryCleanupPolicyArgs(
                id="keep-used-by-stack",
                action="KEEP",
                condition=gcp.artifactregistry.RepositoryCleanupPolicyConditionArgs(
                    tag_state="ANY", version_name_prefixes=[f"sha256:{d}" for d in sorted(set(args.pinned_digests))]
                ),
            ),
        )
    return policies


class WorkloadArtifacts(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        env: Env,
        args: ArtifactsArgs,
        readers: Mapping[str, pulumi.Input[str]],  # workload name -> its account's email
        needs: Sequence[pulumi.Resource],  # the APIs of ARTIFACTS_APIS
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("tpu-platform:artifacts:WorkloadArtifacts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        kept = pulumi.ResourceOptions(
            parent=self, depends_on=list(needs), retain_on_delete=not args.destroyable, protect=env.production
        )
        self.bucket_name = env.bucket_name("artifacts")
        encryption = (
            gcp.storage.BucketEncryptionArgs(default_kms_key_name=args.kms_key_name) if args.kms_key_name else None
        )
        # Every bucket of the stack is made one way (infra/storage.py), lifecycle rules included: the
        # noncurrent rules, and incomplete multipart uploads (a researcher's interrupted upload) aborted.
        self.bucket = private_bucket(
            f"{name}-bucket",
            env,
            name=self.bucket_name,
            purpose="artifacts",
            location=args.location,
            lifecycle_rules=lifecycle_rules(args.noncurrent_versions_to_keep, args.noncurrent_version_days),
            encryption=encryption,
            force_destroy=args.destroyable,
            opts=kept,
        )
        self.objects: dict[str, gcp.storage.BucketObject] = {}
        for key, package in sorted(args.packages.items()):
            # Content-addressed: a changed folder replaces this resource with a new object; the old one is
            # kept in the bucket (retain_on_delete), see the module's docstring.
            self.objects[key] = gcp.storage.BucketObject(
                f"{name}-{key}",
                bucket=self.bucket.name,
                name=package.object_name,
                source=pulumi.FileAsset(str(write_archive(package))),
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
            )
        # Its fields and enum values as the provider sends them: checked against Artifact Registry v1's
        # published schema (the artifactregistry.v1 discovery document).
        self.repository = gcp.artifactregistry.Repository(
            f"{name}-images",
            project=env.project,
            location=env.region,
            repository_id=naming.artifact_repository(env.stack),
            format="DOCKER",
            description=f"Container images of the tpu-platform workloads ({env.stack})",
            docker_config=gcp.artifactregistry.RepositoryDockerConfigArgs(immutable_tags=True),
            cleanup_policies=cleanup_policies(args),
            cleanup_policy_dry_run=False,
            vulnerability_scanning_config=gcp.artifactregistry.RepositoryVulnerabilityScanningConfigArgs(
                enablement_config="INHERITED"
            ),
            kms_key_name=args.kms_key_name,
            labels={**env.labels, "purpose": "images"},
            opts=kept,
        )
        self.grants: dict[str, list[pulumi.Resource]] = {}
        for workload, code in sorted(args.workloads.items()):
            member = pulumi.Output.from_input(readers[workload]).apply(iam.service_account_member)
            made: list[pulumi.Resource] = []
            objects = [args.packages[k].object_name for k in code.packages]
            if objects or code.any_source:
                condition = grants.checked_storage_condition(
                    # Researchers' archives under `sources/`, and the runners (the agent) beside them.
                    grants.objects_in_any(
                        self.bucket_name,
                        [paths.SOURCES_PREFIX, paths.RUNNERS_PREFIX],
                        f"{workload}-sources",
                        f"Only objects under {paths.SOURCES_PREFIX} and {paths.RUNNERS_PREFIX}",
                    )
                    if code.any_source
                    else grants.object_condition(
                        self.bucket_name, objects, f"{workload}-sources", "Only the source archives it runs"
                    ),
                    OBJECT_READER,
                    iamdata.role_permissions(OBJECT_READER),
                )
                made.append(
                    gcp.storage.BucketIAMMember(
                        f"{name}-{workload}-sources",
                        bucket=self.bucket.name,
                        role=OBJECT_READER,
                        member=member,
                        condition=condition,
                        opts=child,
                    )
                )
            if code.pulls_images:
                made.append(
                    gcp.artifactregistry.RepositoryIamMember(
                        f"{name}-{workload}-images",
                        project=env.project,
                        location=env.region,
                        repository=self.repository.repository_id,
                        role=REGISTRY_READER,
                        member=member,
                        opts=child,
                    )
                )
            self.grants[workload] = made
        self.registry = registry(env.region, env.project, naming.artifact_repository(env.stack))
        self.register_outputs({"bucket": self.bucket.name, "registry": self.registry})
