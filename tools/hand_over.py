"""Hand a stack's service accounts, custom roles and act-as grants over to the bootstrap, in its state.

Stacks made their own accounts and roles before the bootstrap did. The program no longer declares them,
so a plain `pulumi up` of such a stack would delete them, live, under its running VMs and functions (a
deleted account's grants do not come back with a new account of the same name). Pulumi deletes a
resource that is gone from the program unless its state says `retainOnDelete`; then it only forgets it
(Pulumi, "Resource options: retainOnDelete"). This tool sets that flag on exactly those resources, in a
`pulumi stack export`, for `pulumi stack import`:

    pulumi stack export --stack dev --file dev.json
    python -m tools.hand_over dev.json
    pulumi stack import --stack dev --file dev.json

and the bootstrap adopts the same accounts and roles (`adopt: [dev]` in its stack file: docs/ci-and-bootstrap.md,
"Upgrading a stack that made its own accounts"). Without this step the deploy fails rather than deletes:
the new deployer holds no right to delete an account, a role or an account's IAM.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.access.environment import BOOTSTRAP_TYPES


def hand_over(export: Mapping[str, Any]) -> list[str]:
    """Mark, in a `pulumi stack export` document (in place), every resource the bootstrap now makes as
    retained on delete; the URNs it marked, in state order."""
    marked = []
    for resource in export.get("deployment", {}).get("resources") or []:
        if resource.get("type") in BOOTSTRAP_TYPES:
            resource["retainOnDelete"] = True
            marked.append(resource["urn"])
    return marked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.hand_over", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("state", type=Path, help="a file written by `pulumi stack export --file`; rewritten in place")
    args = parser.parse_args(argv)
    try:
        export = json.loads(args.state.read_text())
    except (OSError, json.JSONDecodeError) as error:
        print(f"error: {args.state}: {error}; pass a file written by `pulumi stack export --file`", file=sys.stderr)
        return 2
    if not isinstance(export, dict) or "deployment" not in export:
        print(f"error: {args.state} is not a `pulumi stack export` document (no deployment)", file=sys.stderr)
        return 2
    marked = hand_over(export)
    args.state.write_text(json.dumps(export, indent=4) + "\n")
    for urn in marked:
        print(f"kept on delete: {urn}", file=sys.stderr)
    print(f"{len(marked)} resources handed over; now `pulumi stack import --file {args.state}`", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
