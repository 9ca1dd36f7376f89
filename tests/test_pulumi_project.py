"""Pulumi.yaml asks nothing of .venv that the README's manual path (requirements.txt only) lacks."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_runtime_needs_only_what_requirements_txt_installs():
    options = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["runtime"]["options"]
    installed = {
        re.split(r"[=<>\[ ]", line, maxsplit=1)[0].lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    tool = options.get("typechecker")
    assert tool is None or tool in installed, (
        f"Pulumi.yaml runs the typechecker {tool!r} on every preview, but requirements.txt does not install it"
    )
