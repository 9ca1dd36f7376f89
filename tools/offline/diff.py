"""Compare two offline plans (`plan --json`) and summarise the change as Markdown for a PR.

For forks and PRs without cloud access: no credentials needed, only the plans of the base and the
head. Resources are matched by URN. A changed resource is an update or, when an input the provider
cannot change in place differs (`force_new.json`), a replacement: destroyed and created again.
Long and multi-line values are shown as a line diff. A head that could not be planned (a bad stack
file) is shown with its errors; warnings and policy results of the head are listed.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from tools.offline import force_new

SHORT_VALUE = 80  # longer strings, and any multi-line string, are shown as a line diff
DIFF_CONTEXT = 2
MAX_DIFF_LINES = 60  # per property, so a rewritten script does not bury the rest of the comment

Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"


class _Unset:
    """A property present on one side only."""

    def __repr__(self) -> str:
        return "(unset)"


UNSET = _Unset()
Value: TypeAlias = "Json | _Unset"


def _flat(value: Json, prefix: str = "") -> dict[str, Json]:
    if isinstance(value, dict):
        out: dict[str, Json] = {}
        for key, child in value.items():
            out.update(_flat(child, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = {}
        for index, child in enumerate(value):
            out.update(_flat(child, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def changed_properties(before: Mapping[str, Json], after: Mapping[str, Json]) -> list[tuple[str, Value, Value]]:
    old, new = _flat(dict(before)), _flat(dict(after))
    return [
        (key, old.get(key, UNSET), new.get(key, UNSET))
        for key in sorted(old.keys() | new.keys())
        if old.get(key, UNSET) != new.get(key, UNSET)
    ]


def _code(text: str) -> str:
    """Inline code that survives backticks and table pipes in the value."""
    text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


def _is_long(value: Value) -> bool:
    return isinstance(value, str) and (len(value) > SHORT_VALUE or "\n" in value)


def _show(value: Value) -> str:
    if isinstance(value, _Unset):
        return "_(unset)_"
    return _code(value if isinstance(value, str) else json.dumps(value))


def _lines(value: Value) -> list[str]:
    """A long value as lines: JSON documents (dashboards) pretty-printed, scripts by line."""
    if isinstance(value, _Unset) or value is None:
        return []
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict | list):
        text = json.dumps(parsed, indent=1, sort_keys=True)
    return text.splitlines()


def line_diff(old: Value, new: Value) -> list[str]:
    """A unified diff of two long values, cut after MAX_DIFF_LINES lines."""
    lines = list(difflib.unified_diff(_lines(old), _lines(new), "base", "head", n=DIFF_CONTEXT, lineterm=""))[2:]
    if len(lines) > MAX_DIFF_LINES:
        hidden = len(lines) - MAX_DIFF_LINES
        lines = [*lines[:MAX_DIFF_LINES], f"… {hidden} more diff lines (run the plan diff locally to see all)"]
    return lines


@dataclass(frozen=True)
class Change:
    urn: str
    name: str
    type: str
    properties: list[tuple[str, Value, Value, str]]  # (key, old, new, effect: update | replace | replace?)

    @property
    def replaced(self) -> bool:
        return any(effect == "replace" for *_, effect in self.properties)


def _resources(plan: Mapping[str, Json]) -> dict[str, dict[str, Json]]:
    resources = plan.get("resources")
    out: dict[str, dict[str, Json]] = {}
    for r in resources if isinstance(resources, list) else []:
        if isinstance(r, dict) and isinstance(r.get("urn"), str):
            out[str(r["urn"])] = r
    return out


def _follow_renames(before: dict[str, dict[str, Json]], after: dict[str, dict[str, Json]]) -> list[tuple[str, str]]:
    """A head resource whose alias is a base URN is that base resource renamed: compare them as one.

    Pulumi does the same (an alias makes the engine treat the old URN as the new one), so a rename
    with an alias is neither a delete nor a create. `before` is re-keyed in place.
    """
    renamed: list[tuple[str, str]] = []
    for urn, resource in after.items():
        if urn in before:
            continue
        aliases = resource.get("aliases")
        for alias in aliases if isinstance(aliases, list) else []:
            if isinstance(alias, str) and alias in before:
                before[urn] = before.pop(alias)
                renamed.append((alias, urn))
                break
    return sorted(renamed)


def _effect(token: str, key: str) -> str:
    if not key.startswith("inputs."):
        return "update"  # options (protect, retainOnDelete) change how Pulumi treats it, not the cloud
    return force_new.effect(token, key.removeprefix("inputs."))


def _changes(before: dict[str, dict[str, Json]], after: dict[str, dict[str, Json]]) -> list[Change]:
    out = []
    for urn in sorted(before.keys() & after.keys()):
        old, new = before[urn], after[urn]
        props = changed_properties(
            {"inputs": old.get("inputs"), "options": old.get("options", {})},
            {"inputs": new.get("inputs"), "options": new.get("options", {})},
        )
        if props:
            token = str(new.get("type"))
            out.append(Change(urn, str(new.get("name")), token, [(k, o, n, _effect(token, k)) for k, o, n in props]))
    return out


def _label(resource: Mapping[str, Json]) -> str:
    return f"`{resource.get('name')}` ({resource.get('type')})"


def _strings(plan: Mapping[str, Json], key: str) -> list[str]:
    items = plan.get(key)
    return [str(i) for i in items] if isinstance(items, list) else []


def _violations(plan: Mapping[str, Json]) -> dict[tuple[str, str, str], dict[str, Json]]:
    items = plan.get("violations")
    out: dict[tuple[str, str, str], dict[str, Json]] = {}
    for v in items if isinstance(items, list) else []:
        if isinstance(v, dict):
            out[(str(v.get("policy")), str(v.get("resource") or "stack"), str(v.get("message")))] = v
    return out


def _cost(plan: Mapping[str, Json]) -> float | None:
    cost = plan.get("cost")
    total = cost.get("monthlyTotal") if isinstance(cost, dict) else None
    return float(total) if isinstance(total, int | float) else None


def summary_line(create: int, update: int, replace: int, delete: int, unchanged: int) -> str:
    """Pulumi's preview summary, on one line."""
    return (
        f"+ {create} to create, ~ {update} to update, +- {replace} to replace, - {delete} to delete, "
        f"{unchanged} unchanged"
    )


def _property_lines(key: str, old: Value, new: Value, effect: str) -> list[str]:
    mark = {"replace": " **(forces replacement)**", "replace?": " _(may force replacement)_"}.get(effect, "")
    if _is_long(old) or _is_long(new):
        body = line_diff(old, new)
        return [f"  - `{key}`{mark}:", "", "    ```diff", *(f"    {line}" for line in body), "    ```", ""]
    return [f"  - `{key}`: {_show(old)} → {_show(new)}{mark}"]


def diff_markdown(base: Mapping[str, Json], head: Mapping[str, Json]) -> str:
    stack = head.get("stack") or base.get("stack")
    lines = [f"### Offline plan diff: stack `{stack}`", ""]
    errors = _strings(head, "errors")
    if errors:
        lines += [
            "❌ **The head's stack file is invalid: `pulumi preview` and `pulumi up` would stop before "
            "creating anything.**",
            "",
            "```",
            *errors,
            "```",
        ]
        return "\n".join(lines) + "\n"

    before, after = _resources(base), _resources(head)
    renamed = _follow_renames(before, after)
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changes = _changes(before, after)
    replaced = [c for c in changes if c.replaced]
    updated = [c for c in changes if not c.replaced]
    unchanged = len(before.keys() & after.keys()) - len(changes)
    if not (added or removed or changes):
        lines.append("No resource changes.")
    else:
        lines.append(f"**{summary_line(len(added), len(updated), len(replaced), len(removed), unchanged)}**")

    for title, urns, plan in (("+ Create", added, after), ("- Delete", removed, before)):
        if urns:
            lines += ["", f"#### {title}", *(f"- {_label(plan[u])}" for u in urns)]
    if renamed:
        lines += ["", "#### Renamed (an alias keeps the live resource: no replacement)"]
        lines += [f"- `{old.rsplit('::', 1)[-1]}` → {_label(after[new])}" for old, new in renamed]
    for title, group in (("+- Replace (destroyed and created again)", replaced), ("~ Update in place", updated)):
        if not group:
            continue
        lines += ["", f"#### {title}"]
        for change in group:
            lines.append(f"- `{change.name}` ({change.type})")
            for key, old, new, effect in change.properties:
                lines += _property_lines(key, old, new, effect)
    unknown = sorted(
        {c.type for c in changes if not force_new.known(c.type) and not c.type.startswith("tpu-platform:")}
    )
    if unknown:
        lines += ["", f"_Not in the replacement table (shown as updates): {', '.join(unknown)}._"]

    old_v, new_v = _violations(base), _violations(head)
    if new_v or old_v:
        lines += ["", "#### Policies"]
        for key in sorted(new_v):
            v = new_v[key]
            status = "❌ new" if key not in old_v else "⚠️ still"
            lines.append(f"- {status} [{v.get('enforcement')}] `{key[0]}` on `{key[1]}`: {key[2]}")
        lines += [f"- ✅ resolved `{k[0]}` on `{k[1]}`" for k in sorted(old_v.keys() - new_v.keys())]

    warnings = _strings(head, "warnings")
    if warnings:
        old_w = set(_strings(base, "warnings"))
        lines += ["", "#### Warnings", *(f"- {'new: ' if w not in old_w else ''}{w}" for w in warnings)]

    base_cost, head_cost = _cost(base), _cost(head)
    if head_cost is not None or base_cost is not None:
        delta = (head_cost or 0.0) - (base_cost or 0.0)
        lines += ["", f"#### Estimated TPU cost: ${head_cost or 0:,.2f}/month ({delta:+,.2f})"]
    return "\n".join(lines) + "\n"


def unreadable_markdown(which: str, why: str, stack: str | None = None) -> str:
    """The comment when a plan file cannot be read: say so rather than post nothing."""
    title = f"### Offline plan diff: stack `{stack}`" if stack else "### Offline plan diff"
    return f"{title}\n\n❌ The {which} plan could not be read ({why}); see the job log for the plan's error.\n"


def as_plan(data: Json) -> Mapping[str, Json]:
    return data if isinstance(data, dict) else {}


__all__: Sequence[str] = ("changed_properties", "diff_markdown", "line_diff", "summary_line", "unreadable_markdown")
