"""The VM agent's wheelhouse: every wheel requirements-agent.lock pins, for each interpreter it serves, as
one deterministic archive named by its sha256.

`pip download --require-hashes --no-deps --only-binary :all:` fetches exactly the lock's files, each
checked against its hash ("Secure installs", pip's docs: hash-checking mode); `--python-version`,
`--implementation cp` and `--platform` pick the wheels of an interpreter other than the one running
pip (https://pip.pypa.io/en/stable/cli/pip_download/: those options fetch "for an interpreter and system
other than the ones that pip is running on", with `--only-binary=:all:` or `--no-deps`). The lock holds
the hashes of every file of each pinned release, so one lock serves every interpreter whose wheels
exist. The folder of wheels is then packed as infra/packaging.py packs a source folder (sorted members,
fixed times and modes, gzip mtime 0): the same lock gives the same bytes, wherever it is built.

    python -m tools.agent_wheelhouse [--write-pin] [--python 3.10 --python 3.12] [--out build/agent-wheelhouse]

prints the archive's path, digest and size. The stack's own wheelhouse must have the digest
requirements-agent.wheelhouse pins, which the plan reads (infra/packaging.py agent_wheelhouse): the plan
names the archive without building it, so `make plan` stays offline, and `pulumi up` uploads the file
this wrote. A build whose digest differs from the reviewed pin fails and changes nothing, so a deploy
never ships an archive its PR did not show; `--write-pin` (`make lock`, after editing
requirements-agent.txt) writes the new digest. A VM installs from it with no package index and every hash
checked (vm_agent/environment.py).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from infra.catalog import load_catalog
from infra.packaging import WHEELHOUSE_DIR, WHEELHOUSE_PIN, Package, package, pinned_sha256, write_wheelhouse_pin
from vm_agent.installs import requirement_lines

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements-agent.lock"
OUT = WHEELHOUSE_DIR
# The catalog's agent_pythons: 3.10, Ubuntu 22.04's python3, what tpu-ubuntu2204-base runs (os_python), and the
# floor the lock is resolved for; 3.11 (this project's own, and Debian 12's); 3.12: Ubuntu 24.04's.
PYTHONS = load_catalog().agent_pythons
# The manylinux tags a TPU VM's glibc accepts (Ubuntu 22.04: glibc 2.35); pip takes any of them.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


class WheelhouseError(ValueError):
    pass


@dataclass(frozen=True)
class Wheelhouse:
    archive: Package
    wheels: tuple[str, ...]  # file names, sorted


def lock_hashes(lock_text: str) -> frozenset[str]:
    """Every sha256 the lock allows; WheelhouseError when a requirement carries none."""
    hashes: set[str] = set()
    for line in requirement_lines(lock_text):
        if line.startswith("-"):
            continue
        found = [word.split(":", 1)[1] for word in line.split() if word.startswith("--hash=sha256:")]
        if not found:
            raise WheelhouseError(f"{line.split()[0]!r} has no --hash=sha256:...: the wheelhouse installs by hash only")
        hashes.update(found)
    return frozenset(hashes)


def download(lock: Path, pythons: tuple[str, ...], into: Path, extra: tuple[str, ...] = ()) -> None:
    """The lock's wheels for each interpreter, into `into` (pip keeps one copy of a file two interpreters share)."""
    into.mkdir(parents=True, exist_ok=True)
    for python in pythons:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
        argv += ["--only-binary", ":all:", "--require-hashes", "--implementation", "cp", "--python-version", python]
        for platform in PLATFORMS:
            argv += ["--platform", platform]
        done = subprocess.run([*argv, *extra, "--dest", str(into), "-r", str(lock)], capture_output=True, text=True)
        if done.returncode:
            raise WheelhouseError(f"the lock's wheels for Python {python}: {done.stderr.strip()[-2000:]}")


def pack(lock: Path, wheels: Path) -> Wheelhouse:
    """The folder's wheels and the lock as one archive; WheelhouseError for a file the lock does not allow."""
    allowed = lock_hashes(lock.read_text())
    names = []
    for wheel in sorted(wheels.iterdir()):
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if not wheel.name.endswith(".whl") or digest not in allowed:
            raise WheelhouseError(f"{wheel.name} (sha256 {digest}) is not a wheel the lock pins")
        names.append(wheel.name)
    if not names:
        raise WheelhouseError(f"{wheels} holds no wheel")
    with tempfile.TemporaryDirectory() as staging:
        shutil.copytree(wheels, Path(staging) / "wheels")
        shutil.copyfile(lock, Path(staging) / "requirements.lock")
        return Wheelhouse(package(Path(staging)), tuple(names))


def build(
    lock: Path = LOCK, pythons: tuple[str, ...] = PYTHONS, out: Path = OUT, extra: tuple[str, ...] = ()
) -> tuple[Wheelhouse, Path]:
    """Download, pack and write `<out>/<sha256>.tar.gz` (written once: the same digest is the same bytes)."""
    with tempfile.TemporaryDirectory() as folder:
        download(lock, pythons, Path(folder), extra)
        house = pack(lock, Path(folder))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{house.archive.sha256}.tar.gz"
    if not path.exists():
        partial = path.with_suffix(".partial")
        partial.write_bytes(house.archive.data)
        partial.replace(path)
    return house, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", action="append", help=f"interpreter version to serve (default {PYTHONS})")
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--write-pin", action="store_true", help=f"write the digest to {WHEELHOUSE_PIN.name}")
    args = parser.parse_args(argv)
    try:
        house, path = build(args.lock, tuple(args.python or PYTHONS), args.out)
    except WheelhouseError as error:
        print(f"agent wheelhouse: {error}", file=sys.stderr)
        return 1
    if args.lock == LOCK and args.out == OUT and not args.python:  # the stack's own: what the plan names
        if args.write_pin:
            write_wheelhouse_pin(house.archive.sha256)
            print(f"{WHEELHOUSE_PIN.name}: {house.archive.sha256}")
        elif house.archive.sha256 != (pinned := pinned_sha256()):
            path.unlink()
            print(
                f"agent wheelhouse: {args.lock.name} built sha256 {house.archive.sha256}, but {WHEELHOUSE_PIN.name} "
                f"pins {pinned or 'nothing'}: after editing the lock, run `make lock` (which writes the pin with "
                "--write-pin) and commit both, so the plan shows the new archive",
                file=sys.stderr,
            )
            return 1
    size = len(house.archive.data)
    print(f"{path} sha256 {house.archive.sha256} {size / 2**20:.2f} MiB, {len(house.wheels)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
