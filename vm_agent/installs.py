"""What a run may install: only what its author pinned by hash, or the run is refused with the reason.

A folder's requirements are installed from the lock it ships (`requirements.lock`, or a
`requirements.txt` whose every requirement carries `--hash=`), with `--require-hashes --no-deps`:
pip (and uv) then install exactly the listed files, each checked against its sha256, and resolve
nothing of their own ("Secure installs", pip's docs: hash-checking mode; `uv pip install
--require-hashes`). `uv pip compile --generate-hashes requirements.txt -o requirements.lock` writes
such a lock; `--no-emit-package` leaves out what the TPU image provides (its framework).

The catalog's bounds for the image's framework (e.g. protobuf<5 beside TensorFlow < 2.18;
infra/catalog) are checked against the lock's pins before anything is installed. One lock cannot fit
every image (TensorFlow 2.21 needs protobuf >= 5.28, TensorFlow 2.15 protobuf < 5): a folder may ship
more, `requirements-<anything>.lock` beside `requirements.lock`, and the first, by name after
`requirements.lock`, whose pins the bounds allow is installed; when none is, the run is refused with
each lock's reason.

`uv` itself, when the image has none, is installed the same way from the agent's own lock
(`uv-requirements.txt`, beside this file, the project's `uv` pin and hashes: tests compare them).

Standard library only.
"""

from __future__ import annotations

import re
from pathlib import Path

LOCK_NAMES = ("requirements.lock", "requirements.txt")
UV_REQUIREMENTS = Path(__file__).resolve().with_name("uv-requirements.txt")
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([A-Za-z0-9.+!_-]+)")
_BOUND = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(<=|>=|==|!=|<|>)\s*([0-9][A-Za-z0-9.]*)")
HOW = (
    "ship a lock with hashes beside it: uv pip compile --generate-hashes requirements.txt -o requirements.lock "
    "(--no-emit-package for what the TPU image provides)"
)


class LockError(ValueError):
    """A folder's requirements cannot be installed by hash: the run is refused with this reason."""


def requirement_lines(text: str) -> list[str]:
    """Logical lines (backslash continuations joined), without comments and blank lines."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(" ".join(current.split()))
        current = ""
    if current.strip():
        lines.append(" ".join(current.split()))
    return lines


def pins(text: str) -> dict[str, str]:
    """name (normalised) -> pinned version, of a lock's requirements."""
    found = {}
    for line in requirement_lines(text):
        match = _PIN.match(line)
        if match:
            found[normalise(match[1])] = match[3]
    return found


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_of(folder: Path) -> Path | None:
    """The file to install from, or None when the folder has no requirements; LockError when it has
    some that are not pinned by hash."""
    for name in LOCK_NAMES:
        path = folder / name
        if path.is_file():
            _check_pinned(path)
            return path
    return None


def _check_pinned(path: Path) -> None:
    """LockError unless each requirement of `path` is pinned to one version with its hashes."""
    problems = []
    for line in requirement_lines(path.read_text()):
        if line.startswith("-"):
            if not line.startswith(("--hash", "--index-url", "--extra-index-url", "-i ", "--find-links")):
                problems.append(f"option {line.split()[0]!r} (a lock holds pinned requirements only)")
            continue
        if not _PIN.match(line):
            problems.append(f"{line.split()[0]!r} is not pinned with == to one version")
        elif "--hash=" not in line:
            problems.append(f"{line.split()[0]!r} has no --hash=sha256:...")
    if problems:
        raise LockError(f"{path.name} cannot be installed by hash: {'; '.join(problems[:5])}; {HOW}")


def choose_lock(folder: Path, constraints: tuple[str, ...]) -> Path | None:
    """The lock to install from for an image with the framework bounds `constraints` (see above), or None
    when the folder has no requirements; LockError with every lock's reason when none fits."""
    first = lock_of(folder)
    if first is None:
        return None
    others = sorted(p for p in folder.glob("requirements-*.lock") if p.is_file()) if first.suffix == ".lock" else []
    reasons = []
    for lock in (first, *others):
        try:
            if lock != first:
                _check_pinned(lock)
            check_bounds(lock, constraints)
            return lock
        except LockError as error:
            reasons.append(str(error))
    raise LockError(" | ".join(reasons))


def _version_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in re.split(r"[.+!_-]", version))


def check_bounds(lock: Path, constraints: tuple[str, ...]) -> None:
    """LockError naming each pin of `lock` that a catalog bound of the image's framework forbids."""
    pinned = pins(lock.read_text())
    compare = {
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    problems = []
    for constraint in constraints:
        match = _BOUND.fullmatch(constraint.replace(" ", ""))
        if match is None:
            continue
        name, operator, bound = normalise(match[1]), match[2], match[3]
        version = pinned.get(name)
        if version is not None and not compare[operator](_version_key(version), _version_key(bound)):
            problems.append(f"{name}=={version} breaks {constraint}")
    if problems:
        raise LockError(
            f"{lock.name} pins what the image's framework cannot run beside: {'; '.join(problems)} (the catalog's "
            "bounds for this runtime); leave the package out of the lock, or pin a version within the bound"
        )
