"""Golden plans of the shipped stacks: any property drift shows up here, not only a change in counts.

An intended change: `make golden` (`python -m tools.offline golden --write`), then review the JSON diff.
"""

from __future__ import annotations

import difflib

import pytest

from infra.config.stackfile import available_stacks
from tests.support import plan, stack_config
from tools.offline.golden import GOLDEN, golden_path, snapshot


def test_every_shipped_stack_has_a_golden_plan():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == available_stacks()


@pytest.mark.parametrize("stack", available_stacks())
def test_plan_matches_its_golden_file(stack):
    expected = golden_path(stack).read_text()
    actual = snapshot(plan(stack_config(stack), stack))
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), f"tests/golden/{stack}.json", "plan", lineterm="", n=2
        )
        shown = "\n".join(list(diff)[:60])
        pytest.fail(f"the {stack} plan drifted from its golden file; if intended, run `make golden`:\n{shown}")


def test_a_changed_property_is_caught():
    """Drift in one nested input, with counts unchanged, fails the comparison."""
    raw = stack_config("dev")
    edited = raw | {"tpu-platform:network": raw["tpu-platform:network"].replace("0.5", "0.25")}
    assert edited != raw
    assert snapshot(plan(edited, "dev")) != golden_path("dev").read_text()
