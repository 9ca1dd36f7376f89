"""JobSet and Kueue at pinned releases: the objects the admin phase installs, read from their manifests.

Versions (docs/design-gke.md, "Controllers", says why these): JobSet v0.12.0 and Kueue v0.17.8. Each
release manifest is `kustomize build config/default` of the release tag, as the projects' Makefiles
build `manifests.yaml`, kept in infra/gke/manifests/ (its README: source, tag commit, sha256, licence).
A manifest whose sha256 differs from the pin is refused: what is installed is what was reviewed.

Two changes are made to the release objects here, in code and tested, so the files stay the releases'
bytes: the controller image is pinned by digest where its digest is recorded, and Kueue's own
configuration turns fair sharing on (Kueue "Preemption", "Fair Sharing": a `fairSharing` block in the
Configuration with its preemption strategies).
"""

from __future__ import annotations

import copy
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.gke.validation import Validator

MANIFESTS = Path(__file__).resolve().parent / "manifests"
LICENCE = "Apache-2.0"
# Kueue's "Fair Sharing" (site/content/en/docs/concepts/preemption.md): the strategies its example
# configuration enables, tried in this order.
FAIR_SHARING = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}
KUEUE_CONFIG = ("kueue-system", "kueue-manager-config", "controller_manager_config.yaml")


@dataclass(frozen=True)
class Release:
    name: str
    version: str
    tag_commit: str  # the commit the release tag names, in the project's repository
    sha256: str  # of the manifest file
    image: str  # the controller image the manifest names (registry/repository:tag)
    digest: str | None  # that image's digest where one is on record; None: pinned by tag only
    namespace: str  # where the controller runs

    @property
    def file(self) -> str:
        return f"{self.name}-{self.version}.yaml"

    @property
    def source(self) -> str:
        return f"https://github.com/kubernetes-sigs/{self.name}/tree/{self.version}/config/default"

    @property
    def pinned_image(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


JOBSET = Release(
    name="jobset",
    version="v0.12.0",
    tag_commit="f22e565ac3cc3265c7c45ef67ecffdc689af5d77",
    sha256="a41aaf12dd0b7b0a3d626b8d6107f32c3dc889d7e7830adc46b8cdb77a8963bb",
    image="registry.k8s.io/jobset/jobset:v0.12.0",
    digest="sha256:e75536f1135b7bb2f19f8c3b620782fbdd9091d73398e3a272f9a5fed322980d",
    namespace="jobset-system",
)
KUEUE = Release(
    name="kueue",
    version="v0.17.8",
    tag_commit="818686e072da52af3564ba21f37f826fe05190af",
    sha256="060f579f1fda0812c3691b2c605eeb0d67ef27416e51d484793c60df2bdd366f",
    image="registry.k8s.io/kueue/kueue:v0.17.8",
    digest="sha256:cecba825d0b0feab9bed2835efe2eb8d825512f1616c8762ab80c53f2ea6afe6",
    namespace="kueue-system",
)
RELEASES = (JOBSET, KUEUE)

Obj = dict[str, Any]


class ManifestError(Exception):
    """A pinned manifest that is missing, or not the bytes that were pinned."""


@functools.cache
def read_release(release: Release, folder: Path = MANIFESTS) -> tuple[Obj, ...]:
    """The release's objects, as its manifest has them; refused unless the file is the pinned bytes.
    Read once per process (libyaml's loader: 2.5 MB of CRDs); callers get copies to change."""
    path = folder / release.file
    if not path.is_file():
        raise ManifestError(
            f"{path} is missing: the {release.name} {release.version} release manifest "
            f"(infra/gke/manifests/README.md says where it comes from and its sha256)"
        )
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != release.sha256:
        pinned = f"{release.name} {release.version} is pinned at {release.sha256}"
        raise ManifestError(f"{path}: sha256 {digest}, but {pinned}")
    return tuple(obj for obj in yaml.load_all(data, Loader=yaml.CSafeLoader) if obj)


def _pin_image(obj: Obj, release: Release) -> Obj:
    if obj.get("kind") != "Deployment":
        return obj
    pinned = copy.deepcopy(obj)
    containers = pinned["spec"]["template"]["spec"]["containers"]
    named = [c for c in containers if c.get("image") == release.image]
    if len(named) != 1:
        raise ManifestError(f"{release.name} {release.version}: expected one container running {release.image}")
    named[0]["image"] = release.pinned_image
    return pinned


def _with_fair_sharing(obj: Obj) -> Obj:
    namespace, name, key = KUEUE_CONFIG
    meta = obj.get("metadata", {})
    if obj.get("kind") != "ConfigMap" or (meta.get("namespace"), meta.get("name")) != (namespace, name):
        return obj
    patched = copy.deepcopy(obj)
    configuration = yaml.safe_load(patched["data"][key])
    configuration["fairSharing"] = copy.deepcopy(FAIR_SHARING)
    patched["data"][key] = yaml.safe_dump(configuration, sort_keys=False)
    return patched


def controller_objects(release: Release, folder: Path = MANIFESTS) -> list[Obj]:
    """What the admin phase applies for one release: its objects, image by digest, Kueue's fair sharing on."""
    objs = [_pin_image(copy.deepcopy(obj), release) for obj in read_release(release, folder)]
    if release is KUEUE:
        objs = [_with_fair_sharing(obj) for obj in objs]
        if not kueue_configuration(objs).get("fairSharing"):
            raise ManifestError(f"kueue {release.version}: no ConfigMap {KUEUE_CONFIG[1]} to turn fair sharing on in")
    return objs


def kueue_configuration(objs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Kueue's Configuration as the given objects carry it ({} when they carry none)."""
    namespace, name, key = KUEUE_CONFIG
    for obj in objs:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "ConfigMap" and (meta.get("namespace"), meta.get("name")) == (namespace, name):
            return yaml.safe_load(obj["data"][key])
    return {}


def crds(releases: Sequence[Release] = RELEASES, folder: Path = MANIFESTS) -> list[Obj]:
    """The CustomResourceDefinitions of the pinned releases: what the validator judges their kinds by."""
    return [obj for r in releases for obj in read_release(r, folder) if obj.get("kind") == "CustomResourceDefinition"]


@functools.cache
def pinned_validator() -> Validator:
    """A validator for the pinned controllers' kinds and the core kinds (built once: the CRDs are large)."""
    return Validator(crds())
