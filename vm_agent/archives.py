"""The archives the agent fetches (a run's source folder, its own wheelhouse): a file's sha256, and an
unpack that refuses what could write outside its folder. Standard library only."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(archive: Path, target: Path) -> None:
    """Unpack refusing what could write outside `target`: absolute names, `..`, links out, devices."""
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts:
                raise ValueError(f"archive member {member.name!r} would land outside the folder")
            if member.issym() or member.islnk():
                link = Path(member.name).parent / member.linkname
                if member.linkname.startswith("/") or ".." in link.parts:
                    raise ValueError(f"archive link {member.name!r} -> {member.linkname!r} points outside the folder")
            elif not (member.isfile() or member.isdir()):
                raise ValueError(f"archive member {member.name!r} is not a file, folder or link")
        if hasattr(tarfile, "data_filter"):  # 3.12, and security releases of 3.8 to 3.11
            tar.extractall(target, members=members, filter="data")
        else:
            tar.extractall(target, members=members)
