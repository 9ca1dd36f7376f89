"""Stack values marked `secure:` stay secret in every input, output and state.

The program reads config raw (one strict parse for everything), which drops Pulumi's secret marking:
a secure email or billing account would reach resource inputs, outputs and the state in plaintext.
So the plaintext of every secret value is collected once, and a stack transformation wraps any
resource input that contains one in `Output.secret`; Pulumi then encrypts it in state and masks it
in previews (Pulumi, "Secrets": secretness flows from inputs to outputs). Stack outputs go through
the same wrapper. A secret in TPU VM metadata is refused at plan time instead: metadata is readable
by anyone who can read the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pulumi
from pulumi import _types
from pulumi.runtime import config as runtime_config

MIN_SECRET_LENGTH = 6


def secret_keys(raw: Mapping[str, str]) -> list[str]:
    """The config keys Pulumi marked secret for this run (real runs and mocks alike)."""
    return [key for key in raw if runtime_config.is_config_secret(key)]


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    # Numbers and booleans of a secret object are its structure (thresholds, sizes), not its secret.


def secret_values(raw: Mapping[str, str], keys: Iterable[str]) -> dict[str, str]:
    """The plaintexts to hide (each secret scalar, each string leaf of a secret object), and their keys."""
    out: dict[str, str] = {}
    for key in keys:
        text = raw.get(key)
        if text is None:
            continue
        try:
            decoded = json.loads(text) if text[:1] in "{[" else text
        except json.JSONDecodeError:
            decoded = text
        # A short word ("USD", "stop") would hide every input that happens to contain it.
        out.update({leaf: key for leaf in _leaves(decoded) if len(leaf) >= MIN_SECRET_LENGTH})
    return out


def contains_secret(text: str, secrets: Mapping[str, str]) -> bool:
    return any(secret in text for secret in secrets)


def hide(value: Any, secrets: Mapping[str, str]) -> Any:
    """`value` with each part that contains a secret plaintext wrapped in `Output.secret`."""
    if not secrets or value is None:
        return value
    if isinstance(value, str):
        return pulumi.Output.secret(value) if contains_secret(value, secrets) else value
    if isinstance(value, pulumi.Output):
        return value.apply(lambda resolved: hide(resolved, secrets))
    if isinstance(value, Mapping):
        return {k: hide(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [hide(v, secrets) for v in value]
    if _types.is_input_type(type(value)):
        fields = _types.input_type_to_untranslated_dict(value)
        return type(value)(**{k: hide(v, secrets) for k, v in fields.items()})
    return value


def keep_secret(secrets: Mapping[str, str]) -> None:
    """Wrap every later resource's inputs (see the module docstring)."""
    if not secrets:
        return

    def transform(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult:
        return pulumi.ResourceTransformationResult(hide(args.props, secrets), args.opts)

    pulumi.runtime.register_stack_transformation(transform)
