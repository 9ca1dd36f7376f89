"""The Cloud Storage front of the isolation tests refuses what Cloud Storage would, before any IAM: a call
the storage.v1 discovery document does not allow is a 400 and a recorded violation, never forwarded."""

from __future__ import annotations

import json

import pytest

from tests.iam_standins import Grant, IamFront, StsStandIn, role_permissions

TOKEN = "vm-token"
UPLOAD = "/upload/storage/v1/b/ckpt/o"
BOUNDARY = "==b=="


def front() -> IamFront:
    # No emulator behind it: a refused call never reaches one, and an allowed one would fail to connect.
    everything = role_permissions("roles/storage.objectAdmin")
    return IamFront("http://127.0.0.1:9", {TOKEN: [Grant("ckpt", everything)]}, StsStandIn(frozenset({TOKEN})))


def multipart(metadata: dict[str, object]) -> bytes:
    return (
        f"--{BOUNDARY}\r\ncontent-type: application/json\r\n\r\n{json.dumps(metadata)}\r\n"
        f"--{BOUNDARY}\r\ncontent-type: application/octet-stream\r\n\r\nbytes\r\n--{BOUNDARY}--"
    ).encode()


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "why"),
    [
        (
            "POST",
            f"{UPLOAD}?uploadType=multipart",
            multipart({"nmae": "a"}),
            f'multipart/related; boundary="{BOUNDARY}"',
            "unknown field nmae",
        ),
        (
            "POST",
            f"{UPLOAD}?uploadType=resumable",
            b'{"name": "a", "metadata": {"k": 1}}',
            "application/json",
            "metadata.k must be a string",
        ),
        ("POST", f"{UPLOAD}?uploadType=media", b"bytes", "application/octet-stream", "the object has no name"),
        ("GET", "/storage/v1/b/ckpt/o?prefix=a&maxResults=many", b"", "", "maxResults='many': must be an integer"),
        (
            "PATCH",
            "/storage/v1/b/ckpt/o/a",
            b'{"contentTyp": "text/plain"}',
            "application/json",
            "unknown field contentTyp",
        ),
    ],
)
def test_a_call_cloud_storage_would_refuse_is_refused_before_iam(method, path, body, content_type, why):
    storage = front()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
    status, answer, _ = storage.handle(method, path, headers, body)
    assert status == 400 and why in json.loads(answer)["error"]["message"]
    assert len(storage.violations) == 1 and why in storage.violations[0]
    assert storage.denied == []
