"""GCP naming rules, checked against the documented grammar with generated names."""

from __future__ import annotations

import re
import string

from hypothesis import given
from hypothesis import strategies as st

from infra import naming
from infra.config import parse_stack_config, service_account_id
from infra.schema import ConfigError
from tests.support import replace_object, stack_config, workload_settings

LOWER = string.ascii_lowercase + string.digits + "-_"


@given(st.text(alphabet=LOWER + "A.é ", max_size=70))
def test_bucket_names_follow_the_documented_rule(name):
    ok = naming.bucket_name_problem(name) is None
    documented = (
        3 <= len(name) <= 63
        and re.fullmatch(r"[a-z0-9_-]+", name) is not None
        and name[0].isalnum()
        and name[-1].isalnum()
        and not name.startswith("goog")
        and "google" not in name
        and "g00gle" not in name
    )
    assert ok == documented


@given(st.text(alphabet=LOWER, max_size=40))
def test_service_account_ids(account_id):
    ok = naming.service_account_id_problem(account_id) is None
    documented = (
        6 <= len(account_id) <= 30
        and account_id[:1].isalpha()
        and set(account_id) <= set(string.ascii_lowercase + string.digits + "-")
        and not account_id.endswith("-")
    )
    assert ok == documented


@given(st.text(alphabet=LOWER + "A", max_size=70))
def test_label_values(value):
    assert (naming.label_value_problem(value) is None) == (len(value) <= 63 and "A" not in value)


@given(st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True), st.from_regex(r"[a-z][a-z0-9]{0,11}", fullmatch=True))
def test_a_workload_is_accepted_exactly_when_its_names_are_valid(workload, stack):
    raw = replace_object(stack_config(), "workloads", {workload: workload_settings(stack_config())})
    raw = replace_object(raw, "tpuVms", [])
    names_ok = (
        naming.resource_id_problem(workload, 16) is None
        and naming.service_account_id_problem(service_account_id(workload, stack)) is None
        and all(naming.bucket_name_problem(f"acme-ml-sandbox-{stack}-{p}") is None for p in ("data", "models"))
    )
    try:
        parse_stack_config(stack, raw)
        accepted = True
    except ConfigError as error:
        accepted = False
        assert f"stack '{stack}'" in str(error)
    assert accepted == names_ok
