"""The PR plan diff: real plans of edited stacks, read as a reviewer would."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

from tests.support import FIXTURE_STACKS, NS, fixture_config, offline_cli, plan, shipped_plan, with_object
from tools.offline import force_new
from tools.offline.diff import diff_markdown, line_diff
from tools.offline.render import to_json

ROOT = Path(__file__).resolve().parents[1]


def as_json(result) -> dict:
    return json.loads(json.dumps(to_json(result), default=str))


def base_plan() -> dict:
    return as_json(plan(fixture_config("scheduled"), "scheduled"))


def head_plan(edit_key: str, edit) -> dict:
    return as_json(plan(with_object(fixture_config("scheduled"), edit_key, edit), "scheduled"))


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
    head["warnings"] = ["stack 'scheduled': estimated TPU cost 979.20 USD/month exceeds the budget of 500.00 USD"]
    head["cost"] = {"monthlyTotal": 979.2}
    base["cost"] = {"monthlyTotal": 489.6}
    return head


def test_diff_summarises_each_kind_of_change_with_pulumis_summary_line():
    base = base_plan()
    head = crafted_head(base)
    markdown = diff_markdown(base, head)
    unchanged = len(base["resources"]) - 2
    assert "### Offline plan diff: stack `scheduled`" in markdown
    assert f"**+ 1 to create, ~ 1 to update, +- 0 to replace, - 1 to delete, {unchanged} unchanged**" in markdown
    assert "#### + Create\n- `tpu-mnist-second-node` (gcp:tpu/v2Vm:V2Vm)" in markdown
    assert "#### - Delete\n- `buckets-models` (gcp:storage/bucket:Bucket)" in markdown
    assert (
        "#### ~ Update in place\n- `buckets-data` (gcp:storage/bucket:Bucket)\n"
        "  - `inputs.labels.owner`: `fixture-team` → `research`" in markdown
    )
    assert "- ❌ new [mandatory] `tpu-vm-no-external-ip` on `tpu-mnist-second-node`: no" in markdown
    assert "#### Warnings\n- new: stack 'scheduled': estimated TPU cost 979.20 USD/month exceeds the budget" in markdown
    assert "#### Estimated TPU cost: $979.20/month (+489.60)" in markdown


def test_a_vm_moved_to_another_zone_is_a_replacement():
    base = base_plan()
    head = head_plan("tpuVms", lambda vms: vms[0].update(zone="us-central1-c"))
    markdown = diff_markdown(base, head)
    # The node is replaced; the stop job's URL and the guard's completion actions name the zone (updates).
    assert "+- 1 to replace" in markdown
    replaced = markdown.split("#### +- Replace (destroyed and created again)\n", 1)[1].split("#### ~ Update")[0]
    assert "- `tpu-office-v2-node` (gcp:tpu/v2Vm:V2Vm)" in replaced
    assert "  - `inputs.zone`: `us-central1-b` → `us-central1-c` **(forces replacement)**" in replaced
    assert "~ 3 to update" in markdown


def test_a_changed_epochs_shows_the_changed_line_and_updates_in_place():
    base = base_plan()
    head = head_plan("workloads", lambda w: w["mnist"].update(epochs=7))
    markdown = diff_markdown(base, head)
    assert "+- 0 to replace" in markdown and "~ 1 to update" in markdown
    # The epochs are the program's command line in the run spec (JSON, diffed by line), not a VM setting.
    assert "  - `inputs.metadata.tpu-platform-run`:" in markdown
    assert '       "--epochs",\n    -  "5",\n    +  "7",\n' in markdown
    assert "startup-script" not in markdown and "tpu-platform-env" not in markdown


def test_a_long_single_line_json_value_is_diffed_by_line():
    old = json.dumps({"widgets": [{"title": f"chart {i}", "x": i} for i in range(10)]})
    new = old.replace('"chart 7"', '"chart seven"')
    assert old[:60] == new[:60]  # the old 60-character cut showed both sides alike
    diff = line_diff(old, new)
    assert '-   "title": "chart 7",' in diff and '+   "title": "chart seven",' in diff


def test_identical_plans_show_no_change():
    base = base_plan()
    assert "No resource changes." in diff_markdown(base, copy.deepcopy(base))


def test_options_changes_are_shown_as_updates():
    base = base_plan()
    head = copy.deepcopy(base)
    next(r for r in head["resources"] if r["name"] == "buckets-data")["options"]["retainOnDelete"] = False
    markdown = diff_markdown(base, head)
    assert "`options.retainOnDelete`: `true` → `false`" in markdown
    assert "+- 0 to replace" in markdown


def test_every_resource_type_the_stacks_declare_has_a_replacement_rule():
    types = {r.type for stack in ("dev", "prod") for r in shipped_plan(stack).resources if r.custom}
    assert sorted(t for t in types if not force_new.known(t)) == []


def test_the_replacement_table_names_its_source():
    source = force_new.source()
    assert source["repository"] == "hashicorp/terraform-provider-google-beta"
    assert len(str(source["commit"])) == 40
    # Spot checks against the provider's schema: a bucket's location and a VM's runtime force new.
    assert force_new.effect("gcp:storage/bucket:Bucket", "location") == "replace"
    assert force_new.effect("gcp:storage/bucket:Bucket", "labels.owner") == "update"
    assert force_new.effect("gcp:tpu/v2Vm:V2Vm", "runtimeVersion") == "replace"
    assert force_new.effect("gcp:tpu/v2Vm:V2Vm", "schedulingConfig.spot") == "replace"
    assert force_new.effect("gcp:compute/subnetwork:Subnetwork", "ipCidrRange") == "replace?"  # only shrinking


def test_the_extractor_reads_nested_force_new_fields():
    go = """
    Schema: map[string]*schema.Schema{
        "name": {Type: schema.TypeString, ForceNew: true},
        "labels": {
            Type: schema.TypeMap,
            Elem: &schema.Schema{Type: schema.TypeString},
        },
        "network_config": {
            Type: schema.TypeList,
            Elem: &schema.Resource{
                Schema: map[string]*schema.Schema{
                    "network": {
                        Type:     schema.TypeString,
                        ForceNew: true,
                    },
                    "queue_count": {Type: schema.TypeInt},
                },
            },
        },
    },
    CustomizeDiff: customdiff.ForceNewIfChange("retention_policy.0.is_locked", isLocked),
    """
    always, conditional = force_new.force_new_paths(go)
    assert always == {"name", "network_config.network"}
    assert conditional == {"retention_policy.is_locked"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return offline_cli(*args)


def test_cli_prints_the_diff_of_two_plan_files(tmp_path):
    base = base_plan()
    head = crafted_head(base)
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "head.json").write_text(json.dumps(head))
    done = run_cli("diff", str(tmp_path / "base.json"), str(tmp_path / "head.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == diff_markdown(base, head)


def test_an_invalid_stack_file_yields_a_comment_with_its_errors(tmp_path):
    draft = tmp_path / "Pulumi.scheduled.yaml"
    fixture = (FIXTURE_STACKS / "Pulumi.scheduled.yaml").read_text()
    draft.write_text(fixture.replace("program: tf_mnist\n", "program: tf_mnist\n      epochs: many\n"))
    head = run_cli("plan", "--stack-file", str(draft), "--json")
    assert head.returncode == 2
    (tmp_path / "head.json").write_text(head.stdout)
    (tmp_path / "base.json").write_text(json.dumps(base_plan()))
    done = run_cli("diff", str(tmp_path / "base.json"), str(tmp_path / "head.json"))
    assert done.returncode == 0, done.stderr
    assert "The head's stack file is invalid" in done.stdout
    assert f"{NS}:workloads.mnist.epochs = 'many': must be an integer" in done.stdout


def test_an_empty_head_plan_still_yields_a_comment(tmp_path):
    (tmp_path / "base.json").write_text("{}")
    (tmp_path / "head.json").write_text("")
    done = run_cli("diff", str(tmp_path / "base.json"), str(tmp_path / "head.json"))
    assert done.returncode == 0
    assert "The head plan could not be read" in done.stdout
