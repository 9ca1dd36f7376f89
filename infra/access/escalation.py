"""Which identities could widen themselves: public privilege-escalation methods against what each holds.

A method (reference/gcp-privesc/methods.json: public research, compiled with Google's current
permission names) is a set of permissions that, held together on a scope, let the holder become another
principal or gain rights it was not given. The proof asks, for every identity the bootstrap and the
stacks create or grant: does it hold every permission of one method project-wide and unconditionally,
itself or through an account it may act as? Google's own service agents are left out: Google grants
them their roles and their code is Google's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "reference" / "gcp-privesc"
# `service-<number>@gcp-sa-<service>` and the older agents' domains (Cloud Storage's `gs-project-accounts`,
# `<number>@cloudservices.gserviceaccount.com`), never an account of the project itself.
SERVICE_AGENT = re.compile(
    r"serviceAccount:(?:service-\d+@(?:gcp-sa-[a-z0-9-]+|gs-project-accounts|serverless-robot-prod)"
    r"\.iam\.gserviceaccount\.com|\d+@cloudservices\.gserviceaccount\.com)"
)
# Permissions on an account that let the holder act as it: attach it (act-as) or mint its credentials.
BECOME = frozenset(
    {
        "iam.serviceAccounts.actAs",
        "iam.serviceAccounts.getAccessToken",
        "iam.serviceAccounts.getOpenIdToken",
        "iam.serviceAccounts.signBlob",
        "iam.serviceAccounts.signJwt",
        "iam.serviceAccounts.implicitDelegation",
        "iam.serviceAccountKeys.create",
    }
)


@cache
def methods() -> dict[str, frozenset[str]]:
    """Method name -> the permissions it needs."""
    listed = json.loads((DATA / "methods.json").read_text())["methods"]
    return {method: frozenset(entry["permissions"]) for method, entry in listed.items()}


def escalations(held: Iterable[str]) -> list[str]:
    """The methods all of whose permissions are among `held`."""
    held = set(held)
    return sorted(method for method, needed in methods().items() if needed <= held)


def is_service_agent(member: str) -> bool:
    return SERVICE_AGENT.fullmatch(member) is not None


def reach(
    member: str,
    project_permissions: Mapping[str, frozenset[str]],
    becomes: Mapping[str, frozenset[str]],
) -> tuple[frozenset[str], tuple[str, ...]]:
    """What `member` holds project-wide and unconditionally, itself and through every account it can
    become (transitively), and the accounts it becomes on the way.

    `project_permissions`: member -> its unconditional project-level permissions (in one project);
    `becomes`: member -> the account members it holds a `BECOME` permission on."""
    seen, todo = {member}, [member]
    while todo:
        for account in becomes.get(todo.pop(), frozenset()):
            if account not in seen:
                seen.add(account)
                todo.append(account)
    held = frozenset(p for who in seen for p in project_permissions.get(who, frozenset()))
    return held, tuple(sorted(seen - {member}))
