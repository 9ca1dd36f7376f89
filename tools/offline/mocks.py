"""Pulumi mocks that answer like GCP and record every registration.

Computed outputs are realistic and deterministic (derived from names by hashing), so two plans of
the same stack are identical and a plan reads like `pulumi preview` against a real project.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockCallArgs, MockMonitor, MockResourceArgs
from pulumi.runtime.sync_await import _ensure_event_loop


def _digits(seed: str, count: int) -> str:
    return str(int(hashlib.sha256(seed.encode()).hexdigest(), 16))[:count]


def _hex(seed: str, count: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:count]


def _dns_endpoint(project: str, location: str, cluster: str) -> str:
    """The DNS endpoint the mocks give a GKE cluster: the Cluster resource's and the getCluster lookup's."""
    return f"gke-{_hex(f'{project}/{location}/{cluster}', 32)}-{project_number(project)}.{location}.gke.goog"


def project_number(project: str) -> str:
    return "1" + _digits(project, 11)


def match_glob(glob: str) -> re.Pattern[str]:
    """Cloud Storage's `matchGlob` ("List objects: filter by object name"): `*` matches within one
    folder level (no `/`), `**` across levels, `?` one character other than `/`."""
    parts = re.split(r"(\*\*|\*|\?)", glob)
    wild = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wild.get(part, re.escape(part)) for part in parts))


@dataclass
class CloudState:
    """What already exists in the project, as the data sources see it: one table for every lookup.

    A first deploy starts from an empty state; a later deploy from the buckets (and their objects) an
    earlier `up` left behind, completion markers included (`tools/offline/deploys.py`)."""

    buckets: dict[str, dict[str, str]] = field(default_factory=dict)  # bucket -> object name -> text

    def put(self, bucket: str, name: str, text: str = "") -> None:
        self.buckets.setdefault(bucket, {})[name] = text


class GcpMocks(pulumi.runtime.Mocks):
    def __init__(self, default_project: str, state: CloudState | None = None):
        self.default_project = default_project
        self.state = state or CloudState()
        self.invokes: list[tuple[str, dict[str, Any]]] = []

    def call(self, args: MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        inputs = args.args
        self.invokes.append((args.token, dict(inputs)))
        project = inputs.get("projectId") or inputs.get("project") or self.default_project
        buckets = self.state.buckets
        if args.token == "gcp:storage/getBucketObjectContent:getBucketObjectContent":
            content = buckets.get(inputs["bucket"], {}).get(inputs["name"])
            if content is None:
                raise RuntimeError(f"googleapi: Error 404: No such object: {inputs['bucket']}/{inputs['name']}")
            return {"bucket": inputs["bucket"], "name": inputs["name"], "content": content}, []
        if args.token == "gcp:storage/getBuckets:getBuckets":
            prefix = inputs.get("prefix", "")
            found = [{"name": b} for b in sorted(buckets) if b.startswith(prefix)]
            return {"project": project, "prefix": prefix, "buckets": found}, []
        if args.token == "gcp:storage/getBucketObjects:getBucketObjects":
            if inputs["bucket"] not in buckets:
                raise RuntimeError(f"googleapi: Error 404: The specified bucket does not exist: {inputs['bucket']}")
            glob, prefix = inputs.get("matchGlob", "*"), inputs.get("prefix", "")
            names = [n for n in sorted(buckets[inputs["bucket"]]) if n.startswith(prefix)]
            matched = [n for n in names if match_glob(glob).fullmatch(n)]
            return {"bucket": inputs["bucket"], "bucketObjects": [{"name": n} for n in matched]}, []
        if args.token == "gcp:organizations/getProject:getProject":
            return {"projectId": project, "number": project_number(project), "name": project}, []
        if args.token == "gcp:storage/getProjectServiceAccount:getProjectServiceAccount":
            email = f"service-{project_number(project)}@gs-project-accounts.iam.gserviceaccount.com"
            return {"emailAddress": email, "member": f"serviceAccount:{email}", "project": project}, []
        if args.token == "gcp:compute/getDefaultServiceAccount:getDefaultServiceAccount":
            email = f"{project_number(project)}-compute@developer.gserviceaccount.com"
            return {"email": email, "member": f"serviceAccount:{email}", "project": project}, []
        if args.token == "gcp:container/getCluster:getCluster":
            # The cluster as the environment's stack made it (the GKE admin phase looks it up): its DNS
            # endpoint.
            location, name = inputs["location"], inputs["name"]
            dns = _dns_endpoint(project, location, name)
            endpoints = [{"dnsEndpointConfigs": [{"endpoint": dns, "allowExternalTraffic": True}]}]
            return {
                "name": name,
                "location": location,
                "project": project,
                "controlPlaneEndpointsConfigs": endpoints,
            }, []
        raise NotImplementedError(f"offline plan has no mock for the data source {args.token}")

    def new_resource(self, args: MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        project = inputs.get("project", self.default_project)
        state: dict[str, Any] = {"project": project, **inputs}
        name = inputs.get("name") or args.name
        token = args.typ
        if token == "gcp:serviceaccount/account:Account":
            email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            state |= {
                "email": email,
                "member": f"serviceAccount:{email}",
                "name": f"projects/{project}/serviceAccounts/{email}",
                "uniqueId": "1" + _digits(email, 20),
            }
            return f"projects/{project}/serviceAccounts/{email}", state
        if token == "gcp:storage/bucket:Bucket":
            state |= {"url": f"gs://{name}", "selfLink": f"https://www.googleapis.com/storage/v1/b/{name}"}
            return name, state
        if token == "gcp:projects/service:Service":
            return f"{project}/{inputs['service']}", state
        if token == "gcp:billing/budget:Budget":
            budget_id = _hex(f"{self.default_project}/{args.name}/{inputs.get('billingAccount')}", 32)
            state["name"] = f"billingAccounts/{inputs.get('billingAccount')}/budgets/{budget_id}"
            return state["name"], state
        if token == "gcp:monitoring/notificationChannel:NotificationChannel":
            # The server assigns the id once; a renamed (aliased) channel keeps it: seed it by content.
            seed = json.dumps([inputs.get("type"), inputs.get("labels")], sort_keys=True, default=str)
            state["name"] = f"projects/{project}/notificationChannels/{_digits(seed, 19)}"
            return state["name"], state
        if token == "gcp:pubsub/topic:Topic":
            return f"projects/{project}/topics/{name}", state
        if token.startswith("gcp:compute/"):
            kind = {
                "network": "networks",
                "subnetwork": "subnetworks",
                "firewall": "firewalls",
                "router": "routers",
            }.get(token.split("/")[1].split(":")[0].lower())
            if kind:
                region = f"regions/{inputs['region']}/" if "region" in inputs else "global/"
                state["selfLink"] = f"https://www.googleapis.com/compute/v1/projects/{project}/{region}{kind}/{name}"
                state.setdefault("name", name)
                return f"projects/{project}/{region}{kind}/{name}", state
        if token == "gcp:projects/serviceIdentity:ServiceIdentity":
            agent = f"gcp-sa-{inputs['service'].split('.')[0]}"  # Google's pattern for service agents
            state |= {"email": f"service-{project_number(project)}@{agent}.iam.gserviceaccount.com"}
            state["member"] = f"serviceAccount:{state['email']}"
            return f"projects/{project}/services/{inputs['service']}", state
        if token.startswith("gcp:iam/workloadIdentityPool"):
            pools = f"projects/{project_number(project)}/locations/global/workloadIdentityPools"
            state["name"] = f"{pools}/{inputs['workloadIdentityPoolId']}"
            if "workloadIdentityPoolProviderId" in inputs:
                state["name"] += f"/providers/{inputs['workloadIdentityPoolProviderId']}"
            return state["name"], state
        if token == "gcp:cloudfunctionsv2/function:Function":
            state["url"] = f"https://{inputs.get('location')}-{project}.cloudfunctions.net/{name}"
            return f"projects/{project}/locations/{inputs.get('location')}/functions/{name}", state
        if token == "gcp:projects/iAMCustomRole:IAMCustomRole":
            state["name"] = f"projects/{project}/roles/{inputs['roleId']}"
            return state["name"], state
        if token == "gcp:kms/keyRing:KeyRing":
            return f"projects/{project}/locations/{inputs['location']}/keyRings/{inputs['name']}", state
        if token == "gcp:kms/cryptoKey:CryptoKey":
            return f"{inputs['keyRing']}/cryptoKeys/{inputs['name']}", state
        if token == "gcp:tpu/v2Vm:V2Vm":
            state |= {
                "state": "READY",
                "networkEndpoints": [{"ipAddress": f"10.{i}.0.2", "port": 8470} for i in range(1)],
            }
            return f"projects/{project}/locations/{inputs.get('zone')}/nodes/{name}", state
        if token == "gcp:container/cluster:Cluster":
            # What GKE reports once the cluster runs: its DNS endpoint (the one way in: no IP endpoint).
            location = inputs["location"]
            dns = _dns_endpoint(project, location, name)
            config = dict(inputs.get("controlPlaneEndpointsConfig") or {})
            config["dnsEndpointConfig"] = {**(config.get("dnsEndpointConfig") or {}), "endpoint": dns}
            state |= {
                "controlPlaneEndpointsConfig": config,
                "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{name}",
            }
            return f"projects/{project}/locations/{location}/clusters/{name}", state
        if token == "gcp:container/nodePool:NodePool":
            cluster = inputs.get("cluster")
            return f"projects/{project}/locations/{inputs.get('location')}/clusters/{cluster}/nodePools/{name}", state
        if token == "gcp:compute/resourcePolicy:ResourcePolicy":
            region = inputs["region"]
            state["selfLink"] = (
                f"https://www.googleapis.com/compute/v1/projects/{project}/regions/{region}/resourcePolicies/{name}"
            )
            return f"projects/{project}/regions/{region}/resourcePolicies/{name}", state
        if token == "pulumi-python:dynamic/tpu:QueuedResource":
            # What the provider's create returns once the request is ACTIVE in its first zone.
            zone = inputs["zones"][0]["zone"]
            node_id, count = inputs["queuedResourceId"], int(inputs.get("nodeCount") or 1)
            parent = f"projects/{inputs['project']}/locations/{zone}"
            ids = [f"{node_id}-{i}" for i in range(count)] if count > 1 else [node_id]
            state |= {
                "zone": zone,
                "name": f"{parent}/queuedResources/{node_id}",
                "apiVersion": "v2alpha1" if inputs.get("provisioning") == "flex-start" else "v2",
                "state": "ACTIVE",
                "stateInitiator": "",
                "failure": "",
                "nodeNames": [f"{parent}/nodes/{n}" for n in ids],
                "skippedZones": [],
            }
            return state["name"], state
        return f"{args.name}-id", state


@dataclass
class Registration:
    """One resource as the engine would receive it: inputs plus the options that matter to a reviewer."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: list[str] = field(default_factory=list)
    protect: bool = False
    retain_on_delete: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    secret_paths: list[str] = field(default_factory=list)  # inputs the engine received as secrets
    aliases: list[str] = field(default_factory=list)  # earlier URNs of this resource (renames)
    import_id: str = ""  # the `import_` option: an existing resource this one adopts
    provider: str = ""  # the explicit provider's reference (URN::id), when one was given
    remote: bool = False  # a provider's component (kubernetes:yaml/v2:ConfigGroup): its provider makes the calls
    # What the state would hold: the provider's outputs, with the outputs of secret inputs secret too
    # (Pulumi, "Secrets": an output is secret when the input of the same name is).
    state: dict[str, Any] = field(default_factory=dict)


def plain(value: Any) -> Any:
    """Assets and archives as data a plan can print and diff: file names with content digests."""
    if isinstance(value, pulumi.FileAsset):
        path = Path(value.path)
        digest = path.name.removesuffix(".tar.gz")
        # An archive named by its sha256 (infra/artifacts.py) is not read: the agent's wheelhouse need not be
        # built for a plan (`make agent-wheelhouse` builds it for `pulumi up`).
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        return {"file": path.name, "sha256": digest[:16]}
    if isinstance(value, pulumi.StringAsset):
        return {"text": True, "sha256": hashlib.sha256(value.text.encode()).hexdigest()[:16]}
    if isinstance(value, pulumi.AssetArchive):
        return {"archive": {name: plain(v) for name, v in sorted(value.assets.items())}}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


SECRET = "[secret]"


def masked(value: Any, path: str = "", found: list[str] | None = None) -> Any:
    """`value` with each secret (the engine's secret sentinel) replaced by "[secret]", its path noted."""
    found = found if found is not None else []
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            found.append(path or ".")
            return SECRET
        return {k: masked(v, f"{path}.{k}" if path else k, found) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, f"{path}[{i}]", found) for i, v in enumerate(value)]
    return value


def _alias_urns(urn: str, request: Any) -> list[str]:
    """The URNs a renamed resource was known by: its own URN with the alias's name (and type)."""
    head, _, name = urn.rpartition("::")
    prefix, _, token = head.rpartition("$") if "$" in head else head.rpartition("::")
    sep = "$" if "$" in head else "::"
    out = list(request.aliasURNs)
    for alias in request.aliases:
        spec = alias.spec
        if alias.urn:
            out.append(alias.urn)
        elif spec.name or spec.type:
            out.append(f"{prefix}{sep}{spec.type or token}::{spec.name or name}")
    return out


def _state(response: Any, secret_paths: list[str]) -> dict[str, Any]:
    state = plain(masked(rpc.deserialize_properties(response.object)))
    for path in secret_paths:
        key = path.split(".", 1)[0].split("[", 1)[0]
        if key in state:
            state[key] = SECRET
    return state


class RecordingMonitor(MockMonitor):
    """Records each registration as a plan shows it: secrets masked, as `pulumi preview` masks them."""

    def __init__(self, mocks: GcpMocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):  # noqa: N802 - the gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            _ensure_event_loop()
            secret_paths: list[str] = []
            inputs = masked(rpc.deserialize_properties(request.object), "", secret_paths)
            self.registrations.append(
                Registration(
                    urn=response.urn,
                    type=request.type,
                    name=request.name,
                    parent=request.parent,
                    custom=request.custom,
                    inputs=plain(inputs),
                    dependencies=sorted(request.dependencies),
                    protect=bool(request.protect),
                    retain_on_delete=bool(request.retainOnDelete),
                    ignore_changes=list(request.ignoreChanges),
                    secret_paths=secret_paths,
                    state=_state(response, secret_paths),
                    aliases=_alias_urns(response.urn, request),
                    import_id=request.importId,
                    provider=request.provider or next(iter(request.providers.values()), ""),
                    remote=bool(request.remote),
                )
            )
        return response
