"""The README's examples that concern stack settings, executed: the error example and the settings table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_error_example_is_what_the_plan_prints(tmp_path):
    marker = re.search(r"<!-- example: Pulumi\.dev\.yaml with (\w+): (\S+) \(", README)
    assert marker, "the README's error example lost its marker"
    key, value = marker.groups()
    shown = README[marker.end() :].split("```\n", 1)[1].split("```", 1)[0]
    stack = (ROOT / "Pulumi.dev.yaml").read_text()
    edited, count = re.subn(rf"(\n\s+{key}: )\S+", rf"\g<1>{value}", stack)
    assert count == 1
    draft = tmp_path / "Pulumi.dev.yaml"
    draft.write_text(edited)
    done = subprocess.run(
        [sys.executable, "-m", "tools.offline", "plan", "--stack-file", str(draft)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == shown


def test_the_settings_table_is_generated_from_the_declarations():
    from infra.config import docs

    assert docs.readme_with_table(README) == README, (
        "README's settings table is stale: run .venv/bin/python -m tools.offline schema --write"
    )
