"""A folder as a deterministic tar.gz: the same files give the same bytes, wherever the checkout is.

What makes a source folder's object name (`sources/<sha256>.tar.gz`, docs/run-contract.md) a content
hash: members sorted by path; every mtime, uid, gid, owner and group name fixed; modes normalised to
0644 (0755 for directories and files executable by their owner); the gzip header without a file name
and with mtime 0. Byte caches and version-control folders are left out (`__pycache__`, `.git`, `*.pyc`):
they differ between checkouts and never belong on a VM. A symbolic link to a file inside `within` (the
repository, for the stack's folders) is packaged as that file's bytes, so folders can share a helper
(the examples' `runlib.py`) without copies, and a link to a folder inside `within` as that folder's files
(the run contract's package beside `runlib.py`); any other link is refused: it could lead out of the
repository, and a clean clone is what CI packages.

Pure: reads files, returns bytes; `pulumi up` uploads them (infra/artifacts.py).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from infra.config.workload_code import REPO_ROOT
from run_contract import paths

EXCLUDED_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")
FIXED_MTIME = 0
GZIP_LEVEL = 9


class PackagingError(ValueError):
    pass


@dataclass(frozen=True)
class Package:
    data: bytes
    sha256: str
    files: int
    # An archive built before the plan (the agent's wheelhouse, `make agent-wheelhouse`): uploaded from this
    # file, which the plan does not read; `data` is then empty.
    built: Path | None = None
    prefix: str = paths.SOURCES_PREFIX  # where in the artifacts bucket: run_contract/paths.py

    @property
    def object_name(self) -> str:
        return paths.source_object(self.sha256, self.prefix)


def _members(folder: Path, within: Path, under: str = "") -> list[tuple[Path, str]]:
    """The folder's files and folders with their names in the archive (`under` them), sorted by name."""
    out: list[tuple[Path, str]] = []
    for path in sorted(folder.rglob("*"), key=lambda p: p.relative_to(folder).as_posix()):
        relative = path.relative_to(folder)
        name = f"{under}{relative.as_posix()}"
        if any(part in EXCLUDED_DIRS for part in relative.parts) or path.name.endswith(EXCLUDED_SUFFIXES):
            continue
        if path.is_symlink():
            target = path.resolve()
            inside = target.is_relative_to(within.resolve()) and not path.parent.resolve().is_relative_to(target)
            if not (inside and (target.is_file() or target.is_dir())):
                raise PackagingError(
                    f"{folder}: {relative.as_posix()} is a symbolic link to {target}, not to a file or folder "
                    f"inside {within} (and not around the link); package real files, or links into this repository"
                )
            if target.is_dir():  # a shared package (run_contract/): its files, under the link's name
                out.append((path, name))
                out += _members(target, within, f"{name}/")
                continue
        if not (path.is_dir() or path.is_file()):
            raise PackagingError(f"{folder}: {relative.as_posix()} is neither a file nor a folder")
        out.append((path, name))
    return sorted(out, key=lambda member: member[1])


def _info(path: Path, name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        executable = path.stat().st_mode & stat.S_IXUSR
        info.mode = 0o755 if executable else 0o644
        info.size = path.stat().st_size
    return info


def package(folder: Path, within: Path | None = None) -> Package:
    """The folder's files (relative paths, sorted) as tar.gz bytes with their sha256; links are followed
    to files inside `within` (default: the folder itself)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PackagingError(f"{folder} is not a folder")
    return _archive(_members(folder, Path(within or folder)))


def _archive(members: list[tuple[Path, str]]) -> Package:
    raw = io.BytesIO()
    files = 0
    # PAX would add per-file records (atime, ctime) on some inputs; GNU format with fixed fields does not.
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path, name in members:
            info = _info(path, name)
            if info.isdir():
                tar.addfile(info)
            else:
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
                files += 1
    compressed = io.BytesIO()
    # filename="" and mtime=0: the gzip header carries neither the checkout's path nor the time.
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=GZIP_LEVEL) as gz:
        gz.write(raw.getvalue())
    data = compressed.getvalue()
    return Package(data=data, sha256=hashlib.sha256(data).hexdigest(), files=files)


@functools.cache  # a plan packages each folder once, however many VMs and components name it
def repository_folder(folder: str) -> Package:
    """A folder of this repository (`a/b`, relative to its root), links followed inside the repository."""
    return package(REPO_ROOT.joinpath(*folder.split("/")), within=REPO_ROOT)


@functools.cache
def repository_packages(*folders: str) -> Package:
    """Folders of this repository, each under its own name (`vm_agent/...`, `run_contract/...`): Python
    packages that are imported side by side from the folder the archive is unpacked into."""
    members: list[tuple[Path, str]] = []
    for folder in folders:
        path = REPO_ROOT / folder
        if not path.is_dir():
            raise PackagingError(f"{path} is not a folder")
        members += [(path, folder), *_members(path, REPO_ROOT, f"{folder}/")]
    return _archive(members)


# The VM agent's wheelhouse (tools/agent_wheelhouse.py): its digest is pinned in this file, which
# `make agent-wheelhouse` writes, so a plan names the archive by digest without downloading a wheel (offline,
# deterministic); `pulumi up` uploads the archive from WHEELHOUSE_DIR.
WHEELHOUSE_PIN = REPO_ROOT / "requirements-agent.wheelhouse"
WHEELHOUSE_DIR = REPO_ROOT / "build" / "agent-wheelhouse"
_PIN_HEADER = (
    "# The VM agent's wheelhouse: requirements-agent.lock's wheels for each Python the agent serves, as one\n"
    "# archive named by its sha256 (tools/agent_wheelhouse.py). Written by `make agent-wheelhouse`; the plan\n"
    "# names the archive by this digest, and `pulumi up` uploads build/agent-wheelhouse/<sha256>.tar.gz.\n"
)


def write_wheelhouse_pin(sha256: str) -> None:
    WHEELHOUSE_PIN.write_text(f"{_PIN_HEADER}sha256 {sha256}\n")


def pinned_sha256() -> str:
    """The digest requirements-agent.wheelhouse pins; '' when it names none."""
    words = [line.split() for line in WHEELHOUSE_PIN.read_text().splitlines() if line and not line.startswith("#")]
    sha256 = dict(w for w in words if len(w) == 2).get("sha256", "")
    return sha256 if len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256) else ""


@functools.cache
def agent_wheelhouse() -> Package:
    """The pinned wheelhouse, by digest; its file is read only by `pulumi up`'s upload."""
    sha256 = pinned_sha256()
    if not sha256:
        raise PackagingError(f"{WHEELHOUSE_PIN} names no sha256; run `make lock`")
    return Package(data=b"", sha256=sha256, files=0, built=WHEELHOUSE_DIR / f"{sha256}.tar.gz")
