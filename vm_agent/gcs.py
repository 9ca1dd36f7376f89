"""Cloud Storage as the VM's own service account, through Google's client library (google-cloud-storage,
from the agent's own environment: vm_agent/environment.py), and the metadata server's tokens.

The token comes from the metadata server (`instance/service-accounts/default/token`,
https://cloud.google.com/compute/docs/access/authenticate-workloads#applications), through `Tokens`, the
one cache of it the agent keeps (the downscoped tokens of vm_agent/credentials.py are exchanged from it).
`STORAGE_EMULATOR_HOST` points the library at an emulator, as it does everywhere, and then no token is
asked for. The library is imported when a `Storage` is made: the agent's other modules, and a local
folder (a dev run), need none of it.
"""

from __future__ import annotations

import builtins
import datetime
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
# Transient answers worth a retry (https://cloud.google.com/storage/docs/retry-strategy).
RETRIABLE = (408, 429, 500, 502, 503, 504)
# How long the library retries one call (google.api_core's backoff), not its 120 s: the agent's loops try again.
RETRY_SECONDS = 20.0
T = TypeVar("T")


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
    """The metadata server's answer (its token), retried as Cloud Storage's retry strategy says."""
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


def _credentials(tokens: Tokens) -> Any:
    """google-auth credentials that take the VM account's token from `tokens` (renewed there)."""
    from google.auth import credentials

    class VmCredentials(credentials.Credentials):
        def refresh(self, request: Any) -> None:
            self.token = tokens.get()
            left = max(0.0, tokens.expires_at - time.monotonic())
            # google-auth keeps naive UTC times (google.auth._helpers.utcnow).
            self.expiry = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None) + datetime.timedelta(
                seconds=left
            )

    return VmCredentials()


class Storage:
    """The objects calls the agent makes, each a call of google-cloud-storage; its errors become
    StorageError with the HTTP status (404, 412, ...)."""

    def __init__(self, tokens: Tokens | None = None, environ: Mapping[str, str] | None = None):
        """An emulator asks for no token unless `tokens` is given (a sandbox that checks the token)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        # google-cloud-storage 3.17 looks up each bucket it touches (storage.buckets.get, in a background
        # thread) to label its OpenTelemetry spans, unless this is set (google/cloud/storage/
        # _opentelemetry_tracing.py DISABLE_BUCKET_MD_ENV_VAR): a call the VM's object roles do not allow.
        os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
        environ = os.environ if environ is None else environ
        emulator = environ.get("STORAGE_EMULATOR_HOST", "")
        if emulator and "://" not in emulator:
            emulator = "http://" + emulator
        if tokens is None and not emulator:
            tokens = Tokens(metadata_url(environ))
        self.tokens = tokens
        self.library = f"google-cloud-storage {storage.__version__} ({Path(storage.__file__).parents[2]})"
        self.client = storage.Client(
            project=None,  # no project: the agent names every bucket
            credentials=AnonymousCredentials() if tokens is None else _credentials(tokens),
            client_options={"api_endpoint": emulator} if emulator else None,
        )

    def _blob(self, bucket: str, name: str) -> Any:
        return self.client.bucket(bucket).blob(name)

    @staticmethod
    def _retry() -> Any:
        """The library's retry of transient answers (https://cloud.google.com/storage/docs/retry-strategy),
        within RETRY_SECONDS. Every call here is idempotent: reads, deletes, a whole object written again,
        and a create under a precondition."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_timeout(RETRY_SECONDS)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions
        from requests import exceptions as transport

        try:
            return call()
        except exceptions.GoogleAPICallError as error:
            raise StorageError(f"{what}: HTTP {error.code} {error.message}"[:400], int(error.code or 0)) from None
        except (exceptions.RetryError, auth_exceptions.GoogleAuthError, transport.RequestException) as error:
            raise StorageError(f"{what}: {error}"[:400]) from None

    def read(self, bucket: str, name: str) -> bytes:
        return self._call(
            f"read gs://{bucket}/{name}", lambda: self._blob(bucket, name).download_as_bytes(retry=self._retry())
        )

    def download(self, bucket: str, name: str, target: Path) -> None:
        """Stream an object to a file (an archive may be larger than memory should hold)."""
        partial = target.with_name(target.name + ".partial")
        blob = self._blob(bucket, name)
        self._call(f"download gs://{bucket}/{name}", lambda: blob.download_to_filename(partial, retry=self._retry()))
        partial.replace(target)

    def exists(self, bucket: str, name: str) -> bool:
        return self._call(f"look up gs://{bucket}/{name}", lambda: self._blob(bucket, name).exists(retry=self._retry()))

    def write(self, bucket: str, name: str, data: bytes, content_type: str = "application/json") -> None:
        """The object's bytes, replacing any: retried as an idempotent call (the same bytes again)."""
        blob = self._blob(bucket, name)
        self._call(
            f"write gs://{bucket}/{name}",
            lambda: blob.upload_from_string(data, content_type=content_type, retry=self._retry()),
        )

    def create(self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """A new object only: False when one of that name exists (`ifGenerationMatch=0`, which Cloud
        Storage answers with 412 when the object exists: https://cloud.google.com/storage/docs/request-preconditions;
        the library retries such a conditional upload)."""
        blob = self._blob(bucket, name)
        try:
            self._call(
                f"create gs://{bucket}/{name}",
                lambda: blob.upload_from_string(
                    data, content_type=content_type, if_generation_match=0, retry=self._retry()
                ),
            )
        except StorageError as error:
            if error.status == 412:
                return False
            raise
        return True

    def delete(self, bucket: str, name: str) -> None:
        self._call(f"delete gs://{bucket}/{name}", lambda: self._blob(bucket, name).delete(retry=self._retry()))

    def list(self, bucket: str, prefix: str) -> builtins.list[str]:
        return self._call(
            f"list gs://{bucket}/{prefix}",
            lambda: [
                blob.name
                for blob in self.client.list_blobs(
                    bucket, prefix=prefix, fields="items(name),nextPageToken", retry=self._retry()
                )
            ],
        )


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
