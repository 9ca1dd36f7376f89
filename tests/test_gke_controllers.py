"""JobSet and Kueue as the admin phase takes them: a release manifest fetched at deploy time (or read from a
local copy) is installed only as the pinned bytes, its controller image pinned by digest, Kueue configured.

The releases' manifests are not in the repository (docs/design-gke.md, "Where the manifests come from"), so
these tests serve small manifests of their own, shaped like a release's (its namespace, a CRD, the controller
Deployment, Kueue's configuration), from a real HTTP server on loopback and from a folder, and pin them
by their own sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from infra import naming
from infra.gke import controllers
from infra.gke.controllers import (
    JOBSET,
    KUEUE,
    MANIFESTS_ENV,
    ManifestError,
    Release,
    controller_objects,
    download,
    fetch_from_environment,
    from_folder,
    kueue_configuration,
)
from infra.gke.teams import team_objects
from tests import gke_objects as g
from tools.standins.loopback import Handler, serve

KUEUE_CONFIGURATION = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2",
    "kind": "Configuration",
    "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
}


def manifest(release: Release) -> bytes:
    """A release-shaped manifest: the controller's namespace, a CRD, its Deployment (and Kueue's ConfigMap)."""
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release.namespace}},
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{release.name}.example.com"},
            "spec": {"group": f"{release.name}.example.com", "names": {"kind": "Widget", "plural": "widgets"}},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{release.name}-controller-manager", "namespace": release.namespace},
            "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": release.image}]}}},
        },
    ]
    if release.name == "kueue":
        data = {controllers.KUEUE_CONFIG[2]: yaml.safe_dump(KUEUE_CONFIGURATION)}
        meta = {"name": controllers.KUEUE_CONFIG[1], "namespace": controllers.KUEUE_CONFIG[0]}
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return yaml.safe_dump_all(objs).encode()


def pinned(release: Release, data: bytes, url: str = "") -> Release:
    """The release pinned at `data`'s sha256 (and served from `url`)."""
    return dataclasses.replace(release, sha256=hashlib.sha256(data).hexdigest(), url=url or release.url)


class Releases(Handler):
    served: ClassVar[dict[str, bytes]] = {}  # path -> bytes, set by `serve(Releases, served=...)`

    def do_GET(self) -> None:  # noqa: N802 - the http.server method name
        data = self.served.get(self.path)
        self.answer(200, data) if data is not None else self.answer(404, {"error": "not found"})


@pytest.mark.parametrize("release", [JOBSET, KUEUE], ids=lambda r: r.name)
def test_a_downloaded_manifest_is_installed_only_as_the_pinned_bytes(release):
    data = manifest(release)
    tampered = data + b"# one more line\n"
    with serve(Releases, served={"/m.yaml": data, "/tampered.yaml": tampered}) as base:
        good = pinned(release, data, f"{base}/m.yaml")
        assert [o["kind"] for o in controller_objects(good, download)] == [
            "Namespace",
            "CustomResourceDefinition",
            "Deployment",
            *(["ConfigMap"] if release.name == "kueue" else []),
        ]
        served_other_bytes = dataclasses.replace(good, url=f"{base}/tampered.yaml")
        with pytest.raises(ManifestError) as refused:
            controller_objects(served_other_bytes, download)
        assert hashlib.sha256(tampered).hexdigest() in str(refused.value) and good.sha256 in str(refused.value)
        with pytest.raises(ManifestError, match=f"could not download {base}/gone.yaml .* set {MANIFESTS_ENV}"):
            controller_objects(dataclasses.replace(good, url=f"{base}/gone.yaml"), download)


def test_the_real_pins_refuse_any_other_bytes(tmp_path: Path):
    """The committed pins: a copy that is not the release's bytes is refused before anything is parsed."""
    (tmp_path / JOBSET.file).write_bytes(manifest(JOBSET))
    with pytest.raises(ManifestError, match=f"but the release is pinned at {JOBSET.sha256}"):
        controller_objects(JOBSET, from_folder(tmp_path))
    for release in (JOBSET, KUEUE):
        assert len(release.sha256) == 64 and release.digest.startswith("sha256:") and len(release.digest) == 71
        assert release.url == (
            f"https://github.com/kubernetes-sigs/{release.name}/releases/download/{release.version}/manifests.yaml"
        )


def test_a_local_copy_comes_from_the_folder_the_environment_names(tmp_path: Path):
    data = manifest(KUEUE)
    (tmp_path / KUEUE.file).write_bytes(data)
    fetch = fetch_from_environment({MANIFESTS_ENV: str(tmp_path)})
    assert fetch(KUEUE) == data
    with pytest.raises(ManifestError, match=f"has no {JOBSET.file}: save {JOBSET.url} there"):
        fetch(JOBSET)
    assert fetch_from_environment({}) is download  # no folder: `pulumi up` downloads the release


@pytest.mark.parametrize("release", [JOBSET, KUEUE], ids=lambda r: r.name)
def test_the_controller_runs_the_release_image_by_digest(release, tmp_path: Path):
    data = manifest(release)
    (tmp_path / release.file).write_bytes(data)
    objs = controller_objects(pinned(release, data), from_folder(tmp_path))
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    assert [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]] == [
        f"{release.image}@{release.digest}"
    ]
    assert release.version in release.image
    # Each read starts from the release's objects (parsed once, copied): pinning never edits the cache.
    (again,) = [
        o for o in controller_objects(pinned(release, data), from_folder(tmp_path)) if o["kind"] == "Deployment"
    ]
    assert again == deployment


def test_a_manifest_without_its_controller_is_refused(tmp_path: Path):
    data = yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "jobset-system"}}).encode()
    (tmp_path / JOBSET.file).write_bytes(data)
    with pytest.raises(ManifestError, match="expected one controller Deployment"):
        controller_objects(pinned(JOBSET, data), from_folder(tmp_path))


def test_kueue_shares_fairly_and_manages_every_job_of_a_team_namespace(tmp_path: Path):
    data = manifest(KUEUE)
    (tmp_path / KUEUE.file).write_bytes(data)
    configuration = kueue_configuration(controller_objects(pinned(KUEUE, data), from_folder(tmp_path)))
    assert configuration["fairSharing"] == controllers.FAIR_SHARING
    assert configuration["integrations"] == KUEUE_CONFIGURATION["integrations"]  # the release's own, kept
    # A JobSet without a queue label in a team namespace is suspended, never run outside the team's quota
    # (Kueue "Setup manageJobsWithoutQueueName"); other namespaces (kube-system, the controllers') are not managed.
    assert configuration["manageJobsWithoutQueueName"] is True
    (expression,) = configuration["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expression == {"key": controllers.TEAM_NAMESPACE_LABEL, "operator": "Exists"}
    for team in g.TEAMS:
        (namespace,) = [o for o in team_objects(team, "") if o["kind"] == "Namespace"]
        assert expression["key"] in namespace["metadata"]["labels"]


def test_no_team_may_take_a_controllers_namespace():
    assert {r.namespace for r in controllers.RELEASES} <= set(naming.SYSTEM_NAMESPACES)
