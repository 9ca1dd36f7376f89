"""The agent's own environment: Google's client library for Cloud Storage and its dependencies, installed
from the wheelhouse the stack shipped (requirements-agent.lock's wheels, tools/agent_wheelhouse.py) into
a root-owned virtualenv, and checked before every start of the agent.

The start-up script fetches the wheelhouse's archive and keeps it only if its bytes hash to the digest in
the VM's metadata; the unit checks that digest again before each start (its ExecStartPre), then runs
`python -m vm_agent.environment ARCHIVE ENV` with the image's Python, which

- keeps ENV when it is whole: its stamp names this archive's digest, its interpreter is this Python, and
  every file under its site-packages is one an installed distribution's RECORD lists, with the sha256 pip
  wrote there (https://packaging.python.org/en/latest/specifications/recording-installed-packages/);
- else (the first boot, a new wheelhouse, a file changed, added or removed) makes it afresh: a virtualenv
  without pip and without the system's packages, then the image's pip installs the archive's lock into its
  site-packages with `--no-index --find-links <the archive's wheels> --require-hashes --no-deps`: only the
  archive's files, each checked against the lock's hash, no package index reached. `--target`: Debian's and
  Ubuntu's system pip refuses other installs outside a virtualenv (PEP 668, externally managed), and a
  virtualenv made --without-pip has no pip of its own (Ubuntu ships ensurepip apart, in python3-venv).

The agent then runs as `ENV/bin/python -m vm_agent` with PYTHONDONTWRITEBYTECODE set, so nothing but this
module writes under ENV. Standard library only: it runs before the libraries are there. Exit 78 (a
configuration error: systemd does not restart the unit) when the wheelhouse cannot be installed here.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from vm_agent.archives import sha256_file, unpack

STAMP = "tpu-platform-wheelhouse"  # in ENV: the archive's sha256, written last
EXIT_CONFIG = 78


class AgentEnvironmentError(Exception):
    pass


def site_packages(env: Path) -> Path:
    """The virtualenv's site-packages for this interpreter: lib/pythonX.Y/site-packages on Linux (the venv
    module's layout; not sysconfig's default scheme, which Debian points at /usr/local/.../dist-packages)."""
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _recorded(site: Path) -> dict[Path, str]:
    """Every file the RECORDs under `site` list -> its `sha256=<urlsafe b64>` ("" for the RECORD itself).
    pip's --target moves scripts from `../../bin/X` (relative to its staging site-packages) to `bin/X`."""
    listed: dict[Path, str] = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        with open(record, newline="") as handle:
            for row in csv.reader(handle):
                if not row:
                    continue
                name, digest = row[0], row[1] if len(row) > 1 else ""
                path = site / "bin" / Path(name).name if name.startswith("../") else site / name
                listed[Path(os.path.normpath(path))] = digest
    return listed


def problems(env: Path, sha256: str) -> list[str]:
    """Why ENV is not the whole install of the archive `sha256` for this Python; [] when it is."""
    stamp = env / STAMP
    if not stamp.is_file():
        return [f"{env} holds no finished install"]
    if stamp.read_text().strip() != sha256:
        return [f"{env} was installed from another wheelhouse"]
    found: list[str] = []
    python = env / "bin" / "python"
    if not python.exists() or python.resolve() != Path(sys.executable).resolve():
        found.append(f"{python} is not {sys.executable}")
    site = site_packages(env)
    listed = _recorded(site)
    on_disk = {Path(os.path.normpath(path)) for path in site.rglob("*") if path.is_file() or path.is_symlink()}
    for path in sorted(on_disk - set(listed)):
        found.append(f"{path} is no installed file")
    for path, digest in sorted(listed.items()):
        if not digest:
            continue  # the RECORD itself
        if path not in on_disk:
            found.append(f"{path} is missing")
            continue
        algorithm, _, expected = digest.partition("=")
        with open(path, "rb") as handle:
            actual = base64.urlsafe_b64encode(hashlib.new(algorithm, handle.read()).digest()).rstrip(b"=").decode()
        if actual != expected:
            found.append(f"{path} does not match its RECORD")
    return found


def install(archive: Path, env: Path, sha256: str) -> None:
    """ENV made afresh from the archive (see the module's docstring); AgentEnvironmentError when pip refuses."""
    if sha256_file(archive) != sha256:
        raise AgentEnvironmentError(f"{archive} does not match {sha256}")
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=env.parent) as staging:
        unpacked = Path(staging)
        try:
            unpack(archive, unpacked)
        except (tarfile.TarError, ValueError) as error:
            raise AgentEnvironmentError(f"{archive}: {error}") from None
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
        only_the_archive = ["--no-index", "--find-links", str(unpacked / "wheels"), "--require-hashes", "--no-deps"]
        into = ["--target", str(site_packages(env)), "-r", str(unpacked / "requirements.lock")]
        steps = [[sys.executable, "-m", "venv", "--without-pip", str(env)], [*pip, *only_the_archive, *into]]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, env=_clean_environ())
            if done.returncode:
                raise AgentEnvironmentError(f"{' '.join(argv[:4])} failed: {done.stderr.strip()[-1500:]}")
    (env / STAMP).write_text(sha256 + "\n")


def _clean_environ() -> dict[str, str]:
    """The environment pip runs in: no PIP_* of the machine's (an index, extra links) and no PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}


def ensure(archive: Path, env: Path, sha256: str, log: list[str] | None = None) -> bool:
    """ENV whole for the archive: kept when it is (False), installed afresh when not (True)."""
    log = [] if log is None else log
    found = problems(env, sha256)
    if not found:
        log.append(f"agent environment {env} verified")
        return False
    log.append(f"agent environment {env}: {found[0]}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""))
    install(archive, env, sha256)
    left = problems(env, sha256)
    if left:
        raise AgentEnvironmentError(f"the install does not verify: {left[0]}")
    log.append(f"agent environment {env} installed from {archive.name}")
    return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m vm_agent.environment ARCHIVE ENV SHA256", file=sys.stderr)
        return 2
    archive, env, sha256 = Path(args[0]), Path(args[1]), args[2]
    lines: list[str] = []
    try:
        ensure(archive, env, sha256, lines)
    except AgentEnvironmentError as error:
        for line in lines:
            print(f"tpu-platform: {line}")
        print(f"tpu-platform: FATAL: the agent's environment: {error}", file=sys.stderr)
        return EXIT_CONFIG
    for line in lines:
        print(f"tpu-platform: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
