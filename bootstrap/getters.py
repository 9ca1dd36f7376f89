"""Typed getters for the bootstrap's stack file (bootstrap/program.py): each records every problem with its full key
path, so one run reports all bad settings at once. The platform's own stack is read through its models
(infra/config/declared.py); these remain for the bootstrap's few keys."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import overload

from infra.config.problems import (
    ASCII_INTEGER,
    ASCII_NUMBER,
    MISSING,
    REMOVE,
    YAML_BOOLEANS,
    Fix,
    Problems,
    _Missing,
    fullmatch,
    item_key,
    nearest,
    type_name,
)


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

    def value(self, name: str) -> object:
        """The value of `name` as given, or MISSING: for a section a model reads (infra/config/declared.py)."""
        return self._get(name, False)

    @overload
    def text(
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
    def text(
        self,
        name: str,
        default: None,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> str | None: ...

    def text(
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
        return self.check_text(self.key(name), value, choices=choices, pattern=pattern, allowed=allowed, check=check)

    def check_text(
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
            self.problems.add(key, value, f"must be a string, not {type_name(value)}")
            return ""
        if choices is not None:
            options = sorted(choices)
            if value not in options:
                hint = f"; {allowed}" if allowed else ""
                near = nearest(value, options)
                fixes = [Fix.of({key: near})] if near else []
                self.problems.add(key, value, f"must be one of {', '.join(options)}{hint}", fixes=fixes)
                return ""
        if pattern is not None and not fullmatch(pattern, value):
            self.problems.add(key, value, allowed or f"must match {pattern}")
            return ""
        if check is not None and (why := check(value)):
            self.problems.add(key, value, why)
            return ""
        return value

    def boolean(self, name: str, default: bool | _Missing = MISSING) -> bool:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return default if isinstance(default, bool) else False
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value in YAML_BOOLEANS:
            return YAML_BOOLEANS[value]
        self.problems.add(self.key(name), value, "must be true or false")
        return False

    def _number(self, name: str, value: object, integer: bool) -> float | int | None:
        """`value` as a finite number (an int when `integer`), or None when it is not one."""
        if isinstance(value, str):  # Pulumi passes scalar config as strings: ASCII digits only
            text = value.strip()
            if integer and ASCII_INTEGER.fullmatch(text):
                value = int(text)
            elif not integer and ASCII_NUMBER.fullmatch(text):
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
            self.problems.add(self.key(name), value, f"must be {kind}" + ("" if integer else " (finite), like 2.5"))
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

    def sequence(
        self, name: str, default: list[object] | _Missing = MISSING, *, max_items: int | None = None
    ) -> list[object]:
        value = self._get(name, default is MISSING)
        if value is MISSING:
            return list(default) if isinstance(default, list) else []
        if not isinstance(value, list):
            self.problems.add(self.key(name), value, f"must be a list, not {type_name(value)}")
            return []
        if max_items is not None and len(value) > max_items:
            self.problems.add(self.key(name), value, f"must have at most {max_items} items")
            return []
        return list(value)

    def texts(
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
        items = self.sequence(name, list(default) if isinstance(default, list) else default, max_items=max_items)
        key = self.key(name)
        out = [
            self.check_text(f"{key}[{i}]", item, choices=choices, pattern=pattern, allowed=allowed, check=check)
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
            self.problems.add(self.key(name), value, f"must be a mapping, not {type_name(value)}")
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
                self.problems.add(parent.key(key), value, f"must be a mapping, not {type_name(value)}")
        return out

    def elements(
        self, name: str, default: list[object] | _Missing = MISSING, *, max_items: int | None = None
    ) -> list[Node]:
        """Each mapping of a list of mappings, e.g. budget thresholds."""
        out = []
        values = self.sequence(name, default, max_items=max_items)
        for i, value in enumerate(values):
            key = item_key(self.key(name), values, i)
            if isinstance(value, Mapping):
                out.append(Node({str(k): v for k, v in value.items()}, key, self.problems))
            else:
                self.problems.add(key, value, f"must be a mapping, not {type_name(value)}")
        return out

    def done(self, known_hint: Iterable[str] | None = None) -> None:
        """Refuse keys nobody read: a typo must not silently fall back to a default."""
        for name in self.data:
            if name not in self._read:
                known = sorted(known_hint if known_hint is not None else self._read)
                plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", name)  # a misspelling, not a key no path can name
                near = nearest(name, [k for k in known if k not in self.data]) if plain else None
                fixes = [Fix.of({self.key(name): REMOVE, self.key(near): self.data[name]})] if near else []
                self.problems.add(
                    self.key(name), self.data[name], f"unknown key; known keys: {', '.join(known)}", fixes=fixes
                )
