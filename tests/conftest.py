"""Shared fixtures: cached plans of the shipped stacks and of the small fixture stacks (tests/stacks/).

Behaviour tests take `small_config` / `small_plan` and vary them, so editing dev or prod breaks only
the smoke tests and golden plans of the shipped stacks (tests/test_program.py, tests/test_golden.py).
"""

from __future__ import annotations

import pytest

from tests.sandbox import Vm
from tests.support import fixture_config, plan, stack_config
from tools.offline.runner import PlanResult


@pytest.fixture
def small_config() -> dict[str, str]:
    return fixture_config("small")


@pytest.fixture
def small_plan() -> PlanResult:
    return plan(fixture_config("small"), "small")


@pytest.fixture
def dev_plan() -> PlanResult:
    return plan(stack_config("dev"), "dev")


@pytest.fixture
def prod_plan() -> PlanResult:
    return plan(stack_config("prod"), "prod")


@pytest.fixture(autouse=True)
def _no_vm_outlives_its_test():
    yield
    Vm.shut_down_all()
