"""Shared fixtures: the small fixture stack (tests/stacks/Pulumi.small.yaml) and its cached plan.

Behaviour tests vary the fixture stacks (tests/stacks/), so editing dev or prod breaks only the tests of
the shipped stacks' own contract: their inventories and golden plans (tests/test_program.py,
tests/test_golden.py), and what the bootstrap makes for them (tests/test_access.py).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.sandbox import Vm
from tests.support import fixture_config, plan
from tools.offline.runner import PlanResult

# Property tests judge behaviour, never speed: no per-example deadline and no "generation is slow"
# check, which fail on a loaded machine (the tests share two cores with the workers of `pytest -n`).
settings.register_profile("project", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("project")


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
