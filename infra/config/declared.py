"""Settings declared once, as pydantic models: a field's type, default, bounds, choices and description
are the reader, the defaults, the JSON Schema and the settings table at once (settings.py lists them).

A section is a `Section`: unknown keys refused, camelCase keys in the stack file for snake_case fields,
frozen. Scalars take what Pulumi hands the program (`"5"`, `"true"`) exactly as the hand-written getters
of problems.py did, and every refusal is translated into the project's problems (key, value, what is
allowed), never shown in the library's words.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from infra.config.problems import (
    ASCII_INTEGER,
    ASCII_NUMBER,
    MISSING,
    REMOVE,
    YAML_BOOLEANS,
    Fix,
    Problems,
    nearest,
    type_name,
)


class Section(BaseModel):
    """One mapping of the stack file. Its docstring is its description in the settings table."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=True)


def _refuse(kind: str) -> PydanticCustomError:
    return PydanticCustomError("refused", "must be {kind}", {"kind": kind})


def as_integer(value: object) -> object:
    """Pulumi passes scalar config as strings: ASCII digits only; no float, no boolean."""
    if isinstance(value, str) and ASCII_INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse("an integer")
    return value


def _number(value: object) -> object:
    if isinstance(value, str) and ASCII_NUMBER.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _refuse("a number (finite), like 2.5")
    return float(value)


def _flag(value: object) -> object:
    if isinstance(value, str) and value in YAML_BOOLEANS:
        return YAML_BOOLEANS[value]
    if not isinstance(value, bool):
        raise _refuse("true or false")
    return value


def as_text(value: object) -> object:
    if not isinstance(value, str):
        raise PydanticCustomError("refused", "must be a string, not {kind}", {"kind": type_name(value)})
    return value


Integer = Annotated[int, BeforeValidator(as_integer)]
Number = Annotated[float, BeforeValidator(_number)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Text = Annotated[str, BeforeValidator(as_text)]


S = TypeVar("S", bound=Section)


def read(model: type[S], data: object, key: str, problems: Problems) -> S:
    """`data` (the mapping at `key`) as `model`, every refusal recorded in `problems`. What could not be
    read takes its default, so the checks across settings still see a whole section."""
    if data is None or data is MISSING:
        data = {}
    if not isinstance(data, Mapping):
        problems.add(key, data, f"must be a mapping, not {type_name(data)}")
        return model()
    data = _unset_nulls(model, data)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        refused = set()
        for e in error.errors():
            _translate(model, e, data, key, problems)
            refused.add(e["loc"][0])
        kept = {k: v for k, v in data.items() if k not in refused}
        try:
            return model.model_validate(kept)
        except ValidationError:
            return model()


def _unset_nulls(model: type[Section], data: Mapping[object, object]) -> dict[str, object]:
    """`data` less the settings it gives as null, which the stack file means as not set (an unknown key stays,
    to be refused)."""
    out = {}
    for key, value in data.items():
        info, section = _step(model, str(key))
        if value is None and info is not None:
            continue
        out[str(key)] = _unset_nulls(section, value) if section is not None and isinstance(value, Mapping) else value
    return out


def _step(model: type[Section], name: object) -> tuple[FieldInfo | None, type[Section] | None]:
    """The field a stack-file key names in `model`, and its section type when it is one."""
    for field_name, info in model.model_fields.items():
        if name in (field_name, info.alias):
            for kind in (info.annotation, *typing.get_args(info.annotation)):
                if isinstance(kind, type) and issubclass(kind, Section):
                    return info, kind
            return info, None
    return None, None


def _field_at(model: type[Section], loc: tuple[Any, ...]) -> tuple[FieldInfo | None, type[Section]]:
    """The field a problem's location names, and the section holding it."""
    info: FieldInfo | None = None
    for index, step in enumerate(loc):
        info, section = _step(model, step)
        if section is not None and index < len(loc) - 1:
            model = section
    return info, model


def _given(data: object, loc: tuple[Any, ...]) -> object:
    """What the stack file gives at `loc` (`"5"`, not the 5 it was read as)."""
    for step in loc:
        data = data.get(step) if isinstance(data, Mapping) else None
    return data


def _translate(model: type[Section], error: Any, data: Mapping[str, object], key: str, problems: Problems) -> None:
    """One refusal in the project's words: the key, the value given, what is allowed."""
    loc: tuple[Any, ...] = error["loc"]
    path = ".".join([key, *(str(step) for step in loc)])
    info, owner = _field_at(model, loc)
    value = _given(data, loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = sorted(f.alias or n for n, f in owner.model_fields.items())
        here = _given(data, loc[:-1])
        plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", str(loc[-1]))  # a misspelling, not a key no path can name
        near = nearest(str(loc[-1]), [k for k in known if not isinstance(here, Mapping) or k not in here])
        fixes = [Fix.of({path: REMOVE, f"{path.rsplit('.', 1)[0]}.{near}": value})] if near and plain else []
        problems.add(path, value, f"unknown key; known keys: {', '.join(known)}", fixes=fixes)
    elif kind == "missing":
        problems.add(path, MISSING, "required")
    elif kind == "literal_error" and info is not None:
        options = sorted(literal_choices(info.annotation), key=lambda c: (isinstance(c, str), c))
        near = nearest(value, [c for c in options if isinstance(c, str)]) if isinstance(value, str) else None
        fixes = [Fix.of({path: near})] if near else []
        problems.add(path, value, f"must be one of {', '.join(str(c) for c in options)}", fixes=fixes)
    elif kind in ("greater_than", "greater_than_equal", "less_than_equal") and info is not None:
        integer = any(t is int for t in (info.annotation, *typing.get_args(info.annotation)))
        problems.add(path, value, f"must be {'an integer' if integer else 'a number'} {bounds(info)}")
    elif kind in ("model_type", "dict_type"):
        problems.add(path, value, f"must be a mapping, not {type_name(value)}")
    elif kind == "refused":
        problems.add(path, value, error["msg"])
    else:  # a refusal this module does not word yet: said plainly, never in the library's words
        problems.add(path, value, "is not a value this setting takes (see docs/stack-settings.md)")


def limits(info: FieldInfo) -> tuple[float | None, float | None, bool]:
    """(minimum, maximum, whether the minimum is exclusive) of a field."""
    low: float | None = None
    high: float | None = None
    exclusive = False
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = m.ge  # type: ignore[assignment]
        elif isinstance(m, annotated_types.Gt):
            low, exclusive = m.gt, True  # type: ignore[assignment]
        elif isinstance(m, annotated_types.Le):
            high = m.le  # type: ignore[assignment]
    return low, high, exclusive


def bounds(info: FieldInfo) -> str:
    low, high, exclusive = limits(info)
    parts = (
        "" if low is None else f"{'>' if exclusive else '>='} {low:g}",
        "" if high is None else f"<= {high:g}",
    )
    return " and ".join(filter(None, parts))


def literal_choices(annotation: object) -> tuple[Any, ...]:
    """The values of a `Literal[...]` field (or of `Literal[...] | None`)."""
    for kind in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(kind) is Annotated:
            kind = typing.get_args(kind)[0]
        if typing.get_origin(kind) is Literal:
            return typing.get_args(kind)
    return ()


def base_type(annotation: object) -> object:
    """The type of a field less `| None` and `Annotated`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation
