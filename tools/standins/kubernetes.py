"""A loopback stand-in of a GKE cluster's Kubernetes API as a team member reaches it: the cluster's `get`
(container.v1, checked against Google's discovery document) for its DNS endpoint, then namespaced
objects of the API groups `tpu-runs` uses, stored as given.

It records each request as the authorization checks the API server makes for it (Kubernetes "Authorization":
a request's verb is get, list, create, update, patch or delete), including the second check of a
server-side apply that creates its object: `create` on the same name (k8s.io/apiserver
pkg/endpoints/handlers/patch.go, `createAuthorizerAttributes`). Given RBAC objects and a subject, it
refuses with 403 what RBAC does not allow them (infra/access/kubernetes.py decides, as the authorizer does).
Every applied body is checked as the API server's strict field validation would, by the platform's
validator (infra/gke/validation.py): an object it finds fault with is refused with 422, like the API server.
No controller runs: tests write the status a controller would (a Kueue Workload) with `put`, and the order
Kueue's queue manager keeps, which its visibility API serves (`GET .../localqueues/<q>/pendingworkloads`,
authorized as `get` on the subresource `localqueues/pendingworkloads`), with `queue`.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from infra.access import kubernetes as rbac
from infra.gke.crds import KUEUE_GROUP, VISIBILITY_API, VISIBILITY_GROUP
from infra.gke.validation import platform_validator
from tools.standins.contracts import Call, ContractError, api
from tools.standins.loopback import Handler, serve

APPLY = "application/apply-patch+yaml"
OBJECTS = re.compile(
    r"/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
    r"(/(?P<name>[^/]+)(/(?P<subresource>[^/]+))?)?"
)
# Kueue's visibility API (kubernetes-sigs/kueue apis/visibility/v1beta2/types.go): a LocalQueue's pending
# Workloads as a PendingWorkloadsSummary, the one subresource this stand-in serves.
VISIBILITY = (VISIBILITY_GROUP, "localqueues", "pendingworkloads")
CLUSTER = re.compile(r"/v1/projects/[^/]+/locations/[^/]+/clusters/(?P<name>[^/]+)")
ENDPOINT = "gke-0123456789abcdef0123456789abcdef-000000000000.us-central1.gke.goog"


@dataclass(frozen=True)
class Access:
    """One authorization check the API server makes: what RBAC rules are written in."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str = ""


@dataclass
class ClusterState:
    subject: rbac.Subject | None = None  # who calls; None: nothing is refused
    rbac_objects: Sequence[dict[str, Any]] = ()
    objects: dict[tuple[str, str, str, str], dict[str, Any]] = field(default_factory=dict)  # (group, plural, ns, name)
    accesses: list[Access] = field(default_factory=list)
    google_methods: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # bodies the validator refused, and requests RBAC refused
    lock: threading.Lock = field(default_factory=threading.Lock)
    uids: Iterator[int] = field(default_factory=itertools.count)
    queues: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (ns, LocalQueue) -> Workloads in order
    visibility: bool = True  # False: the cluster does not serve Kueue's visibility API (404, as for any unknown path)

    def queue(self, namespace: str, local_queue: str, workloads: Sequence[str]) -> None:
        """The LocalQueue's pending Workloads (by name) in the order Kueue would try them."""
        with self.lock:
            self.queues[(namespace, local_queue)] = list(workloads)

    def pending(self, namespace: str, local_queue: str) -> dict[str, Any]:
        """What the visibility API answers: each pending Workload with its 0-based positions. This stand-in
        has one LocalQueue per ClusterQueue (the platform's: one per team), so the two positions agree."""
        items = []
        for position, name in enumerate(self.queues.get((namespace, local_queue), ())):
            workload = self.get(KUEUE_GROUP, "workloads", namespace, name) or {}
            meta = workload.get("metadata") or {}
            items.append(
                {
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "ownerReferences": meta.get("ownerReferences", []),
                    },
                    "priority": (workload.get("spec") or {}).get("priority", 0),
                    "localQueueName": local_queue,
                    "positionInClusterQueue": position,
                    "positionInLocalQueue": position,
                }
            )
        return {"kind": "PendingWorkloadsSummary", "apiVersion": VISIBILITY_API, "metadata": {}, "items": items}

    def put(self, group: str, plural: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with self.lock:
            self.objects[(group, plural, meta["namespace"], meta["name"])] = obj

    def get(self, group: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((group, plural, namespace, name))

    def allowed(self, access: Access) -> bool:
        if self.subject is None:
            return True
        return rbac.allowed(
            self.rbac_objects, self.subject, access.verb, access.resource, access.group, access.namespace
        )


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def _selected(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, selector.split(",")):  # `key=value`, or `key`: the label is there
        key, equals, value = term.partition("=")
        if (labels.get(key) != value) if equals else (key not in labels):
            return False
    return True


class KubernetesHandler(Handler):
    state: ClusterState

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self.body()
        if (cluster := CLUSTER.fullmatch(url.path)) is not None:
            return self._cluster(method, cluster["name"], body)
        match = OBJECTS.fullmatch(url.path)
        if match is None:
            return self.answer(404, _status(404, "NotFound", f"no route {url.path}"))
        group, plural, ns, name = match["group"], match["plural"], match["ns"], match["name"] or ""
        subresource = match["subresource"] or ""
        if subresource and ((group, plural, subresource) != VISIBILITY or not self.state.visibility):
            return self.answer(404, _status(404, "NotFound", f"no route {url.path}"))
        verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or (verb in ("patch", "delete") and not name) or (subresource and verb != "get"):
            return self.answer(405, _status(405, "MethodNotAllowed", f"{method} {url.path}"))
        resource = f"{plural}/{subresource}" if subresource else plural
        checks = [Access(verb, group, resource, ns, name)]
        exists = self.state.get(group, plural, ns, name) is not None
        if verb == "patch" and not exists:
            checks.append(Access("create", group, plural, ns, name))  # apply that creates: create too
        with self.state.lock:
            self.state.accesses.extend(checks)
        for check in checks:
            if not self.state.allowed(check):
                message = f'{plural}.{group} is forbidden: cannot {check.verb} resource "{resource}" in "{ns}"'
                self.state.refused.append(message)
                return self.answer(403, _status(403, "Forbidden", message))
        if subresource:
            return self.answer(200, self.state.pending(ns, name))
        if verb == "list":
            items = [
                o
                for (g, p, n, _), o in sorted(self.state.objects.items())
                if (g, p, n) == (group, plural, ns) and _selected(o, query.get("labelSelector", ""))
            ]
            return self.answer(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})
        if verb == "get":
            found = self.state.get(group, plural, ns, name)
            return self.answer(200, found) if found else self.answer(404, _status(404, "NotFound", name))
        if verb == "delete":
            with self.state.lock:
                gone = self.state.objects.pop((group, plural, ns, name), None)
            if gone is None:
                return self.answer(404, _status(404, "NotFound", f'{plural}.{group} "{name}" not found'))
            return self.answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return self._apply(group, plural, ns, name, query, body, exists)

    def _apply(
        self, group: str, plural: str, ns: str, name: str, query: dict[str, str], body: bytes, exists: bool
    ) -> None:
        problems = []
        if self.headers.get("Content-Type") != APPLY:
            problems.append(f"Content-Type {self.headers.get('Content-Type')!r}: server-side apply is {APPLY}")
        if not query.get("fieldManager"):
            problems.append("fieldManager is required for apply requests")
        obj = yaml.safe_load(body) if body else None
        if not isinstance(obj, dict):
            problems.append("the body is no object")
            obj = {}
        meta = obj.get("metadata") or {}
        if (meta.get("name"), meta.get("namespace")) != (name, ns):
            problems.append(f"the body names {meta.get('namespace')}/{meta.get('name')}, the URL {ns}/{name}")
        if str(obj.get("apiVersion", "")).split("/")[0] != group:
            problems.append(f"apiVersion {obj.get('apiVersion')!r} is not of the group {group}")
        problems += [str(f) for f in platform_validator().check([obj]).findings] if not problems else []
        if problems:
            self.state.refused.extend(problems)
            return self.answer(422, _status(422, "Invalid", "; ".join(problems)))
        stored = {**obj, "metadata": {**meta, "uid": f"uid-{next(self.state.uids)}"}}
        if exists:
            stored["metadata"]["uid"] = self.state.objects[(group, plural, ns, name)]["metadata"]["uid"]
        self.state.put(group, plural, stored)
        self.answer(200 if exists else 201, stored)

    def _cluster(self, method: str, name: str, body: bytes) -> None:
        try:
            found = api("container.v1").check(Call(method, self.path, body or None))
        except ContractError as error:
            self.state.refused.append(str(error))
            return self.answer(400, {"error": {"code": 400, "message": str(error)}})
        self.state.google_methods.append(found.id)
        config = {"dnsEndpointConfig": {"endpoint": ENDPOINT, "allowExternalTraffic": True}}
        self.answer(200, {"name": name, "controlPlaneEndpointsConfig": config})

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._route("GET")

    def do_PATCH(self) -> None:  # noqa: N802 - http.server's name
        self._route("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
        self._route("DELETE")


@contextlib.contextmanager
def kubernetes_standin(state: ClusterState | None = None) -> Iterator[tuple[str, ClusterState]]:
    """The stand-in on loopback: (its base URL, for both CONTAINER_API_ENDPOINT and KUBERNETES_API_ENDPOINT;
    its state)."""
    state = state or ClusterState()
    with serve(KubernetesHandler, state=state) as url:
        yield url, state
