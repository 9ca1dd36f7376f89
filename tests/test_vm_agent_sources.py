"""vm_agent/sources.py: the run spec's strict parse, and the metadata source against a loopback
metadata server that waits for changes as Compute Engine's does."""

from __future__ import annotations

import email
import email.message
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar, cast
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from run_contract.spec import Allowed, FolderSource, ImageSource, SpecError, StopRequest, parse_run_spec
from tests.support import Writes
from tests.vm_agent_support import ARTIFACTS, REGISTRY
from tools.standins.loopback import Handler, serve
from tools.standins.metadata import metadata_server
from vm_agent.sources import MetadataSource

ALLOWED = Allowed(f"gs://{ARTIFACTS}", REGISTRY)
SHA = "a" * 64
FOLDER = {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{SHA}.tar.gz", "sha256": SHA}
IMAGE = {"kind": "image", "image": f"{REGISTRY}/trainer@sha256:{'b' * 64}"}


def spec(**changes: object) -> str:
    raw = {"runId": "dev/trainer/r1", "source": FOLDER, "command": ["python", "train.py"], "requester": "stack"}
    raw.update(changes)
    return json.dumps({k: v for k, v in raw.items() if v is not None})


def problems(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        parse_run_spec(text, ALLOWED)
    return str(caught.value)


def test_a_folder_spec_parses_with_every_field():
    parsed = parse_run_spec(
        spec(
            env={"STEPS": "3"},
            python="3.11",
            data=f"gs://{ARTIFACTS}-data/x",
            checkpointDir="gs://c/r1",
            modelDir="",
            completion=True,
        ),
        ALLOWED,
    )
    assert parsed.source == FolderSource(FOLDER["uri"], SHA)
    assert parsed.command == ("python", "train.py")
    assert parsed.env == (("STEPS", "3"),)
    assert (parsed.python, parsed.checkpoint_dir, parsed.completion) == ("3.11", "gs://c/r1", True)
    assert len(parsed.fingerprint) == 64
    assert parse_run_spec(spec(env={"STEPS": "4"}), ALLOWED).fingerprint != parsed.fingerprint


def test_an_image_spec_by_digest_parses_and_may_omit_the_command():
    parsed = parse_run_spec(spec(source=IMAGE, command=None), ALLOWED)
    assert parsed.source == ImageSource(IMAGE["image"])
    assert parsed.command == ()


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"source": {**FOLDER, "uri": f"gs://someone-elses-bucket/sources/{SHA}.tar.gz"}},
            f"must be under the stack's artifacts bucket gs://{ARTIFACTS}/",
        ),
        ({"source": {**FOLDER, "sha256": "abc"}}, "source.sha256 'abc': 64 lowercase hex digits"),
        (
            {"source": {**IMAGE, "image": "docker.io/library/python@sha256:" + "b" * 64}},
            f"must be in the stack's repository {REGISTRY}/",
        ),
        ({"source": {**IMAGE, "image": f"{REGISTRY}/trainer:latest"}}, "by digest only"),
        ({"source": {"kind": "zip"}}, "source 'zip'"),
        ({"runId": "../etc"}, "runId '../etc'"),
        ({"command": "python train.py"}, "command 'python train.py': a list of non-empty strings"),
        ({"command": []}, "a folder source needs a command"),
        ({"env": {"TPU_PLATFORM_RUN_ID": "x"}}, "TPU_PLATFORM_* is the run contract's"),
        ({"python": "3"}, "python '3'"),
        ({"source": IMAGE, "python": "3.11"}, "an image brings its own"),
        ({"checkpointDir": "/tmp/ckpt"}, "checkpointDir '/tmp/ckpt': a gs://bucket/path URL"),
        ({"requester": "alice"}, "requester 'alice'"),
        ({"requester": "user:alice@example.com", "completion": True}, "only the stack's own run ends in COMPLETE"),
        ({"epochs": 3}, "unknown keys ['epochs']"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_key_the_value_and_what_is_allowed(changes, says):
    assert says in problems(spec(**changes))


def test_every_problem_is_listed_at_once_with_the_run_id():
    with pytest.raises(SpecError) as caught:
        parse_run_spec(spec(command=[], requester="x", env={"A-B": "1"}), ALLOWED)
    assert len(caught.value.problems) == 3
    assert caught.value.run_id == "dev/trainer/r1"


def test_a_tag_only_where_the_stack_allows_it():
    parsed = parse_run_spec(spec(source={**IMAGE, "image": f"{REGISTRY}/trainer:v1", "allowTag": True}), ALLOWED)
    assert isinstance(parsed.source, ImageSource) and not parsed.source.by_digest


def test_a_vm_without_a_registry_refuses_images():
    with pytest.raises(SpecError, match="TPU_PLATFORM_REGISTRY is empty"):
        parse_run_spec(spec(source=IMAGE), Allowed(f"gs://{ARTIFACTS}", ""))


def test_not_json_is_refused_plainly():
    assert "not JSON" in problems("{runId: 1")
    assert "a JSON object, not list" in problems("[]")


def test_metadata_source_waits_for_a_change_and_returns_each_new_spec_once():
    with metadata_server({"tpu-platform-run": spec()}) as host:
        source = MetadataSource(host.url, ALLOWED)
        first = source.next(5)  # last_etag=NONE: answered at once
        assert first is not None and not isinstance(first, StopRequest) and first.run_id == "dev/trainer/r1"

        started = time.monotonic()
        assert source.next(1) is None  # held for timeout_sec, then the same value: nothing new
        assert time.monotonic() - started >= 0.9

        threading.Timer(0.5, host.set, args=("tpu-platform-run", spec(runId="dev/trainer/r2"))).start()
        started = time.monotonic()
        second = source.next(30)  # answered when the value changes, not after 30 s
        assert time.monotonic() - started < 10
        assert second is not None and not isinstance(second, StopRequest) and second.run_id == "dev/trainer/r2"

        host.set("tpu-platform-run", spec(runId="dev/trainer/r3", command="bad"))
        with pytest.raises(SpecError, match="command 'bad'"):
            source.next(5)
        assert source.next(1) is None  # a refused value is refused once, not in a loop

        host.delete("tpu-platform-run")
        assert source.next(1) == StopRequest("dev/trainer/r2")  # the run it last gave is no longer wanted


def test_metadata_requests_carry_the_flavor_header_and_the_wait_parameters():
    seen: list[str] = []

    def fetch(url: str, timeout: float) -> tuple[int, str, str]:
        seen.append(url)
        return 200, "etag-1", spec()

    source = MetadataSource("http://metadata.test/computeMetadata/v1", ALLOWED, fetch=fetch)
    source.next(7)
    source.next(7)
    assert seen[0].endswith("/instance/attributes/tpu-platform-run?wait_for_change=true&last_etag=NONE&timeout_sec=7")
    assert "last_etag=etag-1" in seen[1]


@pytest.mark.parametrize("package", ["vm_agent", "run_contract"])
def test_the_agent_needs_at_most_its_pythons_floor_and_the_run_contract_3_8(package):
    """The agent runs from its own environment, on the catalog's `agent_pythons` (the start-up script refuses any
    other before vm_agent.environment runs): its floor, 3.10, is what vm_agent may use, and what ruff and pyright
    hold it to. The run contract is also imported by programs (runlib), on whatever Python their image has: kept
    to 3.8. vermin reads every syntax form and standard-library use and names the oldest version that has them all."""
    import tomllib

    from infra.catalog import load_catalog

    root = Path(__file__).resolve().parents[1]
    floor = load_catalog().agent_python_floor if package == "vm_agent" else "3.8"
    done = subprocess.run(
        [str(root / ".venv" / "bin" / "vermin"), f"-t={floor}-", "--no-tips", "--violations", package],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pyright = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pyright"]["executionEnvironments"]
    assert {"root": package, "pythonVersion": floor, "extraPaths": ["."]} in pyright
    if package == "vm_agent":
        ruff = tomllib.loads((root / "vm_agent" / "ruff.toml").read_text())
        assert ruff["target-version"] == "py" + floor.replace(".", "")


VM_TOKEN = """
import sys
from vm_agent.gcs import Storage, fresh_token, metadata_url, vm_credentials

credentials = vm_credentials()
assert vm_credentials() is credentials  # one token source in the process
token, left = fresh_token(credentials)
assert fresh_token(credentials)[0] == token  # still valid: not asked again
print(token, 3000 < left <= 3599, metadata_url())
print(Storage().credentials is credentials, Storage().client.api_endpoint)
emulator = {"STORAGE_EMULATOR_HOST": sys.argv[1]}
print(Storage(environ=emulator).credentials)  # an emulator needs none
Storage(environ=emulator).create("status", "anonymous", b"1")
Storage(credentials, environ=emulator).create("status", "the-vms", b"1")
"""


def test_the_vm_accounts_token_comes_from_the_metadata_server_google_auth_finds():
    """One token source: google-auth's compute_engine credentials, which ask the metadata server at
    GCE_METADATA_HOST (read when google-auth is first imported, so a process of its own). Cloud Storage itself
    is asked with them; an emulator with none, unless given (a sandbox that checks the token)."""
    import os
    import sys

    from tools.standins.metadata import SANDBOX_TOKEN

    objects: dict[str, bytes] = {}
    root = Path(__file__).resolve().parents[1]
    with metadata_server({}) as host, serve(_CreateOnlyGcs, objects=objects) as url:
        _CreateOnlyGcs.authorizations = []
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root), "GCE_METADATA_HOST": host}
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", VM_TOKEN, url], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split("\n")[:3] == [
            f"{SANDBOX_TOKEN} True {host.url}",
            "True https://storage.googleapis.com",
            "None",
        ]
        asked = [path.partition("?")[0] for path in host.asked]
        assert asked.count("/computeMetadata/v1/instance/service-accounts/default/token") == 1  # google-auth keeps it
    assert _CreateOnlyGcs.authorizations == ["", f"Bearer {SANDBOX_TOKEN}"]


class _CreateOnlyGcs(Handler):
    """Objects by name, as Cloud Storage answers a create-only upload (412 when the name exists,
    https://cloud.google.com/storage/docs/request-preconditions) and a delete of a missing object (404)."""

    objects: ClassVar[dict[str, bytes]]
    authorizations: ClassVar[list[str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        query = parse_qs(urlsplit(self.path).query)
        self.authorizations.append(self.headers.get("Authorization", ""))
        # A multipart upload (the library's for a small object): its metadata part names it, then its bytes.
        body = b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + self.body()
        metadata, media = cast(list[email.message.Message], email.message_from_bytes(body).get_payload())
        name, data = json.loads(str(metadata.get_payload()))["name"], cast(bytes, media.get_payload(decode=True))
        if query.get("ifGenerationMatch") != ["0"]:
            self.answer(400, {"error": {"code": 400, "message": "a create without ifGenerationMatch=0"}})
        elif name in self.objects:
            self.answer(412, {"error": {"code": 412, "message": "conditionNotMet"}})
        else:
            self.objects[name] = data
            self.answer(200, {"name": name})

    def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
        name = unquote(urlsplit(self.path).path.rsplit("/o/", 1)[1])
        if self.objects.pop(name, None) is None:
            self.answer(404, {"error": {"code": 404, "message": "No such object"}})
        else:
            self.answer(204, b"")


def test_a_folder_creates_new_objects_only_and_deleting_a_gone_one_is_no_error(tmp_path: Path):
    from vm_agent.gcs import Folder, Storage

    objects: dict[str, bytes] = {}
    with serve(_CreateOnlyGcs, objects=objects) as url:
        remote = Folder("gs://status/vm", Storage(environ={"STORAGE_EMULATOR_HOST": url}))
        local = Folder(str(tmp_path / "status"))
        for folder in (remote, local):
            assert folder.create("runs/a/status.json", b"first") is True
            assert folder.create("runs/a/status.json", b"second") is False
        assert objects == {"vm/runs/a/status.json": b"first"} and local.read("runs/a/status.json") == b"first"
        for folder in (remote, local):
            folder.delete("runs/a/status.json")
            folder.delete("runs/a/status.json")  # gone already: no error
            assert folder.create("runs/a/status.json", b"third") is True
    assert objects == {"vm/runs/a/status.json": b"third"}
    assert (tmp_path / "status" / "runs/a/status.json").read_bytes() == b"third"


def test_each_agent_line_reaches_the_journal_in_one_write(monkeypatch):
    """The agent's log and the telemetry's warnings are written as the run contract's one-write lines
    (run_contract/lines.py): under `python -u` another thread's line could otherwise land between a line and its
    newline (a clean-clone run saw a telemetry warning inside an agent's JSON entry)."""
    from vm_agent import agent, telemetry

    out, err = Writes(), Writes()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    agent.log("run r stopped", run="r")
    shipper = telemetry.Telemetry({}, flush_every_s=3600, credentials=object())
    shipper._warn("Logging failed")  # its own default warning
    shipper.close(1)
    assert [json.loads(text) for text in out.writes] == [
        {"severity": "INFO", "message": "run r stopped", "component": "tpu-platform-agent", "run": "r"}
    ]
    assert err.writes == ["telemetry: Logging failed\n"]
