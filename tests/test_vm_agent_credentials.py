"""A run's downscoped token (vm_agent/credentials.py): the boundary google-auth builds and the exchange its STS
client makes, against the STS stand-in (tests/iam_standins.py), which checks every request against the sts.v1
discovery document and the downscoping page. The whole agent makes the same exchange in the sandbox and the
isolation world (tests/test_vm_agent_isolation.py); here each guarantee of the Downscoper on its own."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from google.auth import credentials as google_credentials
from google.auth import downscoped

from tests.iam_standins import StsStandIn, serve, sts_handler
from tests.vm_agent_support import REPO
from vm_agent.credentials import MAX_EXPRESSION, READ, BoundaryError, Downscoper, access_boundary, boundary, rule
from vm_agent.gcs import StorageError

RUN = "w/vm/run-a"
VM_TOKENS = frozenset(f"vm-token-{n}" for n in range(1, 10))


class VmCredentials(google_credentials.Credentials):
    """The VM account's credentials as google-auth keeps them (its `valid`, its refresh threshold): each refresh
    is a new token, `vm-token-N`, that ends `lifetime_s` later."""

    def __init__(self, lifetime_s: float):
        super().__init__()
        self.lifetime_s = lifetime_s
        self.refreshes = 0

    def refresh(self, request: Any) -> None:
        self.refreshes += 1
        self.token = f"vm-token-{self.refreshes}"
        now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        self.expiry = now + datetime.timedelta(seconds=self.lifetime_s)


@pytest.fixture
def sts() -> Iterator[tuple[StsStandIn, str]]:
    """The stand-in on loopback, and its token endpoint (the discovery document's path)."""
    stand_in = StsStandIn(VM_TOKENS)
    server, url = serve(sts_handler(stand_in))
    try:
        yield stand_in, f"{url}/v1/token"
    finally:
        server.shutdown()
        server.server_close()


def run_boundary() -> downscoped.CredentialAccessBoundary:
    within = boundary(f"gs://ckpt/{RUN}", f"gs://models/{RUN}", "gs://data/mnist/mnist.npz")
    assert within is not None
    return within


def condition(bucket: str, prefix: str, title: str) -> dict[str, str]:
    return {
        "title": title,
        "expression": f"resource.name.startsWith('projects/_/buckets/{bucket}/objects/{prefix}') || "
        f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('{prefix}')",
    }


def test_the_exchange_is_the_request_the_sts_api_takes(sts):
    """The form STS receives, field by field: the sts.v1 document's grant and token types, the VM's token as
    the subject, and `options` the page's boundary, URL-quoted JSON; nothing else."""
    stand_in, url = sts
    issued = Downscoper(run_boundary(), VmCredentials(3600), url).token()
    assert issued.token == "downscoped-1" and stand_in.violations == []
    (form,) = stand_in.forms
    options = json.loads(urllib.parse.unquote(form.pop("options")))
    assert form == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "subject_token": "vm-token-1",
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
    write, read = "inRole:roles/storage.objectAdmin", "inRole:roles/storage.objectViewer"
    assert options == {
        "accessBoundary": {
            "accessBoundaryRules": [
                {
                    "availableResource": "//storage.googleapis.com/projects/_/buckets/ckpt",
                    "availablePermissions": [write],
                    "availabilityCondition": condition("ckpt", f"{RUN}/", "this run's checkpoints"),
                },
                {
                    "availableResource": "//storage.googleapis.com/projects/_/buckets/models",
                    "availablePermissions": [write],
                    "availabilityCondition": condition("models", f"{RUN}/", "this run's model"),
                },
                {
                    "availableResource": "//storage.googleapis.com/projects/_/buckets/data",
                    "availablePermissions": [read],
                    "availabilityCondition": condition("data", "mnist/mnist.npz", "this run's data"),
                },
            ]
        }
    }
    assert stand_in.issued["downscoped-1"] == options["accessBoundary"]["accessBoundaryRules"]


def test_a_runs_boundary_is_built_once_and_what_was_checked_is_what_is_sent(sts, monkeypatch):
    """google-auth's CredentialAccessBoundary refuses what STS would (more than 10 rules): the one `boundary`
    builds before the run starts is the one whose JSON its token is exchanged under, not a second one."""
    built: list[downscoped.CredentialAccessBoundary] = []

    class Counted(downscoped.CredentialAccessBoundary):
        def __init__(self, rules: Any = ()) -> None:
            super().__init__(rules)
            built.append(self)

    monkeypatch.setattr(downscoped, "CredentialAccessBoundary", Counted)
    stand_in, url = sts
    within = run_boundary()
    Downscoper(within, VmCredentials(3600), url).token()
    assert built == [within] and len(within.rules) == 3
    (form,) = stand_in.forms
    assert json.loads(urllib.parse.unquote(form["options"])) == within.to_json()


def eleven_rules() -> str:
    rules = [rule(f"gs://b/p{n}", READ, "t") for n in range(11)]
    return urllib.parse.quote(json.dumps({"accessBoundary": {"accessBoundaryRules": [r.to_json() for r in rules]}}))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer"}, "grantType="),
        ({"requested_token_type": "urn:ietf:params:oauth:token-type:id_token"}, "requestedTokenType="),
        ({"subject_token_type": "urn:ietf:params:oauth:token-type:jwt-bearer"}, "subjectTokenType="),
        ({"subject_token_type": None}, "subjectTokenType is required"),
        ({"subject_token": None}, "subjectToken is required"),
        ({"access_boundary": "x"}, "fields ['accessBoundary'] are not in"),
        ({"options": urllib.parse.quote('{"accessBoundaryRules": []}')}, "options is not a Credential Access"),
        ({"options": "eleven"}, "11 rules: a boundary has 1 to 10"),
        ({"path": "/v1/exchange"}, "POST /v1/exchange"),
        ({"Authorization": "Bearer vm-token-1"}, "an Authorization header"),
    ],
)
def test_the_stand_in_refuses_an_exchange_the_api_would_not_take(sts, change, why):
    """The stand-in is what the tests above and the agent's end-to-end runs hold the exchange to: each way to
    get the request wrong is a 400 and a recorded violation; the Downscoper's own request, unchanged, is a 200."""
    stand_in, url = sts
    Downscoper(run_boundary(), VmCredentials(3600), url).token()
    form, path, headers = dict(stand_in.forms[0]), "/v1/token", {"Content-Type": "application/x-www-form-urlencoded"}
    assert stand_in.handle(path, headers, urllib.parse.urlencode(form).encode())[0] == 200
    for key, value in change.items():
        if key == "path":
            path = value
        elif key == "Authorization":
            headers[key] = value
        elif value is None:
            del form[key]
        else:
            form[key] = eleven_rules() if value == "eleven" else value
    status, answer = stand_in.handle(path, headers, urllib.parse.urlencode(form).encode())
    assert status == 400 and why in answer["error_description"], answer
    assert any(why in v for v in stand_in.violations)


def test_a_token_is_kept_until_near_its_end_then_exchanged_again_from_a_fresh_vm_token(sts):
    stand_in, url = sts
    long_lived = VmCredentials(3600)
    downscoper = Downscoper(run_boundary(), long_lived, url)
    first = downscoper.token()
    assert downscoper.token() is first and stand_in.requests == 1 and long_lived.refreshes == 1

    # A VM token closer to its end than REFRESH_BEFORE_S (and google-auth's own threshold, 225 s): the run's
    # token ends with it, so each ask exchanges again, each time from a VM token google-auth refreshed.
    short_lived = VmCredentials(200)
    downscoper = Downscoper(run_boundary(), short_lived, url)
    asked = time.monotonic()
    second, third = downscoper.token(), downscoper.token()
    assert (second.token, third.token) == ("downscoped-2", "downscoped-3")
    assert [f["subject_token"] for f in stand_in.forms[1:]] == ["vm-token-1", "vm-token-2"]
    assert asked + 190 < third.expires_at <= time.monotonic() + 200  # the source's end, not STS's expires_in (3599)
    assert stand_in.violations == []


def test_runs_asking_at_once_share_one_exchange(sts):
    stand_in, url = sts
    downscoper = Downscoper(run_boundary(), VmCredentials(3600), url)
    start, tokens = threading.Barrier(8), []

    def ask() -> None:
        start.wait()
        tokens.append(downscoper.token().token)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tokens == ["downscoped-1"] * 8 and stand_in.requests == 1


def test_a_refusal_by_sts_is_an_error_that_says_what_sts_said(sts):
    stand_in, url = sts
    stand_in.subject_tokens = frozenset({"another-accounts-token"})
    with pytest.raises(StorageError) as refused:
        Downscoper(run_boundary(), VmCredentials(3600), url).token()
    assert str(refused.value) == (
        "STS refused the token exchange: Error code invalid_request: subject_token is not a token of this VM's account"
    )


def test_sts_out_of_reach_is_an_error_not_a_traceback():
    with pytest.raises(StorageError, match=r"^STS token exchange: .*127\.0\.0\.1"):
        Downscoper(run_boundary(), VmCredentials(3600), "http://127.0.0.1:9/v1/token").token()


def test_what_google_auth_refuses_of_a_boundary_is_a_boundary_error():
    assert len(access_boundary([rule(f"gs://b/p{n}", READ, "t") for n in range(10)]).rules) == 10
    with pytest.raises(BoundaryError, match=r"^11 access boundary rules: .*maximum of 10 rules"):
        access_boundary([rule(f"gs://b/p{n}", READ, "t") for n in range(11)])
    with pytest.raises(BoundaryError, match="'gs:///ckpt' names no bucket"):
        boundary("gs:///ckpt", "", "")
    assert boundary("", "", "") is None  # a run that touches no object gets no token at all


def test_a_condition_longer_than_sts_takes_is_refused_before_the_run_starts():
    """STS takes a condition expression of at most 2048 characters; a longer one would start the run and refuse
    every token it asked for. The folder's prefix appears twice in it (objects, listing)."""

    def length(folder: str) -> int:
        condition = rule(f"gs://b/{folder}", READ, "t").availability_condition
        assert condition is not None
        return len(condition.expression)

    fixed = length("a") - 2 * len("a/")  # all but the prefix
    fits = "a" * ((MAX_EXPRESSION - fixed) // 2 - 1)
    assert length(fits) in (MAX_EXPRESSION - 1, MAX_EXPRESSION)
    with pytest.raises(BoundaryError, match=r"^the condition for 'gs://b/a+b' is 20[45]\d characters; STS takes 2048$"):
        boundary(f"gs://b/{fits}b", "", "")


def test_the_module_imports_without_google_auth():
    """vm_agent/tpu_probe.py imports it on a probe node's own python3, which has no google-auth: the library
    is imported when a boundary is built or a token exchanged, never when the module is."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['google'] = None; import vm_agent.tpu_probe"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("inside", ["not-a-folder", "s3://ckpt/run/"])
def test_the_probe_says_which_folder_it_cannot_narrow_to_without_a_traceback(inside):
    """`python -m vm_agent.tpu_probe boundary INSIDE OUTSIDE MARKER` (tools/smoke.py's) on an INSIDE that names no
    gs:// folder: one JSON line naming it and exit 1, before any token is exchanged (it was a traceback)."""
    done = subprocess.run(
        [sys.executable, "-m", "vm_agent.tpu_probe", "boundary", inside, "gs://other/run/", "gs://status/COMPLETE"],
        cwd=REPO,
        input="vm-token-1\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (1, ""), done.stderr
    (said,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert inside in said["error"], said
