"""Cloud Storage through its JSON API with urllib, as the VM's own service account.

The token comes from the metadata server (`instance/service-accounts/default/token`,
https://cloud.google.com/compute/docs/access/authenticate-workloads#applications); requests follow
the JSON API reference (https://cloud.google.com/storage/docs/json_api/v1/objects: `get` with
`alt=media` for the bytes, `insert` at `/upload/storage/v1` with `uploadType=media`, `list` with
`prefix` and `pageToken`). `STORAGE_EMULATOR_HOST` points it at an emulator, as Google's client
libraries do, and then no token is asked for.
"""

from __future__ import annotations

import builtins
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
GCS_URL = "https://storage.googleapis.com"
# Transient answers worth a retry (https://cloud.google.com/storage/docs/retry-strategy).
RETRIABLE = (408, 429, 500, 502, 503, 504)


class StorageError(Exception):
    """A Cloud Storage or metadata request that failed for good (status and what was asked)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def metadata_url(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get("TPU_PLATFORM_METADATA_URL") or DEFAULT_METADATA_URL


class Tokens:
    """Access tokens of the VM's service account, from the metadata server, renewed before expiry."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self._token = ""
        self.expires_at = 0.0  # time.monotonic() when the token ends
        self._lock = threading.Lock()

    def get(self) -> str:
        with self._lock:
            if time.monotonic() < self.expires_at - 60:
                return self._token
            request = urllib.request.Request(
                self.base_url + "/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
            )
            body = json.loads(_send(request, "the metadata server's token").decode())
            self._token = body["access_token"]
            self.expires_at = time.monotonic() + float(body.get("expires_in", 0))
            return self._token


def _send(request: urllib.request.Request, what: str, timeout: float = 60, attempts: int = 5) -> bytes:
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            if error.code not in RETRIABLE or attempt == attempts - 1:
                detail = error.read().decode(errors="replace")[:300]
                raise StorageError(f"{what}: HTTP {error.code} {detail}".strip(), error.code) from None
        except (urllib.error.URLError, OSError) as error:
            if attempt == attempts - 1:
                raise StorageError(f"{what}: {error}") from None
        time.sleep(min(2**attempt * 0.5, 8))
    raise AssertionError("unreachable")


def split_gs(url: str) -> tuple[str, str]:
    """`gs://bucket/some/prefix/` -> ("bucket", "some/prefix")."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url!r}")
    bucket, _, name = url[len("gs://") :].partition("/")
    return bucket, name.strip("/")


class Storage:
    """The objects calls the agent makes."""

    def __init__(self, tokens: Tokens | None = None, environ: Mapping[str, str] | None = None):
        """An emulator asks for no token unless `tokens` is given (a sandbox that checks the token)."""
        environ = os.environ if environ is None else environ
        emulator = environ.get("STORAGE_EMULATOR_HOST", "")
        if emulator and "://" not in emulator:
            emulator = "http://" + emulator
        self.base = (emulator or GCS_URL).rstrip("/")
        self.tokens = tokens if tokens is not None or emulator else Tokens(metadata_url(environ))

    def _request(self, method: str, url: str, data: bytes | None = None, content_type: str = "") -> bytes:
        headers = {}
        if self.tokens is not None:
            headers["Authorization"] = "Bearer " + self.tokens.get()
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        return _send(request, f"{method} {url}")

    def _object_url(self, bucket: str, name: str) -> str:
        return f"{self.base}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"

    def read(self, bucket: str, name: str) -> bytes:
        return self._request("GET", self._object_url(bucket, name) + "?alt=media")

    def download(self, bucket: str, name: str, target: Path) -> None:
        """Stream an object to a file (an archive may be larger than memory should hold)."""
        headers = {"Authorization": "Bearer " + self.tokens.get()} if self.tokens is not None else {}
        request = urllib.request.Request(self._object_url(bucket, name) + "?alt=media", headers=headers)
        partial = target.with_name(target.name + ".partial")
        try:
            with urllib.request.urlopen(request, timeout=300) as response, open(partial, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except urllib.error.HTTPError as error:
            raise StorageError(f"download gs://{bucket}/{name}: HTTP {error.code}", error.code) from None
        except (urllib.error.URLError, OSError) as error:
            raise StorageError(f"download gs://{bucket}/{name}: {error}") from None
        partial.replace(target)

    def exists(self, bucket: str, name: str) -> bool:
        try:
            self._request("GET", self._object_url(bucket, name))
        except StorageError as error:
            if error.status == 404:
                return False
            raise
        return True

    def write(self, bucket: str, name: str, data: bytes, content_type: str = "application/json") -> None:
        """A multipart upload: the object's metadata (name, content type) and its bytes in one request
        (https://cloud.google.com/storage/docs/uploading-objects, JSON API multipart upload)."""
        boundary = "tpu-platform-" + uuid.uuid4().hex
        metadata = json.dumps({"name": name, "contentType": content_type}).encode()
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                metadata,
                f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        url = f"{self.base}/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        self._request("POST", url, body, f"multipart/related; boundary={boundary}")

    def create(self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """A new object only: False when one of that name exists. A media upload with
        `ifGenerationMatch=0`, which Cloud Storage answers with 412 when the object exists
        (https://cloud.google.com/storage/docs/request-preconditions). Octet-stream by default: the
        sandbox's emulator drops a media upload sent as application/json."""
        query = urllib.parse.urlencode({"uploadType": "media", "name": name, "ifGenerationMatch": "0"})
        try:
            self._request("POST", f"{self.base}/upload/storage/v1/b/{bucket}/o?{query}", data, content_type)
        except StorageError as error:
            if error.status == 412:
                return False
            raise
        return True

    def delete(self, bucket: str, name: str) -> None:
        self._request("DELETE", self._object_url(bucket, name))

    def list(self, bucket: str, prefix: str) -> builtins.list[str]:
        names: list[str] = []
        token = ""
        while True:
            query = {"prefix": prefix, "fields": "items(name),nextPageToken"}
            if token:
                query["pageToken"] = token
            url = f"{self.base}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
            page = json.loads(self._request("GET", url).decode() or "{}")
            names.extend(item["name"] for item in page.get("items", []))
            token = page.get("nextPageToken", "")
            if not token:
                return names


class Folder:
    """A folder of objects named relative to it: `gs://bucket/prefix` or a local path (a dev run)."""

    def __init__(self, url: str, storage: Storage | None = None):
        self.url = url.rstrip("/")
        self.remote = url.startswith("gs://")
        self._storage = storage

    @property
    def storage(self) -> Storage:
        if self._storage is None:
            self._storage = Storage()
        return self._storage

    def _where(self, name: str) -> tuple[str, str]:
        bucket, prefix = split_gs(self.url)
        return bucket, f"{prefix}/{name}" if prefix else name

    def read(self, name: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        if not self.remote:
            path = Path(self.url) / name
            return path.read_bytes() if path.is_file() else None
        try:
            return self.storage.read(*self._where(name))
        except StorageError as error:
            if error.status == 404:
                return None
            raise

    def read_json(self, name: str) -> dict[str, Any]:
        """The JSON object stored at `name`; {} when there is none, or it is not a JSON object."""
        data = self.read(name)
        try:
            value = json.loads(data) if data else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def write_json(self, name: str, record: Mapping[str, Any]) -> None:
        self.write(name, json.dumps(record, sort_keys=True).encode())

    def write(self, name: str, data: bytes) -> None:
        if self.remote:
            self.storage.write(*self._where(name), data)
            return
        path = Path(self.url) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(data)
        partial.replace(path)  # whole or not at all, as an object write is

    def create(self, name: str, data: bytes) -> bool:
        """A new object only (Storage.create): False when one of that name exists."""
        if self.remote:
            return self.storage.create(*self._where(name), data)
        path = Path(self.url) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "xb") as out:
                out.write(data)
        except FileExistsError:
            return False
        return True

    def delete(self, name: str) -> None:
        """Remove the object; one already gone is no error."""
        if not self.remote:
            (Path(self.url) / name).unlink(missing_ok=True)
            return
        try:
            self.storage.delete(*self._where(name))
        except StorageError as error:
            if error.status != 404:
                raise

    def names(self, prefix: str = "") -> Iterator[str]:
        if not self.remote:
            base = Path(self.url)
            return iter(sorted(str(p.relative_to(base)) for p in (base / prefix).rglob("*") if p.is_file()))
        bucket, root = split_gs(self.url)
        cut = len(root) + 1 if root else 0
        start = f"{root}/{prefix}" if root else prefix
        return iter(sorted(name[cut:] for name in self.storage.list(bucket, start)))
