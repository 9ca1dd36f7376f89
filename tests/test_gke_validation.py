"""The validator of Kubernetes objects: its rules on a small CRD written here, then the real pinned CRDs,
then a battery of broken objects it must refuse (typos, wrong types, broken CEL rules, names that refer
to nothing, flavors no pool has, JobSets no queue can admit)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from infra.gke import queues
from infra.gke.controllers import pinned_validator
from infra.gke.validation import InvalidObjectsError, Validator, validate_all
from tests import gke_objects as g

# A CRD written for these tests: one of each schema feature the validator must honour.
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"kind": "Widget", "plural": "widgets"},
        "versions": [
            {"name": "v1old", "served": False, "storage": False, "schema": {"openAPIV3Schema": {"type": "object"}}},
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "metadata": {"type": "object"},
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1},
                                    "max": {"type": "integer"},
                                    "note": {"type": "string", "nullable": True},
                                    "color": {"type": "string"},
                                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    "name": {"type": "string"},
                                },
                                "x-kubernetes-validations": [
                                    {"rule": "!has(self.max) || self.size <= self.max", "message": "size above max"},
                                    {"rule": "self.size == oldSelf.size", "message": "size is immutable"},
                                ],
                            },
                        },
                    }
                },
            },
        ],
    },
}


def widget(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "team-a"},
        "spec": {"size": 2, **spec},
    }


def messages(objs: list[dict[str, Any]], validator: Validator | None = None) -> list[str]:
    report = (validator or Validator([WIDGET_CRD])).check(objs)
    return [str(f) for f in report.findings]


def test_a_good_object_passes_and_its_rules_are_counted():
    report = Validator([WIDGET_CRD]).check([widget(max=3)])
    assert report.ok, report.findings
    assert (report.rules_evaluated, report.rules_skipped) == (1, 1)  # the oldSelf rule holds on updates only


def test_unknown_fields_are_refused_where_the_schema_does_not_preserve_them():
    assert any("'colour' was unexpected" in m for m in messages([widget(colour="red")]))
    assert messages([widget(free={"anything": {"goes": 1}})]) == []


def test_nulls_are_pruned_unless_nullable():
    assert messages([widget(color=None)]) == []  # the API server drops it
    assert messages([widget(note=None)]) == []  # nullable: kept, and null is allowed
    assert any("'size' is a required property" in m for m in messages([{**widget(), "spec": {"size": None}}]))


def test_a_failing_rule_reports_its_message():
    assert any("spec: size above max" in m for m in messages([widget(max=1)]))


def test_a_rule_cel_python_cannot_evaluate_fails():
    crd = copy.deepcopy(WIDGET_CRD)
    spec = crd["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["x-kubernetes-validations"] = [{"rule": "isQuantity(self.name)", "message": "a quantity"}]
    found = messages([widget(name="1Gi")], Validator([crd]))
    assert len(found) == 1 and "rule not evaluated" in found[0] and "isQuantity" in found[0]


def test_an_unserved_version_and_an_unknown_kind_are_refused():
    unserved = {**widget(), "apiVersion": "example.com/v1old"}
    assert any("unknown kind example.com/v1old/Widget" in m for m in messages([unserved]))
    assert any("unknown kind" in m for m in messages([{**widget(), "kind": "Gadget"}]))


def test_metadata_rules():
    cluster_scoped = {**widget(), "metadata": {"name": "w"}}
    assert any("needs its namespace" in m for m in messages([cluster_scoped]))
    bad_name = {**widget(), "metadata": {"name": "Big_W", "namespace": "team-a"}}
    assert any("metadata.name: 'Big_W'" in m for m in messages([bad_name]))


def test_the_rendered_queues_and_a_jobset_pass_the_pinned_crds():
    objs = [*g.queue_objects(), g.jobset()]
    report = validate_all(pinned_validator(), objs, g.pool_labels())
    assert report.ok, report.findings
    assert report.objects == len(objs)
    assert report.rules_evaluated >= 10  # ClusterQueue, ResourceFlavor and JobSet rules ran, not skipped


# --- The battery: each mutation of the good objects is refused, with a finding that names it ----------

Objs = list[dict[str, Any]]


def kind(objs: Objs, wanted: str, name: str | None = None) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == wanted and (name is None or o["metadata"]["name"] == name))


def cq(objs: Objs) -> dict[str, Any]:
    return kind(objs, "ClusterQueue", "vision")["spec"]


def rg(objs: Objs) -> dict[str, Any]:
    return cq(objs)["resourceGroups"][0]


def tpu_quota(objs: Objs) -> dict[str, Any]:
    return rg(objs)["flavors"][0]["resources"][0]


def pod(objs: Objs) -> dict[str, Any]:
    return kind(objs, "JobSet")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def container(objs: Objs) -> dict[str, Any]:
    return pod(objs)["containers"][0]


def rjob(objs: Objs) -> dict[str, Any]:
    return kind(objs, "JobSet")["spec"]["replicatedJobs"][0]


MUTATIONS: dict[str, tuple[Callable[[Objs], object], str]] = {
    # typos in field names (closed schemas)
    "cq-cohort-typo": (lambda o: cq(o).update(cohortNmae=cq(o).pop("cohortName")), "'cohortNmae' was unexpected"),
    "cq-v1beta1-cohort-field": (lambda o: cq(o).update(cohort=cq(o).pop("cohortName")), "'cohort' was unexpected"),
    "cq-preemption-typo": (
        lambda o: cq(o)["preemption"].update(withinClusterQueu="LowerPriority"),
        "'withinClusterQueu' was unexpected",
    ),
    "flavor-nodelabels-typo": (
        lambda o: kind(o, "ResourceFlavor")["spec"].update(nodeLabel={}),
        "'nodeLabel' was unexpected",
    ),
    "lq-clusterqueue-typo": (
        lambda o: kind(o, "LocalQueue")["spec"].update(clusterQueu="vision"),
        "'clusterQueu' was unexpected",
    ),
    "jobset-nodeselector-typo": (lambda o: pod(o).update(nodeSelectr=pod(o).pop("nodeSelector")), "'nodeSelectr' was"),
    "jobset-container-resources-typo": (
        lambda o: container(o).update(resource=container(o).pop("resources")),
        "'resource' was unexpected",
    ),
    "priorityclass-value-typo": (
        lambda o: kind(o, "PriorityClass").update(valu=kind(o, "PriorityClass").pop("value")),
        "'value' is a required property",  # kubernetes-validate reports the first error only
    ),
    "resourcequota-hard-typo": (
        lambda o: kind(o, "ResourceQuota")["spec"].update(hrad=kind(o, "ResourceQuota")["spec"].pop("hard")),
        "'hrad' was unexpected",
    ),
    # wrong types and values
    "nominal-quota-word": (lambda o: tpu_quota(o).update(nominalQuota="eight"), "'eight' does not match"),
    "borrowing-limit-negative-word": (lambda o: tpu_quota(o).update(borrowingLimit="lots"), "'lots' does not match"),
    "fair-sharing-weight-list": (lambda o: cq(o)["fairSharing"].update(weight=[1]), "[1] is not valid"),
    "replicas-string": (lambda o: rjob(o).update(replicas="2"), "'2' is not of type 'integer'"),
    "parallelism-string": (lambda o: rjob(o)["template"]["spec"].update(parallelism="4"), "'4' is not of type"),
    "restart-strategy-enum": (
        lambda o: kind(o, "JobSet")["spec"]["failurePolicy"].update(restartStrategy="Sometimes"),
        "'Sometimes' is not one of",
    ),
    "queueing-strategy-enum": (lambda o: cq(o).update(queueingStrategy="Fastest"), "'Fastest' is not one of"),
    "failure-action-enum": (
        lambda o: kind(o, "JobSet")["spec"]["failurePolicy"]["rules"][0].update(action="Retry"),
        "'Retry' is not one of",
    ),
    "failure-rule-unnamed": (
        lambda o: kind(o, "JobSet")["spec"]["failurePolicy"]["rules"][0].pop("name"),
        "'name' is a required property",
    ),
    "covered-resources-missing": (lambda o: rg(o).pop("coveredResources"), "'coveredResources' is a required"),
    "priorityclass-value-string": (lambda o: kind(o, "PriorityClass").update(value="high"), "'high' is not of type"),
    "namespace-selector-string": (lambda o: cq(o).update(namespaceSelector="team-vision"), "is not of type 'object'"),
    # CEL rules of the CRDs
    "cel-flavor-resources-mismatch": (
        lambda o: rg(o).update(coveredResources=["google.com/tpu", "cpu"]),
        "flavors must have the same number of resources as the coveredResources",
    ),
    "cel-borrowing-without-cohort": (lambda o: cq(o).pop("cohortName"), "must be nil when cohort is empty"),
    "cel-reclaim-never-borrow-within": (
        lambda o: cq(o)["preemption"].update(
            reclaimWithinCohort="Never", borrowWithinCohort={"policy": "LowerPriority"}
        ),
        "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never",
    ),
    "cel-fungibility-preference": (
        lambda o: cq(o)["flavorFungibility"].update(preference="BorrowingOverPreemption"),
        "preference can only be set when both whenCanBorrow and whenCanPreempt are TryNextFlavor",
    ),
    "cel-toleration-without-key": (
        lambda o: kind(o, "ResourceFlavor")["spec"].update(tolerations=[{"operator": "Equal", "value": "x"}]),
        "operator must be Exists when 'key' is empty",
    ),
    # names and metadata
    "namespace-uppercase": (
        lambda o: kind(o, "LocalQueue")["metadata"].update(namespace="Team-Vision"),
        "'Team-Vision'",
    ),
    "queue-name-too-long": (lambda o: kind(o, "LocalQueue")["metadata"].update(name="q" * 64), "1-63 lowercase"),
    "label-value-bad": (lambda o: kind(o, "ResourceFlavor")["metadata"]["labels"].update(team="a b"), "'a b'"),
    "flavor-in-a-namespace": (lambda o: kind(o, "ResourceFlavor")["metadata"].update(namespace="x"), "cluster-scoped"),
    "jobset-name-too-long": (lambda o: kind(o, "JobSet")["metadata"].update(name="t" * 50), "not a DNS-1035 label"),
    # across objects
    "queue-names-missing-flavor": (lambda o: rg(o)["flavors"][0].update(name="tpu-v4-podslice-2x2x1"), "none"),
    "local-queue-names-missing-cluster-queue": (
        lambda o: kind(o, "LocalQueue")["spec"].update(clusterQueue="visoin"),
        "names ClusterQueue 'visoin': none",
    ),
    "flavor-matches-no-pool": (
        lambda o: kind(o, "ResourceFlavor")["spec"]["nodeLabels"].update({queues.TOPOLOGY_LABEL: "8x8"}),
        "no node pool has the labels",
    ),
    "jobset-names-missing-queue": (
        lambda o: kind(o, "JobSet")["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": "vison"}),
        "no LocalQueue 'vison' here",
    ),
    "jobset-more-chips-than-ever": (lambda o: rjob(o).update(replicas=2), "can admit at most 16"),
    "jobset-selects-no-flavor": (
        lambda o: pod(o)["nodeSelector"].update({queues.ACCELERATOR_LABEL: "tpu-v4-podslice"}),
        "on nodes no flavor",
    ),
    "jobset-names-missing-priority": (lambda o: pod(o).update(priorityClassName="urgent"), "PriorityClass 'urgent'"),
}


def test_the_battery_is_large_enough():
    assert len(MUTATIONS) >= 30


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_is_refused(name: str):
    mutate, expected = MUTATIONS[name]
    objs = copy.deepcopy([*g.queue_objects(), g.jobset()])
    mutate(objs)
    report = validate_all(pinned_validator(), objs, g.pool_labels())
    assert any(expected in str(f) for f in report.findings), (expected, [str(f) for f in report.findings])
    with pytest.raises(InvalidObjectsError):
        report.raise_if_any()
