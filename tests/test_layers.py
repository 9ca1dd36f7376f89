"""The code's layers and names.

The layers are import-linter contracts in pyproject.toml ([tool.importlinter]): shipped code imports neither
tools/ nor tests/; the program's homes (composition roots, components, declaration helpers, the
configuration's reader and checks, renderers, the configuration's model, the permission model, the catalog)
each import only those below them; nothing below the components imports Pulumi; sibling modules form no
cycle. Here they run as `make test` runs the tests, and a shipped top-level name is checked against the
standard library and the installed distributions, which import-linter does not see, and the one reader of
Google's role data is checked here too: import-linter sees imports, not the files a module opens.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
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


ROLE_DATA_READER = "infra/access/iamdata.py"
THIS_FILE = "tests/test_layers.py"  # its own examples below name the data
# A path (no spaces) naming Google's role and method tables: reference/gcp-iam/, roles.json.
ROLE_DATA_PATH = re.compile(r"[\w./-]*(gcp-iam|roles\.json)[\w./-]*")


def role_data_paths(source: str) -> list[str]:
    """The string literals of `source` that name the role data as a path; docstrings and comments, which
    cite it, are not paths."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and ROLE_DATA_PATH.fullmatch(node.value)
    ]


def test_only_the_permission_models_reader_opens_googles_role_data():
    """The pack, the bootstrap, the tools and the tests expand roles through infra.access.iamdata."""
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = {
        path: paths
        for path in tracked.stdout.split()
        if path not in (ROLE_DATA_READER, THIS_FILE) and (ROOT / path).is_file()
        if (paths := role_data_paths((ROOT / path).read_text()))
    }
    assert role_data_paths((ROOT / ROLE_DATA_READER).read_text())  # the reader itself is seen
    assert found == {}, f"read the role data through {ROLE_DATA_READER}: {found}"


def test_a_path_to_the_role_data_is_seen_and_a_citation_is_not():
    code = 'DATA = ROOT / "reference" / "gcp-iam"\n# reference/gcp-iam/roles.json\nWHY = "see reference/gcp-iam"\n'
    assert role_data_paths(code) == ["gcp-iam"]
    assert role_data_paths('"""Read from reference/gcp-iam/roles.json."""\n') == []


def test_no_benchmark_imports_the_tests():
    """Benchmarks are scripts, outside import-linter's packages: they share the stand-ins through tools/."""
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "benchmarks").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests")
        or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names))
    ]
    assert not offenders, offenders
