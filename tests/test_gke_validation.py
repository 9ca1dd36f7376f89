"""The validator of Kubernetes objects: its rules on a small CRD written here, then the platform's own
(reduced) JobSet and Kueue schemas with the core kinds, then a battery of broken objects it must refuse
(typos, wrong types, broken CEL rules, names that refer to nothing, flavors no pool has, JobSets no queue
can admit, chips promised that no pool holds)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from infra.config.problems import ConfigError
from infra.gke import crds
from infra.gke.specs import TOPOLOGY_LABEL
from infra.gke.validation import InvalidObjectsError, Validator, platform_validator, validate_all
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


def test_a_subtree_marked_as_a_core_kind_is_checked_as_one():
    crd = copy.deepcopy(WIDGET_CRD)
    spec = crd["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    spec["free"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        crds.CORE_KIND: ["v1", "Pod"],
    }
    good = widget(free={"spec": {"containers": [{"name": "c", "image": "i"}]}})
    assert messages([good], Validator([crd])) == []
    bad = widget(free={"spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicie": "Always"}]}})
    assert messages([bad], Validator([crd])) == [
        "Widget/team-a/w: spec.free.spec.containers[0]: Additional properties are not allowed "
        "('imagePullPolicie' was unexpected)"
    ]


def test_the_rendered_queues_and_a_jobset_pass_the_platforms_schemas():
    objs = [*g.queue_objects(), g.jobset()]
    report = validate_all(platform_validator(), objs, g.SHAPES)
    assert report.ok, report.findings
    assert report.objects == len(objs)
    assert report.rules_evaluated >= 10  # ClusterQueue, ResourceFlavor and JobSet rules ran, not skipped


def test_the_platforms_schemas_are_labelled_as_ours():
    """Reduced schemas, not the release CRDs: each says so, and covers exactly the kinds the platform renders."""
    kinds = {(c["spec"]["group"], c["spec"]["names"]["kind"]) for c in crds.REDUCED_CRDS}
    assert kinds == {
        ("kueue.x-k8s.io", "ResourceFlavor"),
        ("kueue.x-k8s.io", "ClusterQueue"),
        ("kueue.x-k8s.io", "LocalQueue"),
        ("jobset.x-k8s.io", "JobSet"),
    }
    assert all(c["metadata"]["labels"] == {"tpu-platform/schema": "reduced"} for c in crds.REDUCED_CRDS)


def test_a_kind_the_platform_does_not_render_is_unknown():
    cohort = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Cohort", "metadata": {"name": "c"}, "spec": {}}
    old = {**g.queue_objects()[0], "apiVersion": "kueue.x-k8s.io/v1beta1"}
    found = [str(f) for f in platform_validator().check([cohort, old]).findings]
    assert any("unknown kind kueue.x-k8s.io/v1beta2/Cohort" in f for f in found)
    assert any("unknown kind kueue.x-k8s.io/v1beta1/ResourceFlavor" in f for f in found)


def test_findings_on_a_stacks_objects_are_its_config_error():
    objs = g.queue_objects()
    objs[0]["spec"]["nodeLabels"][TOPOLOGY_LABEL] = "9x9"
    with pytest.raises(ConfigError, match=r"(?s)stack 'dev'.*tpu-platform:gke\.teams.*no node pool has the labels"):
        validate_all(platform_validator(), objs, g.SHAPES).raise_for("dev", "tpu-platform:gke.teams")


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


def jobset_spec(objs: Objs) -> dict[str, Any]:
    return kind(objs, "JobSet")["spec"]


def failure_rule(objs: Objs) -> dict[str, Any]:
    return jobset_spec(objs)["failurePolicy"]["rules"][0]


def flavor(objs: Objs) -> dict[str, Any]:
    return kind(objs, "ResourceFlavor")


# name -> (mutation of the good objects, a text the finding that refuses it must contain)
MUTATIONS: dict[str, tuple[Callable[[Objs], object], str]] = {
    # typos in field names (closed schemas; core kinds by kubernetes-validate in strict mode)
    "cq-cohort-typo": (lambda o: cq(o).update(cohortNmae=cq(o).pop("cohortName")), "'cohortNmae' was unexpected"),
    "cq-v1beta1-cohort-field": (lambda o: cq(o).update(cohort=cq(o).pop("cohortName")), "'cohort' was unexpected"),
    "cq-preemption-typo": (
        lambda o: cq(o)["preemption"].update(withinClusterQueu="LowerPriority"),
        "'withinClusterQueu' was unexpected",
    ),
    "flavor-nodelabels-typo": (lambda o: flavor(o)["spec"].update(nodeLabel={}), "'nodeLabel' was unexpected"),
    "lq-clusterqueue-typo": (
        lambda o: kind(o, "LocalQueue")["spec"].update(clusterQueu="vision"),
        "'clusterQueu' was unexpected",
    ),
    "jobset-failure-policy-typo": (
        lambda o: jobset_spec(o)["failurePolicy"].update(maxRestart=1),
        "spec.failurePolicy: Additional properties are not allowed ('maxRestart' was unexpected)",
    ),
    "jobset-nodeselector-typo": (
        lambda o: pod(o).update(nodeSelectr=pod(o).pop("nodeSelector")),
        "spec.replicatedJobs[0].template.spec.template.spec: Additional properties are not allowed ('nodeSelectr'",
    ),
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
    "nominal-quota-word": (lambda o: tpu_quota(o).update(nominalQuota="eight"), "'eight' is not valid under any"),
    "nominal-quota-negative": (lambda o: tpu_quota(o).update(nominalQuota="-8"), "'-8' is not valid under any"),
    "nominal-quota-negative-number": (lambda o: tpu_quota(o).update(nominalQuota=-8), "-8 is not valid under any"),
    "borrowing-limit-word": (lambda o: tpu_quota(o).update(borrowingLimit="lots"), "'lots' is not valid under any"),
    "fair-sharing-weight-list": (lambda o: cq(o)["fairSharing"].update(weight=[1]), "[1] is not valid under any"),
    "replicas-string": (lambda o: rjob(o).update(replicas="2"), "'2' is not of type 'integer'"),
    "replicas-above-int32": (lambda o: rjob(o).update(replicas=2**31), "2147483648 is greater than the maximum"),
    "ttl-negative": (lambda o: jobset_spec(o).update(ttlSecondsAfterFinished=-1), "-1 is less than the minimum"),
    "parallelism-string": (lambda o: rjob(o)["template"]["spec"].update(parallelism="4"), "'4' is not of type"),
    "restart-strategy-enum": (
        lambda o: jobset_spec(o)["failurePolicy"].update(restartStrategy="Sometimes"),
        "'Sometimes' is not one of",
    ),
    "queueing-strategy-enum": (lambda o: cq(o).update(queueingStrategy="Fastest"), "'Fastest' is not one of"),
    "failure-action-enum": (lambda o: failure_rule(o).update(action="Retry"), "'Retry' is not one of"),
    "failure-rule-unnamed": (lambda o: failure_rule(o).pop("name"), "'name' is a required property"),
    "failure-rule-name-pattern": (lambda o: failure_rule(o).update(name="user-error"), "'user-error' does not match"),
    "covered-resources-missing": (lambda o: rg(o).pop("coveredResources"), "'coveredResources' is a required"),
    "covered-resources-empty": (lambda o: rg(o).update(coveredResources=[]), "[] should be non-empty"),
    "node-labels-over-eight": (
        lambda o: flavor(o)["spec"]["nodeLabels"].update({f"example.com/l{i}": "x" for i in range(6)}),
        "has too many properties",
    ),
    "priorityclass-value-string": (lambda o: kind(o, "PriorityClass").update(value="high"), "'high' is not of type"),
    "namespace-selector-string": (lambda o: cq(o).update(namespaceSelector="team-vision"), "is not of type 'object'"),
    "cohort-name-not-dns": (lambda o: cq(o).update(cohortName="Tpu_Platform"), "'Tpu_Platform' does not match"),
    # CEL rules (ours, from the rules the API references state)
    "cel-flavor-resources-mismatch": (
        lambda o: rg(o).update(coveredResources=["google.com/tpu", "cpu"]),
        "each flavor must list exactly the group's coveredResources",
    ),
    "cel-borrowing-without-cohort": (lambda o: cq(o).pop("cohortName"), "borrowingLimit needs a cohort"),
    "cel-lending-without-cohort": (
        lambda o: (
            cq(o).pop("cohortName"),
            [r.pop("borrowingLimit") for f in rg(o)["flavors"] for r in f["resources"]],
            tpu_quota(o).update(lendingLimit=8),
        ),
        "lendingLimit needs a cohort",
    ),
    "cel-reclaim-never-borrow-within": (
        lambda o: cq(o)["preemption"].update(
            reclaimWithinCohort="Never", borrowWithinCohort={"policy": "LowerPriority"}
        ),
        "borrowWithinCohort needs reclaimWithinCohort other than Never",
    ),
    "cel-fungibility-preference": (
        lambda o: cq(o)["flavorFungibility"].update(preference="BorrowingOverPreemption"),
        "preference applies only when whenCanBorrow and whenCanPreempt are both TryNextFlavor",
    ),
    "cel-toleration-without-key": (
        lambda o: flavor(o)["spec"].update(tolerations=[{"operator": "Equal", "value": "x"}]),
        "a toleration without a key must have operator Exists",
    ),
    "cel-failure-rule-targets-nothing": (
        lambda o: failure_rule(o).update(targetReplicatedJobs=["workers"]),
        "a failure rule's targetReplicatedJobs must name replicated jobs of this JobSet",
    ),
    # names and metadata
    "namespace-uppercase": (
        lambda o: kind(o, "LocalQueue")["metadata"].update(namespace="Team-Vision"),
        "'Team-Vision'",
    ),
    "queue-name-too-long": (lambda o: kind(o, "LocalQueue")["metadata"].update(name="q" * 64), "1-63 lowercase"),
    "label-value-bad": (lambda o: flavor(o)["metadata"]["labels"].update(team="a b"), "'a b'"),
    "flavor-in-a-namespace": (lambda o: flavor(o)["metadata"].update(namespace="x"), "cluster-scoped"),
    "jobset-name-too-long": (lambda o: kind(o, "JobSet")["metadata"].update(name="t" * 50), "not a DNS-1035 label"),
    # across objects
    "queue-names-missing-flavor": (
        lambda o: rg(o)["flavors"][0].update(name="tpu-v4-podslice-2x2x1"),
        "names ResourceFlavor 'tpu-v4-podslice-2x2x1': none",
    ),
    "local-queue-names-missing-cluster-queue": (
        lambda o: kind(o, "LocalQueue")["spec"].update(clusterQueue="visoin"),
        "names ClusterQueue 'visoin': none",
    ),
    "flavor-matches-no-pool": (
        lambda o: flavor(o)["spec"]["nodeLabels"].update({TOPOLOGY_LABEL: "8x8"}),
        "no node pool has the labels",
    ),
    "chips-promised-beyond-the-pools": (
        lambda o: tpu_quota(o).update(nominalQuota=32),
        "the ClusterQueues' nominal quotas add up to 32 TPU chips; its pools hold 16",
    ),
    "borrowing-by-preemption-under-fair-sharing": (
        lambda o: cq(o)["preemption"].update(borrowWithinCohort={"policy": "LowerPriority"}),
        "borrowWithinCohort works with classical preemption only",
    ),
    "jobset-names-missing-queue": (
        lambda o: kind(o, "JobSet")["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": "vison"}),
        "no LocalQueue 'vison' here",
    ),
    "jobset-more-chips-than-ever": (
        lambda o: rjob(o).update(replicas=2),
        "asks 32 TPU chips; ClusterQueue 'vision' can admit at most 16",
    ),
    "jobset-selects-no-flavor": (
        lambda o: pod(o)["nodeSelector"].update({"cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice"}),
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
    report = validate_all(platform_validator(), objs, g.SHAPES)
    assert any(expected in str(f) for f in report.findings), (expected, [str(f) for f in report.findings])
    with pytest.raises(InvalidObjectsError):
        report.raise_if_any()
