"""A folder source's fetch step on the GKE engine (infra/startup.py render_pod_fetch), the very script a team's
JobSet carries, run against the storage emulator and a metadata server on loopback: the runner and the folder's
archive are fetched as the pod's identity and unpacked only when each matches the digest the JobSet names;
a refusal ends the step with 78, which fails the run at once, and a read that may heal is retried in the step
and then ends it with 75, which the JobSet retries (tests/test_gke_jobsets.py)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import socket
import struct
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests

from infra.gke.jobsets import FETCH_CONTAINER, FolderRun, run_jobset
from infra.packaging import package
from infra.startup import Artifact
from infra.tpu.metadata import agent_package
from run_contract.spec import FolderSource, RunSpec
from tests import gke_objects as g
from tests.test_gke_jobsets import jobset_action
from tools.standins.loopback import Handler, serve
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server
from tools.standins.storage import storage_emulator

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "fixture-gke-gke-artifacts"
TRAINER = ROOT / "tests/agent_sources/trainer"


def put(storage: str, name: str, data: bytes) -> None:
    requests.post(
        f"{storage}/upload/storage/v1/b/{BUCKET}/o", params={"uploadType": "media", "name": name}, data=data, timeout=10
    ).raise_for_status()


def hostile_archive() -> bytes:
    """A well-formed archive whose member climbs out of the folder it is unpacked into."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        body = b"print('escaped')\n"
        member = tarfile.TarInfo("../escaped.py")
        member.size = len(body)
        tar.addfile(member, io.BytesIO(body))
    return raw.getvalue()


HOSTILE = hostile_archive()  # once: gzip stamps the time


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[str, str]]:
    """The artifacts bucket as `pulumi up` and `tpu-runs submit --team` leave it, and a metadata server; yields
    (STORAGE_EMULATOR_HOST, GCE_METADATA_HOST)."""
    with storage_emulator() as storage, metadata_server() as metadata:
        requests.post(f"{storage}/storage/v1/b", params={"project": "fixture-gke"}, json={"name": BUCKET}, timeout=10)
        runner = agent_package()
        put(storage, runner.object_name, runner.data)
        trainer = package(TRAINER)
        put(storage, f"teams/vision/sources/{trainer.sha256}.tar.gz", trainer.data)
        put(storage, "teams/vision/sources/tampered.tar.gz", trainer.data + b"\0")
        put(storage, "teams/vision/sources/hostile.tar.gz", HOSTILE)
        yield storage, str(metadata)


def folder_jobset(source: FolderSource) -> dict[str, Any]:
    """The JobSet of a run of this source."""
    runner = agent_package()
    spec = RunSpec(run_id="exp-1", source=source, command=("python3", "train.py"), requester="user:ada@example.com")
    folder = FolderRun(g.FOLDER_IMAGE, Artifact(BUCKET, runner.object_name, runner.sha256))
    return run_jobset(spec, g.VISION, g.V5E_16_SPOT, checkpoints="c", models="m", folder=folder)


def fetch_step(source: FolderSource) -> list[str]:
    """The fetch step's command, as the JobSet of a run of this source carries it."""
    jobset = folder_jobset(source)
    (step,) = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["initContainers"]
    assert step["name"] == FETCH_CONTAINER
    return step["command"]


def run(
    world: tuple[str, str],
    tmp_path: Path,
    source: FolderSource,
    python: str | None = sys.executable,
    path: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """The step with `python` as its Python; with None, the one its PATH names `python3`, as in a pod."""
    storage, metadata = world
    env = {
        "PATH": path or os.environ["PATH"],
        "TPU_PLATFORM_ROOT": str(tmp_path),
        **({"TPU_PLATFORM_PYTHON": python} if python else {}),
        "GCE_METADATA_HOST": metadata,
        "STORAGE_EMULATOR_HOST": storage,
    }
    return subprocess.run(fetch_step(source), env=env, capture_output=True, text=True, timeout=120)


def test_the_folder_is_unpacked_where_the_program_runs_once_both_archives_match(world, tmp_path):
    trainer = package(TRAINER)
    done = run(
        world, tmp_path, FolderSource(f"gs://{BUCKET}/teams/vision/sources/{trainer.sha256}.tar.gz", trainer.sha256)
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "source/train.py").read_bytes() == (TRAINER / "train.py").read_bytes()
    assert sorted(p.name for p in (tmp_path / "source").iterdir()) == sorted(p.name for p in TRAINER.iterdir())


def test_an_archive_that_does_not_match_its_digest_ends_the_step_with_78_and_nothing_unpacked(world, tmp_path):
    trainer = package(TRAINER)
    done = run(world, tmp_path, FolderSource(f"gs://{BUCKET}/teams/vision/sources/tampered.tar.gz", trainer.sha256))
    assert done.returncode == 78
    assert f"does not match its digest {trainer.sha256}" in done.stderr
    assert not (tmp_path / "source").exists()
    assert not list((tmp_path / "opt/tpu-platform/archives").glob(f"{trainer.sha256}*"))  # the bad bytes are gone


def test_an_archive_that_would_write_outside_the_folder_is_refused_by_the_runners_unpack(world, tmp_path):
    digest = hashlib.sha256(HOSTILE).hexdigest()
    done = run(world, tmp_path, FolderSource(f"gs://{BUCKET}/teams/vision/sources/hostile.tar.gz", digest))
    assert done.returncode == 78
    assert "would land outside the folder" in done.stderr
    assert not (tmp_path / "escaped.py").exists()


def test_the_step_reads_the_archives_as_the_pods_identity(world, tmp_path):
    """The token comes from the metadata server (the GKE metadata server's, for the team's Kubernetes account),
    and goes to Cloud Storage as a bearer token: no key in the pod."""
    trainer = package(TRAINER)
    script = fetch_step(FolderSource(f"gs://{BUCKET}/teams/vision/sources/{trainer.sha256}.tar.gz", trainer.sha256))[2]
    assert "instance/service-accounts/default/token" in script and "Authorization: Bearer" in script
    assert SANDBOX_TOKEN not in script


def test_the_step_runs_the_images_python3_and_never_a_python_command(world, tmp_path):
    """The folder image is Debian's python3 with no `python` command (docs/design-gke.md: google-cloud-cli's
    Dockerfile; in Debian only python-is-python3 ships /usr/bin/python). As in a pod, with no
    TPU_PLATFORM_PYTHON, the step runs `python3` from its PATH; a `python` ahead of it there is never run."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    ran = tmp_path / "python-ran"
    (tools / "python").write_text(f'#!/bin/sh\necho "$@" > {ran}\nexit 127\n')
    (tools / "python").chmod(0o755)
    trainer = package(TRAINER)
    source = FolderSource(f"gs://{BUCKET}/teams/vision/sources/{trainer.sha256}.tar.gz", trainer.sha256)
    done = run(world, tmp_path / "pod", source, python=None, path=f"{tools}{os.pathsep}{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert not ran.exists()
    assert (tmp_path / "pod/source/train.py").read_bytes() == (TRAINER / "train.py").read_bytes()


def test_an_image_whose_python_is_older_than_the_runners_floor_is_refused_with_78(world, tmp_path):
    """The runner's code (vm_agent) is held to the catalog's oldest agent Python; an older python3 in the folder
    image is named before the runner runs on it. The stand-in answers as Python 3.9 does."""
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\ncase "$1" in -V) echo "Python 3.9.18" ;; *) exit 1 ;; esac\n')  # version_info < floor
    old.chmod(0o755)
    trainer = package(TRAINER)
    source = FolderSource(f"gs://{BUCKET}/teams/vision/sources/{trainer.sha256}.tar.gz", trainer.sha256)
    done = run(world, tmp_path, source, python=str(old))
    assert done.returncode == 78
    assert "the runner needs Python 3.10+; the folder image has Python 3.9.18" in done.stderr
    assert not (tmp_path / "source").exists()


# --- Cloud Storage on a bad minute: what may heal is retried in the step, then left to the JobSet ------------


@dataclass
class Reads:
    """What a flaky Cloud Storage answered: each read's path, in order."""

    failures: int  # the first this many reads fail
    failure: int | str  # with this HTTP status, or "reset": the connection dropped before any answer
    paths: list[str] = field(default_factory=list)


class _Flaky(Handler):
    target: ClassVar[str]
    reads: ClassVar[Reads]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.reads.paths.append(self.path)
        if len(self.reads.paths) > self.reads.failures:
            answer = requests.get(self.target + self.path, timeout=10)
            self.answer(answer.status_code, answer.content)
        elif self.reads.failure == "reset":
            # SO_LINGER on, 0 s: close() sends a TCP reset, not a FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        else:
            status = int(self.reads.failure)
            self.answer(status, {"error": {"code": status, "message": "as Cloud Storage answers"}})


@contextlib.contextmanager
def flaky_storage(storage: str, reads: Reads) -> Iterator[str]:
    """`storage` behind a front whose first `reads.failures` reads fail; yields its STORAGE_EMULATOR_HOST."""
    with serve(_Flaky, target=storage, reads=reads) as flaky:
        yield flaky


def run_flaky(
    world: tuple[str, str], tmp_path: Path, reads: Reads, source: FolderSource
) -> subprocess.CompletedProcess[str]:
    storage, metadata = world
    with flaky_storage(storage, reads) as flaky:
        return run((flaky, metadata), tmp_path, source)


def trainer_source() -> FolderSource:
    trainer = package(TRAINER)
    return FolderSource(f"gs://{BUCKET}/teams/vision/sources/{trainer.sha256}.tar.gz", trainer.sha256)


@pytest.mark.parametrize("failure", [503, 429, "reset"])
def test_a_read_that_fails_for_a_moment_is_retried_within_the_step(world, tmp_path, failure):
    """Cloud Storage's transient answers (408, 429, 5xx, a dropped connection) are retried by the step itself:
    the runner's read fails twice, then both archives are read and the folder unpacked."""
    reads = Reads(failures=2, failure=failure)
    done = run_flaky(world, tmp_path, reads, trainer_source())
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "source/train.py").read_bytes() == (TRAINER / "train.py").read_bytes()
    runner, source = (f"/storage/v1/b/{BUCKET}/o/{name}" for name in ("runners%2F", "teams%2Fvision%2Fsources%2F"))
    assert [p.startswith(runner) for p in reads.paths] == [True, True, True, False]
    assert reads.paths[3].startswith(source)


@pytest.mark.slow  # curl's five waits, 1 + 2 + 4 + 8 + 16 s
def test_a_read_that_keeps_failing_ends_the_step_with_75_and_the_jobset_restarts_the_run(world, tmp_path):
    reads = Reads(failures=1_000, failure=503)
    source = trainer_source()
    done = run_flaky(world, tmp_path, reads, source)
    assert done.returncode == 75, done.stderr
    assert len(reads.paths) == 6  # one read and five retries: bounded
    assert "cannot read the runner gs://" in done.stderr and "(HTTP 503, curl exit 0)" in done.stderr
    assert not (tmp_path / "source").exists()
    assert jobset_action(done.returncode, container=FETCH_CONTAINER, jobset=folder_jobset(source)) == "RestartJobSet"


@pytest.mark.parametrize("status", [403, 404])
def test_an_answer_no_retry_mends_is_a_refusal_at_once(world, tmp_path, status):
    """403 (the pod's identity may not read it) and 404 (no such object) do not heal: read once, exit 78, and
    the run fails without spending its restarts."""
    reads = Reads(failures=1_000, failure=status)
    source = trainer_source()
    done = run_flaky(world, tmp_path, reads, source)
    assert done.returncode == 78, done.stderr
    assert len(reads.paths) == 1
    assert f"FATAL: cannot read the runner gs://{BUCKET}/runners/" in done.stderr
    assert f"(HTTP {status}, curl exit 0)" in done.stderr
    assert jobset_action(done.returncode, container=FETCH_CONTAINER, jobset=folder_jobset(source)) == "FailJobSet"
