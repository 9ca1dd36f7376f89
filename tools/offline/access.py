"""The CI identities' permissions, computed from the shipped stacks' offline plans.

`python -m tools.offline access --write` regenerates `bootstrap/access.json`, which the bootstrap
reads to build each environment's deployer and previewer roles; a test fails when the file and the
plans drift apart (a change that needs a new permission then says so in review, and the bootstrap
is applied before the deploy that needs it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.access.environment import EnvironmentAccess, environment_access
from infra.access.model import Declared, custom_roles, grants_to
from infra.config import parse_stack_config
from tools.offline.runner import PlanResult, plan_stack
from tools.offline.stackfile import ROOT, available_stacks, read_stack_config

ACCESS_FILE = ROOT / "bootstrap" / "access.json"


def declared(result: PlanResult) -> list[Declared]:
    return [Declared(r.type, r.name, r.inputs) for r in result.resources if r.custom]


def quota_project(config: dict[str, str]) -> str | None:
    """The project X-Goog-User-Project names when the stack turns `gcp:userProjectOverride` on."""
    if str(config.get("gcp:userProjectOverride", "")).lower() != "true":
        return None
    return config.get("gcp:billingProject") or config.get("gcp:project")


def access_of(stack: str, result: PlanResult | None = None, config: dict[str, str] | None = None) -> EnvironmentAccess:
    """`config`: the stack's raw config when it comes from a draft file, not `Pulumi.<stack>.yaml` here."""
    result = result or plan_stack(stack)
    config = config if config is not None else (result.config or read_stack_config(stack))
    return environment_access(stack, result.project, declared(result), result.invokes, quota_project(config))


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


def generate(stacks: list[str] | None = None, plan: Callable[[str], PlanResult] = plan_stack) -> dict[str, Any]:
    """`plan`: how to get a stack's plan (the tests pass their cached one)."""
    return {
        stack: {**access_of(stack, plan(stack)).as_json(), "cmekKeys": cmek_keys(stack)}
        for stack in (stacks or available_stacks())
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write(path: Path = ACCESS_FILE) -> None:
    path.write_text(render(generate()))


def _short(scope: str) -> str:
    return scope.split("/serviceAccounts/")[-1].split("@")[0] if "/serviceAccounts/" in scope else scope


def who_can_do_what(result: PlanResult, stack_file: Path | None = None) -> str:
    """The plan's identities and what each may do, for reviewers: the deployer and previewer as
    computed from this plan, then every account the plan creates with each of its grants."""
    config = read_stack_config(result.stack, ROOT, stack_file)
    access = access_of(result.stack, result, config)
    lines = ["Who can do what (computed from Google's role data in reference/gcp-iam):"]
    deployer = config.get("tpu-platform:deployer") or "(no tpu-platform:deployer set)"
    resources = declared(result)
    acts_as = sorted(
        str(r.inputs.get("serviceAccountId", "")).rsplit("/", 1)[-1].split("@")[0]
        for r in resources
        if r.type == "gcp:serviceaccount/iAMMember:IAMMember" and r.inputs.get("member") == f"serviceAccount:{deployer}"
    )
    lines.append(
        f"  deployer   {deployer}: custom role of {len(access.deployer_permissions)} permissions on {access.project}; "
        f"may grant only {len(access.grantable_roles)} roles; acts as {', '.join(acts_as) or 'nothing'}; "
        f"billing.costsManager on {', '.join(access.billing_accounts) or 'no billing account'}"
    )
    lines.append(
        f"  previewer  {len(access.previewer_permissions)} read permissions on {access.project}, "
        "state read-only, secrets decrypt-only; writes nothing"
    )
    custom = custom_roles(resources, result.project)
    accounts = [r for r in resources if r.type == "gcp:serviceaccount/account:Account"]
    for account in accounts:
        email = f"{account.inputs['accountId']}@{result.project}.iam.gserviceaccount.com"
        grants = []
        for grant in grants_to(f"serviceAccount:{email}", resources, result.project, custom):
            where = _short(grant.scope)
            condition = " (own prefix)" if grant.condition else ""
            role = grant.role.rsplit("/", 1)[-1]
            grants.append(f"{role} on {where}{condition} [{len(grant.permissions)}]")
        lines.append(f"  {account.inputs['accountId']:<24} " + ("; ".join(grants) or "no grants"))
    return "\n".join(lines)
