"""Queued TPU capacity: a Pulumi dynamic provider over the TPU API's `queuedResources`.

Why a dynamic provider: pulumi-gcp 10.2.0's `gcp.tpu.V2QueuedResource` (beta-only in the Terraform
provider it is bridged from) takes a node spec of runtime version, accelerator type, description and
network config only (`pulumi_gcp/tpu/_inputs.py`, `V2QueuedResourceTpuNodeSpecNodeArgs`): no
metadata (our start-up script), no service account, no spot, reservation or multislice. Without
them a queued VM would run as the default Compute Engine account with no workload. The REST API has
them all (`tpu.v2.json`), so this module sends the bodies `infra.tpu.queued_api` builds, and the
tests check each one against that discovery document.

What each Pulumi operation does (docs/queued-capacity.md):
- create (`pulumi up`): POST queuedResources in the primary zone. A stock-out (HTTP error or
  operation error with a capacity code, or the request going FAILED for capacity) deletes what was
  made there and moves to the next fallback zone. In a zone with a fallback after it, the request
  may wait up to `fallback_wait_s` for ACTIVE before it is withdrawn and the next zone tried; in the
  last zone it waits at most `settle_wait_s` and then returns with the request still queued
  (WAITING_FOR_RESOURCES / PROVISIONING) in state: `up` never blocks for the hours a queue can take.
  The zone it got is an output (`zone`) and part of the id, so state says where the TPUs are.
- read (`pulumi refresh`): GET; records state, who caused it (USER / SERVICE) and the failure. A
  request that is gone (404) leaves state, so the next `up` creates it again.
- diff: a FAILED, SUSPENDING or SUSPENDED request (failed, preempted, or past its flex-start run
  duration) is replaced: it never comes back by itself (tpu-facts.md). Every input change replaces
  too: the API has no update method for queued resources (tpu.v2.json: create, delete, get, list,
  reset), and patching the nodes would leave the request disagreeing with them. Fallback zones may
  change without replacement while the zone it got stays listed with the same subnet.
- delete (`pulumi destroy`, and before each replacement): DELETE with `force=true`, which deletes the
  request's nodes first (tpu.v2.json queuedResources.delete `force`), then waits for the operation.

Authentication: Application Default Credentials (google-auth), in the process that runs the
provider on the deployer's machine or in CI. `TPU_API_BASE_URL` overrides the endpoint (tests point
it at a stand-in on loopback).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic
from pulumi.dynamic.dynamic import PROVIDER_KEY

from infra.tpu import queued_api as api
from infra.tpu.backend import TpuNodeSpec

BASE_URL_ENV = "TPU_API_BASE_URL"

# Outputs the provider computes; declared as None so Pulumi exposes them on the resource.
COMPUTED = ("zone", "name", "apiVersion", "state", "stateInitiator", "failure", "nodeNames", "skippedZones")
# Inputs that may change without touching the live request (see `diff`).
_ZONES = "zones"


class QueuedTpuError(Exception):
    pass


class TpuApiError(QueuedTpuError):
    def __init__(self, http_status: int, code: int | None, message: str):
        super().__init__(f"TPU API {http_status}: {message}")
        self.http_status = http_status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PollSettings:
    """How long the provider waits; tests shrink every figure to fractions of a second."""

    interval_s: float = 15.0
    operation_timeout_s: float = 900.0  # a create/delete operation; TPU slices take minutes
    fallback_wait_s: float = 900.0  # in a zone with a fallback after it: wait this long for ACTIVE
    settle_wait_s: float = 300.0  # in the last zone: wait this long, then return still queued


# google.rpc.Code names an HTTP error body may carry in `error.status` (google/rpc/code.proto).
_RPC_CODES = {"RESOURCE_EXHAUSTED": api.RESOURCE_EXHAUSTED, "FAILED_PRECONDITION": api.FAILED_PRECONDITION}


class TpuApi:
    """The few queuedResources / operations calls, over an HTTP session (requests-compatible)."""

    def __init__(self, session: Any, base_url: str, poll: PollSettings):
        self.session = session
        self.base_url = base_url
        self.poll = poll

    def _call(self, method: str, url: str, params: Mapping[str, str] | None = None, body: Any = None) -> Any:
        resp = self.session.request(method, url, params=params, json=body, timeout=60)
        if resp.status_code >= 400:
            try:
                err = resp.json().get("error", {})
            except ValueError:
                err = {}
            code = _RPC_CODES.get(err.get("status", ""))
            raise TpuApiError(resp.status_code, code, err.get("message") or resp.text[:500])
        return resp.json() if resp.content else {}

    def create(self, req: api.QueuedRequest, zone: str) -> dict[str, Any]:
        url, params = api.create_url(self.base_url, req, zone)
        return self._call("POST", url, params, api.create_body(req, zone))

    def get(self, version: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", api.resource_url(self.base_url, version, name))
        except TpuApiError as e:
            if e.http_status == 404:
                return None
            raise

    def delete(self, version: str, name: str) -> None:
        """Delete a queued resource and its nodes (`force=true`), and wait until it is gone."""
        try:
            op = self._call("DELETE", api.resource_url(self.base_url, version, name), {"force": "true"})
        except TpuApiError as e:
            if e.http_status == 404:
                return
            raise
        op = self.wait(version, op)
        if op.get("error"):
            raise QueuedTpuError(f"deleting {name} failed: {op['error'].get('message', op['error'])}")

    def wait(self, version: str, op: dict[str, Any]) -> dict[str, Any]:
        """Poll a long-running operation until done (or `operation_timeout_s`)."""
        deadline = time.monotonic() + self.poll.operation_timeout_s
        while not op.get("done"):
            if time.monotonic() > deadline:
                raise QueuedTpuError(f"operation {op.get('name')} not done after {self.poll.operation_timeout_s}s")
            time.sleep(self.poll.interval_s)
            op = self._call("GET", api.resource_url(self.base_url, version, op["name"]))
        return op


def default_session() -> Any:
    """An HTTP session authorised by Application Default Credentials."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(scopes=[api.CLOUD_PLATFORM_SCOPE])
    return AuthorizedSession(credentials)


def request_from_props(props: Mapping[str, Any]) -> api.QueuedRequest:
    return api.QueuedRequest(
        queued_resource_id=props["queuedResourceId"],
        project=props["project"],
        zones=tuple(api.QueuedZone(z["zone"], z["subnetwork"]) for z in props["zones"]),
        accelerator_type=props["acceleratorType"],
        runtime_version=props["runtimeVersion"],
        provisioning=props["provisioning"],
        service_account_email=props["serviceAccountEmail"],
        network=props["network"],
        reservation_name=props.get("reservationName") or "",
        node_count=int(1 if props.get("nodeCount") is None else props["nodeCount"]),
        max_run_duration_s=int(props.get("maxRunDurationSeconds") or 0),
        secure_boot=bool(props.get("secureBoot")),
        metadata=dict(props.get("metadata") or {}),
        labels=dict(props.get("labels") or {}),
        tags=tuple(props.get("tags") or ()),
        description=props.get("description") or "",
    )


class QueuedTpuProvider(pulumi.dynamic.ResourceProvider):
    def __init__(self, poll: PollSettings | None = None, session_factory: Callable[[], Any] | None = None):
        super().__init__()
        self.poll = poll or PollSettings()
        # None in real use (ADC at run time); tests pass a plain session for the loopback stand-in.
        self.session_factory = session_factory

    def _api(self) -> TpuApi:
        session = (self.session_factory or default_session)()
        return TpuApi(session, os.environ.get(BASE_URL_ENV) or api.DEFAULT_BASE_URL, self.poll)

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        try:
            found = api.problems(request_from_props(news))
        except (KeyError, TypeError, ValueError) as e:
            found = [f"malformed queued TPU inputs: {e!r}"]
        failures = [pulumi.dynamic.CheckFailure("queuedResourceId", p) for p in found]
        return pulumi.dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        req = request_from_props(props)
        found = api.problems(req)
        if found:
            raise QueuedTpuError("; ".join(found))
        tpu = self._api()
        skipped: list[str] = []
        for i, z in enumerate(req.zones):
            last = i == len(req.zones) - 1
            name = api.queued_resource_name(req, z.zone)
            got = self._try_zone(tpu, req, z.zone, name, last, skipped)
            if got is not None:
                return pulumi.dynamic.CreateResult(name, self._outs(props, req, z.zone, got, skipped))
        raise QueuedTpuError(
            f"queued TPU {req.queued_resource_id}: no capacity in any zone tried ({'; '.join(skipped)})"
        )

    def _try_zone(
        self, tpu: TpuApi, req: api.QueuedRequest, zone: str, name: str, last: bool, skipped: list[str]
    ) -> dict[str, Any] | None:
        """The request as it stands in `zone`, or None after a stock-out there (noted in `skipped`)."""
        try:
            op = tpu.create(req, zone)
        except TpuApiError as e:
            if api.is_capacity_error(e.code, e.message):
                skipped.append(f"{zone}: {e.message}")
                return None
            raise
        try:
            return self._settle(tpu, req, zone, name, tpu.wait(req.api_version, op), last, skipped)
        except BaseException:
            # Never leave a request queued (or TPUs running) that state does not know about.
            _best_effort(lambda: tpu.delete(req.api_version, name))
            raise

    def _settle(
        self,
        tpu: TpuApi,
        req: api.QueuedRequest,
        zone: str,
        name: str,
        op: dict[str, Any],
        last: bool,
        skipped: list[str],
    ) -> dict[str, Any] | None:
        err = op.get("error")
        if err:
            if api.is_capacity_error(err.get("code"), err.get("message", "")):
                skipped.append(f"{zone}: {err.get('message', '')}")
                tpu.delete(req.api_version, name)  # an accepted-then-failed request may linger
                return None
            raise QueuedTpuError(f"creating {name} failed: {err.get('code')}: {err.get('message')}")
        wait_s = self.poll.settle_wait_s if last else self.poll.fallback_wait_s
        deadline = time.monotonic() + wait_s
        while True:
            current = tpu.get(req.api_version, name)
            if current is None:
                raise QueuedTpuError(f"{name} vanished while being created")
            state, _, failure = api.state_of(current)
            if state == api.ACTIVE:
                return current
            if state == "FAILED":
                if api.failed_for_capacity(current):
                    skipped.append(f"{zone}: {failure}")
                    tpu.delete(req.api_version, name)
                    return None
                raise QueuedTpuError(f"{name} FAILED: {failure}")
            if time.monotonic() >= deadline:
                if last:
                    return current  # queued: `up` returns; `refresh` follows it later
                skipped.append(f"{zone}: still {state} after {wait_s:g}s")
                tpu.delete(req.api_version, name)
                return None
            time.sleep(self.poll.interval_s)

    def _outs(
        self,
        props: Mapping[str, Any],
        req: api.QueuedRequest,
        zone: str,
        current: Mapping[str, Any],
        skipped: Sequence[str],
    ) -> dict[str, Any]:
        state, initiator, failure = api.state_of(current)
        return {
            **props,
            "zone": zone,
            "name": api.queued_resource_name(req, zone),
            "apiVersion": req.api_version,
            "state": state,
            "stateInitiator": initiator,
            "failure": failure,
            "nodeNames": api.node_names(req, zone),
            "skippedZones": list(skipped),
        }

    def read(self, id_: str, props: dict[str, Any]) -> pulumi.dynamic.ReadResult:
        version = props.get("apiVersion") or api.STABLE_API
        current = self._api().get(version, id_)
        if current is None:
            return pulumi.dynamic.ReadResult("", {})  # gone: dropped from state, re-created by `up`
        state, initiator, failure = api.state_of(current)
        outs = {**props, "state": state, "stateInitiator": initiator, "failure": failure}
        return pulumi.dynamic.ReadResult(id_, outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        replaces = [
            k
            for k in sorted(set(olds) | set(news))
            if k not in COMPUTED and k != _ZONES and k != PROVIDER_KEY and olds.get(k) != news.get(k)
        ]
        zones_changed = olds.get(_ZONES) != news.get(_ZONES)
        if zones_changed and not _still_allowed(olds, news.get(_ZONES)):
            replaces.append(_ZONES)
        if olds.get("state") in api.DEAD_STATES:
            replaces.append("state")
        return pulumi.dynamic.DiffResult(
            changes=bool(replaces) or zones_changed,
            replaces=replaces,
            # Same queued resource id and node ids: the old request must be gone first.
            delete_before_replace=True,
        )

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        # Only the fallback zones changed, and the zone it got is still allowed: nothing to send.
        return pulumi.dynamic.UpdateResult({**olds, _ZONES: news[_ZONES]})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        self._api().delete(props.get("apiVersion") or api.STABLE_API, id_)


def _still_allowed(olds: Mapping[str, Any], new_zones: Any) -> bool:
    """Whether the zone the request got is still listed, with the same subnet."""
    if not isinstance(new_zones, list):
        return False  # unknown during preview: assume the worst
    got = olds.get("zone")
    old = {z["zone"]: z["subnetwork"] for z in olds.get(_ZONES) or []}
    new = {z.get("zone"): z.get("subnetwork") for z in new_zones if isinstance(z, dict)}
    return got in new and new[got] == old.get(got)


def _best_effort(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception as e:  # the original error is the one to report
        pulumi.log.warn(f"clean-up after a failed queued TPU create also failed: {e}")


class QueuedTpu(pulumi.dynamic.Resource, module="tpu", name="QueuedResource"):
    """A queued TPU request (one slice, or `nodeCount` slices) as a Pulumi resource."""

    zone: pulumi.Output[str]
    state: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        props: Mapping[str, Any],
        opts: pulumi.ResourceOptions | None = None,
        provider: QueuedTpuProvider | None = None,
    ):
        super().__init__(provider or QueuedTpuProvider(), resource_name, {**props, **dict.fromkeys(COMPUTED)}, opts)


@dataclass(frozen=True)
class QueuedCapacity:
    """What a queued VM asks for beyond `TpuNodeSpec` (the lead maps stack settings onto this)."""

    fallback_zones: tuple[tuple[str, pulumi.Input[str]], ...] = ()  # (zone, subnetwork id), in order
    node_count: int = 1
    reservation_name: str = ""
    max_run_duration_s: int = 0  # flex-start
    provisioning: str = ""  # overrides spec.provisioning, e.g. "flex-start"; "" = spec's


def props_for(spec: TpuNodeSpec, capacity: QueuedCapacity) -> dict[str, Any]:
    zones = [{"zone": spec.zone, "subnetwork": spec.subnetwork}] + [
        {"zone": z, "subnetwork": s} for z, s in capacity.fallback_zones
    ]
    return {
        "queuedResourceId": spec.node_id,
        "project": spec.project,
        "zones": zones,
        "acceleratorType": spec.accelerator_type,
        "runtimeVersion": spec.runtime_version,
        "provisioning": capacity.provisioning or spec.provisioning,
        "serviceAccountEmail": spec.service_account_email,
        "network": spec.network,
        "reservationName": capacity.reservation_name,
        "nodeCount": capacity.node_count,
        "maxRunDurationSeconds": capacity.max_run_duration_s,
        "secureBoot": spec.secure_boot,
        "metadata": dict(spec.metadata),
        "labels": dict(spec.labels),
        "tags": list(spec.tags),
        "description": spec.description,
    }


class QueuedTpuBackend:
    """`TpuBackend` for `capacity: queued`. `create_node` keeps the protocol's signature; the queued
    options come as an extra argument (defaults: one slice, the VM's own zone only)."""

    name = "queued"

    def __init__(self, provider: QueuedTpuProvider | None = None):
        self.provider = provider

    def create_node(
        self,
        resource_name: str,
        spec: TpuNodeSpec,
        opts: pulumi.ResourceOptions,
        capacity: QueuedCapacity | None = None,
    ) -> QueuedTpu:
        return QueuedTpu(resource_name, props_for(spec, capacity or QueuedCapacity()), opts, self.provider)
