"""Stack files are read as the Pulumi CLI reads them (go-yaml v3: YAML 1.2 scalars, duplicate keys refused)."""

from __future__ import annotations

import pytest
import yaml
import yaml.scanner
from hypothesis import given
from hypothesis import strategies as st

from infra.config.stackfile import ROOT, StackFileError, StackFileLoader, load_stack_yaml, read_stack_config
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


# --- the parser: libyaml's where PyYAML has it; a file it refuses is read again for PyYAML's own error ---

STACK_FILES = sorted(
    {*ROOT.glob("Pulumi*.yaml"), *ROOT.glob("*/Pulumi*.yaml"), *(ROOT / "tests" / "stacks").glob("Pulumi*.yaml")}
)


def test_a_valid_stack_file_is_parsed_by_libyaml(monkeypatch):
    """PyYAML's pure-Python scanner took 1.6 s of a 1,000-VM plan, libyaml's 0.23 s (benchmarks/plan_scale.py)."""
    assert yaml.__with_libyaml__  # PyYAML's wheels for Linux, macOS and Windows are built with it

    def pure(*args: object) -> None:
        raise AssertionError("PyYAML's pure-Python scanner read a valid stack file")

    monkeypatch.setattr(yaml.scanner.Scanner, "check_token", pure)
    assert load_stack_yaml((ROOT / "Pulumi.dev.yaml").read_text())["config"]


@pytest.mark.parametrize("path", STACK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_stack_file_reads_the_same_with_either_parser(path):
    text = path.read_text()
    assert load_stack_yaml(text) == yaml.load(text, Loader=StackFileLoader)


@pytest.mark.parametrize(
    "body",
    [
        "config:\n  a: 1\n  a: 2\n",  # a key given twice (refused by the loader's own constructor)
        "config:\n\ta: 1\n",  # a tab for indentation
        "config:\n  a: 'b\n",  # an unclosed quote
        "config:\n  a: b: c\n",  # a value where a key belongs
        "config:\n  a: 1\n b: 2\n",  # a key out of line
        "config:\n  a: [1, 2\n",  # an unclosed list
        "config:\n  a: *b\n",  # an undefined alias
        "config:\n  a:\n  - 1\n  b\n",  # a key without its colon
    ],
)
def test_an_error_quotes_its_line_and_column_as_pyyaml_words_it(body):
    """libyaml refuses each of these too, in other words and without the line; the message is PyYAML's."""
    from infra.config.stackfile import _LibyamlStackFileLoader

    with pytest.raises(yaml.YAMLError):
        yaml.load(body, Loader=_LibyamlStackFileLoader)
    with pytest.raises(yaml.MarkedYAMLError) as pure:
        yaml.load(body, Loader=StackFileLoader)
    with pytest.raises(StackFileError) as caught:
        load_and_read(body)
    assert str(caught.value) == f"Pulumi.dev.yaml is not valid YAML: {pure.value}"
    mark = pure.value.problem_mark
    assert mark is not None and f"line {mark.line + 1}, column {mark.column + 1}:\n" in str(caught.value)
