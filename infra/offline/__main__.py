"""`python -m infra.offline plan [--stack dev] [--json]`: what `pulumi up` would create, offline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pulumi

from infra.offline.access import ACCESS_FILE, who_can_do_what
from infra.offline.access import generate as generate_access
from infra.offline.access import render as render_access
from infra.offline.diff import diff_markdown
from infra.offline.policy_check import check_policies
from infra.offline.render import to_json, to_text
from infra.offline.runner import plan_stack
from infra.offline.stackfile import ROOT, StackFileError, available_stacks, stack_of
from infra.schema import ConfigError
from policy.policies import RULES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.offline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="run the program under mocks and print the planned resources")
    plan.add_argument("--stack", default="dev", help=f"stack file to plan (here: {', '.join(available_stacks())})")
    plan.add_argument("--stack-file", type=Path, help="plan this Pulumi.<stack>.yaml instead (e.g. a draft)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    access = commands.add_parser("access", help="CI identities' permissions computed from every stack's plan")
    access.add_argument("--write", action="store_true", help=f"rewrite {ACCESS_FILE.relative_to(ROOT)}")
    compare = commands.add_parser("diff", help="Markdown summary of the change between two `plan --json` files")
    compare.add_argument("base", type=Path)
    compare.add_argument("head", type=Path)
    args = parser.parse_args(argv)
    if args.command == "access":
        text = render_access(generate_access())
        if args.write:
            ACCESS_FILE.write_text(text)
        else:
            print(text, end="")
        return 0
    if args.command == "diff":
        try:
            base, head = (json.loads(p.read_text()) for p in (args.base, args.head))
        except (OSError, json.JSONDecodeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(diff_markdown(base, head), end="")
        return 0

    try:
        stack = stack_of(args.stack_file) if args.stack_file else args.stack
        result = plan_stack(stack, args.stack_file)
    except (ConfigError, StackFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except pulumi.RunError as error:  # the program's own config error, as `pulumi up` would show it
        print(f"error: {error}", file=sys.stderr)
        return 2

    violations = check_policies(result)
    if args.json:
        json.dump(to_json(result, [v.as_dict() for v in violations]), sys.stdout, indent=2, sort_keys=True, default=str)
        print()
    else:
        section = (
            "Policy violations:\n" + "\n".join(f"  - {v}" for v in violations)
            if violations
            else (f"Policies: all {len(RULES)} rules of the policy pack pass.")
        )
        print(to_text(result, [section, who_can_do_what(result)]), end="")
    mandatory = [v for v in violations if v.enforcement == "mandatory"]
    if mandatory:
        print(
            f"error: {len(mandatory)} mandatory policy violation(s); `pulumi preview --policy-pack policy`"
            " would refuse this stack",
            file=sys.stderr,
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
