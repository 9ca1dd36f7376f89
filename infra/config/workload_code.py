"""Where a workload's code comes from: a folder of this repository or a container image, checked.

Pure: each check returns why a value is refused (None when it is fine), so the reader can name the
stack, the key and the value. A folder must be a directory inside the repository (a clean clone is
what CI packages: no absolute path, no `..`, no symbolic link leading out) holding the command's
entry; an image must be an Artifact Registry reference into this stack's own repository, pinned by
digest unless the stack allows tags.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from infra import naming
from run_contract.names import IMAGE_REF

REPO_ROOT = Path(__file__).resolve().parents[2]
# The repository whose stack is being read: this checkout, or (for an installed `tpu-runs`, whose own copy
# of the program has no workloads/) the checkout the stack file was given from.
_repository = contextvars.ContextVar("repository", default=REPO_ROOT)


def repository() -> Path:
    """The root of the repository a stack's folders and examples are read from."""
    return _repository.get()


@contextlib.contextmanager
def reading_repository(root: Path) -> Iterator[None]:
    """Read stacks as stacks of the repository at `root` while inside."""
    token = _repository.set(root.resolve())
    try:
        yield
    finally:
        _repository.reset(token)


# Interpreters whose first operand is a file (or `-m module`) of the folder; anything else must be a
# file of the folder itself (`./run.sh`), so the entry is checked at plan time, not found missing at boot.
INTERPRETERS = re.compile(r"python(3(\.[0-9]{1,2})?)?|bash|sh")
_FOLDER_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# Artifact Registry image references: the run contract's pattern (run_contract/names.py IMAGE_REF).
IMAGE_ALLOWED = (
    "<region>-docker.pkg.dev/<project>/<repository>/<image>@sha256:<64 hex digits> in this stack's repository"
)
FOLDER_ALLOWED = "a folder of this repository, relative to its root, like workloads or teams/vision/train"


@dataclass(frozen=True)
class ImageRef:
    region: str
    project: str
    repository: str
    name: str
    digest: str  # 64 hex digits, or "" when tagged
    tag: str

    @property
    def registry(self) -> str:
        """`<region>-docker.pkg.dev/<project>/<repository>`: the agent's TPU_PLATFORM_REGISTRY."""
        return registry(self.region, self.project, self.repository)


def registry(region: str, project: str, repository: str) -> str:
    """A Docker repository's endpoint, as Artifact Registry v1 gives it in `Repository.registryUri`
    ("for example: `us-docker.pkg.dev/my-proj/my-repo`")."""
    return f"{region}-docker.pkg.dev/{project}/{repository}"


def parse_image(ref: str) -> ImageRef | None:
    match = IMAGE_REF.fullmatch(ref)
    if match is None:
        return None
    return ImageRef(
        region=match["region"],
        project=match["project"],
        repository=match["repository"],
        name=match["name"],
        digest=match["digest"] or "",
        tag=match["tag"] or "",
    )


def rebased_image(image: ImageRef, *, stack: str, project: str, region: str) -> str:
    """The same image (name and digest or tag) in this stack's own repository."""
    version = f"@sha256:{image.digest}" if image.digest else f":{image.tag}"
    return f"{registry(region, project, naming.artifact_repository(stack))}/{image.name}{version}"


def image_problem(ref: str, *, stack: str, project: str, region: str, allow_tags: bool) -> str | None:
    """Why `ref` may not be run by this stack, or None."""
    image = parse_image(ref)
    expected = registry(region, project, naming.artifact_repository(stack))
    if image is None:
        return f"must be {IMAGE_ALLOWED} ({expected}/<image>@sha256:...)"
    if image.registry != expected:
        return f"must be an image of this stack's repository {expected} (copy it there), not of {image.registry}"
    if image.tag and not allow_tags:
        return (
            f"must be pinned by digest ({expected}/{image.name}@sha256:<64 hex digits>): a tag can be moved "
            "to other code after review, unless the stack accepts tags"
        )
    return None


def folder_problem(folder: str, root: Path | None = None) -> str | None:
    """Why `folder` is not a directory inside the repository at `root` (default: `repository()`), or None."""
    root = root or repository()
    parts = folder.split("/")
    if not folder or folder.startswith("/") or any(not _FOLDER_PART.fullmatch(p) or p in (".", "..") for p in parts):
        return f"must be {FOLDER_ALLOWED}: no absolute path, '..', '.' or empty part"
    path = root.joinpath(*parts)
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        return f"leads out of the repository (a symbolic link to {resolved}); CI packages only the repository"
    try:
        folder_exists = path.is_dir()
    except OSError:  # a name too long for a file name
        folder_exists = False
    if not folder_exists:
        return f"is not a folder of the repository ({path.relative_to(root)} does not exist or is a file)"
    return None


def entry_of(command: tuple[str, ...]) -> tuple[str, str] | None:
    """What the command starts: ("file", path) or ("module", name); None when it names neither."""
    if not command:
        return None
    first = command[0]
    if INTERPRETERS.fullmatch(first):
        rest = iter(command[1:])
        for arg in rest:
            if arg == "-m":
                return ("module", next(rest, ""))
            if arg in ("-c", "-"):  # code on the command line or stdin: nothing in the folder to check
                return None
            if not arg.startswith("-"):
                return ("file", arg)
        return None
    if first.startswith("./"):
        return ("file", first[2:])
    return None


def command_problem(command: tuple[str, ...], folder: str, root: Path | None = None) -> str | None:
    """Why `command` does not start a file or module of `folder` (already checked), or None."""
    root = root or repository()
    entry = entry_of(command)
    if entry is None:
        return (
            "must start a file of the source folder: `python train.py ...`, `python -m package.module ...`, "
            "`bash run.sh` or `./run.sh`"
        )
    kind, name = entry
    base = root.joinpath(*folder.split("/")).resolve()
    if kind == "module":
        if not _MODULE.fullmatch(name):
            return f"`-m {name}` is not a Python module name"
        stem = base.joinpath(*name.split("."))
        found = stem.with_suffix(".py").is_file() or (stem / "__main__.py").is_file()
        return None if found else f"module {name} is not in {folder} ({name.replace('.', '/')}.py or its __main__.py)"
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        return f"the entry {name} must be a file inside {folder}"
    path = base.joinpath(*relative.parts)
    if not path.resolve().is_relative_to(base) or not path.is_file():
        return f"the entry {name} is not a file of {folder}"
    return None
