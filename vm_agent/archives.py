"""The archives the agent fetches (a run's source folder, its own wheelhouse): a file's sha256, and an
unpack that refuses what could write outside its folder. Standard library only.

Run as a program (`python -m vm_agent.archives ARCHIVE SHA256 FOLDER`), it is a GKE pod's last step before a
folder source runs (infra/startup.py render_pod_fetch): the archive is checked against its digest once more and
unpacked into FOLDER, or the step exits with the run contract's 78 and nothing of it runs."""

from __future__ import annotations

import hashlib
import sys
import tarfile
from pathlib import Path

from run_contract.names import EXIT_CONFIG


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


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m vm_agent.archives ARCHIVE SHA256 FOLDER", file=sys.stderr)
        return 2
    archive, sha256, target = Path(argv[0]), argv[1], Path(argv[2])
    digest = sha256_file(archive)
    if digest != sha256:
        print(
            f"tpu-platform: FATAL: {archive} has sha256 {digest}, the run says {sha256}: nothing of it runs",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    target.mkdir(parents=True, exist_ok=True)
    try:
        unpack(archive, target)
    except (tarfile.TarError, ValueError) as error:
        print(f"tpu-platform: FATAL: {archive}: {error}: nothing of it runs", file=sys.stderr)
        return EXIT_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
