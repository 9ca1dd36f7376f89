"""Every Kubernetes object the platform hands to a cluster, checked offline as the API server checks it.

No API server can be had offline, and most bad objects need none to be refused. For each object:
1. Its kind is known: a served version of one of the given CRDs (the platform's: our reduced schemas of
   the JobSet and Kueue kinds it renders, `infra/gke/crds.py`, until the release CRDs can be
   vendored), or a core kind of the pinned Kubernetes minor (kubernetes-validate ships the published
   OpenAPI schemas).
2. Metadata: a name of the kind's naming rule (`infra/naming.py`), a namespace exactly when the kind is
   namespaced, labels of the API server's syntax.
3. A CRD kind: nulls pruned where the schema does not say `nullable` (the API server drops them), then
   the version's `openAPIV3Schema` with `additionalProperties` closed wherever the schema lists
   properties and does not preserve unknown fields (strict field validation: a typo is refused, where a
   non-strict apply would silently drop it), then every `x-kubernetes-validations` rule with cel-python.
   A rule on `oldSelf` holds on updates only and is skipped (counted); a rule cel-python cannot evaluate
   is a finding, never a pass. A subtree the schema marks as a core kind (a JobSet's Job template) is
   checked as that core kind.
4. A core kind: kubernetes-validate in strict mode (unknown fields refused).
Then rules across objects (`cross_object_findings`): a LocalQueue names a ClusterQueue, a ClusterQueue
names ResourceFlavors, a flavor selects nodes some pool has, the nominal chips of a flavor are chips its
pools hold, no queue borrows by preemption under fair sharing, a JobSet's generated names fit (JobSet's
webhook rule) and its queue can ever admit it (`infra/gke/quota.py`).

What only a cluster proves (webhook defaulting and validation, scheduling, admission) is listed by the
smoke test's dry run (tools/smoke.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import celpy
import jsonschema
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from infra import naming
from infra.config.problems import ConfigError, Problem
from infra.gke import jobsets, quota
from infra.gke.crds import CORE_KIND, REDUCED_CRDS
from infra.gke.specs import SliceShape

# The Kubernetes minor whose core schemas judge core kinds: the newest that both pinned controllers run
# their end-to-end tests on (JobSet v0.12.0: 1.32-1.34; Kueue v0.17.8: 1.33-1.35; their READMEs).
KUBERNETES_MINOR = "1.34"

Obj = Mapping[str, Any]

# Cluster-scoped core kinds (every other core kind the platform renders is namespaced).
CLUSTER_SCOPED_CORE = frozenset(
    {
        "Namespace",
        "PriorityClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "APIService",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
)
RBAC_KINDS = frozenset({"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"})


def _path_segment_problem(name: str) -> str | None:
    """RBAC objects take any path segment name (`system:...` included): not '.', '..', no '/' or '%'."""
    if not name or name in (".", "..") or "/" in name or "%" in name:
        return "a path segment: not empty, '.' or '..', without '/' or '%'"
    return None


def name_rule(kind: str) -> Callable[[str], str | None]:
    """The API server's name rule for a kind (kubernetes.io "Object Names and IDs")."""
    if kind in RBAC_KINDS:
        return _path_segment_problem
    if kind == "Namespace":
        return naming.dns1123_label_problem
    if kind == "Service":  # a DNS-1035 label: it starts with a letter
        return lambda name: naming.resource_id_problem(name)
    if kind in quota.KUEUE_KINDS:
        # Kueue writes queue names into labels (kueue.x-k8s.io/queue-name): a label value's 63 characters.
        return naming.dns1123_label_problem
    return naming.dns1123_subdomain_problem


@dataclass(frozen=True)
class Finding:
    obj: str  # "ClusterQueue/team-a" or "LocalQueue/ns/team-a"
    path: str  # "spec.resourceGroups[0]", "" for the object itself
    message: str

    def __str__(self) -> str:
        return f"{self.obj}: {self.path or '(object)'}: {self.message}"


class InvalidObjectsError(Exception):
    """Rendered objects that a cluster would refuse: a bug in what rendered them, or a bad setting."""

    def __init__(self, findings: Sequence[Finding]):
        self.findings = tuple(findings)
        lines = "\n".join(f"  - {f}" for f in self.findings)
        super().__init__(f"{len(self.findings)} problem(s) in the Kubernetes objects:\n{lines}")


@dataclass
class Report:
    objects: int = 0
    rules_evaluated: int = 0
    rules_skipped: int = 0  # on oldSelf: they hold on updates only
    kubernetes_minor: str = KUBERNETES_MINOR  # whose core schemas judge core kinds
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def raise_if_any(self) -> None:
        if self.findings:
            raise InvalidObjectsError(self.findings)

    def raise_for(self, stack: str, key: str) -> None:
        """A stack's rendered objects that a cluster would refuse: its config error, on the settings `key`."""
        if self.findings:
            problems = [Problem(key, "(as rendered)", f"a cluster would refuse {f}") for f in self.findings]
            raise ConfigError(stack, problems)


def describe(obj: Obj) -> str:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    parts = [str(obj.get("kind", "?")), *([str(meta["namespace"])] if meta.get("namespace") else [])]
    return "/".join([*parts, str(meta.get("name", "?"))])


# --- Schemas -------------------------------------------------------------------------------------------


def _strict(node: Mapping[str, Any]) -> dict[str, Any]:
    """The schema as jsonschema's Draft 4 reads it, closed where the API server's strict mode is."""
    out = {k: v for k, v in node.items() if k not in ("x-kubernetes-validations", CORE_KIND)}
    properties = dict(node.get("properties", {}))
    if node.get("x-kubernetes-embedded-resource"):
        # "apiVersion, kind and metadata are implicitly specified and validated" (CRD structural schemas).
        for implicit, schema in (("apiVersion", {"type": "string"}), ("kind", {"type": "string"})):
            properties.setdefault(implicit, schema)
        properties.setdefault("metadata", {"type": "object"})
    if properties:
        out["properties"] = {k: _strict(v) for k, v in properties.items()}
    for key in ("items", "not"):
        if isinstance(node.get(key), Mapping):
            out[key] = _strict(node[key])
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = _strict(node["additionalProperties"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            out[key] = [_strict(s) for s in node[key]]
    if node.get("nullable") and isinstance(node.get("type"), str):
        out["type"] = [node["type"], "null"]
    if properties and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _child(schema: Mapping[str, Any], key: str | int) -> Mapping[str, Any]:
    """The schema of one field or item (empty when the schema says nothing: preserved unknown fields)."""
    if isinstance(key, int):
        items = schema.get("items")
        return items if isinstance(items, Mapping) else {}
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    more = schema.get("additionalProperties")
    return more if isinstance(more, Mapping) else {}


def prune_nulls(value: Any, schema: Mapping[str, Any]) -> Any:
    """Drop `null` fields the schema does not call nullable, as the API server does before validating."""
    if isinstance(value, Mapping):
        return {
            k: prune_nulls(v, _child(schema, k))
            for k, v in value.items()
            if v is not None or _child(schema, k).get("nullable")
        }
    if isinstance(value, list):
        return [prune_nulls(v, _child(schema, i)) for i, v in enumerate(value)]
    return value


def _path(parts: Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- CEL ---------------------------------------------------------------------------------------------


@functools.cache
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _evaluate(rule: str, value: Any) -> tuple[bool, str | None]:
    """(holds, why not evaluated): an error of any kind, unknown functions included, is no pass."""
    try:
        result = _cel_program(rule).evaluate({"self": json_to_cel(value)})
    except Exception as error:  # cel-python raises its own errors and, for some inputs, Python's
        return False, f"{type(error).__name__}: {error}"
    if isinstance(result, CELEvalError):
        return False, str(result.args[0] if result.args else result)
    return bool(result) and isinstance(result, celtypes.BoolType), None


def _rule_findings(value: Any, schema: Mapping[str, Any], where: list[str | int], name: str, report: Report) -> None:
    """The CEL rules of every node present, and the core kinds the schema embeds, depth first."""
    for validation in schema.get("x-kubernetes-validations", ()):
        rule = validation["rule"]
        if "oldSelf" in rule:
            report.rules_skipped += 1
            continue
        report.rules_evaluated += 1
        holds, error = _evaluate(rule, value)
        if error is not None:
            report.findings.append(Finding(name, _path(where), f"rule not evaluated ({error}): {rule}"))
        elif not holds:
            message = validation.get("message") or f"failed rule: {rule}"
            report.findings.append(Finding(name, _path(where), message))
    if CORE_KIND in schema and isinstance(value, Mapping):
        api_version, kind = schema[CORE_KIND]
        embedded = {"apiVersion": api_version, "kind": kind, **value}
        for finding in _core_findings(embedded, name, report.kubernetes_minor):
            report.findings.append(
                Finding(name, _path([*where, finding.path] if finding.path else where), finding.message)
            )
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            _rule_findings(item, _child(schema, key), [*where, key], name, report)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _rule_findings(item, _child(schema, index), [*where, index], name, report)


# --- The validator -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Served:
    schema: Mapping[str, Any]  # the CRD's own
    namespaced: bool

    @functools.cached_property
    def checker(self) -> jsonschema.Draft4Validator:
        closed = _strict(self.schema)
        closed["properties"] = {**closed.get("properties", {}), "metadata": {"type": "object"}}
        return jsonschema.Draft4Validator(closed)


class Validator:
    """Checks objects against the given CRDs (every served version) and Kubernetes' core schemas."""

    def __init__(self, crds: Iterable[Obj], kubernetes_minor: str = KUBERNETES_MINOR):
        self.kubernetes_minor = kubernetes_minor
        self._served: dict[tuple[str, str], _Served] = {}
        for crd in crds:
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served"):
                    key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                    schema = version["schema"]["openAPIV3Schema"]
                    self._served[key] = _Served(schema, spec["scope"] == "Namespaced")

    def check(self, objs: Iterable[Obj]) -> Report:
        report = Report(kubernetes_minor=self.kubernetes_minor)
        for obj in objs:
            report.objects += 1
            self._check_one(obj, report)
        return report

    def _check_one(self, obj: Obj, report: Report) -> None:
        name = describe(obj)
        served = self._served.get((str(obj.get("apiVersion")), str(obj.get("kind"))))
        namespaced = served.namespaced if served else obj.get("kind") not in CLUSTER_SCOPED_CORE
        report.findings.extend(_metadata_findings(obj, name, namespaced))
        if served is not None:
            pruned = prune_nulls(obj, served.schema)
            for error in sorted(served.checker.iter_errors(pruned), key=lambda e: list(e.absolute_path)):
                report.findings.append(Finding(name, _path(error.absolute_path), error.message))
            _rule_findings(pruned, served.schema, [], name, report)
        else:
            report.findings.extend(_core_findings(obj, name, self.kubernetes_minor))


def _metadata_findings(obj: Obj, name: str, namespaced: bool) -> list[Finding]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return [Finding(name, "metadata.name", "every object needs a name")]
    found = []
    problem = name_rule(str(obj.get("kind")))(meta["name"])
    if problem:
        found.append(Finding(name, "metadata.name", f"{meta['name']!r}: {problem}"))
    namespace = meta.get("namespace")
    if namespaced and not namespace:
        found.append(Finding(name, "metadata.namespace", "a namespaced kind needs its namespace"))
    elif not namespaced and namespace:
        found.append(Finding(name, "metadata.namespace", f"{obj.get('kind')} is cluster-scoped: no namespace"))
    elif namespace and (problem := naming.dns1123_label_problem(str(namespace))):
        found.append(Finding(name, "metadata.namespace", f"{namespace!r}: {problem}"))
    for key, value in (meta.get("labels") or {}).items():
        if not isinstance(value, str) or (problem := naming.kubernetes_label_problem(key, value)):
            found.append(Finding(name, f"metadata.labels.{key}", f"{value!r}: {problem or 'a string'}"))
    return found


def _core_findings(obj: Obj, name: str, minor: str) -> list[Finding]:
    import kubernetes_validate  # imported on first use: its schemas are large

    try:
        kubernetes_validate.validate(dict(obj), minor, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [Finding(name, "", f"unknown kind {obj.get('apiVersion')}/{obj.get('kind')} (no CRD, no core schema)")]
    except kubernetes_validate.ValidationError as error:  # jsonschema's error, its first one
        return [Finding(name, _path(error.absolute_path), error.message)]
    return []


# --- Across objects ------------------------------------------------------------------------------------


def cross_object_findings(objs: Sequence[Obj], pools: Sequence[SliceShape] | None = None) -> list[Finding]:
    """What no single object's schema says: names that refer to other objects, JobSets their queues can
    admit, no borrowing by preemption (Kueue runs with fair sharing); and, given the cluster's slice
    pools, that each flavor selects nodes some pool has and promises no more chips than its pools hold."""
    by_kind: dict[str, dict[str, Obj]] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}" if obj.get("kind") in ("LocalQueue", "JobSet") else None
        by_kind.setdefault(str(obj.get("kind")), {})[key or str(meta.get("name"))] = obj
    flavors = by_kind.get("ResourceFlavor", {})
    queues = by_kind.get("ClusterQueue", {})
    found: list[Finding] = []
    for cq in queues.values():
        for flavor in quota.flavor_names(cq):
            if flavor not in flavors:
                found.append(Finding(describe(cq), "spec.resourceGroups", f"names ResourceFlavor {flavor!r}: none"))
        # Kueue's ClusterQueue page: borrowWithinCohort "May only be configured with Classical Preemption, and
        # not with Fair Sharing", which this platform's Kueue runs with (infra/gke/controllers.py).
        policy = ((cq.get("spec") or {}).get("preemption") or {}).get("borrowWithinCohort") or {}
        if policy.get("policy", "Never") != "Never":
            why = "borrowWithinCohort works with classical preemption only; Kueue here runs with fair sharing"
            found.append(Finding(describe(cq), "spec.preemption.borrowWithinCohort", why))
    for lq in by_kind.get("LocalQueue", {}).values():
        target = lq.get("spec", {}).get("clusterQueue")
        if target not in queues:
            found.append(Finding(describe(lq), "spec.clusterQueue", f"names ClusterQueue {target!r}: none"))
    if pools is not None:
        found.extend(_pool_findings(flavors, queues, pools))
    for jobset in by_kind.get("JobSet", {}).values():
        try:
            found.extend(_jobset_findings(jobset, by_kind, queues, flavors))
        except (ValueError, KeyError, TypeError, AttributeError) as error:  # malformed: its own findings say how
            why = f"not checked against its queue ({type(error).__name__}: {error})"
            found.append(Finding(describe(jobset), "", why))
    return found


def _pool_findings(flavors: Mapping[str, Obj], queues: Mapping[str, Obj], pools: Sequence[SliceShape]) -> list[Finding]:
    found = []
    for name, flavor in flavors.items():
        wanted = flavor.get("spec", {}).get("nodeLabels") or {}
        held = sum(p.chips for p in pools if all(p.node_labels.get(k) == v for k, v in wanted.items()))
        if not held:
            found.append(Finding(describe(flavor), "spec.nodeLabels", f"no node pool has the labels {wanted}"))
            continue
        try:
            promised = sum(q.nominal for cq in queues.values() if (q := quota.tpu_quota(cq, name)) is not None)
        except (ValueError, KeyError, TypeError):
            continue  # a malformed quota: the schema's findings say how
        if promised > held:
            why = f"the ClusterQueues' nominal quotas add up to {promised} TPU chips; its pools hold {held}"
            found.append(Finding(describe(flavor), "spec.nodeLabels", why))
    return found


def _jobset_findings(
    jobset: Obj, by_kind: Mapping[str, Mapping[str, Obj]], queues: Mapping[str, Obj], flavors: Mapping[str, Obj]
) -> list[Finding]:
    name, meta = describe(jobset), jobset.get("metadata") or {}
    found = [Finding(name, "metadata.name", problem) for problem in quota.jobset_name_problems(jobset)]
    found += [Finding(name, where, problem) for where, problem in jobsets.multislice_problems(jobset)]
    queue_name = (meta.get("labels") or {}).get(quota.QUEUE_LABEL)
    lq = by_kind.get("LocalQueue", {}).get(f"{meta.get('namespace')}/{queue_name}")
    if lq is None:
        return [*found, Finding(name, f"metadata.labels.{quota.QUEUE_LABEL}", f"no LocalQueue {queue_name!r} here")]
    cq = queues.get(str(lq.get("spec", {}).get("clusterQueue")))
    if cq is None:
        return found  # reported on the LocalQueue
    for priority in quota.priority_class_names(jobset):
        if priority not in by_kind.get("PriorityClass", {}):
            found.append(Finding(name, "spec.replicatedJobs", f"names PriorityClass {priority!r}: none"))
    problem = quota.never_admitted(jobset, cq, list(queues.values()), flavors)
    if problem:
        found.append(Finding(name, "spec.replicatedJobs", problem))
    return found


def validate_all(validator: Validator, objs: Sequence[Obj], pools: Sequence[SliceShape] | None = None) -> Report:
    """Each object on its own, then across them."""
    report = validator.check(objs)
    report.findings.extend(cross_object_findings(objs, pools))
    return report


@functools.cache
def platform_validator() -> Validator:
    """The validator of what the platform renders: our reduced JobSet and Kueue schemas, and core kinds."""
    return Validator(REDUCED_CRDS)
