"""The two examples of the docs that show the shipped dev stack's own output: the error a bad runtime gives
(docs/offline-plan.md) and the cost table (docs/cost-and-lifecycle.md).

Dev is an example the team owns, so these change when the team edits it; `golden --write`, which the docs
say to run after editing a stack, rewrites them with the golden plans. tests/test_readme_examples.py
checks that each is what the command prints."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pulumi

from infra.config.problems import ConfigError
from infra.config.stackfile import ROOT, StackFileError, stack_of
from infra.cost import cost_table
from tools.offline.render import error_text
from tools.offline.runner import plan_stack

DEV = ROOT / "Pulumi.dev.yaml"
ERROR_PAGE = ROOT / "docs" / "offline-plan.md"
COST_PAGE = ROOT / "docs" / "cost-and-lifecycle.md"
# The marker names the edit: `<!-- example: Pulumi.dev.yaml with KEY: VALUE (...) -->`.
ERROR_MARKER = re.compile(r"<!-- example: Pulumi\.dev\.yaml with (\w+): (\S+) \(")
COST_MARKER = "<!-- example: the cost table of `make plan` (dev)"


def dev_with(key: str, value: str) -> str:
    """Pulumi.dev.yaml with its first `key:` set to `value`: the error example's edit."""
    edited, count = re.subn(rf"(\n\s+{key}: )\S+", rf"\g<1>{value}", DEV.read_text(), count=1)
    if not count:
        raise SystemExit(f"Pulumi.dev.yaml sets no {key}, which docs/offline-plan.md's error example changes")
    return edited


def error_example(key: str, value: str) -> str:
    """What `python -m tools.offline plan --stack-file` prints for dev with that edit (its stderr; the test
    of the example runs the command itself and compares)."""
    with tempfile.TemporaryDirectory() as folder:
        draft = Path(folder) / DEV.name
        draft.write_text(dev_with(key, value))
        try:
            plan_stack(stack_of(draft), draft)
        except (ConfigError, StackFileError, pulumi.RunError) as error:
            return error_text(error) + "\n"
    raise SystemExit(f"dev with {key}: {value} plans: choose an edit that dev refuses")


def dev_cost_table() -> str:
    return cost_table(plan_stack("dev").outputs["costEstimate"]) + "\n"


def _with_block(page: str, start: int, content: str) -> str:
    """The page with the fenced block after `start` holding `content` instead."""
    opening = page.index("```", start)
    body = page.index("\n", opening) + 1
    closing = page.index("```", body)
    return page[:body] + content + page[closing:]


def write() -> list[Path]:
    """Rewrite both examples from dev as it is now; return the pages that changed."""
    changed = []
    page = ERROR_PAGE.read_text()
    marker = ERROR_MARKER.search(page)
    if marker is None:
        raise SystemExit(f"{ERROR_PAGE.relative_to(ROOT)} lost its error example's marker")
    new = _with_block(page, marker.end(), error_example(*marker.groups()))
    if new != page:
        ERROR_PAGE.write_text(new)
        changed.append(ERROR_PAGE)
    page = COST_PAGE.read_text()
    if COST_MARKER not in page:
        raise SystemExit(f"{COST_PAGE.relative_to(ROOT)} lost its cost table's marker")
    new = _with_block(page, page.index(COST_MARKER), dev_cost_table())
    if new != page:
        COST_PAGE.write_text(new)
        changed.append(COST_PAGE)
    return changed
