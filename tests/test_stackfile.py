"""Stack files are read as the Pulumi CLI reads them (go-yaml v3: YAML 1.2 scalars, duplicate keys refused)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.config.stackfile import StackFileError, load_stack_yaml, read_stack_config
from tests.support import NS

ROOT_TEXT = "name: tpu-platform\nruntime: python\n"


def stack_dir(tmp_path, body: str):
    (tmp_path / "Pulumi.yaml").write_text(ROOT_TEXT)
    (tmp_path / "Pulumi.dev.yaml").write_text(body)
    return tmp_path


# YAML 1.1 booleans that go-yaml v3 (resolve.go) reads as plain strings.
YAML_11_BOOLEANS = ["yes", "no", "Yes", "No", "YES", "NO", "on", "off", "On", "Off", "y", "n", "Y", "N"]


@given(st.sampled_from(YAML_11_BOOLEANS))
def test_yaml_11_booleans_are_strings_as_the_cli_reads_them(word):
    assert load_stack_yaml(f"a: {word}\n") == {"a": word}


@pytest.mark.parametrize(("text", "value"), [("true", True), ("True", True), ("FALSE", False), ("false", False)])
def test_yaml_12_booleans(text, value):
    assert load_stack_yaml(f"a: {text}\n") == {"a": value}


@pytest.mark.parametrize(
    ("text", "value"), [("1:30", "1:30"), ("1e3", 1000.0), ("0o17", 15), ("012", 10), ("1_000", 1000)]
)
def test_numbers_as_go_yaml_reads_them(text, value):
    assert load_stack_yaml(f"a: {text}\n") == {"a": value}


def test_production_no_is_refused_not_read_as_false(tmp_path):
    from infra.config import parse_stack_config
    from infra.config.problems import ConfigError
    from tests.support import fixture_config

    root = stack_dir(tmp_path, f"config:\n  {NS}:production: no\n")
    raw = {**fixture_config("small"), **read_stack_config("dev", root)}
    with pytest.raises(ConfigError, match=f"{NS}:production = 'no': must be true or false"):
        parse_stack_config("dev", raw)


key = st.from_regex(r"[a-z][a-zA-Z]{0,10}", fullmatch=True)


@given(key, st.integers(0, 3), st.integers(), st.integers())
def test_a_key_given_twice_is_refused_with_both_lines(name, depth, first, second):
    indent = "  " * (depth + 1)
    nesting = "".join(f"{'  ' * (i + 1)}n{i}:\n" for i in range(depth))
    body = f"config:\n{nesting}{indent}{name}: {first}\n{indent}{name}: {second}\n"
    with pytest.raises(StackFileError) as caught:
        load_and_read(body)
    message = str(caught.value)
    assert f"mapping key '{name}' already defined at line {depth + 2}" in message
    assert f"line {depth + 3}" in message


def load_and_read(body: str) -> dict[str, str]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        return read_stack_config("dev", stack_dir(Path(folder), body))
