"""Queued TPU requests as plain data: the spec, its checks, and the exact TPU API bodies and paths.

Pure: no Pulumi, no HTTP. The dynamic provider in `infra.tpu.queued` sends what this module builds;
the tests check every body and path against Google's discovery documents (`tpu.v2.json`,
`tpu.v2alpha1.json` in google-api-python-client).

Field mapping, as gcloud builds the same request (`googlecloudsdk/command_lib/compute/tpus/
queued_resources/util.py`, Cloud SDK 528): `--spot` sets the queued resource's empty `spot` tier;
`--reserved` on v2 sets `reservationName` to `projects/P/locations/ZONE/reservations/-` (any
reservation of the project in that zone) and `--reservation NAME` the full name of one reservation;
`--node-count/--node-prefix` set `multisliceParams` on v2 and `multiNodeParams` on v2alpha1;
`--provisioning-model=flex-start --max-run-duration` exist only on v2alpha1 (`provisioningModel`,
`runDuration.maxRunDuration`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra import naming

DEFAULT_BASE_URL = "https://tpu.googleapis.com/"
STABLE_API = "v2"
# Flex-start exists only here (tpu.v2alpha1.json: QueuedResource.provisioningModel FLEX_START, runDuration).
FLEX_START_API = "v2alpha1"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# What a queued request may ask for. Preemptible is absent: gcloud's queued-resources create has no
# such flag, and Spot replaced it (Google: "preemptible TPUs" are the legacy model).
PROVISIONING = ("on-demand", "spot", "reserved", "flex-start")

# tpu.v2.json NodeSpec.nodeId / MultisliceParams.nodeIdPrefix: `^[A-Za-z0-9_.~+%-]+$`.
_NODE_ID = re.compile(r"^[A-Za-z0-9_.~+%-]+$")
# gcloud's short reservation name pattern (CreateReservationName).
_RESERVATION = re.compile(r"^[a-zA-Z0-9-]+$")

# States (tpu.v2.json QueuedResourceState.state).
WAITING_STATES = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING")
ACTIVE = "ACTIVE"
# Nothing runs and nothing will by itself: only delete and re-create brings the TPUs back
# (tpu-facts.md; QueuedResourceState: SUSPENDED = "resources ... have been deleted").
DEAD_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")


@dataclass(frozen=True)
class QueuedZone:
    zone: str
    subnetwork: str


@dataclass(frozen=True)
class QueuedRequest:
    """One queued request: a slice (or `node_count` slices) tried in `zones` order."""

    queued_resource_id: str
    project: str
    zones: tuple[QueuedZone, ...]  # the primary zone first, then the fallback zones
    accelerator_type: str
    runtime_version: str
    provisioning: str  # one of PROVISIONING
    service_account_email: str
    network: str
    reservation_name: str = ""  # short name of a reservation in the (single) zone; "" = none named
    node_count: int = 1  # > 1: multislice, nodes `<queued_resource_id>-0` … `-<n-1>`
    max_run_duration_s: int = 0  # flex-start only
    secure_boot: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    tags: Sequence[str] = ()
    description: str = ""

    @property
    def api_version(self) -> str:
        return api_version(self.provisioning)

    @property
    def multislice(self) -> bool:
        return self.node_count > 1


def api_version(provisioning: str) -> str:
    """The TPU API version a queued request is made, read and deleted through."""
    return FLEX_START_API if provisioning == "flex-start" else STABLE_API


def problems(req: QueuedRequest) -> list[str]:
    """Every reason `req` cannot be sent, each naming the key, the value and what is allowed."""
    out: list[str] = []
    if not _NODE_ID.match(req.queued_resource_id):
        out.append(f"name {req.queued_resource_id!r}: allowed characters are A-Z a-z 0-9 _ . ~ + % -")
    if not req.zones:
        out.append("zones: at least the VM's own zone is required")
    names = [z.zone for z in req.zones]
    if len(set(names)) != len(names):
        out.append(f"fallbackZones {names}: each zone may appear once, and not repeat the VM's zone")
    for z in req.zones:
        if not z.subnetwork:
            out.append(f"fallbackZones: zone {z.zone!r} has no subnetwork; give its region a subnet")
    if req.provisioning not in PROVISIONING:
        out.append(f"provisioning {req.provisioning!r}: a queued request allows {', '.join(PROVISIONING)}")
    if req.node_count < 1:
        out.append(f"nodeCount {req.node_count}: must be 1 (one slice) or more (multislice)")
    if req.reservation_name:
        if req.provisioning != "reserved":
            out.append(
                f"reservationName {req.reservation_name!r}: needs provisioning 'reserved', not {req.provisioning!r}"
            )
        if not _RESERVATION.match(req.reservation_name):
            out.append(f"reservationName {req.reservation_name!r}: a short name of letters, digits and '-'")
        if len(req.zones) > 1:
            # A reservation lives in one zone (its name is projects/P/locations/ZONE/reservations/R).
            out.append(
                f"reservationName {req.reservation_name!r} with fallbackZones {names[1:]}: a reservation"
                " belongs to one zone; drop the fallback zones"
            )
    if req.provisioning == "flex-start" and req.max_run_duration_s <= 0:
        out.append("runDuration: flex-start needs a maximum run duration (seconds > 0)")
    if req.provisioning != "flex-start" and req.max_run_duration_s:
        out.append(f"runDuration {req.max_run_duration_s}: only flex-start takes a run duration")
    return out


def parent(project: str, zone: str) -> str:
    return f"projects/{project}/locations/{zone}"


def queued_resource_name(req: QueuedRequest, zone: str) -> str:
    return f"{parent(req.project, zone)}/queuedResources/{req.queued_resource_id}"


def node_ids(req: QueuedRequest) -> list[str]:
    """The nodes the request creates (its id is the multislice's nodeIdPrefix)."""
    return naming.node_ids(req.queued_resource_id, req.node_count)


def node_names(req: QueuedRequest, zone: str) -> list[str]:
    return [f"{parent(req.project, zone)}/nodes/{n}" for n in node_ids(req)]


def reservation_path(req: QueuedRequest, zone: str) -> str:
    # `-` = any reservation of the project in this zone (gcloud's `--reserved` on v2).
    return f"projects/{req.project}/locations/{zone}/reservations/{req.reservation_name or '-'}"


def create_url(base_url: str, req: QueuedRequest, zone: str) -> tuple[str, dict[str, str]]:
    """The queuedResources.create URL and its query (`queuedResourceId`)."""
    return (
        f"{base_url.rstrip('/')}/{req.api_version}/{parent(req.project, zone)}/queuedResources",
        {"queuedResourceId": req.queued_resource_id},
    )


def resource_url(base_url: str, api_version: str, name: str) -> str:
    """URL of a queued resource or an operation, by its full name (get / delete)."""
    return f"{base_url.rstrip('/')}/{api_version}/{name}"


def create_body(req: QueuedRequest, zone: str) -> dict[str, Any]:
    """The `QueuedResource` body of queuedResources.create for `zone` (one of `req.zones`)."""
    subnet = next(z.subnetwork for z in req.zones if z.zone == zone)
    node: dict[str, Any] = {
        "acceleratorType": req.accelerator_type,
        "runtimeVersion": req.runtime_version,
        "networkConfig": {
            "network": req.network,
            "subnetwork": subnet,
            "enableExternalIps": False,
            "canIpForward": False,
        },
        # Access is limited by the account's IAM roles; the scope only has to allow them.
        "serviceAccount": {"email": req.service_account_email, "scope": [CLOUD_PLATFORM_SCOPE]},
        "metadata": dict(req.metadata),
        "labels": dict(req.labels),
        "tags": list(req.tags),
    }
    if req.description:
        node["description"] = req.description
    if req.secure_boot:
        node["shieldedInstanceConfig"] = {"enableSecureBoot": True}
    spec: dict[str, Any] = {"parent": parent(req.project, zone), "node": node}
    if req.multislice:
        # Renamed between versions (gcloud util.py: "MultiNodeParams was renamed to MultisliceParams").
        key = "multisliceParams" if req.api_version == STABLE_API else "multiNodeParams"
        spec[key] = {"nodeCount": req.node_count, "nodeIdPrefix": req.queued_resource_id}
    else:
        spec["nodeId"] = req.queued_resource_id
    body: dict[str, Any] = {"tpu": {"nodeSpec": [spec]}}
    if req.provisioning == "spot":
        body["spot"] = {}
    elif req.provisioning == "reserved":
        body["reservationName"] = reservation_path(req, zone)
    elif req.provisioning == "flex-start":
        body["provisioningModel"] = "FLEX_START"
        body["runDuration"] = {"maxRunDuration": f"{req.max_run_duration_s}s"}
    return body


# google.rpc.Code values (google/rpc/code.proto).
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9


def is_capacity_error(code: int | None, message: str) -> bool:
    """Whether a zone said "no capacity here", so the next zone is worth a try.

    The TPU API reports a stock-out as google.rpc code 8, e.g. 'There is no more capacity in the zone
    "europe-west4-a"; you can try in another zone …', and a full reservation as code 9 'Insufficient
    reserved capacity' (SkyPilot's GCP failover handler, FailoverCloudErrorHandlerV2._gcp_handler,
    which blocks the zone for codes 8 and 9; magic-modules PR 7297 quotes the same code-8 message).
    Per-zone TPU quota is code 8 too and another zone may have it; API request-rate limits (also
    code 8 / HTTP 429, "per minute") are not about the zone and are not a reason to move.
    """
    text = message.lower()
    if code == RESOURCE_EXHAUSTED:
        return not any(s in text for s in ("per minute", "rate limit", "quota metric"))
    if code == FAILED_PRECONDITION:
        return "capacity" in text
    return False


def state_of(resource: Mapping[str, Any]) -> tuple[str, str, str]:
    """(state, initiator, failure) of a QueuedResource as get returns it."""
    st = resource.get("state") or {}
    failed = (st.get("failedData") or {}).get("error") or {}
    failure = f"{failed.get('code', '')}: {failed.get('message', '')}" if failed else ""
    return st.get("state", "STATE_UNSPECIFIED"), st.get("stateInitiator", ""), failure


def failed_for_capacity(resource: Mapping[str, Any]) -> bool:
    st = resource.get("state") or {}
    err = (st.get("failedData") or {}).get("error") or {}
    return st.get("state") == "FAILED" and is_capacity_error(err.get("code"), err.get("message", ""))
