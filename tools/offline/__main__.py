"""`python -m tools.offline plan [--stack dev] [--json] [--gke-admin]`: what `pulumi up` would create, offline.

`--gke-admin` plans the GKE engine's admin phase (gke-admin/) for the stack file instead: it needs the
JobSet and Kueue release manifests, which an offline plan does not download; it reads local copies from
the folder `TPU_PLATFORM_CONTROLLER_MANIFESTS` names, each checked against its pinned sha256.

Also `diff BASE HEAD` (the PR comment from two `plan --json` files), `render` (the start-up
script a TPU VM will run), `schema [--write]` (the stack files' JSON Schema and settings table) and
`whatif` (a job's expected cost and time, and the checkpoint interval that wastes least).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pulumi

from infra.config import docs, parse_stack_config
from infra.config.problems import ConfigError
from infra.config.stackfile import ROOT, StackFileError, available_stacks, read_stack_config, stack_of
from infra.gke.admin import GKE_ADMIN_PROJECT
from infra.gke.controllers import MANIFESTS_ENV, manifests_needed
from infra.tpu.metadata import vm_metadata
from policy.policies import RULES
from tools.offline.access import ACCESS_FILE, who_can_do_what
from tools.offline.access import generate as generate_access
from tools.offline.access import render as render_access
from tools.offline.deploys import plan_deploys
from tools.offline.dev_examples import write as write_dev_examples
from tools.offline.diff import as_plan, diff_markdown, unreadable_markdown
from tools.offline.golden import snapshot
from tools.offline.golden import write as write_golden
from tools.offline.policy_check import check_policies
from tools.offline.render import error_lines, error_text, to_json, to_text
from tools.offline.runner import plan_stack
from tools.offline.whatif import add_arguments as whatif_arguments
from tools.offline.whatif import run as run_whatif


def _stack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", default="dev", help=f"stack file to read (here: {', '.join(available_stacks())})")
    parser.add_argument("--stack-file", type=Path, help="read this Pulumi.<stack>.yaml instead (e.g. a draft)")


def _diff(base_path: Path, head_path: Path) -> int:
    plans = []
    for which, path in (("base", base_path), ("head", head_path)):
        try:
            plans.append(as_plan(json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError) as error:
            if which == "base":
                plans.append({})  # a base that cannot be planned: everything in the head is new
                continue
            print(unreadable_markdown(which, str(error).splitlines()[0] if str(error) else "empty"), end="")
            return 0
    print(diff_markdown(plans[0], plans[1]), end="")
    return 0


def _render(stack_name: str, stack_file: Path | None, vm_name: str | None, attribute: str) -> int:
    try:
        stack = stack_of(stack_file) if stack_file else stack_name
        cfg = parse_stack_config(stack, read_stack_config(stack, ROOT, stack_file))
        metadata = vm_metadata(cfg)
    except (ConfigError, StackFileError) as error:
        print(error_text(error), file=sys.stderr)
        return 2
    names = sorted(metadata)
    if not names:
        print(f"error: stack '{stack}' declares no TPU VMs", file=sys.stderr)
        return 2
    if vm_name is None and len(names) > 1:
        print(f"error: stack '{stack}' has several TPU VMs; pass --vm, one of {', '.join(names)}", file=sys.stderr)
        return 2
    vm = vm_name or names[0]
    if vm not in metadata:
        print(f"error: stack '{stack}' has no TPU VM '{vm}'; its TPU VMs: {', '.join(names)}", file=sys.stderr)
        return 2
    print(metadata[vm][attribute], end="" if metadata[vm][attribute].endswith("\n") else "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.offline", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="run the program under mocks and print the planned resources")
    _stack_arguments(plan)
    plan.add_argument("--json", action="store_true", help="print the plan as JSON (a bad stack: its errors)")
    plan.add_argument(
        "--gke-admin", action="store_true", help=f"plan the GKE admin phase (gke-admin/); needs {MANIFESTS_ENV}"
    )
    access = commands.add_parser("access", help="CI identities' permissions computed from every stack's plan")
    access.add_argument("--write", action="store_true", help=f"rewrite {ACCESS_FILE.relative_to(ROOT)}")
    compare = commands.add_parser("diff", help="Markdown summary of the change between two `plan --json` files")
    compare.add_argument("base", type=Path)
    compare.add_argument("head", type=Path)
    render = commands.add_parser("render", help="print the start-up script a TPU VM of the stack will run")
    _stack_arguments(render)
    render.add_argument("--vm", help="the TPU VM's name (needed when the stack has several)")
    render.add_argument("--env", action="store_true", help="print the run settings it reads instead")
    schema = commands.add_parser("schema", help="the JSON Schema of stack files and the settings table of the docs")
    schema.add_argument("--write", action="store_true", help="regenerate schema/stack.schema.json and the table")
    golden = commands.add_parser("golden", help="each shipped stack's plan as JSON, as tests/golden/ keeps it")
    golden.add_argument("--write", action="store_true", help="regenerate tests/golden/ and dev's examples in docs/")
    whatif = commands.add_parser("whatif", help="a job's expected cost and time, and the interval that wastes least")
    whatif_arguments(whatif)
    args = parser.parse_args(argv)
    if args.command == "access":
        text = render_access(generate_access())
        if args.write:
            ACCESS_FILE.write_text(text)
        else:
            print(text, end="")
        return 0
    if args.command == "golden":
        if args.write:
            for path in [*write_golden(), *write_dev_examples()]:
                print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
        else:
            for stack in available_stacks():
                print(snapshot(plan_stack(stack)), end="")
        return 0
    if args.command == "schema":
        if args.write:
            for path in docs.write():
                print(f"wrote {path.relative_to(docs.ROOT)}", file=sys.stderr)
        else:
            print(docs.schema_text(), end="")
        return 0
    if args.command == "diff":
        return _diff(args.base, args.head)
    if args.command == "whatif":
        code, text = run_whatif(args)
        print(text, file=sys.stderr if code else sys.stdout)
        return code
    if args.command == "render":
        return _render(args.stack, args.stack_file, args.vm, "tpu-platform-env" if args.env else "startup-script")

    stack = args.stack
    if args.gke_admin and not os.environ.get(MANIFESTS_ENV):
        print(f"error: {manifests_needed()}", file=sys.stderr)
        return 2
    try:
        stack = stack_of(args.stack_file) if args.stack_file else args.stack
        if args.gke_admin:
            result = plan_stack(stack, args.stack_file, project=GKE_ADMIN_PROJECT)
        else:
            result = plan_stack(stack, args.stack_file)
    except (ConfigError, StackFileError, pulumi.RunError) as error:
        # RunError: the program's own config error, as `pulumi up` would show it.
        print(error_text(error), file=sys.stderr)
        if args.json:  # the PR diff shows these instead of posting nothing
            json.dump({"stack": stack, "errors": error_lines(error)}, sys.stdout, indent=2)
            print()
        return 2

    if args.gke_admin:  # a cluster administrator runs it: no CI identity's access to compute
        who = "Run by a cluster administrator (its own project, gke-admin/), never by CI's deployer."
        if args.json:
            json.dump(to_json(result, []), sys.stdout, indent=2, sort_keys=True, default=str)
            print()
        else:
            print(to_text(result, [who]), end="")
        return 0
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
        deploys = plan_deploys(result)
        print(to_text(result, [section, who_can_do_what(deploys)]), end="")
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
