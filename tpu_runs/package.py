"""A folder as a deterministic tar.gz: the same files give the same bytes, so the same sha256.

Sorted members, fixed mtime/uid/gid/owner names, modes 0644 (0755 for executables and folders), gzip
mtime 0 and no file name in the gzip header. Caches and VCS folders are left out.
RECONCILE: the stack packages its sources with infra/packaging.py (another branch); once it lands,
use it here, so a folder packaged by `tpu-runs submit` and by the stack have the same digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

SKIP_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
SKIP_SUFFIXES = (".pyc", ".pyo")


def _members(folder: Path) -> list[Path]:
    out: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        base = Path(root)
        out += [base / d for d in dirs]
        out += [base / f for f in sorted(files) if not f.endswith(SKIP_SUFFIXES)]
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def package(folder: Path) -> tuple[bytes, str]:
    """The archive's bytes and their sha256 (hex)."""
    folder = folder.resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} is not a folder")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _members(folder):
            if path.is_symlink():
                raise ValueError(f"{path}: links are not packaged; copy the file in")
            info = tarfile.TarInfo(path.relative_to(folder).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            data = path.read_bytes()
            info.size = len(data)
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    return data, hashlib.sha256(data).hexdigest()
