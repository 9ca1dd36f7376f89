"""JobSet and Kueue as pinned: the manifests' bytes, the changes made to them, and the admin phase's
declaration under Pulumi mocks (the objects handed to the Kubernetes provider, exactly)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pulumi_kubernetes as k8s
import pytest

from infra.gke import controllers
from infra.gke.controllers import JOBSET, KUEUE, ManifestError, controller_objects, kueue_configuration
from infra.gke.install import ClusterControllers, TeamQueues
from infra.gke.validation import InvalidObjectsError, validate_all
from tests import gke_objects as g
from tools.offline.runner import run_program

CONFIG_GROUP = "kubernetes:yaml/v2:ConfigGroup"


def test_a_manifest_that_is_not_the_pinned_bytes_is_refused(tmp_path: Path):
    shutil.copy(controllers.MANIFESTS / JOBSET.file, tmp_path / JOBSET.file)
    with (tmp_path / JOBSET.file).open("a") as out:
        out.write("# edited\n")
    with pytest.raises(ManifestError, match=f"pinned at {JOBSET.sha256}"):
        controllers.read_release(JOBSET, tmp_path)
    with pytest.raises(ManifestError, match="missing"):
        controllers.read_release(KUEUE, tmp_path)


@pytest.mark.parametrize("release", [JOBSET, KUEUE], ids=lambda r: r.name)
def test_the_controller_runs_the_release_image_by_digest(release):
    (deployment,) = [o for o in controller_objects(release) if o["kind"] == "Deployment"]
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert images == [f"{release.image}@{release.digest}"]
    assert release.version in release.image
    # The file itself names the tag only, as the release's manifest does.
    (raw,) = [o for o in controllers.read_release(release) if o["kind"] == "Deployment"]
    assert raw["spec"]["template"]["spec"]["containers"][0]["image"] == release.image


def test_kueue_runs_with_fair_sharing():
    assert "fairSharing" not in kueue_configuration(controllers.read_release(KUEUE))  # the release has it off
    configuration = kueue_configuration(controller_objects(KUEUE))
    assert configuration["fairSharing"] == controllers.FAIR_SHARING
    assert "jobset.x-k8s.io/jobset" in configuration["integrations"]["frameworks"]


def test_kueue_serves_the_v1beta2_kinds_the_queues_use():
    kinds = {
        (version["name"], crd["spec"]["names"]["kind"])
        for crd in controllers.crds([KUEUE])
        for version in crd["spec"]["versions"]
        if version["served"]
    }
    assert {("v1beta2", k) for k in ("ClusterQueue", "LocalQueue", "ResourceFlavor")} <= kinds


def test_every_controller_object_passes_the_validator():
    objs = controller_objects(JOBSET) + controller_objects(KUEUE)
    report = validate_all(controllers.pinned_validator(), objs)
    assert report.ok, report.findings
    assert report.objects == 99  # 20 of JobSet, 79 of Kueue


def provider() -> k8s.Provider:
    return k8s.Provider("gke", kubeconfig="{}")


def test_the_admin_phase_hands_the_pinned_objects_to_two_config_groups():
    result = run_program("dev", {}, program=lambda: ClusterControllers("controllers", provider()))
    groups = {r.name: r for r in result.of_type(CONFIG_GROUP)}
    assert groups["controllers-jobset"].inputs["objs"] == controller_objects(JOBSET)
    assert groups["controllers-kueue"].inputs["objs"] == controller_objects(KUEUE)
    assert groups["controllers-kueue"].dependencies == [groups["controllers-jobset"].urn]


def test_the_queues_phase_hands_its_objects_over_once_they_pass():
    objs = g.queue_objects()
    result = run_program("dev", {}, program=lambda: TeamQueues("queues", provider(), objs, g.pool_labels()))
    (group,) = result.of_type(CONFIG_GROUP)
    assert group.inputs["objs"] == objs


def test_the_queues_phase_registers_nothing_when_an_object_is_bad():
    objs = g.queue_objects()
    objs[0]["spec"]["nodeLabels"][g.queues.TOPOLOGY_LABEL] = "9x9"  # a flavor no pool has
    registered = []

    def program():
        registered.append(TeamQueues("queues", provider(), objs, g.pool_labels()))

    with pytest.raises(InvalidObjectsError, match="no node pool has the labels"):
        run_program("dev", {}, program=program)
    assert registered == []
