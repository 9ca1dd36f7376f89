"""The VM agent's wheelhouse (tools/agent_wheelhouse.py): built from a hashed lock, the same bytes wherever it
is built, holding only what the lock pins, and installable by pip with no index and every hash checked."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.vm_agent_support import build_wheel
from tools import agent_wheelhouse
from tools.agent_wheelhouse import WheelhouseError, lock_hashes, pack
from vm_agent.installs import pins

ROOT = Path(__file__).resolve().parents[1]


def local_lock(tmp_path: Path) -> tuple[Path, Path]:
    """A folder with one wheel (tinyckpt 0.1, pure Python) and a lock pinning it by its hash."""
    found = tmp_path / "index"
    wheel = build_wheel(found)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = tmp_path / "requirements-agent.lock"
    lock.write_text(f"tinyckpt==0.1 \\\n    --hash=sha256:{digest}\n    # via -r requirements-agent.txt\n")
    return lock, found


def build_from(lock: Path, found: Path, out: Path) -> tuple[agent_wheelhouse.Wheelhouse, Path]:
    # No index: the wheel comes from the folder, as the lock's files come from the package index.
    return agent_wheelhouse.build(lock, ("3.10", "3.12"), out, extra=("--no-index", "--find-links", str(found)))


def test_the_same_lock_builds_the_same_archive_named_by_its_digest(tmp_path):
    lock, found = local_lock(tmp_path)
    first, path = build_from(lock, found, tmp_path / "one")
    second, again = build_from(lock, found, tmp_path / "two")
    assert first.archive.sha256 == second.archive.sha256
    assert path.name == f"{first.archive.sha256}.tar.gz" == again.name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == first.archive.sha256
    with tarfile.open(path) as tar:
        names = sorted(member.name for member in tar.getmembers() if member.isfile())
    assert names == ["requirements.lock", "wheels/tinyckpt-0.1-py3-none-any.whl"]


def test_pip_installs_it_with_no_index_and_every_hash_checked(tmp_path):
    lock, found = local_lock(tmp_path)
    _, path = build_from(lock, found, tmp_path / "out")
    unpacked = tmp_path / "unpacked"
    with tarfile.open(path) as tar:
        tar.extractall(unpacked)

    def install(target: Path) -> subprocess.CompletedProcess[str]:
        # pip as the boot runs it; into a folder of its own (--target), which a PEP 668 system Python allows.
        argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index"]
        argv += ["--find-links", str(unpacked / "wheels"), "--require-hashes", "--no-deps", "--target", str(target)]
        argv += ["-r", str(unpacked / "requirements.lock")]
        return subprocess.run(argv, capture_output=True, text=True)

    assert install(tmp_path / "env").returncode == 0
    assert (tmp_path / "env" / "tinyckpt" / "__init__.py").is_file()
    # A wheel whose bytes are not the lock's is refused by pip itself.
    wheel = unpacked / "wheels" / "tinyckpt-0.1-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    refused = install(tmp_path / "env2")
    assert refused.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in refused.stderr


def test_a_wheel_the_lock_does_not_pin_is_refused(tmp_path):
    lock, _found = local_lock(tmp_path)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "tinyckpt-0.1-py3-none-any.whl").write_bytes(b"not the locked bytes")
    with pytest.raises(WheelhouseError, match=r"tinyckpt-0.1-py3-none-any.whl \(sha256 [0-9a-f]{64}\) is not a wheel"):
        pack(lock, stray)


def test_a_requirement_without_a_hash_is_refused():
    with pytest.raises(WheelhouseError, match=r"'requests==2\.34\.2' has no --hash"):
        lock_hashes("requests==2.34.2\n")


def test_the_agent_lock_pins_every_package_by_hash_and_the_tests_client_version():
    text = (ROOT / "requirements-agent.lock").read_text()
    assert len(lock_hashes(text)) > 0  # raises for any requirement without its hashes
    # The sandbox's tests drive the emulator with the very client version the agent's environment pins.
    dev = pins((ROOT / "requirements-dev.txt").read_text())
    assert pins(text)["google-cloud-storage"] == dev["google-cloud-storage"]
    direct = pins((ROOT / "requirements-agent.txt").read_text())
    assert all(pins(text)[name] == version for name, version in direct.items())


def test_a_lock_whose_wheels_cannot_be_had_writes_no_archive(tmp_path):
    lock = tmp_path / "requirements-agent.lock"
    lock.write_text("tinyckpt==0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(WheelhouseError, match=r"the lock's wheels for Python 3\.10"):
        agent_wheelhouse.build(lock, ("3.10",), tmp_path / "out", extra=("--no-index", "--find-links", str(empty)))
    assert not (tmp_path / "out").exists()


def test_the_pinned_wheelhouse_is_what_the_lock_builds_for_every_python_the_catalog_serves():
    """requirements-agent.wheelhouse, which the plan reads, names the archive `make agent-wheelhouse` built
    from this lock (make test builds it first): its digest, the lock inside it, and a wheel of each compiled
    package for each of the catalog's agent Pythons."""
    from infra.catalog import load_catalog
    from infra.packaging import agent_wheelhouse as pinned
    from tests.sandbox import agent_wheelhouse_file

    path = agent_wheelhouse_file()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pinned().sha256
    with tarfile.open(path) as tar:
        lock = tar.extractfile("requirements.lock")
        assert lock is not None and lock.read() == (ROOT / "requirements-agent.lock").read_bytes()
        wheels = [Path(m.name).name for m in tar.getmembers() if m.name.startswith("wheels/")]
    for python in load_catalog().agent_pythons:
        tag = "cp" + python.replace(".", "")
        assert any(w.startswith("google_crc32c-") and f"-{tag}-{tag}-" in w for w in wheels), python
    assert load_catalog().agent_pythons == agent_wheelhouse.PYTHONS  # the tool builds what the catalog serves


@pytest.mark.parametrize("write_pin", [False, True])
def test_a_build_that_differs_from_the_reviewed_pin_fails_unless_asked_to_write_it(
    tmp_path, monkeypatch, capsys, write_pin
):
    """A deploy runs `make agent-wheelhouse` and uploads what it built: a digest other than the one the PR
    showed must stop it, not quietly become the new pin."""
    import infra.packaging

    pin = tmp_path / "requirements-agent.wheelhouse"
    reviewed = "a" * 64
    monkeypatch.setattr(infra.packaging, "WHEELHOUSE_PIN", pin)
    infra.packaging.write_wheelhouse_pin(reviewed)
    built = tmp_path / ("b" * 64 + ".tar.gz")
    built.write_bytes(b"archive")
    house = agent_wheelhouse.Wheelhouse(infra.packaging.Package(data=b"archive", sha256="b" * 64, files=1), ())
    monkeypatch.setattr(agent_wheelhouse, "build", lambda *args: (house, built))
    code = agent_wheelhouse.main(["--write-pin"] if write_pin else [])
    if write_pin:
        assert code == 0 and infra.packaging.pinned_sha256() == "b" * 64
    else:
        assert code == 1 and infra.packaging.pinned_sha256() == reviewed and not built.exists()
        assert f"built sha256 {'b' * 64}, but requirements-agent.wheelhouse pins {reviewed}" in capsys.readouterr().err
