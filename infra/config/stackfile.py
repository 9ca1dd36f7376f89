"""Read `Pulumi.yaml` and `Pulumi.<stack>.yaml` into config strings, as the Pulumi CLI passes them.

Like the CLI: project-level defaults from `Pulumi.yaml` apply to keys the stack leaves unset, keys
without a namespace belong to the project, scalars arrive as strings and objects as JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode

ROOT = Path(__file__).resolve().parents[2]


class StackFileError(Exception):
    pass


_BOOL_12 = re.compile(r"true|True|TRUE|false|False|FALSE")
_INT_12 = re.compile(r"[-+]?(0b[01_]+|0o[0-7_]+|0x[0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)")
_FLOAT_12 = re.compile(
    r"[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
)


class StackFileLoader(yaml.SafeLoader):
    """YAML as the Pulumi CLI reads stack files (Go's gopkg.in/yaml.v3, YAML 1.2 core schema).

    PyYAML implements YAML 1.1, where `no`, `off` and `y` are booleans and `1:30` is a number; the
    CLI reads them as strings (go-yaml v3 resolve.go: only true/True/TRUE and false/False/FALSE are
    booleans). And like the CLI (go-yaml v3 decode.go: "mapping key ... already defined at line"),
    a key given twice in one mapping is an error, not "the last one wins".
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"mapping key {key!r} already defined at line {seen[key]}", key_node.start_mark
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# Start from SafeLoader's resolvers less its YAML 1.1 booleans and numbers, then add YAML 1.2's.
StackFileLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if not tag.endswith((":bool", ":int", ":float"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _rx, _first in (
    ("tag:yaml.org,2002:bool", _BOOL_12, "tTfF"),
    ("tag:yaml.org,2002:int", _INT_12, "-+0123456789"),
    ("tag:yaml.org,2002:float", _FLOAT_12, "-+.0123456789"),
):
    StackFileLoader.add_implicit_resolver(_tag, re.compile(f"^(?:{_rx.pattern})$"), list(_first))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node)).replace("_", "")
    sign, digits = (-1 if text.startswith("-") else 1), text.lstrip("+-")
    if digits[:2] in ("0b", "0o", "0x"):
        return sign * int(digits, 0)
    # Go's strconv.ParseInt(s, 0, 64), as go-yaml calls it: a leading 0 means octal.
    return sign * int(digits, 8 if len(digits) > 1 and digits[0] == "0" else 10)


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).replace("_", "")
    return float(
        text.replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf").lower().replace(".nan", "nan")
    )


StackFileLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
StackFileLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


if yaml.__with_libyaml__:

    class _LibyamlStackFileLoader(yaml.CSafeLoader, StackFileLoader):
        """The same resolvers and constructors on libyaml's parser (yaml.CSafeLoader's): some 7x faster on a
        stack of 1,000 TPU VMs. libyaml words its errors its own way, and quotes no line."""


def load_stack_yaml(text: str) -> Any:
    if yaml.__with_libyaml__:
        try:
            return yaml.load(text, Loader=_LibyamlStackFileLoader)
        except yaml.YAMLError:
            pass  # read again below, for the error with its line and column quoted, as the messages show it
    return yaml.load(text, Loader=StackFileLoader)  # a SafeLoader subclass: no arbitrary objects


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = load_stack_yaml(path.read_text()) or {}
    except FileNotFoundError:
        raise StackFileError(f"{path.name} not found in {path.parent}") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{path.name} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise StackFileError(f"{path.name} must be a YAML mapping")
    return data


def available_stacks(root: Path = ROOT) -> list[str]:
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in root.glob("Pulumi.*.yaml"))


def project_name(root: Path = ROOT) -> str:
    return str(_load_yaml(root / "Pulumi.yaml")["name"])


def _as_config_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict) and set(value) == {"secure"}:
        return "[secret]"  # ciphertext: only the real CLI with the stack's secrets provider can read it
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def stack_of(path: Path) -> str:
    """`Pulumi.dev.yaml` holds the stack `dev`."""
    if not (path.name.startswith("Pulumi.") and path.name.endswith(".yaml")) or path.name == "Pulumi.yaml":
        raise StackFileError(f"{path} is not a stack file: its name must be Pulumi.<stack>.yaml")
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


def read_stack_config(stack: str, root: Path = ROOT, path: Path | None = None) -> dict[str, str]:
    """The stack's config (from `path`, default `root/Pulumi.<stack>.yaml`) plus project defaults."""
    project = _load_yaml(root / "Pulumi.yaml")
    name = str(project["name"])
    path = path or root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise StackFileError(
            f"no stack file Pulumi.{stack}.yaml; stacks here: {', '.join(available_stacks(root)) or 'none'}"
        )
    values = _load_yaml(path).get("config") or {}
    if not isinstance(values, dict):
        raise StackFileError(f"Pulumi.{stack}.yaml: 'config' must be a mapping")

    config: dict[str, str] = {}
    for key, spec in (project.get("config") or {}).items():
        full = key if ":" in key else f"{name}:{key}"
        if isinstance(spec, dict) and "default" in spec:
            config[full] = _as_config_string(spec["default"])
    for key, value in values.items():
        full = key if ":" in key else f"{name}:{key}"
        config[full] = _as_config_string(value)
    return config
