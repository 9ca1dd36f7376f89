"""Each run's own credentials: the VM account's token narrowed to that run's objects.

Cloud Storage Credential Access Boundaries (https://cloud.google.com/iam/docs/downscoping-short-lived-credentials):
a boundary is at most 10 rules, each a bucket (`//storage.googleapis.com/projects/_/buckets/B`), an
upper bound of permissions (`inRole:` a Cloud Storage role) and an optional condition; a token
exchanged under it can do at most what both the account's IAM grants and the boundary allow, on Cloud
Storage only ("Other Google Cloud services don't support this feature": such a token is worth nothing
elsewhere, Logging and the TPU API included). The conditions are the page's own forms:
`resource.name.startsWith('projects/_/buckets/B/objects/PREFIX')` for object calls, and
`api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('PREFIX')` for listing.

A run's boundary: its checkpoint and model prefixes (read, write, delete, list: objectAdmin as the upper
bound, so IAM's own grant of objectUser is what holds) and its data (read, list). Nothing of the status
bucket (its state, the completion marker the guard acts on, requests), nothing of the artifacts bucket,
no other prefix: the agent writes those with the VM's own token, which no run ever holds.

The exchange is one POST to STS `v1/token` (the sts.v1 discovery document: `sts.token`, POST
https://sts.googleapis.com/v1/token, GoogleIdentityStsV1ExchangeTokenRequest), form-encoded as
google-auth's `google.oauth2.sts.Client` sends it for `google.auth.downscoped.Credentials.refresh`:
grant_type token-exchange, subject and requested token types access_token, the VM's token as the
subject, and `options` the boundary as URL-quoted JSON. A downscoped token lives no longer than the
token it came from (google-auth: "the same expiration time as the source credentials"), so a run's
token is exchanged again, from a fresh VM token, before either expires. The request is the one the
discovery document describes.

The source token comes from google-auth credentials (vm_agent/gcs.py fresh_token); the exchange itself is
the standard library's.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from vm_agent.gcs import StorageError, fresh_token, split_gs

STS_URL = "https://sts.googleapis.com/v1/token"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
MAX_RULES = 10  # "A Credential Access Boundary can contain up to 10 access boundary rules" (google-auth, the page)
WRITE = "inRole:roles/storage.objectAdmin"  # an upper bound: IAM's own grant (objectUser) is what holds
READ = "inRole:roles/storage.objectViewer"
REFRESH_BEFORE_S = 300.0  # a token closer than this to its end is exchanged again


class BoundaryError(ValueError):
    """A run whose objects cannot be named in one boundary (too many rules, a URL that is not gs://)."""


def _prefix(url: str, folder: bool) -> tuple[str, str]:
    bucket, name = split_gs(url)
    if not bucket:
        raise BoundaryError(f"{url!r} names no bucket")
    return bucket, (f"{name}/" if folder else name) if name else ""


def rule(url: str, permission: str, title: str, folder: bool = True) -> dict[str, Any]:
    """One rule: the objects under the gs:// URL `url` (and listing them), up to `permission`. `folder`: `url`
    is a folder (`<url>/...` only); else an object or a folder (data: one .npz or a folder of shards)."""
    bucket, prefix = _prefix(url, folder)
    resource = f"//storage.googleapis.com/projects/_/buckets/{bucket}"
    found: dict[str, Any] = {"availableResource": resource, "availablePermissions": [permission]}
    if prefix:
        found["availabilityCondition"] = {
            "title": title[:100],
            "expression": (
                f"resource.name.startsWith('projects/_/buckets/{bucket}/objects/{prefix}') || "
                f"api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('{prefix}')"
            ),
        }
    return found


def boundary(checkpoint_dir: str, model_dir: str, data: str) -> list[dict[str, Any]]:
    """The rules of one run's boundary; [] when it touches no object (it then gets no token at all)."""
    rules = []
    if checkpoint_dir:
        rules.append(rule(checkpoint_dir, WRITE, "this run's checkpoints"))
    if model_dir:
        rules.append(rule(model_dir, WRITE, "this run's model"))
    if data:
        rules.append(rule(data.rstrip("/"), READ, "this run's data", folder=False))
    if len(rules) > MAX_RULES:
        raise BoundaryError(f"{len(rules)} access boundary rules; Cloud Storage takes at most {MAX_RULES}")
    return rules


def exchange_body(subject_token: str, rules: list[dict[str, Any]]) -> bytes:
    """The STS request body, as google-auth's sts.Client encodes it."""
    options = urllib.parse.quote(json.dumps({"accessBoundary": {"accessBoundaryRules": rules}}))
    return urllib.parse.urlencode(
        {
            "grant_type": GRANT_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "options": options,
        }
    ).encode()


@dataclass
class Issued:
    token: str
    expires_at: float  # time.monotonic()


class Downscoper:
    """Downscoped tokens for one boundary, exchanged again from a fresh VM token before they expire.
    `credentials`: google-auth credentials of the source account (vm_agent/gcs.py vm_credentials)."""

    def __init__(self, rules: list[dict[str, Any]], credentials: Any, sts_url: str = STS_URL):
        self.rules = rules
        self.credentials = credentials
        self.sts_url = sts_url
        self._issued: Issued | None = None
        self._lock = threading.Lock()

    def token(self) -> Issued:
        with self._lock:
            now = time.monotonic()
            if self._issued is not None and self._issued.expires_at - now > REFRESH_BEFORE_S:
                return self._issued
            subject, source_left = fresh_token(self.credentials)
            request = urllib.request.Request(
                self.sts_url,
                data=exchange_body(subject, self.rules),
                method="POST",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read().decode())
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:300]
                raise StorageError(f"STS token exchange: HTTP {error.code} {detail}", error.code) from None
            except (urllib.error.URLError, OSError, ValueError) as error:
                raise StorageError(f"STS token exchange: {error}") from None
            lifetime = float(answer.get("expires_in") or source_left)
            self._issued = Issued(str(answer["access_token"]), now + min(lifetime, source_left))
            return self._issued
