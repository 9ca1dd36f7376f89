"""JobSet and Kueue at pinned releases: the objects the admin phase installs, from their release manifests.

Versions (docs/design-gke.md, "Controllers", says why these): JobSet v0.12.0 and Kueue v0.17.8. The
manifests are not in this repository: the admin phase takes each release's `manifests.yaml` from its
GitHub release at deploy time, or from a local copy a user points `TPU_PLATFORM_CONTROLLER_MANIFESTS` at
(the offline plan has no network), and refuses any bytes whose sha256 is not the pinned one: what is
installed is what was pinned, whoever serves it.

The pins (docs/design-gke.md, "Where the pins come from"): each sha256 is that of `config/default` built
with kustomize at the release tag, the controller image set to the release's, as each project's Makefile
builds the release asset. The same build of Kueue v0.19.2 gives the sha256 a third party pinned for that
release's downloaded asset, and JobSet v0.12.0's equals the one a third party pinned for its asset.

Two changes are made to the release objects, in code and tested, so the bytes stay the releases': the
controller image is pinned by digest, and Kueue's configuration turns fair sharing on and manages every
job in a team namespace, labelled or not (Kueue "Setup manageJobsWithoutQueueName": a JobSet without a
`kueue.x-k8s.io/queue-name` label is suspended, so no team runs outside its quota).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MANIFESTS_ENV = "TPU_PLATFORM_CONTROLLER_MANIFESTS"  # a folder holding <name>-<version>.yaml copies
DOWNLOAD_SECONDS = 60
LICENCE = "Apache-2.0"
# Kueue's "Fair Sharing" (site/content/en/docs/concepts/preemption.md): the strategies its example
# configuration enables, tried in this order.
FAIR_SHARING = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
# Which namespaces Kueue manages jobs in without a queue label: the teams' (infra/gke/teams.py labels them).
TEAM_NAMESPACE_LABEL = "tpu-platform/team"
MANAGED_JOBS = {
    "manageJobsWithoutQueueName": True,
    "managedJobsNamespaceSelector": {"matchExpressions": [{"key": TEAM_NAMESPACE_LABEL, "operator": "Exists"}]},
}
KUEUE_CONFIG = ("kueue-system", "kueue-manager-config", "controller_manager_config.yaml")


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    tag_commit: str  # the commit the release tag names, in the project's repository
    sha256: str  # of the release's manifests.yaml
    image: str  # the controller image the manifest names (registry/repository:tag)
    digest: str  # that image's digest, as third-party records give it; the smoke test confirms it
    namespace: str  # where the controller runs
    url: str  # the release's manifests.yaml

    @property
    def file(self) -> str:
        """The name of a local copy in the folder `TPU_PLATFORM_CONTROLLER_MANIFESTS` names."""
        return f"{self.name}-{self.version}.yaml"

    @property
    def pinned_image(self) -> str:
        return f"{self.image}@{self.digest}"


JOBSET = Release(
    name="jobset",
    version="v0.12.0",
    tag_commit="f22e565ac3cc3265c7c45ef67ecffdc689af5d77",
    sha256="a41aaf12dd0b7b0a3d626b8d6107f32c3dc889d7e7830adc46b8cdb77a8963bb",
    image="registry.k8s.io/jobset/jobset:v0.12.0",
    digest="sha256:e75536f1135b7bb2f19f8c3b620782fbdd9091d73398e3a272f9a5fed322980d",
    namespace="jobset-system",
    url="https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml",
)
KUEUE = Release(
    name="kueue",
    version="v0.17.8",
    tag_commit="818686e072da52af3564ba21f37f826fe05190af",
    sha256="060f579f1fda0812c3691b2c605eeb0d67ef27416e51d484793c60df2bdd366f",
    image="registry.k8s.io/kueue/kueue:v0.17.8",
    digest="sha256:cecba825d0b0feab9bed2835efe2eb8d825512f1616c8762ab80c53f2ea6afe6",
    namespace="kueue-system",
    url="https://github.com/kubernetes-sigs/kueue/releases/download/v0.17.8/manifests.yaml",
)
RELEASES = (JOBSET, KUEUE)

Obj = dict[str, Any]
Fetch = Callable[[Release], bytes]


class ManifestError(Exception):
    """A release manifest that cannot be had, or is not the bytes that were pinned."""


def download(release: Release) -> bytes:
    """The release's manifest from its GitHub release (what `pulumi up` of the admin phase does)."""
    import requests  # only here: the offline plan and the queues phase never download

    try:
        response = requests.get(release.url, timeout=DOWNLOAD_SECONDS)
        response.raise_for_status()
    except requests.RequestException as error:
        raise ManifestError(
            f"could not download {release.url} ({error}); without network, save it and set "
            f"{MANIFESTS_ENV} to its folder (docs/design-gke.md, 'The admin phase')"
        ) from None
    return response.content


def from_folder(folder: Path) -> Fetch:
    """Local copies, one per release, named `<name>-<version>.yaml` (for an offline plan)."""

    def read(release: Release) -> bytes:
        path = folder / release.file
        if not path.is_file():
            raise ManifestError(
                f"{MANIFESTS_ENV}={folder} has no {release.file}: save {release.url} there under that name"
            )
        return path.read_bytes()

    return read


def manifests_needed() -> str:
    """What an offline plan of the admin phase says when no folder of manifests is named: it never downloads."""
    needed = ", ".join(f"{r.url} as {r.file}" for r in RELEASES)
    return (
        "the GKE admin phase installs JobSet and Kueue from their release manifests, which an offline plan does "
        f"not download: save {needed} in a folder and set {MANIFESTS_ENV} to it (each is checked against its "
        "pinned sha256)"
    )


def fetch_from_environment(environ: Mapping[str, str] = os.environ) -> Fetch:
    """A local folder when `TPU_PLATFORM_CONTROLLER_MANIFESTS` names one; else the release's download."""
    folder = environ.get(MANIFESTS_ENV)
    return from_folder(Path(folder)) if folder else download


def read_release(release: Release, fetch: Fetch) -> tuple[Obj, ...]:
    """The release's objects, as its manifest has them; refused unless the bytes are the pinned ones."""
    data = fetch(release)
    digest = hashlib.sha256(data).hexdigest()
    if digest != release.sha256:
        raise ManifestError(
            f"{release.name} {release.version}: the manifest's sha256 is {digest}, but the release is pinned at "
            f"{release.sha256} (infra/gke/controllers.py); refusing to install other bytes"
        )
    return _parse(data)


@functools.cache
def _parse(data: bytes) -> tuple[Obj, ...]:
    """Parsed once per process (libyaml's loader: 2.5 MB of CRDs); callers get copies to change."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(obj for obj in yaml.load_all(data, Loader=loader) if obj)


def _pin_image(obj: Obj, release: Release) -> Obj:
    if obj.get("kind") != "Deployment":
        return obj
    containers = obj["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c.get("image") == release.image]
    if len(named) != 1:
        raise ManifestError(f"{release.name} {release.version}: expected one container running {release.image}")
    named[0]["image"] = release.pinned_image
    return obj


def _configure_kueue(obj: Obj) -> Obj:
    namespace, name, key = KUEUE_CONFIG
    meta = obj.get("metadata", {})
    if obj.get("kind") != "ConfigMap" or (meta.get("namespace"), meta.get("name")) != (namespace, name):
        return obj
    configuration = yaml.safe_load(obj["data"][key])
    configuration["fairSharing"] = copy.deepcopy(FAIR_SHARING)
    configuration.update(copy.deepcopy(MANAGED_JOBS))
    obj["data"][key] = yaml.safe_dump(configuration, sort_keys=False)
    return obj


def controller_objects(release: Release, fetch: Fetch) -> list[Obj]:
    """What the admin phase applies for one release: its objects, image by digest, Kueue configured."""
    objs = [_pin_image(copy.deepcopy(obj), release) for obj in read_release(release, fetch)]
    if sum(obj.get("kind") == "Deployment" for obj in objs) != 1:
        raise ManifestError(f"{release.name} {release.version}: expected one controller Deployment")
    if release.name == KUEUE.name:
        objs = [_configure_kueue(obj) for obj in objs]
        if not kueue_configuration(objs).get("fairSharing"):
            raise ManifestError(f"kueue {release.version}: no ConfigMap {KUEUE_CONFIG[1]} to configure")
    return objs


def kueue_configuration(objs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Kueue's Configuration as the given objects carry it ({} when they carry none)."""
    namespace, name, key = KUEUE_CONFIG
    for obj in objs:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "ConfigMap" and (meta.get("namespace"), meta.get("name")) == (namespace, name):
            return yaml.safe_load(obj["data"][key])
    return {}


def crds(objs: Sequence[Mapping[str, Any]]) -> list[Obj]:
    """The CustomResourceDefinitions among a release's objects (what the release CRDs would validate by)."""
    return [dict(obj) for obj in objs if obj.get("kind") == "CustomResourceDefinition"]
