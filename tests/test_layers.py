"""The code's layers and names.

The layers are import-linter contracts in pyproject.toml ([tool.importlinter]): shipped code imports neither
tools/ nor tests/; the program's homes (composition roots, components, declaration helpers, the
configuration's reader and checks, renderers, the configuration's model, the permission model, the catalog)
each import only those below them; nothing below the components imports Pulumi; sibling modules form no
cycle. Here they run as `make test` runs the tests, and a shipped top-level name is checked against the
standard library and the installed distributions, which import-linter does not see.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_DISTRIBUTION = "tpu-platform"
# Folders whose modules are imported as top-level names where they run: the repository root (the Pulumi
# programs, the `tpu-runs` wheel), the guard's Cloud Functions source, the workloads and their runlib.
TOP_LEVEL_ROOTS = [ROOT, ROOT / "functions" / "tpu_guard", ROOT / "workloads", ROOT / "workloads" / "lib"]
TOP_LEVEL_ROOTS += sorted(p.parent for p in (ROOT / "workloads").glob("*/example.json"))
NOT_SHIPPED = {"tests", "benchmarks", "docs", "node_modules", "build"}


def top_level_names(folder: Path) -> set[str]:
    """The names `import x` finds in `folder`: modules (`x.py`) and packages (`x/__init__.py`)."""
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("__")}
    packages = {p.parent.name for p in folder.glob("*/__init__.py")}
    return (modules | packages) - NOT_SHIPPED


def shadowed(names: set[str]) -> dict[str, str]:
    """Each name that is also a standard-library module or another distribution's top-level import name."""
    others = {
        name: ", ".join(sorted(set(dists) - {OWN_DISTRIBUTION}))
        for name, dists in importlib.metadata.packages_distributions().items()
        if set(dists) - {OWN_DISTRIBUTION}
    }
    found = {name: "the standard library" for name in names if name in sys.stdlib_module_names}
    found |= {name: f"the distribution {others[name]}" for name in names if name in others}
    return found


def test_the_import_contracts_hold():
    run = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's packages, not an installed copy
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


@pytest.mark.parametrize("folder", TOP_LEVEL_ROOTS, ids=lambda p: str(p.relative_to(ROOT)) or ".")
def test_no_shipped_top_level_name_shadows_the_standard_library_or_a_dependency(folder: Path):
    assert top_level_names(folder)
    assert not shadowed(top_level_names(folder)), (
        f"{folder.relative_to(ROOT)}: rename {shadowed(top_level_names(folder))}"
    )


def test_the_shadow_check_sees_the_standard_library_and_distributions():
    """A package named `platform` would shadow the stdlib's; one named `yaml`, PyYAML's."""
    assert set(shadowed({"platform", "yaml", "infra"})) == {"platform", "yaml"}


def test_no_benchmark_imports_the_tests():
    """Benchmarks are scripts, outside import-linter's packages: they share the stand-ins through tools/."""
    import ast

    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "benchmarks").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests")
        or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names))
    ]
    assert not offenders, offenders
