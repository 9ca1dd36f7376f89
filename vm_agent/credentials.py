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

Both halves are google-auth's (google-auth 2.63.0, the version requirements-agent.lock pins; sources read in
its installed google/auth/downscoped.py and google/oauth2/sts.py):

- The boundary is its types, `AccessBoundaryRule`, `AvailabilityCondition` and `CredentialAccessBoundary`:
  `to_json()` is the page's `{"accessBoundary": {"accessBoundaryRules": [...]}}` (a condition's
  `expression`, and its `title` when set), and `CredentialAccessBoundary` refuses more than 10 rules
  (`InvalidValue`), which `access_boundary` words as a BoundaryError. A run's is built once, by `boundary` before
  the run starts: what was checked is what its Downscoper sends.
- The exchange is its STS client, `google.oauth2.sts.Client(endpoint).exchange_token`, called with what
  `downscoped.Credentials.refresh` passes it: grant_type token-exchange, subject and requested token types
  access_token, the VM's token as the subject, the boundary's JSON as `additional_options`. It POSTs that
  form-encoded (`options` the JSON, URL-quoted; empty fields left out), with no Authorization header, through
  `google.auth.transport.requests.Request`: the sts.v1 discovery document's `sts.token`, POST
  https://sts.googleapis.com/v1/token with a GoogleIdentityStsV1ExchangeTokenRequest (grantType,
  requestedTokenType, subjectToken, subjectTokenType required; `options` "a serialized JSON object").
  A non-200 answer is an `OAuthError` whose first argument reads `Error code <error>: <error_description>`
  (google/oauth2/utils.py handle_error_response), a request that got no answer a `TransportError`.
  `downscoped.Credentials` itself is not used: its endpoint is `https://sts.{universe_domain}/v1/token`,
  fixed when it is made (`_STS_TOKEN_URL_PATTERN`), so the tests' STS stand-in on loopback could not answer
  it; the client takes its endpoint as an argument (`STS_URL` here, `TPU_PLATFORM_STS_URL` in a sandbox).

A downscoped token lives no longer than the token it came from (google-auth's refresh: "the same expiration
time as the source credentials"; the discovery document: `expires_in` is absent when "the access token has
the same expiration time as the `subject_token`"), so a run's token ends at the earlier of the two, and is
exchanged again, from a fresh VM token, before it does.

google-auth is imported when first used, as in vm_agent/gcs.py: vm_agent/tpu_probe.py imports this module
on a probe node's own python3, which has none of it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from run_contract.cel import objects_under

from vm_agent.gcs import StorageError, fresh_token, split_gs

if TYPE_CHECKING:
    from google.auth.downscoped import AccessBoundaryRule, CredentialAccessBoundary

STS_URL = "https://sts.googleapis.com/v1/token"
# The sts.v1 discovery document's values for a downscoping exchange (google-auth's downscoped.py holds the same
# three, as private names).
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
WRITE = "inRole:roles/storage.objectAdmin"  # an upper bound: IAM's own grant (objectUser) is what holds
READ = "inRole:roles/storage.objectViewer"
REFRESH_BEFORE_S = 300.0  # a token closer than this to its end is exchanged again
# "The maximum length of the expression field is 2048 characters" (the STS API reference, AccessBoundaryRule
# availabilityCondition: cloud.google.com/iam/docs/reference/sts/rest/v1/AccessBoundary).
MAX_EXPRESSION = 2048
EXCHANGE_TIMEOUT_S = 30  # a run waits on its token (the transport's own default is 120 s)


class BoundaryError(ValueError):
    """A run whose objects cannot be named in one boundary (too many rules, a URL that is not gs://)."""


def _prefix(url: str, folder: bool) -> tuple[str, str]:
    bucket, name = split_gs(url)
    if not bucket:
        raise BoundaryError(f"{url!r} names no bucket")
    return bucket, (f"{name}/" if folder else name) if name else ""


def rule(url: str, permission: str, title: str, folder: bool = True) -> AccessBoundaryRule:
    """One rule: the objects under the gs:// URL `url` (and listing them), up to `permission`. `folder`: `url`
    is a folder (`<url>/...` only); else an object or a folder (data: one .npz or a folder of shards)."""
    from google.auth import downscoped

    bucket, prefix = _prefix(url, folder)
    condition = None
    if prefix:
        expression = objects_under(bucket, prefix)
        if len(expression) > MAX_EXPRESSION:
            raise BoundaryError(
                f"the condition for {url!r} is {len(expression)} characters; STS takes {MAX_EXPRESSION}"
            )
        condition = downscoped.AvailabilityCondition(expression, title=title)
    return downscoped.AccessBoundaryRule(
        f"//storage.googleapis.com/projects/_/buckets/{bucket}", [permission], condition
    )


def access_boundary(rules: Sequence[AccessBoundaryRule]) -> CredentialAccessBoundary:
    """google-auth's boundary of `rules`; a BoundaryError for what it refuses (more than 10 rules)."""
    from google.auth import downscoped, exceptions

    try:
        return downscoped.CredentialAccessBoundary(list(rules))
    except exceptions.GoogleAuthError as error:
        raise BoundaryError(f"{len(rules)} access boundary rules: {error}") from None


def boundary(checkpoint_dir: str, model_dir: str, data: str) -> CredentialAccessBoundary | None:
    """One run's boundary, built (and so checked) once, before the run starts rather than at its first token;
    None when it touches no object (it then gets no token at all)."""
    rules = []
    if checkpoint_dir:
        rules.append(rule(checkpoint_dir, WRITE, "this run's checkpoints"))
    if model_dir:
        rules.append(rule(model_dir, WRITE, "this run's model"))
    if data:
        rules.append(rule(data.rstrip("/"), READ, "this run's data", folder=False))
    return access_boundary(rules) if rules else None


@dataclass
class Issued:
    token: str
    expires_at: float  # time.monotonic()


class Downscoper:
    """Downscoped tokens for one boundary (`boundary` or `access_boundary`), exchanged again from a fresh VM token
    before they expire. `credentials`: google-auth credentials of the source account (vm_agent/gcs.py
    vm_credentials)."""

    def __init__(self, within: CredentialAccessBoundary, credentials: Any, sts_url: str = STS_URL):
        self.options = within.to_json()
        self.credentials = credentials
        self.sts_url = sts_url
        self._issued: Issued | None = None
        self._lock = threading.Lock()

    def token(self) -> Issued:
        """The current token; StorageError when STS refuses the exchange or cannot be reached."""
        from google.auth import exceptions
        from google.auth.transport.requests import Request
        from google.oauth2 import sts

        with self._lock:
            now = time.monotonic()
            if self._issued is not None and self._issued.expires_at - now > REFRESH_BEFORE_S:
                return self._issued
            subject, source_left = fresh_token(self.credentials)
            try:
                answer = sts.Client(self.sts_url).exchange_token(
                    functools.partial(Request(), timeout=EXCHANGE_TIMEOUT_S),
                    grant_type=GRANT_TYPE,
                    subject_token=subject,
                    subject_token_type=ACCESS_TOKEN_TYPE,
                    requested_token_type=ACCESS_TOKEN_TYPE,
                    additional_options=self.options,
                )
            except exceptions.OAuthError as error:
                raise StorageError(f"STS refused the token exchange: {error.args[0]}"[:400]) from None
            except (exceptions.GoogleAuthError, OSError, ValueError) as error:  # ValueError: a 200 that is not JSON
                raise StorageError(f"STS token exchange: {error}"[:400]) from None
            token = answer.get("access_token") if isinstance(answer, dict) else None
            if not isinstance(token, str) or not token:
                given = sorted(answer) if isinstance(answer, dict) else type(answer).__name__
                raise StorageError(f"STS token exchange: an answer without an access_token ({given})")
            try:
                lifetime = float(answer.get("expires_in") or source_left)
            except (TypeError, ValueError):
                raise StorageError(f"STS token exchange: expires_in {answer['expires_in']!r} is not seconds") from None
            self._issued = Issued(token, now + min(lifetime, source_left))
            return self._issued
