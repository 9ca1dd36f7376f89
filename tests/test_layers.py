"""The layers of the runtime package, checked on the source (ast) and by importing it.

- infra/ is the runtime: it imports nothing from tools/ (the offline plan, CI helpers), tests/ or
  policy/ (the policy pack). The tools import the runtime, never the other way round.
- The pure layer (config parsing, the catalog, naming, cost, start-up rendering, the permission
  model, request bodies) imports no Pulumi, so it is tested and reused with plain objects.
- Every other module declares resources (or reads Pulumi config) and is listed as such, so a new
  module's layer is a decision, not an accident.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"

# Plain Python: no `pulumi`, no `pulumi_gcp`, directly or through another infra module.
PURE = {
    "infra",
    "infra.access",
    "infra.access.accounts",
    "infra.access.calls",
    "infra.access.environment",
    "infra.access.escalation",
    "infra.access.iamdata",
    "infra.access.kubernetes",
    "infra.access.model",
    "infra.access.researchers",
    "infra.catalog",
    "infra.catalog.gke",
    "infra.completion_marker",
    "infra.config",
    "infra.config.docs",
    "infra.config.examples",
    "infra.config.model",
    "infra.config.reader",
    "infra.config.rules",
    "infra.config.settings",
    "infra.config.sources",
    "infra.config.stackfile",
    "infra.cost",
    "infra.gke",
    "infra.gke.crds",
    "infra.gke.controllers",
    "infra.gke.jobsets",
    "infra.gke.queues",
    "infra.gke.quota",
    "infra.gke.specs",
    "infra.gke.teams",
    "infra.gke.validation",
    "infra.goodput",
    "infra.goodput.interval",
    "infra.goodput.pricing",
    "infra.goodput.timeline",
    "infra.goodput.whatif",
    "infra.iam",
    "infra.naming",
    "infra.packaging",
    "infra.schedule",
    "infra.config.problems",
    "infra.startup",
    "infra.tpu",
    "infra.tpu.metadata",
    "infra.tpu.queued_api",
}
# Components, grants, invokes and the Pulumi config edge: these import Pulumi.
DECLARATION = {
    "infra.apis",
    "infra.artifacts",
    "infra.tpu_guard",
    "infra.budget",
    "infra.buckets",
    "infra.gke.admin",
    "infra.gke.cluster",
    "infra.gke.install",
    "infra.gke.slice_pools",
    "infra.gke.team_access",
    "infra.grants",
    "infra.identity",
    "infra.lifecycle",
    "infra.monitoring",
    "infra.network",
    "infra.platform",
    "infra.researchers",
    "infra.run_status",
    "infra.secrets",
    "infra.stack",
    "infra.storage",
    "infra.tpu.backend",
    "infra.tpu.cloud_tpu",
    "infra.tpu.queued",
    "infra.tpu.vm",
}
PULUMI = ("pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_policy", "pulumiverse_time")
OUTSIDE_THE_RUNTIME = ("tools", "tests", "policy", "bootstrap", "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(INFRA.rglob("*.py"))}


def imports_in(source: str, package: str) -> set[str]:
    """Every module `source` imports, at any depth of its code (also inside functions): `from a import b`
    counts as `a.b` when that is a module of ours, else as `a`; relative imports resolve from `package`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES}
    return found


def imported(name: str) -> set[str]:
    path = MODULES[name]
    return imports_in(path.read_text(), name if path.name == "__init__.py" else name.rpartition(".")[0])


def top(module: str) -> str:
    return module.split(".")[0]


def test_every_runtime_module_has_a_layer():
    assert set(MODULES) == PURE | DECLARATION, (
        f"unlisted: {sorted(set(MODULES) - PURE - DECLARATION)}; gone: {sorted((PURE | DECLARATION) - set(MODULES))}"
    )
    assert not PURE & DECLARATION


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_runtime_imports_no_tool_test_or_policy_code(name):
    outside = sorted(m for m in imported(name) if top(m) in OUTSIDE_THE_RUNTIME)
    assert not outside, f"{MODULES[name].relative_to(ROOT)} imports {outside}: infra/ must not depend on them"


@pytest.mark.parametrize("name", sorted(PURE))
def test_the_pure_layer_imports_no_pulumi(name):
    """Transitively: a pure module importing a declaration module would pull Pulumi in."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for module in imported(current):
            assert top(module) not in PULUMI, f"{current} imports {module} (reached from {name})"
            assert module not in DECLARATION, f"{current} imports the declaration module {module} (from {name})"
            if module in MODULES:
                todo.append(module)


def test_the_pure_layer_imports_with_pulumi_absent():
    """The same, by running Python: with the Pulumi packages made unimportable, every pure module loads."""
    block = "; ".join(f"sys.modules[{p!r}] = None" for p in PULUMI)
    imports = "; ".join(f"importlib.import_module({m!r})" for m in sorted(PURE))
    run = subprocess.run(
        [sys.executable, "-c", f"import importlib, sys; {block}; {imports}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_reader_sees_every_import_form():
    """Lazy imports inside functions, aliases, relative imports and `from package import module`."""
    source = (
        "def f():\n    from tools.offline import runner\n"
        "import pulumi_gcp as gcp\nfrom .. import naming\nfrom .model import X\nfrom infra import cost\n"
    )
    assert imports_in(source, "infra.config") == {
        "tools.offline",
        "pulumi_gcp",
        "infra",
        "infra.naming",
        "infra.config.model",
        "infra.cost",
    }
