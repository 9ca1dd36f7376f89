"""The run spec: what a run is (its source folder or image, command, env, places), and its strict parser.

A run spec is JSON (docs/run-contract.md, "A run spec"): the stack's run in the instance attribute
`tpu-platform-run`, a researcher's in a request (run_contract.request). Parsing lists every problem at once, each with
the key, the bad value and what is allowed, and refuses a source that is not the stack's own: a folder
archive outside `TPU_PLATFORM_ARTIFACTS`, an image outside `TPU_PLATFORM_REGISTRY`, an image by tag
unless the stack allowed tags for it (`"allowTag": true`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Union

from run_contract.names import (
    CONTRACT_PREFIX,
    IMAGE_NAME,
    MAX_RUN_ID,
    REQUESTER,
    REQUESTER_RULE,
    RUN_ATTRIBUTE,
    RUN_ID,
    SHA256,
    TAG,
)

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PYTHON_VERSION = re.compile(r"3\.\d{1,2}")

SPEC_KEYS = {
    "runId": "the run's id",
    "source": "where the code comes from: a folder archive or an image",
    "command": "the program and its arguments",
    "env": "extra environment for the program",
    "python": "a Python version for a folder's virtualenv, e.g. 3.11",
    "requester": REQUESTER_RULE,
    "data": "gs:// URL of the run's data, or empty",
    "checkpointDir": "gs:// URL for checkpoints, or empty",
    "modelDir": "gs:// URL for the model, or empty",
    "completion": "true: the run ends in <status-dir>/COMPLETE",
}
FOLDER_KEYS = ("kind", "uri", "sha256")
IMAGE_KEYS = ("kind", "image", "allowTag")


@dataclass(frozen=True)
class Form:
    """What one kind of run spec may say beyond the shared rules: its keys, and its run ids and
    requesters. The stack's (metadata) is `STACK_FORM`; a researcher's request's is run_contract.request's."""

    keys: tuple[str, ...]
    run_id: re.Pattern[str]
    run_id_rule: str
    requester: re.Pattern[str]
    requester_rule: str
    max_run_id: int = MAX_RUN_ID
    noun: str = "keys"  # what the spec's keys are called in a problem


STACK_FORM = Form(
    tuple(SPEC_KEYS),
    RUN_ID,
    f"needs letters, digits, '.', '_', '-' in '/'-separated parts, at most {MAX_RUN_ID} characters",
    REQUESTER,
    REQUESTER_RULE,
)


class SpecError(ValueError):
    """A run spec that cannot be run, with every problem found (key, value, what is allowed)."""

    def __init__(self, where: str, problems: list[str], run_id: str = ""):
        self.where = where
        self.problems = problems
        self.run_id = run_id
        super().__init__(f"refused run spec ({where}): " + "; ".join(problems))


@dataclass(frozen=True)
class Allowed:
    """The stack's own places: the artifacts bucket (`gs://name`) and the registry repository."""

    artifacts: str
    registry: str


@dataclass(frozen=True)
class FolderSource:
    uri: str
    sha256: str
    kind: str = "folder"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "uri": self.uri, "sha256": self.sha256}


@dataclass(frozen=True)
class ImageSource:
    image: str
    allow_tag: bool = False
    kind: str = "image"

    @property
    def by_digest(self) -> bool:
        return "@sha256:" in self.image

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "image": self.image}


Source = Union[FolderSource, ImageSource]


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    source: Source
    command: tuple[str, ...]
    requester: str
    env: tuple[tuple[str, str], ...] = ()
    python: str = ""
    data: str = ""
    checkpoint_dir: str = ""
    model_dir: str = ""
    completion: bool = False
    # sha256 of the spec's canonical JSON: a changed setting under the same run id is a new desired run.
    fingerprint: str = field(default="", compare=False)
    # The request object a self-service run came from (run_contract.request), kept in its state: "" for
    # the stack's run.
    request: str = field(default="", compare=False)


@dataclass(frozen=True)
class StopRequest:
    run_id: str


def _fingerprint(raw: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parse_run_spec(
    text: str, allowed: Allowed, where: str = f"metadata {RUN_ATTRIBUTE}", form: Form = STACK_FORM
) -> RunSpec:
    """The run spec in `text`, or a SpecError listing every problem with it."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise SpecError(where, [f"not JSON ({error})"]) from None
    if not isinstance(raw, dict):
        raise SpecError(where, [f"a run spec is a JSON object, not {type(raw).__name__}"])
    problems: list[str] = []
    unknown = sorted(set(raw) - set(form.keys))
    if unknown:
        problems.append(f"unknown {form.noun} {unknown}; allowed: {sorted(form.keys)}")

    run_id = raw.get("runId")
    if not isinstance(run_id, str) or not form.run_id.fullmatch(run_id) or len(run_id) > form.max_run_id:
        problems.append(f"runId {run_id!r}: {form.run_id_rule}")
        run_id = ""

    requester = raw.get("requester")
    if not isinstance(requester, str) or not form.requester.fullmatch(requester):
        problems.append(f"requester {requester!r}: {form.requester_rule}")

    source = _parse_source(raw.get("source"), allowed, problems)

    command = raw.get("command", [])
    if not isinstance(command, list) or not all(isinstance(w, str) and w for w in command):
        problems.append(f"command {command!r}: a list of non-empty strings")
        command = []
    elif not command and not isinstance(source, ImageSource):
        problems.append('command []: a folder source needs a command (e.g. ["python", "train.py"])')

    env = raw.get("env", {})
    pairs: list[tuple[str, str]] = []
    if not isinstance(env, dict):
        problems.append(f"env {env!r}: an object of NAME: value strings")
    else:
        for name, value in sorted(env.items()):
            if not ENV_NAME.fullmatch(name) or not isinstance(value, str):
                problems.append(f"env {name!r}={value!r}: names are [A-Za-z_][A-Za-z0-9_]*, values strings")
            elif name.startswith(CONTRACT_PREFIX):
                problems.append(f"env {name}: {CONTRACT_PREFIX}* is the run contract's, set by the platform")
            else:
                pairs.append((name, value))

    python = raw.get("python", "")
    if python and not isinstance(source, FolderSource):
        problems.append(f"python {python!r}: only a folder source runs in a virtualenv; an image brings its own")
    elif not isinstance(python, str) or (python and not PYTHON_VERSION.fullmatch(python)):
        problems.append(f'python {python!r}: a version such as "3.11", or absent for the image\'s Python')
        python = ""

    locations = {}
    for key in ("data", "checkpointDir", "modelDir"):
        value = raw.get(key, "")
        if not isinstance(value, str) or (value and not re.fullmatch(r"gs://[a-z0-9._-]+(/\S*)?", value)):
            problems.append(f'{key} {value!r}: a gs://bucket/path URL or ""')
            value = ""
        locations[key] = value

    completion = raw.get("completion", False)
    if not isinstance(completion, bool):
        problems.append(f"completion {completion!r}: true or false")
        completion = False
    if completion and requester != "stack":
        problems.append("completion true: only the stack's own run ends in COMPLETE (the guard stops the VM)")

    if problems or source is None:
        raise SpecError(where, problems, run_id)
    return RunSpec(
        run_id=run_id,
        source=source,
        command=tuple(command),
        requester=str(requester),
        env=tuple(pairs),
        python=python,
        data=locations["data"],
        checkpoint_dir=locations["checkpointDir"],
        model_dir=locations["modelDir"],
        completion=completion,
        fingerprint=_fingerprint(raw),
    )


def _parse_source(raw: Any, allowed: Allowed, problems: list[str]) -> Source | None:
    if not isinstance(raw, dict) or raw.get("kind") not in ("folder", "image"):
        kind = raw.get("kind") if isinstance(raw, dict) else raw
        problems.append(f'source {kind!r}: {{"kind": "folder", "uri", "sha256"}} or {{"kind": "image", "image"}}')
        return None
    keys = FOLDER_KEYS if raw["kind"] == "folder" else IMAGE_KEYS
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        problems.append(f"source: unknown keys {unknown} for kind {raw['kind']}; allowed: {list(keys)}")
    if raw["kind"] == "folder":
        return _parse_folder(raw, allowed, problems)
    return _parse_image(raw, allowed, problems)


def _parse_folder(raw: dict[str, Any], allowed: Allowed, problems: list[str]) -> FolderSource | None:
    uri, sha = raw.get("uri"), raw.get("sha256")
    ok = True
    if not isinstance(sha, str) or not SHA256.fullmatch(sha):
        problems.append(f"source.sha256 {sha!r}: 64 lowercase hex digits (the archive's sha256)")
        ok = False
    if not allowed.artifacts:
        problems.append("source.uri: this VM has no artifacts bucket (TPU_PLATFORM_ARTIFACTS is empty)")
        ok = False
    elif not isinstance(uri, str) or not uri.startswith(allowed.artifacts.rstrip("/") + "/"):
        problems.append(f"source.uri {uri!r}: must be under the stack's artifacts bucket {allowed.artifacts}/")
        ok = False
    elif not uri.endswith(".tar.gz") or ".." in uri.split("/"):
        problems.append(f"source.uri {uri!r}: a .tar.gz archive object")
        ok = False
    return FolderSource(uri, sha) if ok else None  # type: ignore[arg-type]


def _parse_image(raw: dict[str, Any], allowed: Allowed, problems: list[str]) -> ImageSource | None:
    image, allow_tag = raw.get("image"), raw.get("allowTag", False)
    if not isinstance(allow_tag, bool):
        problems.append(f"source.allowTag {allow_tag!r}: true or false")
        return None
    if not allowed.registry:
        problems.append("source.image: this VM has no Artifact Registry repository (TPU_PLATFORM_REGISTRY is empty)")
        return None
    prefix = allowed.registry.rstrip("/") + "/"
    if not isinstance(image, str) or not image.startswith(prefix):
        problems.append(f"source.image {image!r}: must be in the stack's repository {prefix}")
        return None
    rest = image[len(prefix) :]
    name, at, digest = rest.partition("@")
    if at:
        if IMAGE_NAME.fullmatch(name) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            return ImageSource(image, allow_tag)
        problems.append(f"source.image {image!r}: <name>@sha256:<64 hex digits>")
        return None
    name, colon, tag = rest.rpartition(":")
    if not colon or not IMAGE_NAME.fullmatch(name) or not TAG.fullmatch(tag):
        problems.append(f"source.image {image!r}: {prefix}<name>@sha256:<digest>")
        return None
    if not allow_tag:
        problems.append(
            f"source.image {image!r}: by digest only ({prefix}{name}@sha256:<digest>); a tag can move under a "
            "running experiment, and only a stack that allows tags for this workload may use one"
        )
        return None
    return ImageSource(image, allow_tag)
