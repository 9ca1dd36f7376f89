"""Where the stack's desired run comes from: the metadata source (the run spec and its parser are the run
contract's: run_contract/spec.py)."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Protocol

from run_contract.spec import RUN_ATTRIBUTE, Allowed, RunSpec, StopRequest, parse_run_spec


class RunSource(Protocol):
    def next(self, timeout_s: float) -> RunSpec | StopRequest | None: ...  # None: nothing new


Fetch = Callable[[str, float], tuple[int, str, str]]  # url, timeout -> (status, ETag, body)


def _fetch(url: str, timeout: float) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("ETag", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("ETag", "") if error.headers else "", ""


class MetadataSource:
    """The stack's desired run: the instance attribute `tpu-platform-run`, waited on for changes.

    Compute Engine's metadata server holds a request with `wait_for_change=true` until the value
    differs from the one whose `ETag` is passed as `last_etag`, or until `timeout_sec` passes, when it
    answers with the current value (https://cloud.google.com/compute/docs/metadata/querying-metadata,
    "Wait for changes"). Google's guest agent starts with `last_etag=NONE`, which never matches, so
    the first request answers at once (GoogleCloudPlatform/guest-agent, metadata/metadata.go). An
    attribute that does not exist answers 404 at once: then the source asks again every 10 s at most."""

    def __init__(
        self,
        base_url: str,
        allowed: Allowed,
        attribute: str = RUN_ATTRIBUTE,
        fetch: Fetch = _fetch,
        log: Callable[..., None] = lambda *a, **k: None,
    ):
        self.base_url = base_url.rstrip("/")
        self.allowed = allowed
        self.attribute = attribute
        self.etag = "NONE"
        self.text: str | None = None  # the last value seen; None: absent
        self.current = ""  # run id of the last spec taken from here
        self._fetch = fetch
        self._log = log

    def next(self, timeout_s: float) -> RunSpec | StopRequest | None:
        wait = max(1, int(timeout_s))
        query = urllib.parse.urlencode({"wait_for_change": "true", "last_etag": self.etag, "timeout_sec": wait})
        url = f"{self.base_url}/instance/attributes/{self.attribute}?{query}"
        try:
            status, etag, body = self._fetch(url, wait + 10)
        except (urllib.error.URLError, OSError) as error:
            # Maintenance can make the server answer 503 or not at all for a moment (same page).
            self._log(f"metadata server unreachable: {error}", severity="WARNING")
            time.sleep(min(wait, 5))
            return None
        if status == 404:
            self.etag = "NONE"
            if self.text is not None:
                self.text = None
                if self.current:
                    stopped, self.current = self.current, ""
                    return StopRequest(stopped)
            time.sleep(min(wait, 10))  # nothing to wait on: ask again soon
            return None
        if status != 200:
            self._log(f"metadata server answered HTTP {status} for {self.attribute}", severity="WARNING")
            time.sleep(min(wait, 5))
            return None
        self.etag = etag or "NONE"
        if body == self.text:
            return None  # timed out unchanged, or changed and changed back
        self.text = body
        if not body.strip():
            if self.current:
                stopped, self.current = self.current, ""
                return StopRequest(stopped)
            return None
        spec = parse_run_spec(body, self.allowed, f"metadata {self.attribute}")
        self.current = spec.run_id
        return spec
