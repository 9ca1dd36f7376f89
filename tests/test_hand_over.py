"""Upgrading a stack that made its own accounts and roles: nothing live is deleted, the bootstrap adopts them.

The state an upgrade starts from is the shipped stacks' plan of that time (tests/snapshots/*.before-
bootstrap-identities.json), exported as Pulumi keeps state. A `pulumi up` of today's program deletes
what the state has and the program no longer declares, unless the state retains it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from infra.access.environment import BOOTSTRAP_TYPES, RETIRED_PROJECT_ROLES
from tests.support import shipped_plan
from tests.test_bootstrap import bootstrap_config
from tests.test_bootstrap import plan as plan_bootstrap
from tools import hand_over
from tools.offline import diff
from tools.offline.access import ACCESS_FILE
from tools.offline.render import to_json

SNAPSHOTS = Path(__file__).parent / "snapshots"
STACKS = ("dev", "prod")


def exported(stack: str) -> dict:
    """The state of a stack last deployed when it made its own accounts, as `pulumi stack export` writes it."""
    plan = json.loads((SNAPSHOTS / f"{stack}.before-bootstrap-identities.json").read_text())
    resources = [
        {
            "urn": r["urn"],
            "type": r["type"],
            "custom": not r["type"].startswith("tpu-platform:"),
            "inputs": r["inputs"],
            **({"retainOnDelete": True} if r["options"]["retainOnDelete"] else {}),
        }
        for r in plan["resources"]
    ]
    return {"version": 3, "deployment": {"manifest": {}, "resources": resources}}


def deleted_by_up(state: dict, stack: str) -> list[dict]:
    """What `pulumi up` of today's program would delete from the cloud: gone from the program (renames
    followed), and not retained."""
    head = diff._resources(to_json(shipped_plan(stack)))
    before = {r["urn"]: r for r in state["deployment"]["resources"]}
    renamed = {old for old, _ in diff._follow_renames(diff._resources({"resources": list(before.values())}), head)}
    return [r for urn, r in before.items() if urn not in head and urn not in renamed and not r.get("retainOnDelete")]


def revoked(resource: dict) -> bool:
    """A grant this version revokes on purpose (the deployer may: RETIRED_PROJECT_ROLES)."""
    return resource["inputs"].get("role") in RETIRED_PROJECT_ROLES


def retired_rule(resource: dict) -> bool:
    """The firewall rule that let every TPU VM reach every other, which one rule per multi-host job replaces
    (infra/network.py): deleted on purpose."""
    return resource["type"] == "gcp:compute/firewall:Firewall" and resource["inputs"]["name"].endswith(
        "-between-tpu-workers"
    )


@pytest.mark.parametrize("stack", STACKS)
def test_a_plain_up_would_delete_live_accounts_roles_and_grants(stack):
    """Why the step exists: without it, the accounts under running VMs are deleted."""
    deleted = [r for r in deleted_by_up(exported(stack), stack) if not revoked(r) and not retired_rule(r)]
    assert {r["type"] for r in deleted} == set(BOOTSTRAP_TYPES)
    assert any(r["inputs"].get("accountId") == f"tpu-mnist-{stack}" for r in deleted)


@pytest.mark.parametrize("stack", STACKS)
def test_after_the_hand_over_an_up_deletes_nothing(stack):
    state = exported(stack)
    marked = hand_over.hand_over(state)
    # Only what this version removes on purpose: the build account's project-wide Cloud Run Builder, and the
    # firewall rule between every TPU VM.
    gone = deleted_by_up(state, stack)
    assert [r["inputs"]["role"] for r in gone if not retired_rule(r)] == ["roles/run.builder"]
    assert [r["inputs"]["name"] for r in gone if retired_rule(r)] == [f"tpu-{stack}-between-tpu-workers"]
    # Exactly the accounts, roles and act-as grants; nothing else is kept that would have been deleted.
    types = {r["urn"]: r["type"] for r in exported(stack)["deployment"]["resources"]}
    assert marked and all(types[urn] in BOOTSTRAP_TYPES for urn in marked)
    # And nothing else is replaced on the way (a new binding of a grant, a re-created VM). Content digests
    # do not count: a changed agent or example folder is a new archive `sources/<sha256>.tar.gz`, and a
    # new read grant naming it, by design, whatever the hand-over does.
    base = json.loads((SNAPSHOTS / f"{stack}.before-bootstrap-identities.json").read_text())
    before, after = diff._resources(base), diff._resources(to_json(shipped_plan(stack)))
    assert [c.urn for c in diff._changes(before, after) if replaced_beyond_digests(c)] == []


def replaced_beyond_digests(change: diff.Change) -> bool:
    def undigested(value: object) -> str:
        text = re.sub(r"[0-9a-f]{16,64}", "<sha256>", json.dumps(value, sort_keys=True, default=str))
        # The agent's archive moved from `sources/` to the deployer's own `runners/` (run_contract/paths.py): a new
        # object name, as a new digest is.
        text = text.replace("runners/<sha256>.tar.gz", "sources/<sha256>.tar.gz")
        # A read grant's condition names each content-named archive the account reads: one more of them (the
        # agent's wheelhouse, since the agent has its own environment) is content too.
        return re.sub(r'(resource\.name == \\"[^"\\]*<sha256>\.tar\.gz\\")( \|\| \1)+', r"\1", text)

    # The members of an archive named by its content (the guard's `tpu-guard-<digest>.zip`) are content too.
    return any(
        effect == "replace" and not path.startswith("inputs.source.archive.") and undigested(old) != undigested(new)
        for path, old, new, effect in change.properties
    )


@pytest.mark.parametrize("stack", STACKS)
def test_without_the_hand_over_the_new_deployer_cannot_delete_them_either(stack):
    """A deploy that skipped the step fails at the deletes, rather than deleting: no such right remains."""
    held = set(json.loads(ACCESS_FILE.read_text())[stack]["deployerPermissions"])
    assert not held & {"iam.serviceAccounts.delete", "iam.roles.delete", "iam.serviceAccounts.setIamPolicy"}


def test_the_tool_rewrites_the_export_and_refuses_what_is_not_one(tmp_path, capsys):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(exported("dev")))
    assert hand_over.main([str(path)]) == 0
    again = json.loads(path.read_text())
    retained = [r for r in again["deployment"]["resources"] if r.get("retainOnDelete")]
    assert {r["type"] for r in retained} >= set(BOOTSTRAP_TYPES)
    assert "resources handed over" in capsys.readouterr().err
    path.write_text("[]")
    assert hand_over.main([str(path)]) == 2
    assert "not a `pulumi stack export` document" in capsys.readouterr().err


def test_the_bootstrap_adopts_the_accounts_and_roles_as_the_stack_made_them():
    """`adopt: [dev, prod]` imports them (Pulumi's `import` option: the inputs must match what exists, or
    the import fails), so the bootstrap's declarations are the stack's old ones, value for value."""
    adopting = plan_bootstrap(bootstrap_config(adopt=json.dumps(["dev", "prod"])))
    for stack in STACKS:
        old = json.loads((SNAPSHOTS / f"{stack}.before-bootstrap-identities.json").read_text())["resources"]
        project = old[0]["inputs"].get("project") or shipped_plan(stack).project
        made = {
            r.inputs.get("accountId") or r.inputs.get("roleId"): r
            for r in adopting.resources
            if r.type in BOOTSTRAP_TYPES[:2] and r.inputs.get("project") == project
        }
        for before in (r for r in old if r["type"] in BOOTSTRAP_TYPES[:2]):
            key = before["inputs"].get("accountId") or before["inputs"].get("roleId")
            now = made[key]
            kept = {k: v for k, v in before["inputs"].items() if k != "permissions"}
            assert {k: now.inputs.get(k) for k in kept} == kept, key
            if "permissions" in before["inputs"]:
                assert sorted(now.inputs["permissions"]) == sorted(before["inputs"]["permissions"]), key
            kind = "serviceAccounts" if "accountId" in before["inputs"] else "roles"
            name = f"{key}@{project}.iam.gserviceaccount.com" if kind == "serviceAccounts" else key
            assert now.import_id == f"projects/{project}/{kind}/{name}"
    # Without `adopt` (a fresh project), nothing is imported: the accounts do not exist yet.
    assert not [r for r in plan_bootstrap().resources if r.import_id]


def test_adopt_names_only_environments_of_the_bootstrap():
    from bootstrap.program import parse_bootstrap_config
    from infra.config.problems import ConfigError

    with pytest.raises(ConfigError, match="staging"):
        parse_bootstrap_config("acme", bootstrap_config(adopt=json.dumps(["staging"])))
    assert parse_bootstrap_config("acme", bootstrap_config(adopt='["dev"]')).adopt == ("dev",)
