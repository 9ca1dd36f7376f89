"""vm_agent/run_requests.py, the agent's RequestSource, against the real GCS emulator.

The agent's calls go through a loopback proxy that checks each one against Google's storage.v1
discovery document and keeps its method id and Authorization header, then forwards it to the
emulator. What it refuses is recorded as a failed run state with the reason, never raised.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import requests

import vm_agent.gcs
from run_contract.request import RunPlaces, parse_request
from run_contract.spec import Allowed, FolderSource, RunSpec, SpecError, StopRequest
from tests.sandbox import storage_emulator
from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server, sandbox_credentials
from vm_agent.gcs import Storage
from vm_agent.run_requests import RequestSource
from vm_agent.settings import Settings

STATUS = "acme-status"
ARTIFACTS = "acme-artifacts"
REGISTRY = "us-central1-docker.pkg.dev/acme-research/runs"  # a project id has 6 to 30 characters
VM = "shared"
SHA = "a" * 64
ALICE = "user:alice@acme.example"
OWNER = "user-alice@acme.example"  # her folders' name (vm_agent/sources.py member_key, infra/naming.py)
RUN = f"{OWNER}/exp-1"  # her run exp-1, as the agent knows it
SPEC = {
    "runId": "exp-1",
    "source": {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{SHA}.tar.gz", "sha256": SHA},
    "command": ["python", "train.py"],
    "requester": "user:alice@acme.example",
}


@dataclass
class Seen:
    methods: list[str] = field(default_factory=list)
    authorization: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)


class _Proxy(Handler):
    target: ClassVar[str]
    seen: ClassVar[Seen]

    def _forward(self) -> None:
        body = self.body()
        try:
            self.seen.methods.append(
                api("storage.v1")
                .check(Call(self.command, self.path, body or None, self.headers.get("Content-Type", "")))
                .id
            )
        except ContractError as error:
            self.seen.violations.append(str(error))
        self.seen.authorization.add(self.headers.get("Authorization", ""))
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type",)}
        answer = requests.request(self.command, self.target + self.path, data=body or None, headers=headers, timeout=10)
        self.answer(answer.status_code, answer.content)

    do_GET = do_POST = do_DELETE = _forward  # noqa: N815 - http.server's names


@contextlib.contextmanager
def checking_proxy(target: str) -> Iterator[tuple[str, Seen]]:
    seen = Seen()
    with serve(_Proxy, target=target, seen=seen) as url:
        yield url, seen


class Bucket:
    def __init__(self, storage: str):
        self.storage = storage

    def put(self, name: str, data: Any) -> None:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        url = f"{self.storage}/upload/storage/v1/b/{STATUS}/o"
        headers = {"Content-Type": "application/octet-stream"}
        params = {"uploadType": "media", "name": name}
        requests.post(url, params=params, data=raw, headers=headers, timeout=10).raise_for_status()

    def names(self, prefix: str = "") -> list[str]:
        answer = requests.get(f"{self.storage}/storage/v1/b/{STATUS}/o", params={"prefix": prefix}, timeout=10)
        return sorted(i["name"] for i in answer.json().get("items", []))

    def state(self, run_id: str) -> dict[str, Any]:
        name = requests.utils.quote(f"{VM}/runs/{run_id}/status.json", safe="")  # type: ignore[attr-defined]
        return requests.get(
            f"{self.storage}/storage/v1/b/{STATUS}/o/{name}", params={"alt": "media"}, timeout=10
        ).json()


@dataclass
class Agent:
    bucket: Bucket
    seen: Seen
    env: dict[str, str]

    def source(self, **overrides: str) -> RequestSource:
        env = {**self.env, **overrides}
        return RequestSource.from_settings(Settings.from_environ(env), env, credentials=sandbox_credentials())


@pytest.fixture
def agent() -> Iterator[Agent]:
    with storage_emulator() as storage, checking_proxy(storage) as (proxy, seen), metadata_server({}) as metadata:
        requests.post(
            f"{storage}/storage/v1/b", params={"project": "acme"}, json={"name": STATUS}, timeout=10
        ).raise_for_status()
        yield Agent(
            Bucket(storage),
            seen,
            {
                "TPU_PLATFORM_STATUS_DIR": f"gs://{STATUS}/{VM}",
                "TPU_PLATFORM_ARTIFACTS": f"gs://{ARTIFACTS}",
                "TPU_PLATFORM_REGISTRY": REGISTRY,
                "TPU_PLATFORM_SELF_SERVICE": "1",
                "STORAGE_EMULATOR_HOST": proxy,
                "GCE_METADATA_HOST": metadata,
                "TPU_PLATFORM_STACK": "dev",
                "TPU_PLATFORM_VM": VM,
                "TPU_PLATFORM_WORKLOAD": "mnist",
            },
        )


def request(name: str = "20261130T040000Z-exp-1.json", owner: str = OWNER) -> str:
    return f"{VM}/requests/{owner}/{name}"


def test_requests_are_taken_in_name_order_each_once(agent: Agent):
    agent.bucket.put(request("20261130T040500Z-exp-2.json"), {**SPEC, "runId": "exp-2"})
    agent.bucket.put(request(), SPEC)
    agent.bucket.put(request("20261130T041000Z-stop-exp-1.json"), {"stop": "exp-1"})
    source = agent.source()
    assert [getattr(source.next(0), "run_id", None) for _ in range(4)] == [RUN, f"{OWNER}/exp-2", RUN, None]
    assert agent.bucket.names(f"{VM}/requests/") == []
    assert agent.bucket.state(RUN)["state"] == "queued"
    assert agent.bucket.state(f"{OWNER}/exp-2")["request"] == request("20261130T040500Z-exp-2.json")
    # The calls are the storage.v1 methods the VM's grant allows, with the VM account's token.
    assert agent.seen.violations == []
    assert set(agent.seen.methods) == {
        "storage.objects.list",
        "storage.objects.get",
        "storage.objects.insert",
        "storage.objects.delete",
    }
    assert agent.seen.authorization == {f"Bearer {SANDBOX_TOKEN}"}


def test_a_stop_request_is_a_stop(agent: Agent):
    agent.bucket.put(request("20261130T041000Z-stop-exp-1.json"), {"stop": "exp-1"})
    assert agent.source().next(0) == StopRequest(RUN)


def test_a_stop_names_a_run_of_the_member_whose_folder_it_is_in_only(agent: Agent):
    """Bob's stop of `exp-1` is a stop of Bob's exp-1: the agent compares run ids, so it can never stop
    Alice's (IAM lets Bob write only under his own folder: infra/researchers.py)."""
    agent.bucket.put(request(), SPEC)
    agent.bucket.put(request("20261130T041000Z-stop-exp-1.json", owner="user-bob@acme.example"), {"stop": "exp-1"})
    source = agent.source()
    assert getattr(source.next(0), "run_id", None) == RUN
    assert source.next(0) == StopRequest("user-bob@acme.example/exp-1") != StopRequest(RUN)


def test_two_researchers_may_use_one_run_id_and_get_two_runs_with_their_own_places(agent: Agent):
    agent.bucket.put(request(), SPEC)
    bob = {**SPEC, "requester": "user:bob@acme.example"}
    agent.bucket.put(request(owner="user-bob@acme.example"), bob)
    source = agent.source(TPU_PLATFORM_CHECKPOINTS="gs://cc")
    first, second = source.next(0), source.next(0)
    assert isinstance(first, RunSpec) and isinstance(second, RunSpec)
    assert (first.run_id, second.run_id) == (RUN, "user-bob@acme.example/exp-1")
    assert first.checkpoint_dir == f"gs://cc/mnist/{VM}/{OWNER}/exp-1" != second.checkpoint_dir
    assert agent.bucket.state("user-bob@acme.example/exp-1")["state"] == "queued"


def test_a_request_that_says_another_requester_than_its_folders_is_refused(agent: Agent):
    record = refused(agent, {**SPEC, "requester": "user:mallory@acme.example"})
    assert "the request is in the folder of user:alice@acme.example" in record["reason"]


def test_a_request_in_no_members_folder_is_refused(agent: Agent):
    agent.bucket.put(f"{VM}/requests/20261130T040000Z-exp-1.json", SPEC)  # the layout before folders per member
    assert agent.source().next(0) is None
    assert "<member>/<UTC yyyymmddThhmmssZ>" in agent.bucket.state("refused-20261130t040000z-exp-1")["reason"]


def test_a_request_taken_before_a_restart_is_not_replayed(agent: Agent):
    agent.bucket.put(request(), SPEC)
    # The agent created the run's state and died before deleting the request.
    agent.bucket.put(f"{VM}/runs/{RUN}/status.json", {"runId": RUN, "state": "running", "request": request()})
    assert agent.source().next(0) is None
    assert agent.bucket.names(f"{VM}/requests/") == []
    assert agent.bucket.state(RUN)["state"] == "running"  # untouched


def refused(agent: Agent, data: Any, name: str = "20261130T040000Z-exp-1.json", **env: str) -> dict[str, Any]:
    agent.bucket.put(request(name), data)
    assert agent.source(**env).next(0) is None  # refused: nothing to run, no exception
    assert agent.bucket.names(f"{VM}/requests/") == []
    (state,) = [n for n in agent.bucket.names(f"{VM}/runs/") if n.endswith("status.json")]
    record = agent.bucket.state(state[len(f"{VM}/runs/") : -len("/status.json")])
    assert record["state"] == "failed" and record["request"] == request(name)
    return record


def test_a_vm_that_does_not_allow_self_service_refuses_every_request(agent: Agent):
    record = refused(agent, SPEC, TPU_PLATFORM_SELF_SERVICE="0")
    assert record["runId"] == RUN
    assert "TPU VM shared does not take self-service runs" in record["reason"]


def test_a_source_told_why_refuses_every_request_with_that_reason(agent: Agent):
    source = agent.source()
    source.refusal = "TPU VM shared is a slice of 4 hosts: self-service runs are single-host only for now"
    agent.bucket.put(request(), SPEC)
    assert source.next(0) is None and source.unfinished() == []
    assert agent.bucket.state(RUN)["reason"] == source.refusal


def test_a_state_that_is_not_a_json_object_is_neither_resumed_nor_a_crash(agent: Agent):
    # Only the agent writes runs/ (researchers' grant covers requests/ only), but a damaged object
    # there must not stop it from taking requests or resuming the runs it can read.
    # (Runs other than the request's: a request for a run id whose state exists is refused as used before,
    # since the state is created only if absent, ifGenerationMatch=0, which the sandbox's emulator now honours.)
    agent.bucket.put(f"{VM}/runs/{OWNER}/exp-8/status.json", [1, 2])
    agent.bucket.put(f"{VM}/runs/{OWNER}/exp-9/status.json", b"not json")
    agent.bucket.put(request(), SPEC)
    source = agent.source()
    assert source.unfinished() == []
    assert getattr(source.next(0), "run_id", None) == RUN


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (
            {**SPEC, "source": {"kind": "folder", "uri": f"gs://elsewhere/sources/{SHA}.tar.gz", "sha256": SHA}},
            "must be under the stack's artifacts bucket gs://acme-artifacts/",
        ),
        (
            {**SPEC, "source": {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{'b' * 64}.tar.gz", "sha256": SHA}},
            f"must be the stack's artifacts bucket object gs://{ARTIFACTS}/sources/{SHA}.tar.gz",
        ),
        (
            {**SPEC, "source": {"kind": "image", "image": f"docker.io/library/x@sha256:{SHA}"}},
            "must be in the stack's repository",
        ),
        ({**SPEC, "source": {"kind": "image", "image": f"{REGISTRY}/x:latest"}}, "by digest only"),
        # A tag the stack's own run may use where the stack allows it: never in a request.
        ({**SPEC, "source": {"kind": "image", "image": f"{REGISTRY}/x:latest", "allowTag": True}}, "pinned by digest"),
        ({**SPEC, "runId": "exp-9"}, "is not the one in the request's name"),
        ({**SPEC, "requester": "stack"}, "a researcher's user:EMAIL"),
        ({**SPEC, "command": []}, "a folder source needs a command"),
        ({**SPEC, "runId": "Exp_1"}, "1-32 lowercase letters"),
        ({**SPEC, "env": {"TPU_PLATFORM_MODEL_DIR": "gs://x"}}, "run contract's"),
        ({**SPEC, "completion": True}, "unknown fields ['completion']"),
        ({**SPEC, "modelDir": "gs://elsewhere/x"}, "unknown fields ['modelDir']"),
        (
            {**SPEC, "source": {"kind": "image", "image": f"{REGISTRY}/x@sha256:{SHA}"}, "python": "3.11"},
            "only a folder source runs in a virtualenv",
        ),
    ],
)
def test_a_request_the_agent_may_not_run_is_refused_and_recorded(agent: Agent, data, why):
    assert why in refused(agent, data)["reason"]


def test_malformed_requests_are_recorded_under_their_request_name(agent: Agent):
    assert refused(agent, b"{not json")["reason"] == "not JSON"
    assert agent.bucket.names(f"{VM}/runs/") == [f"{VM}/runs/{OWNER}/refused-20261130t040000z-exp-1/status.json"]


def test_an_object_not_named_as_a_request_for_this_vm_is_refused(agent: Agent):
    assert "not a request for VM shared" in refused(agent, SPEC, name="other-vm/x.json")["reason"]


def test_a_run_id_used_before_is_refused_without_touching_that_run(agent: Agent):
    agent.bucket.put(f"{VM}/runs/{RUN}/status.json", {"runId": RUN, "state": "finished", "request": "older"})
    agent.bucket.put(request(), SPEC)
    assert agent.source().next(0) is None
    assert agent.bucket.state(RUN)["state"] == "finished"
    assert "was used before" in agent.bucket.state(f"{OWNER}/refused-20261130t040000z-exp-1")["reason"]


def test_an_unreachable_bucket_is_logged_and_retried_not_raised(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(vm_agent.gcs, "RETRY_SECONDS", 1.0)  # the library's retries, over at once
    lines: list[str] = []
    storage = Storage(environ={"STORAGE_EMULATOR_HOST": "127.0.0.1:9"})  # nothing listens there
    source = RequestSource(
        f"gs://{STATUS}/{VM}", f"gs://{ARTIFACTS}", REGISTRY, self_service=True, storage=storage, log=lines.append
    )
    assert source.next(0) is None
    assert lines and "listing shared/requests/ failed" in lines[0]


# One run spec: a request is parsed by vm_agent/sources.py's parser into its RunSpec, with the places the
# platform gives it: the requester's own, inside the VM's prefix (infra/naming.py member_objects_prefix).
def test_a_request_is_the_shared_run_spec_with_the_platforms_places():
    places = RunPlaces(f"gs://{STATUS}-ckpt", f"gs://{STATUS}-models", "mnist", VM)
    allowed = Allowed(f"gs://{ARTIFACTS}", REGISTRY)
    spec = parse_request({**SPEC, "env": {"K": "v"}, "python": "3.11"}, "x", allowed, places, ALICE)
    assert isinstance(spec, RunSpec) and spec.source == FolderSource(SPEC["source"]["uri"], SHA)
    assert (spec.run_id, spec.command, spec.python) == (RUN, ("python", "train.py"), "3.11")
    assert spec.env == (("K", "v"),)
    assert spec.model_dir == f"gs://{STATUS}-models/mnist/{VM}/{OWNER}/exp-1"
    assert spec.checkpoint_dir == f"gs://{STATUS}-ckpt/mnist/{VM}/{OWNER}/exp-1"
    assert spec.completion is False and spec.data == ""
    # Every problem at once, as the stack's run spec.
    with pytest.raises(SpecError) as error:
        parse_request(
            {**SPEC, "runId": "X", "env": {"TPU_PLATFORM_RUN_ID": "y"}, "extra": 1}, "x", allowed, places, ALICE
        )
    assert len(error.value.problems) == 3


def test_a_request_named_like_the_stack_runs_default_never_gets_the_stack_runs_folders():
    """The stack's run of a VM keeps its files in `<workload>/<vm>/<run>/` (infra/tpu/metadata.py run_prefix,
    default run `r1`); a researcher's run `r1` gets `<workload>/<vm>/<member>/r1/`: a member key holds '@',
    a stack run id never does, so no request resumes from or overwrites the stack run's checkpoints."""
    places = RunPlaces("gs://cc", "gs://mm", "mnist", VM)
    spec = parse_request({**SPEC, "runId": "r1"}, "x", Allowed(f"gs://{ARTIFACTS}", REGISTRY), places, ALICE)
    stack_run = f"gs://cc/mnist/{VM}/r1"
    assert spec.checkpoint_dir == f"gs://cc/mnist/{VM}/{OWNER}/r1"
    assert not spec.checkpoint_dir.startswith(stack_run) and not stack_run.startswith(spec.checkpoint_dir)


def test_a_member_key_names_its_member_back_and_each_member_its_own_folders_and_log():
    """The platform's grants name a researcher's folders by run_contract.paths.member_key, and the agent reads
    who asked from a request's folder with member_of_key: one inverts the other, and no two members share a
    key or a log. (The agent and the program both import run_contract, so there is no second copy to compare.)"""
    from run_contract import paths

    members = (ALICE, "group:ml-researchers@acme.example", "user:a.b+c@sub.acme.example")
    for member in members:
        assert paths.member_of_key(paths.member_key(member)) == member
    assert len({paths.member_key(m) for m in members}) == len({paths.researcher_log(m) for m in members}) == 3


def test_a_taken_request_keeps_its_name_in_the_spec_and_its_dirs_from_agent_env(agent: Agent):
    agent.bucket.put(request(), SPEC)
    spec = agent.source(
        TPU_PLATFORM_MODELS="gs://mm", TPU_PLATFORM_CHECKPOINTS="gs://cc", TPU_PLATFORM_WORKLOAD="mnist"
    ).next(0)
    assert isinstance(spec, RunSpec) and spec.request == request()
    assert (spec.model_dir, spec.checkpoint_dir) == (f"gs://mm/mnist/{VM}/{RUN}", f"gs://cc/mnist/{VM}/{RUN}")
