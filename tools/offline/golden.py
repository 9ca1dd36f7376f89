"""Golden plans: each shipped stack's full offline plan as JSON, kept in tests/golden/ and compared by a
test, so a change to any property of any resource shows up in review, not only a
change in counts. Regenerate with `python -m tools.offline golden --write` (or `make golden`) and
read the diff before committing it.
"""

from __future__ import annotations

import json
from pathlib import Path

from infra.config.stackfile import ROOT, available_stacks
from tools.offline.render import to_json
from tools.offline.runner import PlanResult, plan_stack

GOLDEN = ROOT / "tests" / "golden"


def golden_path(stack: str) -> Path:
    return GOLDEN / f"{stack}.json"


def snapshot(result: PlanResult) -> str:
    return json.dumps(to_json(result), indent=1, sort_keys=True, default=str) + "\n"


def write() -> list[Path]:
    GOLDEN.mkdir(exist_ok=True)
    written = []
    for stack in available_stacks():
        path = golden_path(stack)
        path.write_text(snapshot(plan_stack(stack)))
        written.append(path)
    return written
