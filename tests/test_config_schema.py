"""The JSON Schema of stack files: generated from the declarations, in the repository as generated,
and agreeing with the reader on the shipped stacks and on values each declaration refuses."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from infra.config import docs, parse_stack_config
from infra.config.declared import stack_key
from infra.config.problems import ConfigError
from infra.config.settings import SETTINGS, Setting
from infra.config.stackfile import load_stack_yaml, read_stack_config
from tests.support import FIXTURE_STACKS, fixture_config

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads(docs.SCHEMA_FILE.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_the_schema_file_is_generated_from_the_declarations():
    assert docs.SCHEMA_FILE.read_text() == docs.schema_text(), (
        "schema/stack.schema.json is stale: run .venv/bin/python -m tools.offline schema --write"
    )


def test_the_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_shipped_stacks_match_the_schema_and_point_editors_at_it(stack):
    text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=./schema/stack.schema.json"
    assert list(VALIDATOR.iter_errors(load_stack_yaml(text))) == []


@pytest.mark.parametrize(
    ("schedule", "valid"),
    [({"stop": "0 20 * * *"}, True), ({"start": "0 8 * * *"}, True), ({"timeZone": "Etc/UTC"}, False)],
)
def test_the_schema_takes_a_schedule_with_either_side_and_refuses_one_with_neither(schedule, valid):
    data = yaml.safe_load((FIXTURE_STACKS / "Pulumi.small.yaml").read_text())
    data["config"]["tpu-platform:tpuVms"][0]["schedule"] = schedule
    assert (not list(VALIDATOR.iter_errors(data))) is valid


def bad_values(s: Setting) -> list[object]:
    """Values the declaration refuses, by its own bounds."""
    out: list[object] = []
    if s.choices and s.kind == "string":
        out.append("not-one-of-them")
    if s.pattern:
        out.append("bad value\n")
    if s.maximum is not None:
        out.append(s.maximum * 2 + 1)
    if s.minimum is not None:
        out.append(s.minimum - 1)
    return out


def _set(config: dict, s: Setting, value: object) -> bool:
    """Put `value` at the setting's path in the first matching place of `config`; False when absent."""
    first, *rest = s.key.replace("[]", ".[]").split(".")
    top = first if first.startswith("gcp:") else f"tpu-platform:{first}"
    target = config.get(top)
    if not rest:
        config[top] = value
        return True
    for step in rest[:-1]:
        if step == "[]":
            if not isinstance(target, list) or not target:
                return False
            target = target[0]
        elif step == "<name>":
            if not isinstance(target, dict) or not target:
                return False
            target = next(iter(target.values()))
        else:
            if not isinstance(target, dict):
                return False
            target = target.setdefault(step, {})
    if not isinstance(target, dict):
        return False
    target[rest[-1]] = value
    return True


CASES = [(s, v) for s in SETTINGS if s.kind not in ("object", "map", "list") for v in bad_values(s)]


@pytest.mark.parametrize(("setting", "value"), CASES, ids=[f"{s.key}={v!r}" for s, v in CASES])
def test_schema_and_reader_both_refuse_what_a_declaration_refuses(setting, value, tmp_path):
    stack = "prod" if "automation" in setting.key or "kmsKeyName" in setting.key else "dev"
    source = ROOT / f"Pulumi.{stack}.yaml"
    if setting.key.startswith("gke."):  # no shipped stack runs the GKE engine: its fixture stack does
        stack, source = "gke", FIXTURE_STACKS / "Pulumi.gke.yaml"
    data = yaml.safe_load(source.read_text())
    if not _set(data["config"], setting, value):
        pytest.fail(f"{setting.key} has no place in {source.name} to put a value")
    assert list(VALIDATOR.iter_errors(data)), f"the schema accepts {setting.key} = {value!r}"
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError):
        parse_stack_config(stack, read_stack_config(stack, tmp_path))


def test_pulumi_yaml_declares_the_scalars_as_the_declarations_do():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    for name, spec in project.items():
        s = next(s for s in SETTINGS if s.key == name)
        assert spec["type"] == s.kind
        assert spec.get("default") == s.default


@pytest.mark.parametrize("path", sorted(FIXTURE_STACKS.glob("Pulumi.*.yaml")), ids=lambda p: p.name)
def test_each_fixture_stack_matches_the_schema(path):
    """The fixture stacks stand in for the shipped ones in the behaviour tests: they must be stack files
    an editor would accept too."""
    assert list(VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))) == []


@pytest.mark.parametrize("section", ["monitoring", "artifacts", "automation"])
def test_a_section_left_out_takes_the_defaults_the_settings_table_states(section):
    """One declaration: the value a stack without the section gets is the table's default, field by field."""
    raw = {k: v for k, v in fixture_config("small").items() if k != f"tpu-platform:{section}"}
    read = getattr(parse_stack_config("small", raw), section)
    for s in SETTINGS:
        if s.key.startswith(f"{section}.") and s.kind != "object":
            value = read
            for name in s.key.split(".")[1:]:
                value = getattr(value, next(n for n, f in type(value).model_fields.items() if stack_key(n, f) == name))
            assert value == s.default, s.key
