"""Cloud Storage as the VM's own service account, through Google's client library (google-cloud-storage,
from the agent's own environment: vm_agent/environment.py), and the VM account's credentials.

The credentials are google-auth's `compute_engine.Credentials`, one per process (`vm_credentials`): every
client the agent has takes its token from them, and google-auth renews it from the metadata server
(`instance/service-accounts/default/token`, https://cloud.google.com/compute/docs/access/authenticate-workloads#applications)
before it expires. google-auth finds the metadata server at `GCE_METADATA_HOST` (default
metadata.google.internal), read once, when `google.auth.compute_engine` is first imported
(google/auth/compute_engine/_metadata.py, `_GCE_METADATA_HOST`): the agent's own address of it comes from
the same variable (`metadata_url`), so the two cannot disagree. `STORAGE_EMULATOR_HOST` points the library at
an emulator, as it does everywhere, and then no token is asked for unless credentials are given. The
libraries are imported when first used: the agent's other modules, and a local folder (a dev run), need
none of them.
"""

from __future__ import annotations

import builtins
import datetime
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

METADATA_HOST_ENV = "GCE_METADATA_HOST"  # google-auth's name (google/auth/environment_vars.py)
DEFAULT_METADATA_HOST = "metadata.google.internal"
# How long the library retries one call (google.api_core's backoff), not its 120 s: the agent's loops try again.
RETRY_SECONDS = 20.0
T = TypeVar("T")


class StorageError(Exception):
    """A Cloud Storage or metadata request that failed for good (status and what was asked)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def metadata_url(environ: Mapping[str, str] | None = None) -> str:
    """The metadata server's v1 root, where google-auth finds it: `GCE_METADATA_HOST` (host or host:port)."""
    environ = os.environ if environ is None else environ
    return f"http://{environ.get(METADATA_HOST_ENV) or DEFAULT_METADATA_HOST}/computeMetadata/v1"


_vm_credentials: Any = None
_vm_credentials_lock = threading.Lock()


def vm_credentials() -> Any:
    """The VM account's credentials (google-auth's compute_engine.Credentials), the one token source of this
    process: made once, renewed by google-auth. Only the agent's own process uses them; a run gets a
    narrowed token of its own (vm_agent/credentials.py)."""
    global _vm_credentials
    with _vm_credentials_lock:
        if _vm_credentials is None:
            from google.auth import compute_engine

            _vm_credentials = compute_engine.Credentials()
        return _vm_credentials


_refresh_lock = threading.Lock()


def fresh_token(credentials: Any) -> tuple[str, float]:
    """(an access token of `credentials`, its seconds left; inf when unknown), refreshed first unless still
    valid (google-auth counts a token that ends within its refresh threshold as not valid). For what sends
    the token itself: a token exchange, a `docker login`. StorageError when it cannot be had."""
    with _refresh_lock:
        if not credentials.valid:
            from google.auth import exceptions
            from google.auth.transport.requests import Request

            try:
                credentials.refresh(Request())
            except exceptions.GoogleAuthError as error:
                raise StorageError(f"no access token for the VM's account: {error}"[:400]) from None
        expiry = credentials.expiry  # naive UTC (google.auth._helpers.utcnow), None for no end
    if expiry is None:
        return credentials.token, float("inf")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    return credentials.token, (expiry - now).total_seconds()


def split_gs(url: str) -> tuple[str, str]:
    """`gs://bucket/some/prefix/` -> ("bucket", "some/prefix")."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url!r}")
    bucket, _, name = url[len("gs://") :].partition("/")
    return bucket, name.strip("/")


class Storage:
    """The objects calls the agent makes, each a call of google-cloud-storage; its errors become
    StorageError with the HTTP status (404, 412, ...)."""

    def __init__(self, credentials: Any = None, environ: Mapping[str, str] | None = None):
        """The VM account's credentials (`vm_credentials`) unless others are given; an emulator asks for no
        token unless `credentials` are given (a sandbox that checks the token)."""
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
        if credentials is None and not emulator:
            credentials = vm_credentials()
        self.credentials = credentials
        self.library = f"google-cloud-storage {storage.__version__} ({Path(storage.__file__).parents[2]})"
        self.client = storage.Client(
            project=None,  # no project: the agent names every bucket
            credentials=AnonymousCredentials() if credentials is None else credentials,
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
