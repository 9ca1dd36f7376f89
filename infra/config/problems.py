"""A small strict reader for stack-file values: typed getters that record every problem with its
full key path, so one run reports all bad settings at once, each naming key, value and what is allowed.

A getter returns the value, or a falsy placeholder ("" / 0 / False / []) when the value is missing or
refused: the problem is recorded and `Problems.raise_if_any` stops the parse before the placeholder
could be used, while follow-up checks on a falsy value are skipped.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload


class _Missing:
    """A required value that is not set: falsy, so follow-up checks on it are skipped."""

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


MISSING = _Missing()
ASCII_INTEGER = re.compile(r"[-+]?[0-9]+")
ASCII_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
# Pulumi passes scalar config as strings, and YAML 1.2 spells booleans these ways.
YAML_BOOLEANS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


class _Remove:
    """An edit that removes a key from the stack file."""

    def __repr__(self) -> str:
        return "<remove>"


REMOVE = _Remove()
_SEGMENT = re.compile(r"\.([^.\[\]]+)|\[([^.\[\]]+)\]")
ITEM_NAME = re.compile(r"[a-z][a-z0-9-]{0,62}")  # a name GCP could take: longer ones are named by position


class Named(str):
    """The item of a list whose `name` is this (`tpuVms[mnist]`)."""


def item_key(key: str, items: Sequence[object], index: int) -> str:
    """The key of a list's item: by its name where it has a plain one no other item shares (`tpuVms[mnist]`),
    else by its position (`tpuVms[0]`)."""
    names = [i.get("name") if isinstance(i, Mapping) else getattr(i, "name", None) for i in items]
    name = names[index]
    plain = isinstance(name, str) and ITEM_NAME.fullmatch(name) and names.count(name) == 1
    return f"{key}[{name if plain else index}]"


def key_segments(key: str) -> list[str | int]:
    """A problem's key as steps into the stack file's config: `tpu-platform:tpuVms[mnist].zone` is
    `["tpu-platform:tpuVms", Named("mnist"), "zone"]` (a top-level key, then mapping keys and list items, by
    name or position)."""
    top = re.match(r"[^.\[]+", key)
    if top is None:
        raise ValueError(f"not a config key: {key!r}")
    steps: list[str | int] = [top[0]]
    rest = key[top.end() :]
    for match in _SEGMENT.finditer(rest):
        item = match[2]
        steps.append(match[1] if item is None else int(item) if re.fullmatch("[0-9]+", item) else Named(item))
    if "".join(m[0] for m in _SEGMENT.finditer(rest)) != rest:
        raise ValueError(f"not a config key: {key!r}")
    return steps


def _yaml_text(value: object) -> str:
    """A value as the stack file spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_yaml_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _pulumi_scalar(value: object) -> str:
    """A top-level scalar as Pulumi passes it to the program: a string (`true`, `10`, `us-central1`)."""
    return _yaml_text(value) if isinstance(value, bool | int | float) else str(value)


@dataclass(frozen=True)
class Fix:
    """A change to the stack file that resolves a problem: each key (a problem key, like
    `tpu-platform:tpuVms[0].runtimeVersion`) set to a value, or removed (REMOVE).

    Rules compute the values from what the checks accept; the reader keeps a fix only when the stack
    with it applied passes those same checks (`Problems.keep_fixes_that_work`), so a suggestion
    never leads to another error."""

    edits: tuple[tuple[str, object], ...]

    @classmethod
    def of(cls, edits: Mapping[str, object]) -> Fix:
        return cls(tuple(edits.items()))

    def says(self, key: str) -> str:
        """The fix in words, each key named relative to the problem's `key` where they share an item."""
        return " and ".join(
            f"remove {_relative(path, key)}" if value is REMOVE else f"set {_relative(path, key)}: {_yaml_text(value)}"
            for path, value in self.edits
        )

    def apply(self, raw: Mapping[str, str]) -> dict[str, str]:
        """A copy of `raw` (the stack's config as Pulumi passes it: objects JSON-encoded) with the fix made."""
        out = dict(raw)
        for path, value in self.edits:
            top, *steps = key_segments(path)
            assert isinstance(top, str)
            if not steps:
                if value is REMOVE:
                    out.pop(top, None)
                else:
                    out[top] = json.dumps(value) if isinstance(value, Mapping | list) else _pulumi_scalar(value)
                continue
            data = target = _container(_decoded(out.get(top)), steps[0])
            for step, following in itertools.pairwise(steps):
                child = _container(_child(target, step), following)
                _edit(target, step, child)
                target = child
            _edit(target, steps[-1], value)
            out[top] = json.dumps(data)
        return out


def _decoded(text: str | None) -> object:
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None  # not JSON: the fix replaces it


def _container(value: object, step: str | int) -> Any:
    """`value` if it can hold `step` (a mapping for a key, a list for an item), else an empty one."""
    kind = dict if isinstance(step, str) and not isinstance(step, Named) else list
    return value if isinstance(value, kind) else kind()


def _position(container: list[Any], step: str | int) -> int:
    """Where the item `step` names is in a list (past its end: an item to add)."""
    if isinstance(step, int):
        return step
    return next(
        (i for i, v in enumerate(container) if isinstance(v, Mapping) and v.get("name") == step), len(container)
    )


def _child(container: Any, step: str | int) -> object:
    if isinstance(container, dict):
        return container.get(step)
    index = _position(container, step)
    return container[index] if index < len(container) else None


def _edit(container: Any, step: str | int, value: object) -> None:
    """Set `step` of a mapping or list to `value` (the next position of a list adds an item), or remove it."""
    if isinstance(container, dict):
        if value is REMOVE:
            container.pop(step, None)
        else:
            container[step] = value
    elif isinstance(container, list):
        step = _position(container, step)
        if value is REMOVE:
            del container[step : step + 1]
        elif step == len(container):
            container.append(value)
        else:
            container[step] = value


def _relative(path: str, key: str) -> str:
    """`path` as seen from the problem at `key`: below the same list item (`tpuVms[mnist]`) or beside the
    key in its mapping, only the rest (`runtimeVersion`); anywhere else, the whole key."""
    steps, near = key_segments(path), key_segments(key)
    common = 0
    while common < min(len(steps) - 1, len(near)) and steps[common] == near[common]:
        common += 1
    if common and (isinstance(steps[common - 1], int | Named) or common == len(near) - 1):
        rest = steps[common:]
        return "".join(f"[{s}]" if isinstance(s, int | Named) else f".{s}" for s in rest).lstrip(".")
    return path


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    allowed: str  # why the value is refused, or what is allowed
    fixes: tuple[Fix, ...] = ()  # changes that resolve it, each checked to lead to no other error
    advice: str = ""  # what else to do, where no change can be computed (another generation, a key of theirs)

    def __str__(self) -> str:
        shown = "(not set)" if self.value is MISSING else repr(self.value)
        ways = [fix.says(self.key) for fix in self.fixes] + ([self.advice] if self.advice else [])
        return f"{self.key} = {shown}: {self.allowed}" + (f"; {', or '.join(ways)}" if ways else "")

    @property
    def identity(self) -> tuple[str, str]:
        """What a problem is, whatever fixes it offers: the same key refused for the same reason."""
        return (self.key, self.allowed)


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


# Each fix is checked by checking the whole stack again: a big broken stack gets suggestions for its first
# problems only (a 1,000-VM stack takes most of a second a check), the rest on the next plan.
MAX_RECHECKS = 12


@dataclass
class Problems:
    items: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    offer_fixes: bool = True  # False while a fix is being checked: its findings need no fixes of their own

    def add(self, key: str, value: object, allowed: str, *, fixes: Iterable[Fix] = (), advice: str = "") -> None:
        """A problem, with the fixes that may resolve it (`keep_fixes_that_work` keeps those that do).
        `fixes` is read only when fixes are offered: a generator is not run while a fix is checked."""
        self.items.append(Problem(key, value, allowed, tuple(fixes) if self.offer_fixes else (), advice))

    def warn(self, key: str, value: object, advice: str, *, fixes: Iterable[Fix] = ()) -> None:
        """Legal but likely a mistake: shown in the plan, does not stop it."""
        self.warnings.append(Problem(key, value, advice, tuple(fixes) if self.offer_fixes else ()))

    def keep_fixes_that_work(self, recheck: Callable[[Fix], Problems]) -> None:
        """Drop each fix that does not work: `recheck` checks the stack again with the fix applied, and
        the problem must be gone with no error that was not there before. Past MAX_RECHECKS distinct
        fixes, the rest are dropped unchecked."""
        before = {p.identity for p in self.items}
        checked: dict[str, Problems] = {}

        def works(problem: Problem, fix: Fix) -> bool:
            if repr(fix.edits) not in checked:
                if len(checked) >= MAX_RECHECKS:
                    return False
                checked[repr(fix.edits)] = recheck(fix)
            after = checked[repr(fix.edits)]
            if problem.identity in {p.identity for p in (*after.items, *after.warnings)}:
                return False
            return {p.identity for p in after.items} <= before

        def vetted(problems: list[Problem]) -> list[Problem]:
            return [
                dataclasses.replace(p, fixes=tuple(f for f in p.fixes if works(p, f))) if p.fixes else p
                for p in problems
            ]

        self.items, self.warnings = vetted(self.items), vetted(self.warnings)

    def raise_if_any(self, stack: str) -> None:
        if self.items:
            raise ConfigError(stack, self.items)


def type_name(value: object) -> str:
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


def nearest(given: str, options: Iterable[str]) -> str | None:
    """The one option `given` most likely misspells (`provisoning` for `provisioning`), or None."""
    close = difflib.get_close_matches(given, list(options), n=1, cutoff=0.7)
    return close[0] if close else None


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
