"""A GCE metadata server on loopback, the one every test and benchmark uses: instance attributes
(changed while it runs, with ETags and `wait_for_change`), the instance's zone, and what google-auth
asks of one to act as the instance's service account. It keeps every path it was asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, ClassVar

JSON = "application/json"


def metadata_etag(value: str) -> str:
    """An attribute value's ETag (the real server's is an opaque hex string that changes with the value)."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class _MetadataHandler(http.server.BaseHTTPRequestHandler):
    """Instance attributes, and what google-auth asks of a metadata server to act as the instance's
    service account: the ping (`/` answering `Metadata-Flavor: Google`), the account and a token; and
    the instance's zone (`instance/zone` is `projects/NUMBER/zones/ZONE`, querying-metadata).

    Attributes answer with an `ETag` header and honour `wait_for_change=true&last_etag=E&timeout_sec=N`
    as Compute Engine's server does (https://cloud.google.com/compute/docs/metadata/querying-metadata,
    "Wait for changes"): held until the value's ETag differs from E, or N seconds pass, then answered
    with the current value. Tests change attributes while it runs (`MetadataHost.set`/`.delete`)."""

    attributes: ClassVar[dict[str, str]] = {}
    changed: ClassVar[threading.Condition] = threading.Condition()
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        prefix = "/computeMetadata/v1/instance/attributes/"
        path, _, query = self.path.partition("?")
        if self.headers.get("Metadata-Flavor") != "Google":
            self.send_error(403, "Missing Metadata-Flavor: Google")  # as the real server answers
            return
        # The server answers for the account as `default` and by its email alike (querying-metadata,
        # "service-accounts/"); google-auth asks by email once it has learnt it.
        account = "/computeMetadata/v1/instance/service-accounts/default/"
        path = path.replace(f"/service-accounts/{SANDBOX_ACCOUNT}/", "/service-accounts/default/")
        if path in ("/", "/computeMetadata/v1/"):
            self._answer("computeMetadata/")
        elif path == account + "token":
            self._answer(json.dumps({"access_token": SANDBOX_TOKEN, "expires_in": 3599, "token_type": "Bearer"}), JSON)
        elif path == account:
            info = {"email": SANDBOX_ACCOUNT, "aliases": ["default"], "scopes": [CLOUD_PLATFORM]}
            self._answer(json.dumps(info), JSON)
        elif path == account + "email":
            self._answer(SANDBOX_ACCOUNT)
        elif path == "/computeMetadata/v1/instance/zone":
            self._answer(f"projects/{PROJECT_NUMBER}/zones/{ZONE}")
        elif path.startswith(prefix):
            self._attribute(path.removeprefix(prefix), urllib.parse.parse_qs(query))
        else:
            self._not_found()

    def _attribute(self, name: str, query: dict[str, list[str]]) -> None:
        with self.changed:
            if query.get("wait_for_change") == ["true"]:
                last = query.get("last_etag", [""])[0]
                deadline = time.monotonic() + float(query.get("timeout_sec", ["3600"])[0])
                while name in self.attributes and metadata_etag(self.attributes[name]) == last:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.changed.wait(remaining)
            value = self.attributes.get(name)
        if value is None:
            self._not_found()
        else:
            self._answer(value, etag=metadata_etag(value))

    def _not_found(self) -> None:
        self.send_response(404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, text: str, content_type: str = "application/text", etag: str = "") -> None:
        body = text.encode()
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", content_type)
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class MetadataHost(str):
    """GCE_METADATA_HOST of a sandbox metadata server, which can also change its attributes."""

    handler: type[_MetadataHandler]

    @property
    def url(self) -> str:
        return f"http://{self}/computeMetadata/v1"

    @property
    def asked(self) -> list[str]:
        """Every path (with its query) the server was asked, in order."""
        return self.handler.asked

    def set(self, name: str, value: str) -> None:
        with self.handler.changed:
            self.handler.attributes[name] = value
            self.handler.changed.notify_all()

    def delete(self, name: str) -> None:
        with self.handler.changed:
            self.handler.attributes.pop(name, None)
            self.handler.changed.notify_all()


@contextlib.contextmanager
def metadata_server(
    attributes: dict[str, str] | None = None, address: tuple[str, int] = ("127.0.0.1", 0)
) -> Iterator[MetadataHost]:
    """A GCE metadata server on loopback answering instance attributes; yields GCE_METADATA_HOST. In a
    network namespace of a test's own it may take the real server's address, 169.254.169.254:80."""
    state = {"attributes": dict(attributes or {}), "changed": threading.Condition(), "asked": []}
    handler = type("Handler", (_MetadataHandler,), state)
    server = http.server.ThreadingHTTPServer(address, handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # a quick shutdown()
    thread.start()
    host = MetadataHost(f"{server.server_address[0]}:{server.server_address[1]}")
    host.handler = handler
    try:
        yield host
    finally:
        with handler.changed:  # release requests still waiting for a change
            handler.attributes.clear()
            handler.changed.notify_all()
        server.shutdown()


SANDBOX_TOKEN = "sandbox-access-token"
SANDBOX_ACCOUNT = "sandbox@acme-ml-sandbox.iam.gserviceaccount.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
PROJECT_NUMBER = 123456789
ZONE = "us-central2-b"


def sandbox_credentials() -> Any:
    """google-auth credentials holding the token this server gives, for code run inside a test's own process:
    google-auth reads GCE_METADATA_HOST once per process (google/auth/compute_engine/_metadata.py), so a
    process cannot ask each test's own server. A sandboxed agent (its own process) asks the server itself."""
    from google.oauth2.credentials import Credentials

    return Credentials(SANDBOX_TOKEN)
