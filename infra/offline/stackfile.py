"""Read `Pulumi.yaml` and `Pulumi.<stack>.yaml` into config strings, as the Pulumi CLI passes them.

Like the CLI: project-level defaults from `Pulumi.yaml` apply to keys the stack leaves unset, keys
without a namespace belong to the project, scalars arrive as strings and objects as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


class StackFileError(Exception):
    pass


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
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
