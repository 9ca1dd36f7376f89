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
from infra.config.problems import ConfigError
from infra.tpu.metadata import vm_metadata
from tests.support import NS, fixture_config, plan, stack_config

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
# The fuzz draws from every setting the shipped stacks hold (the widest set of real settings); the
# hostile inputs below vary the fixture stacks.
BASE = {stack: stack_config(stack) for stack in ("dev", "prod")}
SANDBOX, PRODUCTION = fixture_config("scheduled"), fixture_config("production")


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
    raw = {**SANDBOX, **{f"{NS}:{k}": v for k, v in extra.items()}}
    unknown = {f"{NS}:{k}" for k in extra} - set(SANDBOX)
    if not unknown:
        return
    try:
        parse_stack_config("scheduled", raw)
    except ConfigError as error:
        named = {p.key for p in error.problems}
        assert unknown <= named | {f"{NS}:{k}" for k in ("production", "namePrefix", "owner", "billingAccount")}
        return
    raise AssertionError(f"unknown keys {unknown} were accepted")


# --- Each class of hostile input found by the hostile-stack-file review, generated. ---------------------------

from hypothesis import assume  # noqa: E402

from infra.config import PLATFORM_ACCOUNTS  # noqa: E402
from infra.config.model import (  # noqa: E402
    MAX_BUDGET_AMOUNT,
    RECOVERY_INTERVALS,
    tpu_regions,
)
from tests.support import replace_object, with_object, with_scalar, workload_settings  # noqa: E402
from tools.offline.mocks import GcpMocks, RecordingMonitor  # noqa: E402
from tools.offline.runner import run_program  # noqa: E402

NON_ASCII_DIGITS = st.sampled_from("²³¹٠١٢٣٤٥٦٧٨٩۰۱۲۳४५६೧๑")


def refused(raw: dict[str, str], key: str, stack: str = "scheduled") -> str:
    """Parsing fails with a ConfigError naming `key`; nothing else escapes."""
    try:
        parse_all_the_way(stack, raw)
    except ConfigError as error:
        assert any(p.key.startswith(key) for p in error.problems), str(error)
        return str(error)
    raise AssertionError(f"{key} was accepted")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["tpuVms[0].name", "workloads.run", "buckets.kmsKeyName", "schedule.start", "labels"]))
def test_a_trailing_newline_is_refused_everywhere(where):
    base = PRODUCTION if where == "buckets.kmsKeyName" else SANDBOX
    edits = {
        "tpuVms[0].name": ("tpuVms", lambda v: v[0].update(name=v[0]["name"] + "\n"), "tpuVms[0].name"),
        "workloads.run": ("workloads", lambda w: w["mnist"].update(run="r1\n"), "workloads.mnist.run"),
        "buckets.kmsKeyName": ("buckets", lambda b: b.update(kmsKeyName=b["kmsKeyName"] + "\n"), "buckets.kmsKeyName"),
        "schedule.start": (
            "tpuVms",
            lambda v: v[0]["schedule"].update(start="0 8 * * 1-5\n#"),
            "tpuVms[office-v2].schedule",
        ),
        "labels": ("tpuVms", lambda v: v[0]["labels"].update({"team": "ml\n"}), "tpuVms[office-v2].labels.team"),
    }
    key, edit, problem_key = edits[where]
    stack = "production" if where == "buckets.kmsKeyName" else "scheduled"
    refused(with_object(base, key, edit), f"{NS}:{problem_key}", stack)


@settings(max_examples=60, deadline=None)
@given(
    NON_ASCII_DIGITS,
    st.sampled_from(["epochs", "batchSize", "frameworkVersion", "acceleratorType", "schedule", "idleMinutes"]),
)
def test_non_ascii_digits_are_refused_not_crashed_on(digit, where):
    raw, key = {
        "epochs": (with_object(SANDBOX, "workloads", lambda w: w["mnist"].update(epochs=f"1{digit}")), "workloads"),
        "batchSize": (with_object(SANDBOX, "workloads", lambda w: w["mnist"].update(batchSize=digit)), "workloads"),
        "frameworkVersion": (
            with_object(SANDBOX, "workloads", lambda w: w["mnist"].update(frameworkVersion=f"2.1{digit}.1")),
            "workloads",
        ),
        "acceleratorType": (
            with_object(SANDBOX, "tpuVms", lambda v: v[0].update(acceleratorType=f"v2-{digit}")),
            "tpuVms",
        ),
        "schedule": (
            with_object(SANDBOX, "tpuVms", lambda v: v[0]["schedule"].update(stop=f"0 {digit} * * *")),
            "tpuVms",
        ),
        "idleMinutes": (with_scalar(SANDBOX, "monitoring", f'{{"idleMinutes": "6{digit}"}}'), "monitoring"),
    }[where]
    refused(raw, f"{NS}:{key}")


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=3, max_size=20))
def test_gcp_region_must_be_a_tpu_region(region):
    raw = with_scalar(SANDBOX, "gcp:region", region)
    if region in tpu_regions():
        parse_all_the_way("scheduled", raw)
    else:
        assert f"gcp:region = {region!r}: must be one of" in refused(raw, "gcp:region")


@settings(max_examples=40, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=MAX_BUDGET_AMOUNT * 1.01, allow_infinity=False),
        st.integers(min_value=MAX_BUDGET_AMOUNT + 1),
        st.sampled_from(["Infinity", "NaN", "-Infinity"]),
    )
)
def test_budget_beyond_int64_or_not_finite_is_refused(amount):
    if isinstance(amount, str):  # NaN and Infinity are not JSON: the whole object is refused
        text = SANDBOX[f"{NS}:budget"].replace('"amount": 500', f'"amount": {amount}')
        refused({**SANDBOX, f"{NS}:budget": text}, f"{NS}:budget")
    else:
        refused(with_object(SANDBOX, "budget", lambda b: b.update(amount=amount)), f"{NS}:budget.amount")


def test_budget_amount_as_yaml_inf_is_refused():
    refused(with_object(SANDBOX, "budget", lambda b: b.update(amount=float("inf"))), f"{NS}:budget")


@settings(max_examples=30, deadline=None)
@given(st.integers(257, 600), st.sampled_from("aé€"))
def test_workload_descriptions_over_256_bytes_are_refused(length, char):
    description = char * (length // len(char.encode()) + 1)
    assume(len(description.encode()) > 256)
    raw = with_object(SANDBOX, "workloads", lambda w: w["mnist"].update(description=description))
    assert "at most 256 UTF-8 bytes" in refused(raw, f"{NS}:workloads.mnist.description")


@settings(max_examples=20, deadline=None)
@given(st.integers(513, 2000))
def test_tpu_descriptions_over_512_characters_are_refused(length):
    raw = with_object(SANDBOX, "tpuVms", lambda v: v[0].update(description="d" * length))
    refused(raw, f"{NS}:tpuVms[office-v2].description")


@settings(max_examples=20, deadline=None)
@given(st.integers(59, 120))
def test_more_labels_than_gcp_allows_are_refused(count):
    labels = {f"l{i}": "x" for i in range(count)}  # with the platform's 6 reserved, over 64
    raw = with_object(SANDBOX, "tpuVms", lambda v: v[0].update(labels=labels))
    assert "must have at most 58 entries" in refused(raw, f"{NS}:tpuVms[office-v2].labels")


def test_58_labels_are_accepted():
    labels = {f"l{i}": "x" for i in range(58)}
    parse_all_the_way("scheduled", with_object(SANDBOX, "tpuVms", lambda v: v[0].update(labels=labels)))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 1440))
def test_recovery_interval_must_divide_the_hour(every):
    raw = with_object(PRODUCTION, "automation", lambda a: a["recovery"].update(everyMinutes=every))
    if every in RECOVERY_INTERVALS:
        parse_all_the_way("production", raw)
        assert 60 % every == 0  # `*/N * * * *` then fires every N minutes, evenly
    else:
        refused(raw, f"{NS}:automation.recovery.everyMinutes", "production")


@given(st.sampled_from([*PLATFORM_ACCOUNTS, "deployer"]))
def test_workloads_named_like_the_platforms_accounts_are_refused(name):
    raw = replace_object(SANDBOX, "workloads", {name: workload_settings(SANDBOX)})
    raw = replace_object(raw, "tpuVms", [])
    assert "is reserved" in refused(raw, f"{NS}:workloads.{name}")


def test_the_reserved_names_are_the_platforms_accounts():
    """Every service account the program declares, other than a workload's, is one of the reserved names."""
    from infra.config import parse_stack_config as parse
    from infra.config import service_account_id

    for stack, raw in (("scheduled", SANDBOX), ("production", PRODUCTION)):
        cfg = parse(stack, raw)
        result = plan(raw, stack)
        ids = {r.inputs["accountId"] for r in result.of_type("gcp:serviceaccount/account:Account")}
        workloads = {service_account_id(w.name, stack) for w in cfg.workloads}
        assert ids - workloads <= {service_account_id(p, stack) for p in PLATFORM_ACCOUNTS}


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzéüßøæœłñçąęžšαβγжщ0123456789_-", min_size=1, max_size=63))
def test_international_lowercase_letters_are_accepted_in_label_values(value):
    raw = with_object(SANDBOX, "tpuVms", lambda v: v[0]["labels"].update({"team": value}))
    cfg = parse_stack_config("scheduled", raw)
    assert ("team", value) in cfg.tpu_vms[0].labels


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(list("ÉÜΣЖABC .@")))
def test_uppercase_and_punctuation_are_still_refused_in_label_values(char):
    raw = with_object(SANDBOX, "tpuVms", lambda v: v[0]["labels"].update({"team": f"ml{char}"}))
    refused(raw, f"{NS}:tpuVms[office-v2].labels.team")


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(
        [
            ("buckets", lambda b: b.update(location="MOON")),
            ("budget", lambda b: b.update(amount=float("inf"))),
            ("workloads", lambda w: w["mnist"].update(epochs="٣")),
            ("tpuVms", lambda v: v[0].update(acceleratorType="v2-²")),
            ("tpuVms", lambda v: v[0]["labels"].update({f"k{i}": "v" for i in range(70)})),
            ("automation", lambda a: a.update(recovery={"everyMinutes": 90})),
        ]
    )
)
def test_bad_input_registers_no_resource(case):
    key, edit = case
    monitor = RecordingMonitor(GcpMocks("fixture-project"))
    try:
        run_program("scheduled", with_object(SANDBOX, key, edit), monitor=monitor)
    except Exception as error:  # the program's RunError, as `pulumi up` shows it
        assert "tpu-platform:" in str(error) and "Traceback" not in str(error)
    else:
        raise AssertionError("accepted")
    assert monitor.registrations == []
