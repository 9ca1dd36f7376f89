"""Problems found in a stack's settings, each naming key, value and what is allowed, with the fixes that
resolve them; one run reports them all (`ConfigError`). The settings are read through their models
(infra/config/declared.py): what could not be read takes a falsy placeholder, so the checks that follow
skip it, and `Problems.raise_if_any` stops the parse before anything else could use it.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


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
    return item_keys(key, items)[index]


def item_keys(key: str, items: Sequence[object]) -> list[str]:
    """Every item's key (`item_key`), the names counted once: a loop over a fleet's VMs that asked
    `item_key` for each would count them once per VM."""
    names = [i.get("name") if isinstance(i, Mapping) else getattr(i, "name", None) for i in items]
    counts = collections.Counter(n for n in names if isinstance(n, str))
    return [
        f"{key}[{name if isinstance(name, str) and ITEM_NAME.fullmatch(name) and counts[name] == 1 else index}]"
        for index, name in enumerate(names)
    ]


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
