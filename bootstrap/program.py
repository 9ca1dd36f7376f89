"""The bootstrap's resources: what CI needs to run `pulumi preview/up` with no key anywhere, and every
identity the stacks use, so that no CI identity can make or widen one.

Run by an administrator (the roles that takes: `BOOTSTRAP_ADMIN_ROLES` below; docs/ci-and-bootstrap.md), and again
whenever `bootstrap/access.json` changes:
- a GCS bucket for Pulumi state: versioned, soft delete kept 30 days, uniform access, public access
  prevented, protected;
- per environment a KMS key (rotated every 90 days, protected) for that stack's `gcpkms://` secrets;
- a Workload Identity pool whose GitHub provider accepts only this repository, pinned by its numeric
  id and its owner's (a renamed or re-created repository of the same name gets nothing);
- one previewer for all environments: reads state, decrypts each environment's secrets, and holds
  per environment a custom role of exactly the reads `pulumi preview --refresh` makes (no write at
  all), reading objects only by name (the ones a refresh reads, under an IAM condition);
- one deployer per environment, federated only for that GitHub environment *and* the deploy
  workflow on the deploy ref, so the environment's required reviewers are a real boundary. It holds a
  custom role computed from that environment's plans (`bootstrap/access.json`), the project IAM admin
  role only under a condition listing the roles the plan grants, act-as on the accounts its plans
  attach, costs-manager on the billing account, read-write on its own stack's state files (read on the
  backend's `meta.yaml`) and its own secrets key. It cannot create or change a service account, a
  custom role or an account's IAM: those are made here;
- for each environment: the service accounts and custom roles its stack uses (`accounts`, `roles`)
  and act-as on them for who attaches them; Cloud Resource Manager, Service Usage and IAM enabled
  first; Google's agents and the CMEK keys of other projects;
- a wait after the grants a deploy uses (IAM changes take minutes to apply).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pulumi
import pulumi_gcp as gcp
from pydantic import Field

from bootstrap import PROJECT
from infra import naming
from infra.access import iam
from infra.access.accounts import SERVICE_ACCOUNT_USER, StackIdentities
from infra.access.conditions import check_condition
from infra.access.environment import (
    BILLING_DEPLOY_ROLE,
    BILLING_PREVIEW_ROLE,
    ObjectReads,
    log_names_condition,
    object_reads_condition,
)
from infra.config import BILLING_ACCOUNT, GCP_PROJECT_ID, declared
from infra.config.declared import Allowed, Items, Section, Text
from infra.config.model import GcpSettings
from infra.config.problems import Fix, Problems, decode_objects, fullmatch, nearest, type_name
from infra.grants import propagation_wait
from infra.stack import raw_stack_config
from run_contract.cel import cel_string, listed_under, named_under, object_name

NAMESPACE = PROJECT
PLATFORM_PROJECT = "tpu-platform"  # the Pulumi project name of the platform (its state paths)
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
KEY_ROTATION = "7776000s"  # 90 days
STATE_SOFT_DELETE = "2592000"  # 30 days to undo a deleted or overwritten state file
ACCESS_FILE = Path(__file__).resolve().parent / "access.json"
DEPLOY_WORKFLOW = ".github/workflows/deploy.yml"
APIS = (
    "cloudresourcemanager.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",  # short-lived tokens for the service accounts
    "sts.googleapis.com",  # token exchange for workload identity federation
    "storage.googleapis.com",
    "cloudkms.googleapis.com",
)
# Enabled in each environment project before its first preview: with gcp:userProjectOverride the
# provider sends X-Goog-User-Project on every call (terraform-provider-google transport/config.go),
# which Google accepts only once these are on (hashicorp/terraform-provider-google#11435).
# IAM: the environment's service accounts and custom roles are created here, before its first deploy.
ENVIRONMENT_APIS = ("cloudresourcemanager.googleapis.com", "serviceusage.googleapis.com", "iam.googleapis.com")
PROJECT_IAM_ADMIN = "roles/resourcemanager.projectIamAdmin"
# What whoever runs the bootstrap needs, by where (proven against its plan with Google's role data):
# on the admin project and each environment project; on the billing account; on the project of
# each CMEK key. No basic role.
BOOTSTRAP_ADMIN_ROLES: dict[str, tuple[str, ...]] = {
    "project": (
        "roles/serviceusage.serviceUsageAdmin",
        "roles/resourcemanager.projectIamAdmin",
        "roles/iam.serviceAccountAdmin",
        "roles/iam.roleAdmin",
        "roles/iam.workloadIdentityPoolAdmin",
        "roles/storage.admin",
        "roles/cloudkms.admin",
    ),
    "billing": ("roles/billing.admin",),
    "kms": ("roles/cloudkms.admin",),
}
ENCRYPTER_DECRYPTER = "roles/cloudkms.cryptoKeyEncrypterDecrypter"


NUMERIC_ID = r"[0-9]{1,20}"
GIT_REF = r"refs/(heads|tags)/[A-Za-z0-9_./-]+"


class BootstrapConfig(Section):
    """The bootstrap's own keys (`tpu-platform-bootstrap:...`), read as the platform's (infra/config/declared.py)."""

    # gcp:project, the admin project: the provider's key, not the bootstrap's (the reader supplies it).
    project: str = Field(default="", exclude=True)
    repository: Annotated[Text, Allowed("owner/name of a GitHub repository", r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")] = (
        Field(validation_alias="githubRepository")
    )
    repository_id: Annotated[
        Text, Allowed("the repository's numeric id (gh api repos/OWNER/NAME --jq .id)", NUMERIC_ID)
    ] = Field(validation_alias="githubRepositoryId")
    repository_owner_id: Annotated[
        Text, Allowed("the owner's numeric id (gh api repos/OWNER/NAME --jq .owner.id)", NUMERIC_ID)
    ] = Field(validation_alias="githubRepositoryOwnerId")
    deploy_ref: Annotated[Text, Allowed("a full git ref like refs/heads/main", GIT_REF)] = "refs/heads/main"
    state_bucket: Annotated[Text, Allowed(check=naming.bucket_name_problem)]
    location: Annotated[Text, Allowed("a region like us-central1", r"[a-z]+-[a-z]+\d+")] = "us-central1"
    billing_account: (
        Annotated[Text, Allowed("a billing account id like 012345-6789AB-CDEF01", BILLING_ACCOUNT)] | None
    ) = None
    # Each platform stack and its GCP project, checked by the reader, which names the stack.
    environments: Annotated[tuple[tuple[str, Any], ...], Items(mapping=True)]
    # Environments whose accounts and custom roles the stack made before the bootstrap did: imported
    # once (docs/ci-and-bootstrap.md, "Upgrading a stack that made its own accounts").
    adopt: Annotated[tuple[Text, ...], Items()] = ()


def parse_bootstrap_config(stack: str, raw: dict[str, str]) -> BootstrapConfig:
    problems = Problems()
    envs_key, adopt_key = f"{NAMESPACE}:environments", f"{NAMESPACE}:adopt"
    own = decode_objects(
        {k: v for k, v in raw.items() if k.startswith(f"{NAMESPACE}:")}, [envs_key, adopt_key], problems
    )
    gcp_project = raw.get("gcp:project")
    project = declared.read(GcpSettings, {} if gcp_project is None else {"project": gcp_project}, "gcp:", problems)
    given = {k.removeprefix(f"{NAMESPACE}:"): v for k, v in own.items()}
    config = declared.read(BootstrapConfig, given, f"{NAMESPACE}:", problems, supplied={"project": project.project})
    environments: dict[str, str] = {}
    for name, value in config.environments:
        key = f"{envs_key}.{name}"
        # The program's own rule: an environment it would refuse to plan gets no accounts.
        if why := naming.stack_problem(name):
            problems.add(key, name, f"a stack name of {why}")
        elif not isinstance(value, str):
            problems.add(key, value, f"must be a string, not {type_name(value)}")
        elif not fullmatch(GCP_PROJECT_ID, value):
            problems.add(key, value, "a GCP project id")
        else:
            environments[name] = value
    for index, name in enumerate(config.adopt):
        if name not in environments:
            key, near = f"{adopt_key}[{index}]", nearest(name, sorted(environments))
            allowed = f"must be one of {', '.join(sorted(environments))}; an environment of this bootstrap"
            problems.add(key, name, allowed, fixes=[Fix.of({key: near})] if near else [])
    access = read_access()
    for name, env_project in environments.items():
        entry = access.get(name)
        if entry is None:
            problems.add(f"{envs_key}.{name}", name, f"a stack planned in {ACCESS_FILE.name}: {', '.join(access)}")
        elif entry["project"] != env_project:
            planned = f"the project of Pulumi.{name}.yaml ({entry['project']}), as planned in {ACCESS_FILE.name}"
            problems.add(f"{envs_key}.{name}", env_project, planned)
    problems.raise_if_any(stack)
    return config.model_copy(update={"environments": tuple(environments.items())})


def read_access() -> dict[str, Any]:
    return json.loads(ACCESS_FILE.read_text())


def load_bootstrap_config() -> BootstrapConfig:
    return parse_bootstrap_config(pulumi.get_stack(), raw_stack_config())


def modified_grants_condition(roles: list[str]) -> str:
    """Grant or revoke only these roles (cloud.google.com/iam/docs/setting-limits-on-granting-roles)."""
    listed = ", ".join(cel_string(role) for role in roles)
    return f"api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', []).hasOnly([{listed}])"


def state_paths_condition(bucket: str, stack: str) -> str:
    """The deployer reads and writes its own stack's state files only.

    Pulumi's DIY backend keeps a stack under `.pulumi/{stacks,history,backups,locks}/<project>/<stack>`.
    Object reads and writes are checked on the object (`resource.name`). Whole names only: `dev` must
    not match `dev-eu` (a stack file, then folders ending in '/').
    """
    return " || ".join(named_under(bucket, path) for path in _own_state(stack))


def state_reads_condition(bucket: str, stack: str) -> str:
    """What else the CLI reads, never writes: the backend's layout (`.pulumi/meta.yaml`, which any
    deployer could otherwise rewrite for every stack: pulumi/pulumi#12437), and listings of its own
    stack's folders and of the project's stacks. Listing is checked on the bucket, so it is limited with
    the `objectListPrefix` API attribute (Cloud Storage, "IAM Conditions: API attributes")."""
    lists = " || ".join(listed_under(path) for path in [*_own_state(stack), f".pulumi/stacks/{PLATFORM_PROJECT}/"])
    return f"resource.name == {cel_string(object_name(bucket, '.pulumi/meta.yaml'))} || {lists}"


def _own_state(stack: str) -> list[str]:
    return [f".pulumi/stacks/{PLATFORM_PROJECT}/{stack}.json"] + [
        f".pulumi/{kind}/{PLATFORM_PROJECT}/{stack}/" for kind in ("history", "backups", "locks")
    ]


def _principal_set(pool: gcp.iam.WorkloadIdentityPool, attribute: str, value: str) -> pulumi.Output[str]:
    return pool.name.apply(lambda name: f"principalSet://iam.googleapis.com/{name}/attribute.{attribute}/{value}")


def _environment_role(
    stack: str, project: str, opts: pulumi.ResourceOptions, kind: str, description: str, permissions: list[str]
) -> gcp.projects.IAMCustomRole:
    """An environment's deployer or previewer role, in its project, with permissions from access.json."""
    return gcp.projects.IAMCustomRole(
        f"{kind}-{stack}-role",
        project=project,
        role_id=naming.custom_role_id(kind, stack),
        title=f"tpu-platform: {kind} of {stack}",
        description=description,
        permissions=permissions,
        opts=opts,
    )


def _member(account: gcp.serviceaccount.Account) -> pulumi.Output[str]:
    return account.email.apply(iam.service_account_member)


@dataclass
class _Shared:
    """What every environment's identities refer to."""

    cfg: BootstrapConfig
    state: gcp.storage.Bucket
    key_ring: gcp.kms.KeyRing
    pool: gcp.iam.WorkloadIdentityPool
    previewer: gcp.serviceaccount.Account
    after_apis: pulumi.ResourceOptions
    kept: pulumi.ResourceOptions
    grants: list[pulumi.Resource]  # every grant a deploy uses, for the wait after them


def build_bootstrap(cfg: BootstrapConfig, access: dict[str, Any] | None = None) -> dict[str, Any]:
    """`access`: each environment's entry of bootstrap/access.json (default: the file)."""
    access = access if access is not None else read_access()
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
        # A deleted or overwritten state object stays recoverable for 30 days (previews take no lock
        # on a GCS backend: pulumi/pulumi#8642), on top of the 50 kept versions.
        soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(retention_duration_seconds=int(STATE_SOFT_DELETE)),
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
    # The one key every stack used before each environment had its own: kept (protected) so that an
    # administrator can still read state history encrypted with it; no CI identity holds a right on it.
    gcp.kms.CryptoKey(
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
            "attribute.repository_id": "assertion.repository_id",
            # GitHub's token names the job's environment only when the job has one, and always the
            # workflow file and ref that run it (GitHub, "About security hardening with OpenID Connect").
            "attribute.deploy": (
                "(has(assertion.environment) ? assertion.environment : 'none') + '@' + assertion.job_workflow_ref"
            ),
        },
        # Numeric ids, not the name: a deleted-and-recreated repository, or one renamed into the old name,
        # keeps the name but not the id (GitHub's OIDC claims repository_id, repository_owner_id).
        attribute_condition=(
            f"assertion.repository_id == {cel_string(cfg.repository_id)} && "
            f"assertion.repository_owner_id == {cel_string(cfg.repository_owner_id)}"
        ),
        opts=after_apis,
    )

    previewer = gcp.serviceaccount.Account(
        "ci-previewer",
        account_id="tpu-platform-ci-previewer",
        display_name=f"tpu-platform CI previewer ({cfg.repository})",
        project=cfg.project,
        opts=after_apis,
    )
    shared = _Shared(cfg, state, key_ring, pool, previewer, after_apis, kept, [])
    _federate(shared, "ci-previewer-federated", previewer, "repository_id", cfg.repository_id)
    # A preview reads state (each environment's secrets: below) and can write neither.
    shared.grants.append(
        gcp.storage.BucketIAMMember(
            "ci-previewer-state", bucket=state.name, role="roles/storage.objectViewer", member=_member(previewer)
        )
    )
    if cfg.billing_account:
        shared.grants.append(
            gcp.billing.AccountIamMember(
                "ci-previewer-billing",
                billing_account_id=cfg.billing_account,
                role=BILLING_PREVIEW_ROLE,
                member=_member(previewer),
            )
        )

    deployers: dict[str, pulumi.Output[str]] = {}
    secrets: dict[str, pulumi.Output[str]] = {}
    for stack, project in sorted(cfg.environments):
        deployers[stack], secrets[stack] = _environment(shared, stack, project, access[stack])

    # IAM changes "typically propagate in 2 minutes, but could potentially take 7 minutes or longer"
    # (IAM, "Access change propagation"): the first deploy after a bootstrap run uses these grants.
    propagation_wait("grants", shared.grants)
    return {
        "stateBackend": state.name.apply(lambda name: f"gs://{name}"),
        "secretsProviders": secrets,
        "workloadIdentityProvider": provider.name,
        "previewServiceAccount": previewer.email,
        "deployServiceAccounts": deployers,
    }


def _federate(shared: _Shared, name: str, target: gcp.serviceaccount.Account, attribute: str, value: str) -> None:
    gcp.serviceaccount.IAMMember(
        name,
        service_account_id=target.name,
        role="roles/iam.workloadIdentityUser",
        member=_principal_set(shared.pool, attribute, value),
    )


def _environment(
    shared: _Shared, stack: str, project: str, entry: dict[str, Any]
) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """One environment: its APIs, identities, key and agents. Returns its deployer and secrets provider."""
    cfg, grants = shared.cfg, shared.grants
    env_apis = [
        gcp.projects.Service(f"{stack}-api-{api.split('.')[0]}", project=project, service=api, disable_on_destroy=False)
        for api in ENVIRONMENT_APIS
    ]
    in_env = pulumi.ResourceOptions(depends_on=env_apis)
    deployer = gcp.serviceaccount.Account(
        f"deployer-{stack}",
        account_id=naming.deployer_account_id(stack),
        display_name=f"tpu-platform deployer of {stack}",
        project=cfg.project,
        opts=shared.after_apis,
    )
    member = _member(deployer)
    workflow = f"{cfg.repository}/{DEPLOY_WORKFLOW}@{cfg.deploy_ref}"
    _federate(shared, f"deployer-{stack}-federated", deployer, "deploy", f"{stack}@{workflow}")

    # The accounts and custom roles the stack uses: made here, never by its deployer.
    identities = StackIdentities.from_json(entry)
    adopting = stack in cfg.adopt
    accounts: dict[str, gcp.serviceaccount.Account] = {}
    for spec in identities.accounts:
        accounts[spec.account_id] = gcp.serviceaccount.Account(
            f"{stack}-account-{spec.account_id}",
            account_id=spec.account_id,
            display_name=spec.display_name,
            description=spec.description,
            project=project,
            opts=pulumi.ResourceOptions(depends_on=env_apis, import_=spec.name(project) if adopting else None),
        )
    for spec in identities.roles:
        gcp.projects.IAMCustomRole(
            f"{stack}-role-{spec.role_id}",
            project=project,
            role_id=spec.role_id,
            title=spec.title,
            description=spec.description,
            permissions=list(spec.permissions),
            opts=pulumi.ResourceOptions(depends_on=env_apis, import_=spec.name(project) if adopting else None),
        )
    # Act-as on an account is granted on the account: the deployer on those its plans attach, a
    # platform account on those it attaches at run time (the guard re-creating a node).
    actors = [("deployer", member, target) for target in entry["deployerActsAs"]] + [
        (actor, accounts[actor].email.apply(iam.service_account_member), target) for actor, target in identities.acts_as
    ]
    for who, who_member, target in actors:
        grants.append(
            gcp.serviceaccount.IAMMember(
                f"{stack}-{who}-acts-as-{target}",
                service_account_id=accounts[target].name,
                role=SERVICE_ACCOUNT_USER,
                member=who_member,
            )
        )

    role = _environment_role(
        stack,
        project,
        in_env,
        "deployer",
        "Computed from the environment's plans (bootstrap/access.json); nothing else.",
        entry["deployerPermissions"],
    )
    grants.append(
        gcp.projects.IAMMember(f"deployer-{stack}-grant", project=project, role=role.name, member=member, opts=in_env)
    )
    if entry["deployerLogPermissions"]:
        # Logging sees log buckets and views by name in a condition (conditions-resource-attributes): the deployer
        # edits the platform's own only, never `_Default` itself nor another's bucket or view.
        log_role = _environment_role(
            stack,
            project,
            in_env,
            "deployer-logs",
            "The deployer's calls on the platform's own log buckets and views, under a condition naming them.",
            entry["deployerLogPermissions"],
        )
        expression = log_names_condition(entry["deployerLogPrefixes"])
        check_condition("deployer-logs", frozenset(entry["deployerLogPermissions"]), expression)
        grants.append(
            gcp.projects.IAMMember(
                f"deployer-{stack}-logs-grant",
                project=project,
                role=log_role.name,
                member=member,
                condition=gcp.projects.IAMMemberConditionArgs(
                    title="only-platform-logs",
                    description=f"Only the {stack} stack's log buckets and views",
                    expression=expression,
                ),
                opts=in_env,
            )
        )
    grants.append(
        gcp.projects.IAMMember(
            f"deployer-{stack}-grants-only-platform-roles",
            project=project,
            role=PROJECT_IAM_ADMIN,
            member=member,
            condition=gcp.projects.IAMMemberConditionArgs(
                title="only-platform-roles",
                description=f"Grant and revoke only the roles the {stack} plan grants",
                expression=modified_grants_condition(entry["grantableRoles"]),
            ),
            opts=in_env,
        )
    )
    grants.append(
        gcp.storage.BucketIAMMember(
            f"deployer-{stack}-state",
            bucket=shared.state.name,
            role="roles/storage.objectUser",
            member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(
                title=f"own-state-{stack}",
                description=f"Only the state of stack {stack}",
                expression=state_paths_condition(cfg.state_bucket, stack),
            ),
        )
    )
    grants.append(
        gcp.storage.BucketIAMMember(
            f"deployer-{stack}-state-reads",
            bucket=shared.state.name,
            role="roles/storage.objectViewer",
            member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(
                title=f"backend-layout-{stack}",
                description="Read the backend's layout and list the stack's own folders",
                expression=state_reads_condition(cfg.state_bucket, stack),
            ),
        )
    )
    # Each environment's secrets under its own key: no deployer can decrypt another's.
    key = gcp.kms.CryptoKey(
        f"secrets-key-{stack}",
        name=f"pulumi-secrets-{stack}",
        key_ring=shared.key_ring.id,
        purpose="ENCRYPT_DECRYPT",
        rotation_period=KEY_ROTATION,
        opts=shared.kept,
    )
    grants.append(
        gcp.kms.CryptoKeyIAMMember(
            f"deployer-{stack}-secrets", crypto_key_id=key.id, role=ENCRYPTER_DECRYPTER, member=member
        )
    )
    # A preview decrypts the state's secrets (Pulumi's gcpkms provider unwraps the stack's data key).
    # A production stack keeps no secret in its stack file (infra/platform.py refuses one), since any
    # branch of the repository can run the previewer.
    grants.append(
        gcp.kms.CryptoKeyIAMMember(
            f"previewer-{stack}-secrets",
            crypto_key_id=key.id,
            role="roles/cloudkms.cryptoKeyDecrypter",
            member=_member(shared.previewer),
        )
    )
    for account_id in entry["billingAccounts"]:
        grants.append(
            gcp.billing.AccountIamMember(
                f"deployer-{stack}-billing-{account_id}",
                billing_account_id=account_id,
                role=BILLING_DEPLOY_ROLE,
                member=member,
            )
        )

    preview_role = _environment_role(
        stack,
        project,
        in_env,
        "previewer",
        "The reads of `pulumi preview --refresh` (bootstrap/access.json); no write.",
        entry["previewerPermissions"],
    )
    previewer = _member(shared.previewer)
    grants.append(
        gcp.projects.IAMMember(
            f"previewer-{stack}-grant", project=project, role=preview_role.name, member=previewer, opts=in_env
        )
    )
    reads = ObjectReads(**{k: tuple(v) for k, v in entry["previewerObjectReads"].items()})
    if reads.objects or reads.listings:
        # Cloud Storage honours resource.name in conditions: the previewer reads the platform's own
        # objects (packaged sources, the guard's archive, completion markers), never data or models.
        grants.append(
            gcp.projects.IAMMember(
                f"previewer-{stack}-object-reads",
                project=project,
                role="roles/storage.objectViewer",
                member=previewer,
                condition=gcp.projects.IAMMemberConditionArgs(
                    title="refresh-reads-only",
                    description="Only the objects a refresh of the stack reads",
                    expression=object_reads_condition(reads),
                ),
                opts=in_env,
            )
        )
    _agents(stack, project, entry, env_apis)
    return deployer.email, key.id.apply(lambda key_id: f"gcpkms://{key_id}")


def _agents(stack: str, project: str, entry: dict[str, Any], apis: Sequence[pulumi.Resource]) -> None:
    in_env = pulumi.ResourceOptions(depends_on=list(apis))
    env_apis: list[pulumi.Resource] = list(apis)
    agent_apis = {grant["agent"] for grant in entry["agentGrants"]} - {"storage.googleapis.com"}
    for api in sorted(agent_apis):  # an agent is generated only where its API is on
        env_apis.append(
            gcp.projects.Service(
                f"{stack}-api-{api.split('.')[0]}", project=project, service=api, disable_on_destroy=False
            )
        )
    for grant in entry["agentGrants"]:
        # Google's agents of the environment, with roles the deployer may not grant (they hold
        # act-as and token rights): provisioned and granted here, before the first deploy.
        short = grant["agent"].split(".")[0]
        if grant["agent"] == "storage.googleapis.com":
            agent_member = gcp.storage.get_project_service_account_output(
                project=project, opts=pulumi.InvokeOutputOptions(depends_on=env_apis)
            ).member
        else:
            identity = gcp.projects.ServiceIdentity(
                f"{stack}-{short}-agent",
                project=project,
                service=grant["agent"],
                opts=pulumi.ResourceOptions(depends_on=env_apis),
            )
            agent_member = identity.member
        gcp.projects.IAMMember(
            f"{stack}-{short}-agent-{grant['role'].rsplit('.', 1)[-1]}",
            project=project,
            role=grant["role"],
            member=agent_member,
            opts=in_env,
        )
    for index, grant in enumerate(entry["cmekKeys"]):
        # The environment's Google agents use keys kept in another project (a security team's); the
        # grant is made here so that the deployer needs no right on those keys.
        if grant["agent"] == "storage.googleapis.com":
            key_user = gcp.storage.get_project_service_account_output(
                project=project, opts=pulumi.InvokeOutputOptions(depends_on=env_apis)
            ).member
        else:  # Pub/Sub's agent, provisioned here (its API on first), as Eventarc's above
            api = gcp.projects.Service(
                f"{stack}-api-cmek-{index}", project=project, service=grant["agent"], disable_on_destroy=False
            )
            key_user = gcp.projects.ServiceIdentity(
                f"{stack}-cmek-{index}-identity",
                project=project,
                service=grant["agent"],
                opts=pulumi.ResourceOptions(depends_on=[*env_apis, api]),
            ).member
        gcp.kms.CryptoKeyIAMMember(
            f"{stack}-cmek-{index}-{grant['agent'].split('.')[0]}-agent",
            crypto_key_id=grant["key"],
            role=ENCRYPTER_DECRYPTER,
            member=key_user,
        )
