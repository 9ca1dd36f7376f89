"""Our reduced schemas of the JobSet and Kueue kinds the platform renders, shaped as CRDs for the validator.

These are NOT the release CRDs. The releases' CRDs cannot be kept in this repository yet (they come only
inside the release manifests, which the admin phase downloads at deploy time and checks by sha256:
infra/gke/controllers.py), so the validator judges JobSet and Kueue objects by these schemas, written here
from each project's published API reference. Replace them by the release CRDs once those can be vendored:
`Validator(crds)` takes either.

What they hold, kind by kind (the page each is written from):
- ResourceFlavor, ClusterQueue, LocalQueue of `kueue.x-k8s.io/v1beta2`: every field of their spec, the
  documented enums and list limits, and the rules the reference states in words, as our own CEL rules
  (Kueue v0.17.8, https://kueue.sigs.k8s.io/docs/reference/kueue.v1beta2/ : `ClusterQueueSpec`,
  `ResourceGroup`, `FlavorQuotas`, `ResourceQuota`, `ClusterQueuePreemption`, `BorrowWithinCohort`,
  `FlavorFungibility`, `FairSharing`, `LocalQueueSpec`, `ResourceFlavorSpec`; and the ClusterQueue
  concept page https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/ for the two rules marked so).
- JobSet of `jobset.x-k8s.io/v1alpha2`: the fields the platform renders or will (replicated jobs,
  failure and success policies, network, TTL, suspend), from JobSet v0.12.0's
  https://jobset.sigs.k8s.io/docs/reference/jobset.v1alpha2/ (`JobSetSpec`, `ReplicatedJob`,
  `FailurePolicy`, `FailurePolicyRule`, `SuccessPolicy`, `Network`). A replicated job's `template` is a
  `batch/v1` JobTemplateSpec: the validator checks it as a core Job with Kubernetes' own published schema
  (kubernetes-validate), as the release CRD embeds that schema.

Every object schema lists its properties, so the validator closes it (an unknown field is refused).
Fields the platform never sets are left out on purpose: an object that sets one is refused, which is
stricter than a cluster; widen the schema (from the reference) when the platform starts rendering it.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
# Kueue's visibility API (on by default from Kueue 0.9, feature gate VisibilityOnDemand: kubernetes-sigs/kueue
# pkg/features/kube_features.go): a LocalQueue's pending Workloads in order, each with its position
# (apis/visibility/v1beta2/types.go PendingWorkloadsSummary; docs "Pending Workloads on-demand").
VISIBILITY_GROUP = f"visibility.{KUEUE_GROUP}"
VISIBILITY_API = f"{VISIBILITY_GROUP}/{KUEUE_VERSION}"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSET_API = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
# A subtree the validator checks as this core kind (apiVersion, kind) with kubernetes-validate.
CORE_KIND = "x-tpu-platform-core-kind"
INT32 = (-(2**31), 2**31 - 1)

# A Quantity's serialization format (k8s.io/apimachinery/pkg/api/resource, type Quantity, as the Kueue
# reference links it): <signedNumber><suffix>; a number is digits, digits.digits, digits. or .digits; a
# suffix a binary SI (Ki Mi Gi Ti Pi Ei), a decimal SI (m, none, k M G T P E) or a decimal exponent
# (e or E and a signed number).
_NUMBER = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)"
_SUFFIX = rf"(Ki|Mi|Gi|Ti|Pi|Ei|[mkMGTPE]|[eE][+-]?{_NUMBER})?"
QUANTITY = rf"^[+-]?{_NUMBER}{_SUFFIX}$"
NON_NEGATIVE_QUANTITY = rf"^\+?{_NUMBER}{_SUFFIX}$"  # "must be non-negative" (Kueue `ResourceQuota`)
# DNS-1123 subdomain (names of ClusterQueues and cohorts: Kueue `ClusterQueueReference`, `CohortReference`).
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# JobSet `FailurePolicyRule.name`: the reference prints it as ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
# (its page renders the bracketed group as a link).
FAILURE_RULE_NAME = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), rules: tuple[Schema, ...] = ()) -> Schema:
    out: Schema = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


def _rule(rule: str, message: str) -> Schema:
    return {"rule": rule, "message": message}


def _string(pattern: str | None = None, max_length: int | None = None) -> Schema:
    out: Schema = {"type": "string"}
    if pattern:
        out["pattern"] = pattern
    if max_length is not None:
        out["maxLength"] = max_length
    return out


def _enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def _int32(minimum: int = INT32[0]) -> Schema:
    return {"type": "integer", "format": "int32", "minimum": minimum, "maximum": INT32[1]}


def _list(items: Schema, max_items: int | None = None, min_items: int | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items}
    if max_items is not None:
        out["maxItems"] = max_items
    if min_items is not None:
        out["minItems"] = min_items
    return out


def _map(values: Schema, max_properties: int | None = None) -> Schema:
    out: Schema = {"type": "object", "additionalProperties": values}
    if max_properties is not None:
        out["maxProperties"] = max_properties
    return out


def _quantity(non_negative: bool = False) -> Schema:
    """An int-or-string Quantity, as a CRD writes one (`x-kubernetes-int-or-string`)."""
    pattern = NON_NEGATIVE_QUANTITY if non_negative else QUANTITY
    number: Schema = {"type": "integer", **({"minimum": 0} if non_negative else {})}
    return {"x-kubernetes-int-or-string": True, "anyOf": [number, {"type": "string", "pattern": pattern}]}


def _crd(group: str, version: str, kind: str, plural: str, scope: str, spec: Schema) -> Schema:
    """A CRD-shaped record of one served version, as `Validator` reads the release CRDs."""
    root = _obj({"apiVersion": _string(), "kind": _string(), "metadata": {"type": "object"}, "spec": spec})
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"tpu-platform/schema": "reduced"}},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"kind": kind, "plural": plural},
            "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": root}}],
        },
    }


# --- Core types the Kueue kinds embed (Kubernetes API reference: LabelSelector, Taint, Toleration) ---------

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
LABEL_SELECTOR = _obj(
    {
        "matchLabels": _map(_string()),
        "matchExpressions": _list(
            _obj({"key": _string(), "operator": _string(), "values": _list(_string())}, required=("key", "operator"))
        ),
    }
)
TAINT = _obj(
    {"key": _string(), "value": _string(), "effect": _enum(*EFFECTS), "timeAdded": _string()},
    required=("key", "effect"),
)
# Kubernetes API reference, Toleration: key "If the key is empty, operator must be Exists"; operator
# "Exists is equivalent to wildcard for value"; tolerationSeconds "only for NoExecute effect".
TOLERATION = _obj(
    {
        "key": _string(),
        "operator": _enum("Exists", "Equal"),
        "value": _string(),
        "effect": _enum(*EFFECTS),
        "tolerationSeconds": {"type": "integer"},
    },
    rules=(
        _rule(
            "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "a toleration without a key must have operator Exists",
        ),
        _rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists has no value",
        ),
        _rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds goes with effect NoExecute",
        ),
    ),
)

# --- Kueue v1beta2 -----------------------------------------------------------------------------------------

STOP_POLICY = _enum("None", "Hold", "HoldAndDrain")
FAIR_SHARING = _obj({"weight": _quantity()})  # FairSharing.weight: a Quantity

RESOURCE_FLAVOR_SPEC = _obj(
    {
        "nodeLabels": _map(_string(), max_properties=8),  # "nodeLabels can be up to 8 elements"
        "nodeTaints": _list(TAINT, max_items=8),
        "tolerations": _list(TOLERATION, max_items=8),
    }
)

RESOURCE_QUOTA = _obj(
    {
        "name": _string(),
        "nominalQuota": _quantity(non_negative=True),  # "The nominalQuota must be non-negative."
        "borrowingLimit": _quantity(non_negative=True),  # "If not null, it must be non-negative."
        "lendingLimit": _quantity(non_negative=True),
    },
    required=("name", "nominalQuota"),
)
FLAVOR_QUOTAS = _obj(
    {"name": _string(), "resources": _list(RESOURCE_QUOTA, max_items=64)},  # "up to 64 resources"
    required=("name", "resources"),
)
RESOURCE_GROUP = _obj(
    {
        # "The list cannot be empty and it can contain up to 64 resources" / "up to 64 flavors".
        "coveredResources": _list(_string(), max_items=64, min_items=1),
        "flavors": _list(FLAVOR_QUOTAS, max_items=64, min_items=1),
    },
    required=("coveredResources", "flavors"),
    rules=(
        # ResourceGroup.flavors: "Each flavor MUST list all the resources listed for this group in the same
        # order" (checked here as the same count and names; the order is not).
        _rule(
            "self.flavors.all(f, size(f.resources) == size(self.coveredResources)"
            " && f.resources.all(r, r.name in self.coveredResources))",
            "each flavor must list exactly the group's coveredResources",
        ),
    ),
)
_NO_COHORT = "!has(self.cohortName) || self.cohortName == ''"
_LIMIT_UNSET = (
    "!has(self.resourceGroups) || self.resourceGroups.all(g, g.flavors.all(f, f.resources.all(r, !has(r.{limit}))))"
)
CLUSTER_QUEUE_SPEC = _obj(
    {
        "resourceGroups": _list(RESOURCE_GROUP, max_items=16),  # "resourceGroups can be up to 16"
        "cohortName": _string(pattern=DNS1123_SUBDOMAIN, max_length=253),
        "queueingStrategy": _enum("StrictFIFO", "BestEffortFIFO"),
        "namespaceSelector": LABEL_SELECTOR,
        "flavorFungibility": _obj(
            {
                "whenCanBorrow": _enum("MayStopSearch", "TryNextFlavor"),
                "whenCanPreempt": _enum("MayStopSearch", "TryNextFlavor"),
                "preference": _enum("BorrowingOverPreemption", "PreemptionOverBorrowing"),
            },
            rules=(
                # Concept page, FlavorFungibility: the preference steers the choice "When both policies are
                # set to TryNextFlavor" (whenCanBorrow defaults to MayStopSearch).
                _rule(
                    "!has(self.preference) || (has(self.whenCanBorrow) && self.whenCanBorrow == 'TryNextFlavor'"
                    " && (!has(self.whenCanPreempt) || self.whenCanPreempt == 'TryNextFlavor'))",
                    "preference applies only when whenCanBorrow and whenCanPreempt are both TryNextFlavor",
                ),
            ),
        ),
        "preemption": _obj(
            {
                "reclaimWithinCohort": _enum("Never", "LowerPriority", "Any"),
                "borrowWithinCohort": _obj(
                    {"policy": _enum("Never", "LowerPriority"), "maxPriorityThreshold": _int32()}
                ),
                "withinClusterQueue": _enum("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
            },
            rules=(
                # Concept page, Preemption: borrowWithinCohort "is only supported when reclaimWithinCohort is
                # enabled (different than Never)".
                _rule(
                    "!has(self.borrowWithinCohort) || !has(self.borrowWithinCohort.policy)"
                    " || self.borrowWithinCohort.policy == 'Never'"
                    " || (has(self.reclaimWithinCohort) && self.reclaimWithinCohort != 'Never')",
                    "borrowWithinCohort needs reclaimWithinCohort other than Never",
                ),
            ),
        ),
        "stopPolicy": STOP_POLICY,
        "fairSharing": FAIR_SHARING,
    },
    rules=(
        # ResourceQuota: "borrowingLimit must be null if spec.cohortName is empty"; likewise lendingLimit.
        _rule(f"!({_NO_COHORT}) || ({_LIMIT_UNSET.format(limit='borrowingLimit')})", "borrowingLimit needs a cohort"),
        _rule(f"!({_NO_COHORT}) || ({_LIMIT_UNSET.format(limit='lendingLimit')})", "lendingLimit needs a cohort"),
    ),
)
LOCAL_QUEUE_SPEC = _obj(
    {
        # ClusterQueueReference: "It must be a DNS (RFC 1123) and has the maximum length of 253 characters."
        "clusterQueue": _string(pattern=DNS1123_SUBDOMAIN, max_length=253),
        "stopPolicy": STOP_POLICY,
        "fairSharing": FAIR_SHARING,
    }
)

# --- JobSet v1alpha2 ---------------------------------------------------------------------------------------

FAILURE_ACTIONS = (
    "FailJobSet",
    "RestartJobSet",
    "RestartJobSetAndIgnoreMaxRestarts",
    "RestartJob",
    "RestartJobAndIgnoreMaxRestarts",
)
JOB_TEMPLATE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True, CORE_KIND: ["batch/v1", "Job"]}
JOBSET_SPEC = _obj(
    {
        "replicatedJobs": _list(
            _obj(
                {"name": _string(), "groupName": _string(), "replicas": _int32(), "template": JOB_TEMPLATE},
                required=("name", "template"),
            )
        ),
        "network": _obj(
            {
                "enableDNSHostnames": {"type": "boolean"},
                "subdomain": _string(),
                "publishNotReadyAddresses": {"type": "boolean"},
            }
        ),
        "successPolicy": _obj(
            {"operator": _enum("All", "Any"), "targetReplicatedJobs": _list(_string())}, required=("operator",)
        ),
        "failurePolicy": _obj(
            {
                "maxRestarts": _int32(),
                # FailurePolicy.restartStrategy: "Defaults to Recreate"; BlockingRecreate (the project's
                # failure-policy example) and InPlaceRestart (the maxRestarts text) are the others.
                "restartStrategy": _enum("Recreate", "BlockingRecreate", "InPlaceRestart"),
                "rules": _list(
                    _obj(
                        {
                            "name": _string(pattern=FAILURE_RULE_NAME),
                            "action": _enum(*FAILURE_ACTIONS),
                            "onJobFailureReasons": _list(_string()),
                            "onJobFailureMessagePatterns": _list(_string()),
                            "targetReplicatedJobs": _list(_string()),
                        },
                        required=("name", "action"),
                    )
                ),
            }
        ),
        "suspend": {"type": "boolean"},
        "ttlSecondsAfterFinished": _int32(minimum=0),
    },
    rules=(
        # FailurePolicyRule.targetReplicatedJobs: "the names of the replicated jobs the operator applies to".
        _rule(
            "!has(self.failurePolicy) || !has(self.failurePolicy.rules) || self.failurePolicy.rules.all(r,"
            " !has(r.targetReplicatedJobs)"
            " || r.targetReplicatedJobs.all(t, self.replicatedJobs.exists(j, j.name == t)))",
            "a failure rule's targetReplicatedJobs must name replicated jobs of this JobSet",
        ),
    ),
)

REDUCED_CRDS: tuple[Schema, ...] = (
    _crd(KUEUE_GROUP, KUEUE_VERSION, "ResourceFlavor", "resourceflavors", "Cluster", RESOURCE_FLAVOR_SPEC),
    _crd(KUEUE_GROUP, KUEUE_VERSION, "ClusterQueue", "clusterqueues", "Cluster", CLUSTER_QUEUE_SPEC),
    _crd(KUEUE_GROUP, KUEUE_VERSION, "LocalQueue", "localqueues", "Namespaced", LOCAL_QUEUE_SPEC),
    _crd(JOBSET_GROUP, JOBSET_VERSION, "JobSet", "jobsets", "Namespaced", JOBSET_SPEC),
)
