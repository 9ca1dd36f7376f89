"""A small strict reader for stack-file values: typed getters that record every problem with its
full key path, so one run reports all bad settings at once, each naming key, value and what is allowed.

A getter returns the value, or a falsy placeholder ("" / 0 / False / []) when the value is missing or
refused: the problem is recorded and `Problems.raise_if_any` stops the parse before the placeholder
could be used, while follow-up checks on a falsy value are skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import overload


class _Missing:
    """A required value that is not set: falsy, so follow-up checks on it are skipped."""

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


MISSING = _Missing()
_ASCII_INTEGER = re.compile(r"[-+]?[0-9]+")
_ASCII_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    allowed: str

    def __str__(self) -> str:
        shown = "(not set)" if self.value is MISSING else repr(self.value)
        return f"{self.key} = {shown}: {self.allowed}"


class ConfigError(Exception):
    """Every problem found in one stack's settings."""

    def __init__(self, stack: str, problems: Iterable[Problem]):
        self.stack = stack
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = len(self.problems)
        super().__init__(
            f"stack '{stack}': {count} invalid setting{'s' if count != 1 else ''} (Pulumi.{stack}.yaml):\n{lines}"
        )


@dataclass
class Problems:
    items: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def add(self, key: str, value: object, allowed: str) -> None:
        self.items.append(Problem(key, value, allowed))

    def warn(self, key: str, value: object, advice: str) -> None:
        """Legal but likely a mistake: shown in the plan, does not stop it."""
        self.warnings.append(Problem(key, value, advice))

    def raise_if_any(self, stack: str) -> None:
        if self.items:
            raise ConfigError(stack, self.items)


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def decode_objects(raw: Mapping[str, object], keys: Iterable[str], problems: Problems) -> dict[str, object]:
    """`raw` with the values of `keys` JSON-decoded: Pulumi passes object and list config as JSON."""
    out = dict(raw)
    for key in keys:
        text = out.get(key)
        if isinstance(text, str):
            try:
                # NaN and Infinity are not JSON; Python's decoder would accept them.
                out[key] = json.loads(text, parse_constant=_no_constant)
            except (json.JSONDecodeError, ValueError, RecursionError):
                problems.add(key, out.pop(key), "must be a YAML mapping or list (Pulumi passes it as JSON)")
    return out


def fullmatch(pattern: str, text: str) -> bool:
    """The whole text matches, `\\d` and `\\w` meaning ASCII only (`re.match` with `$` would accept a
    trailing newline, and `\\d` would accept Arabic-Indic or superscript digits)."""
    return re.fullmatch(pattern, text, flags=re.ASCII) is not None


class Node:
    """One mapping in the stack file, at a key path. Getters return a value or a falsy placeholder."""

    def __init__(self, data: Mapping[str, object], path: str, problems: Problems):
        self.data = data
        self.path = path
        self.problems = problems
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, required: bool) -> object:
        """The value of `name`, or MISSING (recorded as a problem when `required`)."""
        self._read.add(name)
        value = self.data.get(name, MISSING)
        if value is None:
            value = MISSING
        if value is MISSING and required:
            self.problems.add(self.key(name), MISSING, "required")
        return value

    @overload
    def str(
        self,
        name: str,
        default: str | _Missing = ...,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> str: ...

    @overload
    def str(
        self,
        name: str,
        default: None,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> str | None: ...

    def str(
        self,
        name: str,
        default: str | _Missing | None = MISSING,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> str | None:
        """A string; refused when not among `choices`, not matching `pattern` (whole, ASCII classes)
        or when `check` says why."""
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return default if isinstance(default, str) or default is None else ""
        return self.check_str(self.key(name), value, choices=choices, pattern=pattern, allowed=allowed, check=check)

    def check_str(
        self,
        key: str,
        value: object,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> str:
        if not isinstance(value, str):
            self.problems.add(key, value, f"must be a string, not {_type_name(value)}")
            return ""
        if choices is not None:
            options = sorted(choices)
            if value not in options:
                hint = f"; {allowed}" if allowed else ""
                self.problems.add(key, value, f"must be one of {', '.join(options)}{hint}")
                return ""
        if pattern is not None and not fullmatch(pattern, value):
            self.problems.add(key, value, allowed or f"must match {pattern}")
            return ""
        if check is not None and (why := check(value)):
            self.problems.add(key, value, why)
            return ""
        return value

    def bool(self, name: str, default: bool | _Missing = MISSING) -> bool:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return default if isinstance(default, bool) else False
        if isinstance(value, bool):
            return value
        # Pulumi passes scalar config as strings, and YAML 1.2 spells booleans these ways.
        if isinstance(value, str) and value in ("true", "True", "TRUE", "false", "False", "FALSE"):
            return value.lower() == "true"
        self.problems.add(self.key(name), value, "must be true or false")
        return False

    def _number(self, name: str, value: object, integer: bool) -> float | int | None:
        """`value` as a finite number (an int when `integer`), or None when it is not one."""
        if isinstance(value, str):  # Pulumi passes scalar config as strings: ASCII digits only
            text = value.strip()
            if integer and _ASCII_INTEGER.fullmatch(text):
                value = int(text)
            elif not integer and _ASCII_NUMBER.fullmatch(text):
                value = float(text)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if integer and isinstance(value, float):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    def _bounded(
        self,
        name: str,
        value: object,
        *,
        integer: bool,
        minimum: float | None,
        maximum: float | None,
        exclusive_minimum: bool,
    ) -> float | int | None:
        number = self._number(name, value, integer)
        kind = "an integer" if integer else "a number"
        if number is None:
            self.problems.add(self.key(name), value, f"must be {kind}" + ("" if integer else " (finite)"))
            return None
        low_ok = minimum is None or (number > minimum if exclusive_minimum else number >= minimum)
        high_ok = maximum is None or number <= maximum
        if not (low_ok and high_ok):
            low = "" if minimum is None else f"{'>' if exclusive_minimum else '>='} {minimum:g}"
            high = "" if maximum is None else f"<= {maximum:g}"
            self.problems.add(self.key(name), value, f"must be {kind} {' and '.join(filter(None, (low, high)))}")
            return None
        return number

    def number(
        self,
        name: str,
        default: float | _Missing = MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
    ) -> float:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return default if isinstance(default, int | float) else 0.0
        bounded = self._bounded(
            name, value, integer=False, minimum=minimum, maximum=maximum, exclusive_minimum=exclusive_minimum
        )
        return 0.0 if bounded is None else bounded

    def optional_number(
        self, name: str, *, minimum: float | None = None, maximum: float | None = None, exclusive_minimum: bool = False
    ) -> float | None:
        value = self._get(name, False)
        if value is MISSING:
            return None
        return self._bounded(
            name, value, integer=False, minimum=minimum, maximum=maximum, exclusive_minimum=exclusive_minimum
        )

    def integer(
        self,
        name: str,
        default: int | _Missing = MISSING,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        choices: Iterable[int] | None = None,
    ) -> int:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return default if isinstance(default, int) else 0
        bounded = self._bounded(name, value, integer=True, minimum=minimum, maximum=maximum, exclusive_minimum=False)
        if bounded is None:
            return 0
        if choices is not None and bounded not in set(choices):
            self.problems.add(self.key(name), value, f"must be one of {', '.join(str(c) for c in sorted(choices))}")
            return 0
        return int(bounded)

    def list(
        self, name: str, default: list[object] | _Missing = MISSING, *, max_items: int | None = None
    ) -> list[object]:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return list(default) if isinstance(default, list) else []
        if not isinstance(value, list):
            self.problems.add(self.key(name), value, f"must be a list, not {_type_name(value)}")
            return []
        if max_items is not None and len(value) > max_items:
            self.problems.add(self.key(name), value, f"must have at most {max_items} items")
            return []
        return list(value)

    def str_list(
        self,
        name: str,
        default: list[str] | _Missing = MISSING,
        *,
        max_items: int | None = None,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> list[str]:
        """A list of unique strings, each checked like `str`."""
        items = self.list(name, list(default) if isinstance(default, list) else default, max_items=max_items)
        key = self.key(name)
        out = [
            self.check_str(f"{key}[{i}]", item, choices=choices, pattern=pattern, allowed=allowed, check=check)
            for i, item in enumerate(items)
        ]
        duplicates = sorted({v for v in out if v and out.count(v) > 1})
        if duplicates:
            self.problems.add(key, items, f"must not repeat {', '.join(duplicates)}")
        return [v for v in out if v]

    def child(self, name: str, required: bool = True) -> Node | None:
        """The mapping under `name`; an absent optional one is an empty mapping, an absent required one None."""
        value = self._get(name, required)
        if value is MISSING:
            return None if required else Node({}, self.key(name), self.problems)
        if not isinstance(value, Mapping):
            self.problems.add(self.key(name), value, f"must be a mapping, not {_type_name(value)}")
            return None
        return Node({str(k): v for k, v in value.items()}, self.key(name), self.problems)

    def entries(
        self, name: str, required: bool = True, *, max_items: int | None = None
    ) -> list[tuple[str, object, str]]:
        """(key, value, key path) of each entry of a free-form mapping, e.g. labels or subnets by region."""
        parent = self.child(name, required)
        if parent is None:
            return []
        if max_items is not None and len(parent.data) > max_items:
            self.problems.add(self.key(name), dict(parent.data), f"must have at most {max_items} entries")
            return []
        return [(k, v, parent.key(k)) for k, v in parent.data.items()]

    def items(self, name: str) -> list[tuple[str, Node]]:
        """Each (key, child mapping) of a mapping-of-mappings, e.g. workloads by name."""
        parent = self.child(name, False)
        if parent is None:
            return []
        parent._read.update(parent.data)
        out: list[tuple[str, Node]] = []
        for key, value in parent.data.items():
            if isinstance(value, Mapping):
                out.append((key, Node({str(k): v for k, v in value.items()}, parent.key(key), self.problems)))
            elif value is None:
                out.append((key, Node({}, parent.key(key), self.problems)))
            else:
                self.problems.add(parent.key(key), value, f"must be a mapping, not {_type_name(value)}")
        return out

    def elements(
        self, name: str, default: list[object] | _Missing = MISSING, *, max_items: int | None = None
    ) -> list[Node]:
        """Each mapping of a list of mappings, e.g. budget thresholds."""
        out = []
        for i, value in enumerate(self.list(name, default, max_items=max_items)):
            key = f"{self.key(name)}[{i}]"
            if isinstance(value, Mapping):
                out.append(Node({str(k): v for k, v in value.items()}, key, self.problems))
            else:
                self.problems.add(key, value, f"must be a mapping, not {_type_name(value)}")
        return out

    def done(self, known_hint: Iterable[str] | None = None) -> None:
        """Refuse keys nobody read: a typo must not silently fall back to a default."""
        for name in self.data:
            if name not in self._read:
                known = sorted(known_hint if known_hint is not None else self._read)
                self.problems.add(self.key(name), self.data[name], f"unknown key; known keys: {', '.join(known)}")
