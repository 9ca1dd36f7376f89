"""Shared fixtures: the small fixture stack (tests/stacks/Pulumi.small.yaml) and its cached plan.

Behaviour tests vary the fixture stacks (tests/stacks/), so editing dev or prod breaks only the tests of
the shipped stacks' own contract: their inventories and golden plans (tests/test_program.py,
tests/test_golden.py), and what the bootstrap makes for them (tests/test_access.py).
"""

from __future__ import annotations

import pytest

from tests.sandbox import Vm
from tests.support import fixture_config, plan
from tools.offline.runner import PlanResult


@pytest.fixture
def small_config() -> dict[str, str]:
    return fixture_config("small")


@pytest.fixture
def small_plan() -> PlanResult:
    return plan(fixture_config("small"), "small")


@pytest.fixture(autouse=True)
def _no_vm_outlives_its_test():
    yield
    Vm.shut_down_all()
