"""Render a plan as a readable tree (for people) or JSON (for machines and the PR diff)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from infra.cost import cost_table
from tools.offline.mocks import Registration
from tools.offline.runner import PlanResult

LONG_STRING = 300  # longer or multi-line strings (startup scripts) are summarised by size and digest


def _urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if urn else ""


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out = []
        for key in sorted(value):
            out += _flatten(value[key], f"{prefix}.{key}" if prefix else key)
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = []
        for i, item in enumerate(value):
            out += _flatten(item, f"{prefix}[{i}]")
        return out
    if value is None or value == [] or value == {}:
        return []
    return [(prefix, value)]


def _summarised(inputs: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes object group's CRDs shown by name and digest: a release's CRDs are megabytes of schema
    (the JSON plan keeps every field)."""
    objs = inputs.get("objs")
    if not isinstance(objs, list):
        return inputs
    shown = []
    for obj in objs:
        if isinstance(obj, dict) and obj.get("kind") == "CustomResourceDefinition":
            text = json.dumps(obj, sort_keys=True)
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            name = (obj.get("metadata") or {}).get("name")
            obj = f"CustomResourceDefinition {name} <{len(text):,} bytes, sha256 {digest}…>"
        shown.append(obj)
    return {**inputs, "objs": shown}


def _show(value: Any) -> str:
    if isinstance(value, str) and (len(value) > LONG_STRING or "\n" in value):
        digest = hashlib.sha256(value.encode()).hexdigest()[:12]
        return f"<{len(value.encode()):,} bytes, sha256 {digest}…>"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def error_lines(error: Exception) -> list[str]:
    """A refused stack's problems, a line each, as `plan --json` lists them."""
    return str(error).splitlines()


def error_text(error: Exception) -> str:
    """A refused stack as the command prints it on stderr (and docs/offline-plan.md shows it)."""
    return "error: " + "\n".join(error_lines(error))


def to_json(plan: PlanResult, violations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    resources = sorted(plan.resources, key=lambda r: r.urn)
    return {
        "stack": plan.stack,
        "project": plan.project,
        "resourceCount": len(resources),
        "countByType": dict(sorted(Counter(r.type for r in resources).items())),
        "resources": [
            {
                "urn": r.urn,
                "type": r.type,
                "name": r.name,
                "parent": _urn_name(r.parent) or None,
                "inputs": r.inputs,
                "options": {"protect": r.protect, "retainOnDelete": r.retain_on_delete},
                "dependsOn": r.dependencies,
                **({"aliases": r.aliases} if r.aliases else {}),
            }
            for r in resources
        ],
        "outputs": plan.outputs,
        "cost": plan.outputs.get("costEstimate"),
        "warnings": plan.warnings,
        "violations": violations or [],
    }


def to_text(plan: PlanResult, extra_sections: list[str] | None = None) -> str:
    children: dict[str, list[Registration]] = {}
    for r in plan.resources:
        children.setdefault(r.parent, []).append(r)
    declared = {r.urn for r in plan.resources}
    roots = [p for p in children if p not in declared]
    lines = [
        f"Offline plan of stack '{plan.stack}' in GCP project {plan.project}",
        f"(the real program under Pulumi mocks: `pulumi up` on an empty stack would create "
        f"{len(plan.resources)} resources)",
        "",
    ]

    def walk(parent: str, depth: int) -> None:
        for r in sorted(children.get(parent, []), key=lambda r: (r.custom, r.name)):
            flags = [f for f, on in (("protect", r.protect), ("kept on destroy", r.retain_on_delete)) if on]
            pad = "  " * depth
            lines.append(f"{pad}+ {r.name}  ({r.type}){'  [' + ', '.join(flags) + ']' if flags else ''}")
            for key, value in _flatten(_summarised({k: v for k, v in r.inputs.items() if k != "project"})):
                lines.append(f"{pad}      {key}: {_show(value)}")
            walk(r.urn, depth + 1)

    for root in sorted(roots):
        walk(root, 0)

    lines += ["", "Outputs:"]
    for key, value in _flatten({k: v for k, v in plan.outputs.items() if k != "costEstimate"}):
        lines.append(f"  {key}: {_show(value)}")
    lines += ["", "Resources by type:"]
    for token, count in sorted(Counter(r.type for r in plan.resources).items()):
        lines.append(f"  {count:4d}  {token}")
    if plan.outputs.get("costEstimate"):
        lines += ["", cost_table(plan.outputs["costEstimate"])]
    for section in extra_sections or []:
        lines += ["", section]
    if plan.warnings:
        lines += ["", "Warnings:"] + [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"
