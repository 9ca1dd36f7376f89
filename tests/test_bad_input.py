"""Property-based: whatever a stack file holds, the plan ends in one ConfigError, never a crash.

Every setting, at every depth, is replaced by generated junk (wrong types, empty values, huge
numbers, unknown strings). Parsing must either accept it or raise ConfigError whose every line names
the stack and a key path; no other exception may escape (it would reach the user as a traceback).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import parse_stack_config
from infra.schema import ConfigError
from infra.tpu.metadata import vm_metadata
from tests.support import NS, stack_config

JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**12), max_value=10**12)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "v4-8", "us-central1-a", "roles/editor", "10.0.0.0/8", "2.15.0", "spot"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
BASE = {stack: stack_config(stack) for stack in ("dev", "prod")}


def paths(value, prefix=()):
    """Every (path) inside a decoded stack setting."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


SETTINGS = [
    (stack, key, path)
    for stack, raw in BASE.items()
    for key, text in raw.items()
    if key.startswith(f"{NS}:")
    for path in (paths(json.loads(text)) if text.startswith(("[", "{")) else [()])
]


def replaced(raw: dict[str, str], key: str, path: tuple, junk) -> dict[str, str]:
    if not path:
        return {**raw, key: junk if isinstance(junk, str) else json.dumps(junk)}
    value = json.loads(raw[key])
    target = value
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = junk
    return {**raw, key: json.dumps(value)}


def parse_all_the_way(stack: str, raw: dict[str, str]) -> None:
    """What the program does before declaring resources: parse, then render the VMs' metadata."""
    vm_metadata(parse_stack_config(stack, raw))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SETTINGS), JUNK)
def test_any_junk_in_any_setting_is_a_clean_config_error(setting, junk):
    stack, key, path = setting
    try:
        parse_all_the_way(stack, replaced(BASE[stack], key, path, junk))
    except ConfigError as error:
        assert error.problems
        assert str(error).startswith(f"stack '{stack}'")
        for problem in error.problems:
            assert problem.key and problem.allowed


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=20), max_size=4))
def test_unknown_keys_anywhere_at_top_level_are_named(extra):
    raw = {**BASE["dev"], **{f"{NS}:{k}": v for k, v in extra.items()}}
    unknown = {f"{NS}:{k}" for k in extra} - set(BASE["dev"])
    if not unknown:
        return
    try:
        parse_stack_config("dev", raw)
    except ConfigError as error:
        named = {p.key for p in error.problems}
        assert unknown <= named | {f"{NS}:{k}" for k in ("production", "namePrefix", "owner", "billingAccount")}
        return
    raise AssertionError(f"unknown keys {unknown} were accepted")
