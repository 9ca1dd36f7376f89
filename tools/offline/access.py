"""The CI identities' permissions, computed from the shipped stacks' offline plans.

`python -m tools.offline access --write` regenerates `bootstrap/access.json`, which the bootstrap
reads to build each environment's identities: the deployer's and previewer's roles, and the accounts
and custom roles the stack uses (`infra/access/accounts.py`). Each stack is planned as a first deploy
and as a later one (`tools/offline/deploys.py`), and the file holds what both need. A test fails
when the file and the plans drift apart (a change that needs a new permission, account or role then
says so in review, and the bootstrap is applied before the deploy that needs it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from infra import naming
from infra.access.accounts import StackIdentities
from infra.access.environment import EnvironmentAccess, Plan, environment_access
from infra.access.model import Declared, custom_roles, grants_to
from infra.config import parse_stack_config
from infra.config.stackfile import ROOT, available_stacks, read_stack_config
from infra.platform import stack_identities
from tools.offline.deploys import plan_deploys
from tools.offline.runner import PlanResult, plan_stack

ACCESS_FILE = ROOT / "bootstrap" / "access.json"
Deploys = Mapping[str, PlanResult]  # "fresh" and "later"


def declared(result: PlanResult) -> list[Declared]:
    """What a provider acts on: custom resources, and providers' own components (their children are the
    provider's to make, so the mocks never see them)."""
    return [Declared(r.type, r.name, r.inputs) for r in result.resources if r.custom or r.remote]


def quota_project(config: Mapping[str, str]) -> str | None:
    """The project X-Goog-User-Project names when the stack turns `gcp:userProjectOverride` on."""
    if str(config.get("gcp:userProjectOverride", "")).lower() != "true":
        return None
    return config.get("gcp:billingProject") or config.get("gcp:project")


def stack_deploys(stack: str, stack_file: Path | None = None) -> dict[str, PlanResult]:
    """The stack planned as a first deploy and as a later one."""
    return plan_deploys(plan_stack(stack, stack_file))


def identities_of(stack: str, config: Mapping[str, str]) -> StackIdentities:
    return stack_identities(parse_stack_config(stack, dict(config)))


def access_of(stack: str, deploys: Deploys | None = None, config: Mapping[str, str] | None = None) -> EnvironmentAccess:
    """`config`: the stack's raw config when it comes from a draft file, not `Pulumi.<stack>.yaml` here."""
    deploys = deploys or stack_deploys(stack)
    fresh = deploys["fresh"]
    config = config if config is not None else (fresh.config or read_stack_config(stack))
    plans = [Plan(declared(result), result.invokes) for result in deploys.values()]
    return environment_access(
        stack,
        fresh.project,
        plans,
        quota_project(config),
        identities_of(stack, config),
        naming.platform_log_prefixes(fresh.project, stack),
    )


def cmek_keys(stack: str) -> list[dict[str, str]]:
    """Keys in other projects the environment's Google agents must use, with the agent: granted by the
    bootstrap. Cloud Storage encrypts the buckets; Pub/Sub the budget topic (infra/budget.py); Artifact
    Registry the image repository (infra/artifacts.py; its agent needs the key's Encrypter/Decrypter:
    Artifact Registry, "Enable customer-managed encryption keys")."""
    cfg = parse_stack_config(stack, read_stack_config(stack))
    key = cfg.buckets.kms_key_name
    if not key:
        return []
    agents = ["storage.googleapis.com"] + (["pubsub.googleapis.com"] if cfg.budget.pubsub_topic else [])
    agents.append("artifactregistry.googleapis.com")
    return [{"key": key, "agent": agent} for agent in agents]


def generate(stacks: list[str] | None = None, deploys: Callable[[str], Deploys] = stack_deploys) -> dict[str, Any]:
    """`deploys`: how to get a stack's plans (the tests pass their cached ones)."""
    out = {}
    for stack in stacks or available_stacks():
        cfg = parse_stack_config(stack, read_stack_config(stack))
        entry = access_of(stack, deploys(stack)).as_json()
        out[stack] = {**entry, "cmekKeys": cmek_keys(stack), "production": cfg.production}
    return out


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write(path: Path = ACCESS_FILE) -> None:
    path.write_text(render(generate()))


def read_access(path: Path = ACCESS_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def _short(scope: str) -> str:
    return scope.split("/serviceAccounts/")[-1].split("@")[0] if "/serviceAccounts/" in scope else scope


def not_made(stack: str, identities: StackIdentities, access: Mapping[str, Any]) -> list[str]:
    """The accounts, roles and act-as grants the stack names that the bootstrap (as access.json has it)
    does not make: the deploy would fail on each, until the bootstrap is run with them."""
    entry = access.get(stack)
    if entry is None:
        count = f"{len(identities.accounts)} accounts and {len(identities.roles)} custom roles"
        return [
            f"stack {stack} is not in bootstrap/access.json: the bootstrap makes none of its {count}; add it to the "
            "bootstrap's environments, run `python -m tools.offline access --write` and apply the bootstrap"
        ]
    made = StackIdentities.from_json(entry)
    problems = [f"account {a.account_id}" for a in identities.accounts if a not in made.accounts]
    problems += [f"custom role {r.role_id}" for r in identities.roles if r not in made.roles]
    problems += [
        f"act-as of {actor} on {target}" for actor, target in identities.acts_as if (actor, target) not in made.acts_as
    ]
    return [
        f"{what} is not made by the bootstrap (bootstrap/access.json): run `python -m tools.offline access --write` "
        "and apply the bootstrap before deploying"
        for what in problems
    ]


def who_can_do_what(deploys: Deploys) -> str:
    """Each identity of the environment and its reach, for reviewers: the CI identities as computed from
    this stack's plans (and where they reach beyond it), then every account the stack uses."""
    fresh = deploys["fresh"]
    stack, project, config = fresh.stack, fresh.project, fresh.config  # the config the stack was planned with
    access = access_of(stack, deploys, config)
    committed = read_access()
    lines = [f"Who can do what in environment {stack} (project {project}; Google's role data in reference/gcp-iam):"]
    deployer = config.get("tpu-platform:deployer") or "(no tpu-platform:deployer set)"
    shared = sorted(
        other
        for other, entry in committed.items()
        if other != stack and set(entry.get("billingAccounts", ())) & set(access.billing_accounts)
    )
    billing = ", ".join(access.billing_accounts) or "no billing account"
    lines.append(
        f"  deployer   {deployer}: a custom role of {len(access.deployer_permissions)} permissions on {project} "
        f"(no iam.roles.*, no service-account creation or IAM); may grant only {len(access.grantable_roles)} roles "
        f"there; acts as {', '.join(access.deployer_acts_as) or 'nothing'}; its own stack's state files and "
        f"secrets key; billing.costsManager on {billing}"
        + (
            f", which also holds the budgets of {', '.join(shared)}: Google has no narrower budget grant"
            if shared
            else ""
        )
    )
    reads = access.previewer_object_reads
    lines.append(
        f"  previewer  {len(access.previewer_permissions)} read permissions on {project}; objects only "
        f"{', '.join(reads.objects) or 'none'}; every stack's state read-only; writes nothing"
    )
    identities = access.identities
    resources = declared(fresh)
    custom = custom_roles(resources, project) | {r.name(project): frozenset(r.permissions) for r in identities.roles}
    acts = {target: [a for a, t in identities.acts_as if t == target] for _, target in identities.acts_as}
    for account in identities.accounts:
        grants = []
        for grant in grants_to(account.member(project), resources, project, custom):
            where = _short(grant.scope)
            condition = " (own prefix)" if grant.condition else ""
            grants.append(f"{grant.role.rsplit('/', 1)[-1]} on {where}{condition} [{len(grant.permissions)}]")
        actors = ["deployer"] * (account.account_id in access.deployer_acts_as) + acts.get(account.account_id, [])
        attach = f"; attached by {', '.join(actors)}" if actors else ""
        lines.append(f"  {account.account_id:<24} " + ("; ".join(grants) or "no grants") + attach)
    lines += [f"  ! {problem}" for problem in not_made(stack, identities, committed)]
    return "\n".join(lines)
