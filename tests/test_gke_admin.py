"""The GKE engine's admin phase, its own Pulumi project (gke-admin/): the real program (the root __main__.py,
routed on the project's name) planned under mocks from the environment's stack file, with release-shaped
manifests of the tests' own read from a folder, as `TPU_PLATFORM_CONTROLLER_MANIFESTS` names one."""

from __future__ import annotations

import json
from pathlib import Path

import pulumi
import pytest
import yaml

import infra.config
import infra.gke.admin
from infra.config.stackfile import ROOT, read_stack_config
from infra.gke import controllers
from infra.gke.admin import GKE_ADMIN_PROJECT
from infra.gke.controllers import JOBSET, KUEUE, MANIFESTS_ENV, controller_objects, from_folder
from infra.gke.teams import admin_objects
from tests.support import fixture_config, replace_object
from tests.test_gke_controllers import manifest, pinned
from tools.offline import __main__ as offline
from tools.offline.mocks import GcpMocks, RecordingMonitor
from tools.offline.runner import PlanResult, program_file, run_program

CONFIG_GROUP = "kubernetes:yaml/v2:ConfigGroup"
STACK_FILE = ROOT / "tests" / "stacks" / "Pulumi.gke.yaml"  # the GKE fixture: two pools, two teams


@pytest.fixture
def manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of release-shaped manifests, the program's pins moved to them, and the variable naming it."""
    releases = []
    for release in (JOBSET, KUEUE):
        data = manifest(release)
        (tmp_path / release.file).write_bytes(data)
        releases.append(pinned(release, data))
    jobset, kueue = releases
    for module in (controllers, infra.gke.admin):
        monkeypatch.setattr(module, "JOBSET", jobset)
        monkeypatch.setattr(module, "KUEUE", kueue)
        monkeypatch.setattr(module, "RELEASES", (jobset, kueue))
    monkeypatch.setenv(MANIFESTS_ENV, str(tmp_path))
    return tmp_path


def admin_plan(raw: dict[str, str], stack: str = "gke", monitor: RecordingMonitor | None = None) -> PlanResult:
    # gke-admin/__main__.py, as Pulumi runs gke-admin/.
    return run_program(stack, raw, project=GKE_ADMIN_PROJECT, monitor=monitor)


def test_the_project_file_routes_to_the_admin_phase():
    project = yaml.safe_load((ROOT / "gke-admin" / "Pulumi.yaml").read_text())
    assert project["name"] == GKE_ADMIN_PROJECT and "main" not in project  # runs gke-admin/__main__.py
    assert program_file(GKE_ADMIN_PROJECT) == ROOT / "gke-admin" / "__main__.py"
    assert project["runtime"]["options"]["virtualenv"] == "../.venv"


def test_the_admin_phase_installs_jobset_then_kueue_and_the_teams_places(manifests: Path):
    raw = read_stack_config("gke", ROOT, STACK_FILE)
    result = admin_plan(raw)
    groups = {r.name: r for r in result.of_type(CONFIG_GROUP)}
    folder = from_folder(manifests)
    assert groups["controllers-jobset"].inputs["objs"] == controller_objects(controllers.JOBSET, folder)
    assert groups["controllers-kueue"].inputs["objs"] == controller_objects(controllers.KUEUE, folder)
    assert groups["controllers-kueue"].dependencies == [groups["controllers-jobset"].urn]
    example = infra.config.parse_stack_config("gke", raw)
    assert example.gke is not None
    assert groups["teams-objects"].inputs["objs"] == admin_objects(example.gke.teams, example.deployer)
    # Only Kubernetes objects, through one provider reaching the stack's cluster by its DNS endpoint.
    assert {r.type for r in result.resources} == {
        CONFIG_GROUP,
        "pulumi:providers:kubernetes",
        "tpu-platform:gke:ClusterControllers",
        "tpu-platform:gke:TeamPlaces",
    }
    (provider,) = result.of_type("pulumi:providers:kubernetes")
    kubeconfig = json.loads(provider.inputs["kubeconfig"])
    (lookup,) = [args for token, args in result.invokes if token == "gcp:container/getCluster:getCluster"]
    assert lookup == {"name": "tpu-gke", "location": "us-central1", "project": "fixture-gke"}
    assert kubeconfig["clusters"][0]["cluster"]["server"].endswith(".us-central1.gke.goog")
    assert kubeconfig["users"][0]["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert all(r.provider.startswith(provider.urn) for r in result.of_type(CONFIG_GROUP))
    assert result.outputs["teams"] == {
        "vision": {"namespace": "team-vision", "serviceAccount": "tpu-workloads"},
        "nlp": {"namespace": "team-nlp", "serviceAccount": "tpu-workloads"},
    }


def test_without_its_manifests_the_offline_plan_says_what_it_needs(monkeypatch, capsys):
    monkeypatch.delenv(MANIFESTS_ENV, raising=False)
    assert offline.main(["plan", "--gke-admin", "--stack-file", str(STACK_FILE)]) == 2
    error = capsys.readouterr().err
    assert f"set {MANIFESTS_ENV}" in error and JOBSET.url in error and KUEUE.url in error and "sha256" in error


def test_the_offline_plan_of_the_admin_phase_prints_what_it_installs(manifests, capsys):
    assert offline.main(["plan", "--gke-admin", "--stack-file", str(STACK_FILE)]) == 0
    out = capsys.readouterr().out
    assert "controllers-kueue  (kubernetes:yaml/v2:ConfigGroup)" in out and "never by CI's deployer" in out
    assert "CustomResourceDefinition widgets.kueue.example.com <" in out  # a CRD shown by name and digest


def test_manifests_of_other_bytes_stop_the_admin_phase_before_anything_is_declared(manifests: Path):
    (manifests / KUEUE.file).write_bytes(manifest(KUEUE) + b"# edited\n")
    monitor = RecordingMonitor(GcpMocks("fixture-gke"))
    with pytest.raises(pulumi.RunError, match=r"controller manifests .*the release is pinned at"):
        admin_plan(read_stack_config("gke", ROOT, STACK_FILE), monitor=monitor)
    assert monitor.registrations == []


def test_a_stack_without_the_gke_engine_has_no_admin_phase(manifests):
    with pytest.raises(pulumi.RunError, match=r"tpu-platform:gke .*declare the gke section"):
        admin_plan(fixture_config("small"), "small")


def test_a_team_object_a_cluster_would_refuse_stops_the_admin_phase(manifests, monkeypatch):
    raw = fixture_config("gke")
    teams = [{"name": "vision", "members": ["user:ada@example.com"], "nominalChips": {"v5e": 16}}]
    gke = {**json.loads(raw["tpu-platform:gke"]), "teams": teams}

    def with_a_bad_label(*args):
        objs = admin_objects(*args)
        objs[0]["metadata"]["labels"]["tpu-platform/bad"] = "not a label value!"
        return objs

    monkeypatch.setattr(infra.gke.admin, "admin_objects", with_a_bad_label)
    monitor = RecordingMonitor(GcpMocks("fixture-gke"))
    with pytest.raises(
        pulumi.RunError, match=r"tpu-platform:gke\.teams .*a cluster would refuse Namespace/team-vision"
    ):
        admin_plan(replace_object(raw, "gke", gke), monitor=monitor)
    assert monitor.registrations == []
