"""The REST calls of `tpu-runs`, on one HTTP session with the researcher's credentials.

Exactly the methods of infra/access/researcher_calls.py (tests record them against the stand-ins); on
the GKE engine, a team member's: the cluster's `get` (its DNS endpoint, as `gcloud container clusters
get-credentials --dns-endpoint` reads it) and Kubernetes requests through that endpoint with the same
Google token (infra/access/identities.py MEMBER_METHODS), which the team's Role allows (infra/gke/teams.py).
Endpoints follow the usual overrides, for emulators and stand-ins on loopback:
STORAGE_EMULATOR_HOST (Cloud Storage), TPU_API_ENDPOINT, LOGGING_API_ENDPOINT, CONTAINER_API_ENDPOINT,
KUBERNETES_API_ENDPOINT (instead of the cluster's DNS endpoint).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import requests

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
LOGIN = "gcloud auth application-default login"


class CallError(Exception):
    """A call Google refused, said in words: what was tried, on what, and what to do."""


def adc_session() -> requests.Session:
    """An authorized session with Application Default Credentials (`gcloud auth application-default login`)."""
    import google.auth
    import google.auth.exceptions
    from google.auth.transport.requests import AuthorizedSession

    try:
        credentials, _ = google.auth.default(scopes=list(SCOPES))
    except google.auth.exceptions.DefaultCredentialsError:
        raise CallError(f"no Google credentials: run `{LOGIN}` first") from None
    return AuthorizedSession(credentials)


class Google:
    def __init__(self, session: requests.Session, stack: str):
        self.session = session
        self.stack = stack
        self.storage = (os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com").rstrip("/")
        self.tpu = (os.environ.get("TPU_API_ENDPOINT") or "https://tpu.googleapis.com").rstrip("/")
        self.logging = (os.environ.get("LOGGING_API_ENDPOINT") or "https://logging.googleapis.com").rstrip("/")
        self.container = (os.environ.get("CONTAINER_API_ENDPOINT") or "https://container.googleapis.com").rstrip("/")
        self._kubernetes = (os.environ.get("KUBERNETES_API_ENDPOINT") or "").rstrip("/")

    def _send(
        self, what: str, method: str, url: str, ok: tuple[int, ...] = (), refused: str = "", **kwargs: Any
    ) -> requests.Response:
        from google.auth import exceptions

        try:
            answer = self.session.request(method, url, timeout=60, **kwargs)
        except exceptions.RefreshError as error:  # the token endpoint refused the login (expired, revoked)
            why = f"your Google login is no longer valid ({_first_line(error)}); run `{LOGIN}` and try again"
            raise CallError(f"could not {what}: {why}") from None
        except exceptions.TransportError as error:  # the token endpoint could not be reached to refresh it
            why = (
                f"your Google login could not be refreshed, the network failed reaching Google's token endpoint "
                f"({_network_reason(error)}); check the connection or proxy, or run `{LOGIN}` again"
            )
            raise CallError(f"could not {what}: {why}") from None
        except exceptions.GoogleAuthError as error:
            raise CallError(
                f"could not {what}: your Google login cannot be used ({_first_line(error)}); run `{LOGIN}`"
            ) from None
        except requests.RequestException as error:
            why = f"the network failed reaching {urlsplit(url).netloc} ({_network_reason(error)})"
            raise CallError(f"could not {what}: {why}; check the connection or proxy and try again") from None
        if answer.status_code < 300 or answer.status_code in ok:
            return answer
        message = _google_message(answer)
        if answer.status_code == 401:
            raise CallError(f"could not {what}: Google did not accept your login (HTTP 401{message}); run `{LOGIN}`")
        if answer.status_code == 403 and refused:
            raise CallError(f"you may not {what} (HTTP 403{message}). {refused}")
        if answer.status_code == 403:
            raise CallError(
                f"you may not {what} (HTTP 403{message}). Researchers of stack '{self.stack}' are listed "
                f"under tpu-platform:researchers in Pulumi.{self.stack}.yaml; ask its owners to add you, then "
                "wait a minute for IAM to apply it"
            )
        raise CallError(f"could not {what}: HTTP {answer.status_code}{message}")

    # Cloud Storage: objects.list, objects.get, objects.insert (new objects only).
    def _object(self, bucket: str, name: str) -> str:
        return f"{self.storage}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def list_objects(self, bucket: str, prefix: str, refused: str = "") -> Iterator[dict[str, Any]]:
        token = None
        while True:
            params = {"prefix": prefix, **({"pageToken": token} if token else {})}
            url = f"{self.storage}/storage/v1/b/{quote(bucket, safe='')}/o"
            page = self._send(f"list gs://{bucket}/{prefix}", "GET", url, refused=refused, params=params).json()
            yield from page.get("items", [])
            token = page.get("nextPageToken")
            if not token:
                return

    def read(self, bucket: str, name: str, refused: str = "") -> bytes | None:
        answer = self._send(
            f"read gs://{bucket}/{name}",
            "GET",
            self._object(bucket, name),
            ok=(404,),
            refused=refused,
            params={"alt": "media"},
        )
        return None if answer.status_code == 404 else answer.content

    def stat(self, bucket: str, name: str, refused: str = "") -> dict[str, Any] | None:
        """The object's metadata (storage.v1 objects.get: its size, md5Hash, crc32c), or None when there is none."""
        answer = self._send(f"read gs://{bucket}/{name}", "GET", self._object(bucket, name), ok=(404,), refused=refused)
        return None if answer.status_code == 404 else answer.json()

    def exists(self, bucket: str, name: str, refused: str = "") -> bool:
        return self.stat(bucket, name, refused) is not None

    def create(self, bucket: str, name: str, data: bytes, content_type: str) -> bool:
        """Upload a new object; False when one of that name exists already (ifGenerationMatch=0)."""
        answer = self._send(
            f"write gs://{bucket}/{name}",
            "POST",
            f"{self.storage}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
            ok=(412,),
            params={"uploadType": "media", "name": name, "ifGenerationMatch": "0"},
            data=data,
            headers={"Content-Type": content_type},
        )
        return answer.status_code != 412

    # Cloud TPU: nodes.list in one zone.
    def nodes(self, project: str, zone: str) -> list[dict[str, Any]]:
        parent = f"projects/{project}/locations/{zone}"
        out: list[dict[str, Any]] = []
        token = None
        while True:
            params = {"pageToken": token} if token else {}
            page = self._send(
                f"list the TPU VMs of {parent}", "GET", f"{self.tpu}/v2/{parent}/nodes", params=params
            ).json()
            out += page.get("nodes", [])
            token = page.get("nextPageToken")
            if not token:
                return out

    # Cloud Logging: entries.list, through a log view (resourceNames names the view).
    def entries(self, view: str, log_filter: str, page_token: str | None = None, refused: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {
            "resourceNames": [view],
            "filter": log_filter,
            "orderBy": "timestamp asc",
            "pageSize": 1000,
        }
        if page_token:
            body["pageToken"] = page_token
        url = f"{self.logging}/v2/entries:list"
        return self._send("read the run's log", "POST", url, refused=refused, json=body).json()

    # GKE: the cluster's DNS endpoint (container.projects.locations.clusters.get), then the Kubernetes API.
    def kubernetes(self, project: str, location: str, cluster: str) -> str:
        """The base URL of the cluster's Kubernetes API: its DNS endpoint, which takes a Google token
        (KUBERNETES_API_ENDPOINT stands in for it on loopback)."""
        name = f"projects/{project}/locations/{location}/clusters/{cluster}"
        found = self._send(f"read the GKE cluster {name}", "GET", f"{self.container}/v1/{name}").json()
        endpoint = ((found.get("controlPlaneEndpointsConfig") or {}).get("dnsEndpointConfig") or {}).get("endpoint")
        if not endpoint:
            raise CallError(f"the GKE cluster {name} has no DNS endpoint: its stack's `pulumi up` makes one")
        return self._kubernetes or f"https://{endpoint}"

    def apply(self, base: str, path: str, obj: Mapping[str, Any], manager: str, refused: str) -> dict[str, Any]:
        """Server-side apply (Kubernetes "Server-Side Apply"): a PATCH of the whole object as
        application/apply-patch+yaml (JSON is YAML), owned by `manager`; unknown fields refused (Strict)."""
        meta = obj["metadata"]
        return self._send(
            f"apply {obj['kind']} {meta['namespace']}/{meta['name']}",
            "PATCH",
            f"{base}{path}/{quote(meta['name'], safe='')}",
            refused=refused,
            params={"fieldManager": manager, "fieldValidation": "Strict"},
            data=json.dumps(obj).encode(),
            headers={"Content-Type": "application/apply-patch+yaml"},
        ).json()

    def kube_list(self, base: str, path: str, what: str, refused: str, selector: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            params = {**({"labelSelector": selector} if selector else {}), **({"continue": token} if token else {})}
            page = self._send(f"list {what}", "GET", f"{base}{path}", refused=refused, params=params).json()
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    def kube_get(self, base: str, path: str, what: str, refused: str) -> dict[str, Any] | None:
        """One object; None when the API server has none there (404: no such object, or API not served)."""
        answer = self._send(f"read {what}", "GET", f"{base}{path}", ok=(404,), refused=refused)
        return None if answer.status_code == 404 else answer.json()

    def kube_delete(self, base: str, path: str, name: str, what: str, refused: str) -> bool:
        """Delete one object; False when there is none of that name."""
        url = f"{base}{path}/{quote(name, safe='')}"
        answer = self._send(f"delete {what}", "DELETE", url, ok=(404,), refused=refused)
        return answer.status_code != 404


def _first_line(error: BaseException) -> str:
    """The error's own words; google-auth's RefreshError carries (message, the token endpoint's answer)."""
    text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    return (text.strip().splitlines() or [type(error).__name__])[0][:300]


def _network_reason(error: BaseException) -> str:
    """The innermost cause, which names the host and what happened ("Connection refused"), not the
    chain of wrappers around it (google.auth's TransportError wraps requests', which wraps urllib3's)."""
    while error.__cause__ is not None or (error.args and isinstance(error.args[0], BaseException)):
        error = error.__cause__ or error.args[0]
    reason = getattr(error, "reason", None)
    return _first_line(reason if isinstance(reason, BaseException) else error)


def _google_message(answer: requests.Response) -> str:
    """Google's own words (they name the permission refused), as `: <message>`, or ""."""
    try:
        message = answer.json().get("error", {}).get("message", "")
    except ValueError:
        message = answer.text[:300]
    return f": {message.strip()}" if message and message.strip() else ""
