"""Compare two offline plans (`plan --json`) and summarise the change as Markdown for a PR.

For forks and PRs without cloud access: no credentials needed, only the plans of the base and the
head. Resources are matched by URN; a change lists the properties that differ.
"""

from __future__ import annotations

from typing import Any

MAX_VALUE = 80
UNSET = object()  # a property present on one side only


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, child in value.items():
            out.update(_flat(child, f"{prefix}.{key}" if prefix else key))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = {}
        for index, child in enumerate(value):
            out.update(_flat(child, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    if value is UNSET:
        return "_(unset)_"
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", "⏎").replace("|", "\\|")
    if len(text) > MAX_VALUE:
        text = f"{text[: MAX_VALUE - 20]}… ({len(text):,} chars)"
    return f"`{text}`"


def changed_properties(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    old, new = _flat(before), _flat(after)
    return [
        (key, old.get(key, UNSET), new.get(key, UNSET))
        for key in sorted(old.keys() | new.keys())
        if old.get(key, UNSET) != new.get(key, UNSET)
    ]


def _cost(plan: dict[str, Any]) -> float | None:
    cost = plan.get("cost") or {}
    return cost.get("monthlyTotal")


def diff_markdown(base: dict[str, Any], head: dict[str, Any]) -> str:
    stack = head.get("stack") or base.get("stack")
    before = {r["urn"]: r for r in base.get("resources", [])}
    after = {r["urn"]: r for r in head.get("resources", [])}
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = {
        urn: props
        for urn in sorted(before.keys() & after.keys())
        if (props := changed_properties(
            {"inputs": before[urn]["inputs"], "options": before[urn].get("options", {})},
            {"inputs": after[urn]["inputs"], "options": after[urn].get("options", {})},
        ))
    }  # fmt: skip

    def name(resource: dict[str, Any]) -> str:
        return f"`{resource['name']}` ({resource['type']})"

    lines = [f"### Offline plan diff: stack `{stack}`", ""]
    if not (added or removed or changed):
        lines.append("No resource changes.")
    else:
        lines.append(f"**{len(added)} to add, {len(changed)} to change, {len(removed)} to delete**")
    for title, urns, plan in (("Added", added, after), ("Removed", removed, before)):
        if urns:
            lines += ["", f"#### {title}", *(f"- {name(plan[u])}" for u in urns)]
    if changed:
        lines += ["", "#### Changed"]
        for urn, props in changed.items():
            lines.append(f"- {name(after[urn])}")
            for key, old, new in props:
                show_old = (
                    "_(unset)_" if not isinstance(old, str | int | float | bool | list | type(None)) else _show(old)
                )
                show_new = (
                    "_(unset)_" if not isinstance(new, str | int | float | bool | list | type(None)) else _show(new)
                )
                lines.append(f"  - `{key}`: {show_old} → {show_new}")

    def violation_key(v: dict[str, Any]) -> tuple:
        return (v.get("policy"), v.get("resource"), v.get("message"))

    old_v = {violation_key(v): v for v in base.get("violations", [])}
    new_v = {violation_key(v): v for v in head.get("violations", [])}
    introduced = [new_v[k] for k in sorted(new_v.keys() - old_v.keys(), key=str)]
    resolved = [old_v[k] for k in sorted(old_v.keys() - new_v.keys(), key=str)]
    if introduced or resolved:
        lines += ["", "#### Policy violations"]
        lines += [f"- ❌ new [{v['enforcement']}] `{v['policy']}` on `{v.get('resource') or 'stack'}`: {v['message']}"
                  for v in introduced]  # fmt: skip
        lines += [f"- ✅ resolved `{v['policy']}` on `{v.get('resource') or 'stack'}`" for v in resolved]

    base_cost, head_cost = _cost(base), _cost(head)
    if head_cost is not None or base_cost is not None:
        delta = (head_cost or 0.0) - (base_cost or 0.0)
        lines += ["", f"#### Estimated TPU cost: ${head_cost or 0:,.2f}/month ({delta:+,.2f})"]
    return "\n".join(lines) + "\n"
