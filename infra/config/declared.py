"""Settings declared once, as pydantic models: a field's type, default, bounds, choices and description
are the reader, the defaults, the JSON Schema and the settings table at once (settings.py lists them).

A section is a `Section`: unknown keys refused, camelCase keys in the stack file for snake_case fields,
frozen. Scalars take what Pulumi hands the program (`"5"`, `"true"`) exactly as the hand-written getters
of problems.py did, and every refusal is translated into the project's problems (key, value, what is
allowed), never shown in the library's words.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, TypeVar

from annotated_types import Ge, Gt, Le
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

from infra.config.problems import (
    ASCII_INTEGER,
    ASCII_NUMBER,
    MISSING,
    REMOVE,
    YAML_BOOLEANS,
    Fix,
    Problems,
    fullmatch,
    item_keys,
    nearest,
    type_name,
)


class Section(BaseModel):
    """One mapping of the stack file. Its docstring is its description in the settings table."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True, strict=True)
    # Settings of which the stack must give at least one (the schema's anyOf, the table's "at least one of").
    any_of: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def complete(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """The section as the stack gives it, with what follows from it (a default another setting decides)."""
        return data

    @model_validator(mode="before")
    @classmethod
    def _completed(cls, data: Any) -> Any:
        """Less the settings given as null, which the stack file means as not set (an unknown key stays, to be
        refused), then completed."""
        if not isinstance(data, Mapping):
            return data
        return cls.complete({k: v for k, v in data.items() if v is not None or _step(cls, k)[0] is None})


def refuse(why: str, fix: object = None) -> PydanticCustomError:
    """A refusal in the project's words (`_translate` shows it as it is), with the value that would do instead."""
    return PydanticCustomError("refused", "{why}", {"why": why, "fix": fix})


@dataclass(frozen=True)
class Unstated:
    """An optional setting whose default the table and the schema do not state: the objects read the field's
    default ("" for a string), the stack simply leaves the setting out."""


@dataclass(frozen=True)
class Placeholder:
    """What a required field that is not a plain type holds while its stack is refused (the plan stops before
    anything reads it)."""

    value: object


def as_integer(value: object) -> object:
    """Pulumi passes scalar config as strings: ASCII digits only; no float, no boolean."""
    if isinstance(value, str) and ASCII_INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise refuse("must be an integer")
    return value


def _number(value: object) -> object:
    if isinstance(value, str) and ASCII_NUMBER.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise refuse("must be a number (finite), like 2.5")
    return value if isinstance(value, int) else float(value)  # an int stays one: compared exactly, shown as given


def _flag(value: object) -> object:
    if isinstance(value, str) and value in YAML_BOOLEANS:
        return YAML_BOOLEANS[value]
    if not isinstance(value, bool):
        raise refuse("must be true or false")
    return value


def as_text(value: object) -> object:
    if not isinstance(value, str):
        raise refuse(f"must be a string, not {type_name(value)}")
    return value


Integer = Annotated[int, BeforeValidator(as_integer)]
Number = Annotated[float | int, BeforeValidator(_number)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Text = Annotated[str, BeforeValidator(as_text)]


class _Rule:
    """Metadata of a field that checks its value after the type has (`Annotated[str, Allowed(...)]`)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self, handler(source))

    def __call__(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Allowed(_Rule):
    """What a setting takes beyond its type, in words (errors, the settings table), with the pattern and the
    check that decide it."""

    allowed: str = ""
    pattern: str | None = None
    check: Callable[[str], str | None] | None = None

    def __call__(self, value: Any) -> Any:
        if self.pattern is not None and not fullmatch(self.pattern, value):
            raise refuse(self.allowed or f"must match {self.pattern}")
        if self.check is not None and (why := self.check(value)):
            raise refuse(why)
        return value


@dataclass(frozen=True)
class OneOf(_Rule):
    """The values a setting takes: a tuple the code keeps (the catalog's, GCP's), or a function that gives
    them when a stack is read (the examples of the repository being read, which an installed `tpu-runs`
    learns only from the stack file's path)."""

    given: tuple[Any, ...] | Callable[[], tuple[Any, ...]]
    refusal: Callable[[Any], str] | None = None  # the refusal in words of its own, else "must be one of ..."
    hint: str = ""  # said after "must be one of ..."

    @property
    def choices(self) -> tuple[Any, ...]:
        return self.given() if callable(self.given) else self.given

    def __call__(self, value: Any) -> Any:
        choices = self.choices
        if value in choices:
            return value
        near = nearest(value, [c for c in choices if isinstance(c, str)]) if isinstance(value, str) else None
        if self.refusal is not None:
            raise refuse(self.refusal(value), near)
        options = sorted(choices, key=lambda c: (isinstance(c, str), c))
        raise refuse(f"must be one of {', '.join(map(str, options))}{self.hint and f'; {self.hint}'}", near)


@dataclass(frozen=True)
class Items(_Rule):
    """A list setting (at most `most` items, none repeated unless `repeats`), or a mapping's entries (read as
    (name, value) pairs in the stack file's order)."""

    most: int | None = None
    repeats: bool = False
    mapping: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        inner = core_schema.no_info_after_validator_function(self.distinct, handler(source))
        return core_schema.no_info_before_validator_function(self.read, inner)

    def read(self, value: object) -> object:
        if self.mapping and isinstance(value, tuple):  # already read: (key, value) pairs
            return value
        if not isinstance(value, Mapping if self.mapping else list | tuple):
            raise refuse(f"must be a {'mapping' if self.mapping else 'list'}, not {type_name(value)}")
        if self.most is not None and len(value) > self.most:
            raise refuse(f"must have at most {self.most} {'entries' if self.mapping else 'items'}")
        return tuple((str(k), v) for k, v in value.items()) if isinstance(value, Mapping) else tuple(value)

    def distinct(self, items: tuple[Any, ...]) -> tuple[Any, ...]:
        if self.repeats or self.mapping:  # items that may repeat need not be hashable (a slice pool's catalog type)
            return items
        if repeated := sorted({v for v in items if items.count(v) > 1}, key=str):
            raise refuse(f"must not repeat {', '.join(map(str, repeated))}", list(dict.fromkeys(items)))
        return items


S = TypeVar("S", bound=Section)


def read(
    model: type[S], data: Mapping[str, object], key: str, problems: Problems, supplied: Mapping[str, object] = {}
) -> S:
    """`data` (the mapping at `key`) as `model`, every refusal recorded in `problems`. What could not be
    read takes its default (a required setting an empty placeholder), so the checks across settings still
    see a whole section. `supplied`: the values of fields that are not the stack's (`exclude=True`, like a
    workload's name, its key in the stack), which the stack may not give itself."""
    keys: dict[tuple[str, int], list[str]] = {}  # each list's item keys, made once however many items are refused
    for name in supplied.keys() & {k for k, v in data.items() if v is not None}:
        _translate(model, {"type": "extra_forbidden", "loc": (name,)}, data, key, problems, keys)
    data = {**{k: v for k, v in data.items() if k not in supplied}, **supplied}
    try:
        return model.model_validate(data)
    except ValidationError as error:
        for e in error.errors():
            _translate(model, e, data, key, problems, keys)
        return _recovered(model, data, [e["loc"] for e in error.errors()])


def _recovered(model: type[S], data: Mapping[str, object], refused: list[tuple[Any, ...]]) -> S:
    """`model` from `data` less the settings at the `refused` locations: a section or a list item with a refused
    setting keeps its others, as the checks across settings expect."""
    kept: dict[str, object] = {}
    for name, value in data.items():
        below = [loc[1:] for loc in refused if loc[0] == name]
        if not below:
            kept[name] = value
            continue
        _, section = _step(model, name)
        if section is None or not all(below):
            continue
        if isinstance(value, Mapping):
            kept[name] = _recovered(section, value, below)
        elif isinstance(value, list) and all(isinstance(loc[0], int) for loc in below):
            items = [(item, [loc[1:] for loc in below if loc[0] == i]) for i, item in enumerate(value)]
            kept[name] = [
                _recovered(section, item, wrong) if wrong else section.model_validate(item)
                for item, wrong in items
                if isinstance(item, Mapping) and () not in wrong
            ]
    return _placeholder(model, kept)


def _placeholder(model: type[S], kept: Mapping[str, object] = {}) -> S:
    """`model` from the settings `kept` (each valid on its own), the others at their defaults, the required ones
    empty: "", 0, false or no items."""
    values = {}
    kept = model.complete(kept)
    for name, info in model.model_fields.items():
        given = kept.get(stack_key(name, info), kept.get(name))
        if given is not None:
            try:
                values[name] = _field_reader(model, name).validate_python(given)
                continue
            except ValidationError:  # a section valid only with what was refused from it: its default
                pass
        if info.is_required():
            kind = base_type(info.annotation)
            held = next((m.value for m in info.metadata if isinstance(m, Placeholder)), MISSING)
            if held is not MISSING:
                values[name] = held
            elif isinstance(kind, type) and issubclass(kind, Section):
                values[name] = _placeholder(kind)
            else:
                empty: Any = typing.get_origin(kind) or kind
                values[name] = empty()
    return model.model_construct(**values)


@functools.cache
def _field_reader(model: type[Section], name: str) -> TypeAdapter[Any]:
    """What reads one field of `model` on its own (built once: building one takes milliseconds)."""
    info = model.model_fields[name]
    kind: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    return TypeAdapter(kind)


def _section_in(annotation: object) -> type[Section] | None:
    """The section a field holds: itself, or the items of its list."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    return next(filter(None, (_section_in(a) for a in typing.get_args(annotation))), None)


def _step(model: type[Section], name: object) -> tuple[FieldInfo | None, type[Section] | None]:
    """The field a stack-file key names in `model`, and its section type when it is one."""
    for field_name, info in model.model_fields.items():
        if name in (field_name, stack_key(field_name, info)):
            return info, _section_in(info.annotation)
    return None, None


def _field_at(model: type[Section], loc: tuple[Any, ...]) -> tuple[FieldInfo | None, type[Section]]:
    """The field a problem's location names, and the section holding it."""
    info: FieldInfo | None = None
    for index, step in enumerate(loc):
        if isinstance(step, int):  # an item of a list: the list's field still decides
            continue
        info, section = _step(model, step)
        if section is not None and index < len(loc) - 1:
            model = section
    return info, model


def _given(data: object, loc: tuple[Any, ...]) -> object:
    """What the stack file gives at `loc` (`"5"`, not the 5 it was read as)."""
    for step in loc:
        if isinstance(data, list) and isinstance(step, int):
            data = data[step] if step < len(data) else None
        else:
            data = data.get(step) if isinstance(data, Mapping) else None
    return data


def _translate(
    model: type[Section],
    error: Any,
    data: Mapping[str, object],
    key: str,
    problems: Problems,
    keys: dict[tuple[str, int], list[str]],
) -> None:
    """One refusal in the project's words: the key, the value given, what is allowed."""
    loc: tuple[Any, ...] = error["loc"]
    path = key
    for index, step in enumerate(loc):
        items = _given(data, loc[:index])
        if isinstance(step, int) and isinstance(items, list):
            if (path, id(items)) not in keys:
                keys[path, id(items)] = item_keys(path, items)
            path = keys[path, id(items)][step]
        else:
            path = f"{path}[{step}]" if isinstance(step, int) else f"{path}{'' if path.endswith(':') else '.'}{step}"
    info, owner = _field_at(model, loc)
    value = _given(data, loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        known = sorted(stack_key(n, f) for n, f in owner.model_fields.items() if not f.exclude)
        here, beside = _given(data, loc[:-1]), path.removesuffix(str(loc[-1]))  # `a.b.` or a namespace's `ns:`
        plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", str(loc[-1]))  # a misspelling, not a key no path can name
        near = nearest(str(loc[-1]), [k for k in known if not isinstance(here, Mapping) or here.get(k) is None])
        fixes = [Fix.of({path: REMOVE, f"{beside}{near}": value})] if near and plain else []
        shown = [f"{beside}{k}" if beside.endswith(":") else k for k in known]  # top-level keys in full
        problems.add(path, value, f"unknown key; known keys: {', '.join(shown)}", fixes=fixes)
    elif kind == "missing":
        problems.add(path, MISSING, "required")
    elif kind in ("greater_than", "greater_than_equal", "less_than_equal") and info is not None:
        integer = base_type(info.annotation) is int
        problems.add(path, value, f"must be {'an integer' if integer else 'a number'} {bounds(info)}")
    elif kind in ("model_type", "dict_type"):
        problems.add(path, value, f"must be a mapping, not {type_name(value)}")
    elif kind == "refused":
        fix = error.get("ctx", {}).get("fix")
        problems.add(path, value, error["msg"], fixes=[Fix.of({path: fix})] if fix is not None else [])
    else:  # a refusal this module does not word yet: said plainly, never in the library's words
        problems.add(path, value, "is not a value this setting takes (see docs/stack-settings.md)")


def stack_key(name: str, info: FieldInfo) -> str:
    """The key a field has in the stack file: camelCase, or the name it is read by where that differs
    (`acceleratorType` for a VM's `accelerator`)."""
    return info.validation_alias if isinstance(info.validation_alias, str) else info.alias or name


def limits(info: FieldInfo) -> tuple[float | None, float | None, bool]:
    """(minimum, maximum, whether the minimum is exclusive) of a field."""
    bound = {k: v for m in marks(info) if isinstance(m, Ge | Gt | Le) for k, v in dataclasses.asdict(m).items()}
    return bound.get("ge", bound.get("gt")), bound.get("le"), "gt" in bound


def bounds(info: FieldInfo) -> str:
    low, high, exclusive = limits(info)
    parts = ("" if low is None else f"{'>' if exclusive else '>='} {low:g}", "" if high is None else f"<= {high:g}")
    return " and ".join(filter(None, parts))


def choices_of(info: FieldInfo) -> tuple[Any, ...]:
    return next((m.choices for m in marks(info) if isinstance(m, OneOf)), ())


def marks(info: FieldInfo) -> list[object]:
    """The metadata of a field, its items' and its `| None` alternative's included."""

    def inner(annotation: object) -> list[object]:
        args = typing.get_args(annotation)
        own = list(args[1:]) if typing.get_origin(annotation) is Annotated else []
        return own + [m for a in args for m in inner(a)]

    return [*info.metadata, *inner(info.annotation)]


def base_type(annotation: object) -> object:
    """The type of a field less `| None` and `Annotated`."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
