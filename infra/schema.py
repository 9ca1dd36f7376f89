"""A small strict reader for stack-file values: typed getters that record every problem with its
full key path, so one run reports all bad settings at once, each naming key, value and what is allowed.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class _Missing:
    """A required value that is not set: falsy, so follow-up checks on it are skipped."""

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Problem:
    key: str
    value: Any
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

    def add(self, key: str, value: Any, allowed: str) -> None:
        self.items.append(Problem(key, value, allowed))

    def warn(self, key: str, value: Any, advice: str) -> None:
        """Legal but likely a mistake: shown in the plan, does not stop it."""
        self.warnings.append(Problem(key, value, advice))

    def raise_if_any(self, stack: str) -> None:
        if self.items:
            raise ConfigError(stack, self.items)


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def decode_objects(raw: Mapping[str, Any], keys: Iterable[str], problems: Problems) -> dict[str, Any]:
    """`raw` with the values of `keys` JSON-decoded: Pulumi passes object and list config as JSON."""
    out = dict(raw)
    for key in keys:
        if isinstance(out.get(key), str):
            try:
                out[key] = json.loads(out[key])
            except json.JSONDecodeError:
                problems.add(key, out.pop(key), "must be a YAML mapping or list (Pulumi passes it as JSON)")
    return out


class Node:
    """One mapping in the stack file, at a key path. Getters return a value or None on a problem."""

    def __init__(self, data: Mapping[str, Any], path: str, problems: Problems):
        self.data = data
        self.path = path
        self.problems = problems
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def _get(self, name: str, default: Any) -> tuple[bool, Any]:
        """(set, value): whether the stack sets `name`, and its value or the default."""
        self._read.add(name)
        value = self.data.get(name, MISSING)
        if value is MISSING or value is None:
            if default is MISSING:
                self.problems.add(self.key(name), MISSING, "required")
            return False, default
        return True, value

    def str(self, name: str, default: Any = MISSING, **checks: Any) -> Any:
        """A string; `checks` are those of `check_str` (choices, pattern, allowed, check)."""
        given, value = self._get(name, default)
        if not given:
            return value
        return self.check_str(self.key(name), value, **checks)

    def check_str(
        self,
        key: str,
        value: Any,
        *,
        choices: Iterable[str] | None = None,
        pattern: str | None = None,
        allowed: str = "",
        check: Callable[[str], str | None] | None = None,
    ) -> Any:
        if not isinstance(value, str):
            self.problems.add(key, value, f"must be a string, not {_type_name(value)}")
            return None
        if choices is not None:
            options = sorted(choices)
            if value not in options:
                hint = f"; {allowed}" if allowed else ""
                self.problems.add(key, value, f"must be one of {', '.join(options)}{hint}")
                return None
        if pattern is not None and not re.fullmatch(pattern, value):
            self.problems.add(key, value, allowed or f"must match {pattern}")
            return None
        if check is not None and (why := check(value)):
            self.problems.add(key, value, why)
            return None
        return value

    def bool(self, name: str, default: Any = MISSING) -> Any:
        given, value = self._get(name, default)
        if isinstance(value, bool) or not given:
            return value
        # Pulumi passes scalar config as strings.
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.problems.add(self.key(name), value, "must be true or false")
        return None

    def number(
        self,
        name: str,
        default: Any = MISSING,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
        integer: bool = False,
    ) -> Any:
        given, value = self._get(name, default)
        if not given:
            return value
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = int(value) if integer else float(value)
        kind = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
            self.problems.add(self.key(name), value, f"must be {kind}")
            return None
        low_ok = minimum is None or (value > minimum if exclusive_minimum else value >= minimum)
        high_ok = maximum is None or value <= maximum
        if not (low_ok and high_ok):
            low = "" if minimum is None else f"{'>' if exclusive_minimum else '>='} {minimum:g}"
            high = "" if maximum is None else f"<= {maximum:g}"
            self.problems.add(self.key(name), value, f"must be {kind} {' and '.join(filter(None, (low, high)))}")
            return None
        return value

    def list(self, name: str, default: Any = MISSING, *, max_items: int | None = None) -> Any:
        given, value = self._get(name, default)
        if not given:
            return value
        if not isinstance(value, list):
            self.problems.add(self.key(name), value, f"must be a list, not {_type_name(value)}")
            return None
        if max_items is not None and len(value) > max_items:
            self.problems.add(self.key(name), value, f"must have at most {max_items} items")
            return None
        return value

    def str_list(self, name: str, default: Any = MISSING, *, max_items: int | None = None, **checks: Any) -> Any:
        """A list of unique strings, each checked like `str`."""
        items = self.list(name, default, max_items=max_items)
        if not isinstance(items, list):
            return items
        key = self.key(name)
        out = [self.check_str(f"{key}[{i}]", item, **checks) for i, item in enumerate(items)]
        duplicates = sorted({v for v in out if v is not None and out.count(v) > 1})
        if duplicates:
            self.problems.add(key, items, f"must not repeat {', '.join(duplicates)}")
        return [v for v in out if v is not None]

    def child(self, name: str, default: Any = MISSING) -> Node | None:
        given, value = self._get(name, default)
        if value is MISSING:
            return None
        if not given:
            value = {}
        if not isinstance(value, Mapping):
            self.problems.add(self.key(name), value, f"must be a mapping, not {_type_name(value)}")
            return None
        return Node(value, self.key(name), self.problems)

    def entries(self, name: str, default: Any = MISSING) -> list[tuple[str, Any, str]]:
        """(key, value, key path) of each entry of a free-form mapping, e.g. labels or subnets by region."""
        parent = self.child(name, default)
        if parent is None:
            return []
        return [(str(k), v, parent.key(str(k))) for k, v in parent.data.items()]

    def items(self, name: str) -> list[tuple[str, Node]]:
        """Each (key, child mapping) of a mapping-of-mappings, e.g. workloads by name."""
        parent = self.child(name, {})
        if parent is None:
            return []
        parent._read.update(parent.data)
        out: list[tuple[str, Node]] = []
        for key, value in parent.data.items():
            if isinstance(value, Mapping):
                out.append((str(key), Node(value, parent.key(str(key)), self.problems)))
            elif value is None:
                out.append((str(key), Node({}, parent.key(str(key)), self.problems)))
            else:
                self.problems.add(parent.key(str(key)), value, f"must be a mapping, not {_type_name(value)}")
        return out

    def elements(self, name: str, default: Any = MISSING, **kwargs: Any) -> list[Node]:
        """Each mapping of a list of mappings, e.g. budget thresholds."""
        items = self.list(name, default, **kwargs)
        if not isinstance(items, list):
            return []
        out = []
        for i, value in enumerate(items):
            key = f"{self.key(name)}[{i}]"
            if isinstance(value, Mapping):
                out.append(Node(value, key, self.problems))
            else:
                self.problems.add(key, value, f"must be a mapping, not {_type_name(value)}")
        return out

    def done(self, known_hint: Iterable[str] | None = None) -> None:
        """Refuse keys nobody read: a typo must not silently fall back to a default."""
        for name in self.data:
            if name not in self._read:
                known = sorted(known_hint if known_hint is not None else self._read)
                self.problems.add(self.key(str(name)), self.data[name], f"unknown key; known keys: {', '.join(known)}")
