"""The stack's settings as rows (key, type, default, bounds and description), derived from their one
declaration, the models of `model.py`.

The reader (`reader.py`) reads each section through its model (`declared.read`), and the JSON Schema of
`Pulumi.<stack>.yaml` and the settings table of docs/stack-settings.md are generated from these rows
(`python -m tools.offline schema --write`), so the three cannot disagree.

Keys are paths below the stack file's `config:`: `tpu-platform:budget.amount`; `[]` is each item
of a list (`tpuVms[].zone`) and `<name>` each key of a mapping (`workloads.<name>.epochs`).
Limits are GCP's where GCP has one; the comment beside each says where it is documented.
"""

from __future__ import annotations

import inspect
import types
import typing
from dataclasses import dataclass
from typing import Literal

from pydantic_core import PydanticUndefined

from infra.config.declared import (
    Allowed,
    Items,
    Section,
    Unstated,
    base_type,
    choices_of,
    limits,
    marks,
    stack_key,
)
from infra.config.model import PROJECT, GcpSettings, PlatformConfig

Kind = Literal["string", "integer", "number", "boolean", "list", "object", "map"]
Scalar = str | int | float | bool


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    description: str
    default: Scalar | None = None  # None: no default (required unless `optional`)
    optional: bool = False  # may be left unset with no default
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] | tuple[int, ...] = ()
    pattern: str | None = None
    allowed: str = ""  # what a pattern or check accepts, in words (error messages, the table)
    max_items: int | None = None
    items: Kind | None = None  # kind of list items / map values
    unique: bool = True  # list items may not repeat (a command's arguments may)
    any_of: tuple[str, ...] = ()  # an object: at least one of these children must be given

    @property
    def full(self) -> str:
        """The key as the stack file writes it at the top: `tpu-platform:budget.amount`, `gcp:region`."""
        return self.key if self.key.startswith("gcp:") else f"{PROJECT}:{self.key}"

    @property
    def name(self) -> str:
        """The key as written in the stack file: `tpu-platform:budget`, `gcp:region`, or a nested leaf."""
        return self.key.rsplit(".", 1)[-1].removesuffix("[]")

    @property
    def required(self) -> bool:
        return self.default is None and not self.optional and self.kind not in ("object", "map", "list")


_KINDS: dict[object, Kind] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    float | int: "number",
    str: "string",
    typing.Any: "string",
}


def _kind(annotation: object) -> Kind:
    plain = base_type(annotation)
    if isinstance(plain, type) and issubclass(plain, Section):
        return "object"
    if plain not in _KINDS and isinstance(plain, types.UnionType):  # `int | Any`: its first type says what it takes
        plain = typing.get_args(plain)[0]
    return _KINDS.get(plain) or _KINDS.get(typing.get_origin(plain), "string")  # else a catalog type, by name


def declared(key: str, model: type[Section], *, optional: bool = True) -> tuple[Setting, ...]:
    """The rows of a section declared as a model (infra/config/model.py): itself, then each of its fields."""
    description = " ".join(inspect.cleandoc(model.__doc__ or "").splitlines())
    rows = [Setting(key, "object", description, optional=optional, any_of=model.any_of)]
    for name, info in model.model_fields.items():
        if info.exclude:  # not the stack's: what the reader supplies
            continue
        child = f"{key}{'' if key.endswith(':') or not key else '.'}{stack_key(name, info)}"
        kind = base_type(info.annotation)
        if isinstance(kind, type) and issubclass(kind, Section):
            rows.extend(declared(child, kind, optional=not info.is_required()))
            continue
        rule = next((m for m in marks(info) if isinstance(m, Allowed)), Allowed())
        many = next((m for m in info.metadata if isinstance(m, Items)), None)
        item = typing.get_args(kind)[0] if many else None
        if many and many.mapping and typing.get_args(item):  # (name, value) pairs; else sections by name
            item = typing.get_args(item)[1]
        low, high, exclusive = limits(info)
        unstated = any(isinstance(m, Unstated) for m in marks(info))
        default = None if info.default in (PydanticUndefined, ()) or unstated else info.default
        rows.append(
            Setting(
                child,
                ("map" if many.mapping else "list") if many else _kind(info.annotation),
                info.description or "",
                default=default,
                optional=default is None and not info.is_required(),
                minimum=low,
                maximum=high,
                exclusive_minimum=exclusive,
                choices=choices_of(info),
                pattern=rule.pattern,
                allowed=rule.allowed,
                max_items=many.most if many else None,
                items=_kind(item) if many else None,
                unique=not (many and many.repeats),
            )
        )
        if many and _kind(item) == "object":
            rows.extend(declared(f"{child}{'.<name>' if many.mapping else '[]'}", base_type(item))[1:])  # type: ignore[arg-type]
    return tuple(rows)


SETTINGS: tuple[Setting, ...] = (*declared("gcp:", GcpSettings)[1:], *declared("", PlatformConfig)[1:])

BY_KEY = {s.key: s for s in SETTINGS}


def setting(key: str) -> Setting:
    """The declaration of `key` (`budget.amount`, `tpuVms[].zone` or `gcp:region`)."""
    return BY_KEY[key]


def children(parent: str) -> tuple[Setting, ...]:
    """The settings directly below `parent` (`budget`, `budget.thresholds[]`; "" for the top level)."""
    if not parent:
        return tuple(s for s in SETTINGS if "." not in s.key and not s.key.startswith("gcp:"))
    return tuple(s for s in SETTINGS if s.key.startswith(parent + ".") and "." not in s.key[len(parent) + 1 :])
