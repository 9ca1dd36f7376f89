"""The PR plan diff on two crafted plans: an added VM, a removed bucket, a changed label, a new violation."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

from infra.offline.diff import diff_markdown
from infra.offline.render import to_json
from infra.offline.runner import plan_stack

ROOT = Path(__file__).resolve().parents[1]


def base_plan() -> dict:
    return json.loads(json.dumps(to_json(plan_stack("dev")), default=str))


def crafted_head(base: dict) -> dict:
    head = copy.deepcopy(base)
    resources = head["resources"]
    vm = next(r for r in resources if r["type"] == "gcp:tpu/v2Vm:V2Vm")
    extra = copy.deepcopy(vm)
    extra["name"] = "tpu-mnist-second-node"
    extra["urn"] = vm["urn"].replace(vm["name"], extra["name"])
    resources.append(extra)
    head["resources"] = [r for r in resources if not r["name"].endswith("buckets-models")]
    data = next(r for r in head["resources"] if r["name"] == "buckets-data")
    data["inputs"]["labels"]["owner"] = "research"
    head["violations"] = [
        {"policy": "tpu-vm-no-external-ip", "enforcement": "mandatory", "resource": extra["name"], "message": "no"}
    ]
    head["cost"] = {"monthlyTotal": 979.2}
    base["cost"] = {"monthlyTotal": 489.6}
    return head


def test_diff_summarises_each_kind_of_change():
    base = base_plan()
    head = crafted_head(base)
    markdown = diff_markdown(base, head)
    assert "### Offline plan diff: stack `dev`" in markdown
    assert "**1 to add, 1 to change, 1 to delete**" in markdown
    assert "#### Added\n- `tpu-mnist-second-node` (gcp:tpu/v2Vm:V2Vm)" in markdown
    assert "#### Removed\n- `buckets-models` (gcp:storage/bucket:Bucket)" in markdown
    assert (
        "- `buckets-data` (gcp:storage/bucket:Bucket)\n  - `inputs.labels.owner`: `ml-platform` → `research`"
        in markdown
    )
    assert "- ❌ new [mandatory] `tpu-vm-no-external-ip` on `tpu-mnist-second-node`: no" in markdown
    assert "#### Estimated TPU cost: $979.20/month (+489.60)" in markdown


def test_identical_plans_show_no_change():
    base = base_plan()
    assert "No resource changes." in diff_markdown(base, copy.deepcopy(base))


def test_options_changes_are_shown():
    base = base_plan()
    head = copy.deepcopy(base)
    next(r for r in head["resources"] if r["name"] == "buckets-data")["options"]["retainOnDelete"] = False
    assert "`options.retainOnDelete`: `True` → `False`" in diff_markdown(base, head)


def test_cli_prints_the_diff_of_two_plan_files(tmp_path):
    base = base_plan()
    head = crafted_head(base)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "head.json").write_text(json.dumps(head))
    done = subprocess.run(
        [sys.executable, "-m", "infra.offline", "diff", str(tmp_path / "base.json"), str(tmp_path / "head.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == diff_markdown(base, head)
