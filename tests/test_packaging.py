"""Deterministic packaging: same files, same bytes; one changed byte, another hash."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import run_contract
from infra.config.examples import examples
from infra.config.workload_code import REPO_ROOT
from infra.packaging import PackagingError, package, repository_folder


def make_folder(root: Path) -> Path:
    """A placeholder source folder (an agent or a workload), with what checkouts leave behind."""
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "train.py").write_text("print('train')\n")
    (root / "pkg" / "__pycache__" / "train.cpython-311.pyc").write_bytes(os.urandom(16))
    (root / "stray.pyc").write_bytes(os.urandom(8))
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "requirements.txt").write_text("optax==0.2.8\n")
    (root / "run.sh").write_text("#!/bin/sh\nexec python -m pkg.train\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_the_same_folder_gives_the_same_bytes_twice(tmp_path):
    folder = make_folder(tmp_path / "a")
    assert package(folder).data == package(folder).data


def test_another_checkout_path_times_owner_and_umask_give_the_same_bytes(tmp_path):
    first = package(make_folder(tmp_path / "one"))
    other = make_folder(tmp_path / "elsewhere" / "deeper")
    for path in other.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
        if path.is_file() and path.name != "run.sh":
            path.chmod(0o600)  # a stricter umask in the other checkout
    (other / "pkg" / "__pycache__" / "other.pyc").write_bytes(b"different cache")
    assert package(other).data == first.data
    assert package(other).sha256 == first.sha256


def test_one_changed_byte_changes_the_hash(tmp_path):
    folder = make_folder(tmp_path / "a")
    before = package(folder).sha256
    (folder / "pkg" / "train.py").write_text("print('trbin')\n")
    assert package(folder).sha256 != before


def test_a_new_empty_file_or_a_lost_executable_bit_changes_the_hash(tmp_path):
    folder = make_folder(tmp_path / "a")
    before = package(folder).sha256
    (folder / "run.sh").chmod(0o644)
    assert package(folder).sha256 != before
    (folder / "run.sh").chmod(0o755)
    (folder / "empty.txt").write_text("")
    assert package(folder).sha256 != before


def test_members_are_sorted_normalised_and_without_caches(tmp_path):
    data = package(make_folder(tmp_path / "a")).data
    assert data[4:8] == b"\0\0\0\0"  # gzip MTIME field: 0
    assert not data[3] & 0x08  # gzip FLG.FNAME unset: no file name in the header
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == ["pkg", "pkg/__init__.py", "pkg/train.py", "requirements.txt", "run.sh"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.name: oct(m.mode) for m in members}["run.sh"] == "0o755"
    assert {m.name: oct(m.mode) for m in members}["pkg/train.py"] == "0o644"


def test_the_archive_unpacks_with_the_system_tar_to_the_same_files(tmp_path):
    folder = make_folder(tmp_path / "a")
    (tmp_path / "a.tar.gz").write_bytes(package(folder).data)
    (tmp_path / "out").mkdir()
    subprocess.run(["tar", "-xzf", str(tmp_path / "a.tar.gz"), "-C", str(tmp_path / "out")], check=True)
    assert (tmp_path / "out" / "pkg" / "train.py").read_text() == "print('train')\n"
    assert os.access(tmp_path / "out" / "run.sh", os.X_OK)
    assert not (tmp_path / "out" / ".git").exists()


def test_a_symbolic_link_is_refused(tmp_path):
    folder = make_folder(tmp_path / "a")
    os.symlink("/etc/passwd", folder / "passwd")
    with pytest.raises(PackagingError, match="passwd is a symbolic link"):
        package(folder)


def test_a_link_to_a_file_inside_the_repository_is_packaged_as_that_file(tmp_path):
    """How the examples share runlib.py (workloads/*/runlib.py -> ../lib/runlib.py) without copies."""
    repo = tmp_path / "repo"
    folder = make_folder(repo / "team" / "train")
    (repo / "lib").mkdir()
    (repo / "lib" / "helper.py").write_text("HELP = 1\n")
    os.symlink("../../lib/helper.py", folder / "helper.py")
    data = package(folder, within=repo).data
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        member = tar.getmember("helper.py")
        assert member.isfile() and tar.extractfile(member).read() == b"HELP = 1\n"  # pyright: ignore[reportOptionalMemberAccess]
    # The same bytes as a real copy of the file: a link is no part of what the VM gets.
    (folder / "helper.py").unlink()
    (folder / "helper.py").write_text("HELP = 1\n")
    assert package(folder, within=repo).data == data


def test_a_link_to_a_folder_inside_the_repository_is_packaged_as_that_folders_files(tmp_path):
    """How the examples carry the run contract's package (workloads/*/run_contract -> ../../run_contract)."""
    repo = tmp_path / "repo"
    folder = make_folder(repo / "team" / "train")
    (repo / "lib" / "shared").mkdir(parents=True)
    (repo / "lib" / "shared" / "__init__.py").write_text("NAME = 1\n")
    os.symlink("../../lib/shared", folder / "shared")
    data = package(folder, within=repo).data
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        assert tar.getmember("shared").isdir()
        assert tar.extractfile("shared/__init__.py").read() == b"NAME = 1\n"  # pyright: ignore[reportOptionalMemberAccess]
    (folder / "shared").unlink()
    shutil.copytree(repo / "lib" / "shared", folder / "shared")
    assert package(folder, within=repo).data == data  # the same bytes as a real copy


@pytest.mark.parametrize("target", ["../../secret.txt", "/etc/hostname", "..", "../../../repo"])
def test_a_link_leading_outside_the_repository_or_around_itself_is_refused(tmp_path, target):
    repo = tmp_path / "repo"
    folder = make_folder(repo / "team" / "train")
    (tmp_path / "secret.txt").write_text("not the repository's\n")
    (repo / "lib").mkdir()
    os.symlink(target, folder / "linked")
    with pytest.raises(PackagingError, match=r"linked is a symbolic link to .*, not to a file or folder inside"):
        package(folder, within=repo)
    # Without `within`, the folder itself is the limit: a link to a file of the repository beside it too.
    (repo / "lib" / "helper.py").write_text("")
    os.symlink("../../lib/helper.py", folder / "helper.py")
    with pytest.raises(PackagingError, match=r"helper\.py is a symbolic link"):
        package(folder)


def test_the_examples_share_runlib_and_the_run_contract_by_links_and_each_archive_holds_their_bytes():
    shared = (REPO_ROOT / "workloads" / "lib" / "runlib.py").read_bytes()
    for example in examples().values():
        assert (REPO_ROOT / example.folder / "runlib.py").is_symlink()
        assert (REPO_ROOT / example.folder / "run_contract").is_symlink()
        data = repository_folder(example.folder).data
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
            assert tar.extractfile("runlib.py").read() == shared  # pyright: ignore[reportOptionalMemberAccess]
            contract = {name: tar.extractfile(f"run_contract/{name}").read() for name in run_contract.files()}  # pyright: ignore[reportOptionalMemberAccess]
        assert contract == run_contract.files()


@pytest.mark.parametrize("name", sorted(examples()))
def test_each_example_folder_packages_the_same_from_a_copy(tmp_path, name):
    """CI packages a clean clone: a copy elsewhere (no caches, links kept as git checks them out) gives
    the checkout's bytes."""
    clone = tmp_path / "clone"
    for shared in ("workloads", "run_contract"):
        shutil.copytree(
            REPO_ROOT / shared, clone / shared, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    folder = examples()[name].folder
    copy = package(clone / folder, within=clone)
    assert copy.sha256 == repository_folder(folder).sha256
    assert copy.object_name == f"sources/{copy.sha256}.tar.gz"
