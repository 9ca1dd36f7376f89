"""Team queues as rendered: what each object says, and that the rules across them hold."""

from __future__ import annotations

from dataclasses import replace

from infra.gke import queues
from tests import gke_objects as g


def by_kind(kind: str) -> list[dict]:
    return [o for o in g.queue_objects() if o["kind"] == kind]


def test_a_flavor_per_shape_with_the_pools_node_labels_and_their_chips():
    flavors = queues.flavors([*g.SHAPES, replace(g.V5E_16_SPOT, slices=2)])
    assert [f.name for f in flavors] == ["tpu-v5-lite-podslice-4x4-spot", "tpu-v6e-slice-4x4", "tpu7x-2x2x2"]
    assert flavors[0].chips == 16 + 32  # two pools of the same shape add up
    rendered = {f["metadata"]["name"]: f["spec"]["nodeLabels"] for f in by_kind("ResourceFlavor")}
    assert rendered == {g.flavor(s): s.node_labels for s in g.SHAPES}  # the pools' labels: one home
    assert rendered["tpu-v5-lite-podslice-4x4-spot"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
        "cloud.google.com/gke-spot": "true",
    }


def test_a_cluster_queue_per_team_in_one_cohort_listing_every_flavor():
    cqs = {q["metadata"]["name"]: q["spec"] for q in by_kind("ClusterQueue")}
    assert set(cqs) == {"vision", "nlp"}
    for name, spec in cqs.items():
        assert spec["cohortName"] == queues.COHORT
        assert spec["preemption"]["reclaimWithinCohort"] == "Any"
        assert spec["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": f"team-{name}"}}
        (group,) = spec["resourceGroups"]
        assert [f["name"] for f in group["flavors"]] == [g.flavor(s) for s in g.SHAPES]
    vision = {f["name"]: f["resources"][0] for f in cqs["vision"]["resourceGroups"][0]["flavors"]}
    assert vision["tpu-v5-lite-podslice-4x4-spot"] == {
        "name": "google.com/tpu",
        "nominalQuota": 16,
        "borrowingLimit": 16,
    }
    assert vision["tpu-v6e-slice-4x4"] == {"name": "google.com/tpu", "nominalQuota": 0, "borrowingLimit": 16}
    nlp = cqs["nlp"]["resourceGroups"][0]["flavors"][1]["resources"][0]
    assert nlp == {"name": "google.com/tpu", "nominalQuota": 32}  # no limit: what the cohort lends


def test_a_local_queue_per_team_in_its_namespace():
    assert {
        (q["metadata"]["namespace"], q["metadata"]["name"], q["spec"]["clusterQueue"]) for q in by_kind("LocalQueue")
    } == {
        ("team-vision", "vision", "vision"),
        ("team-nlp", "nlp", "nlp"),
    }


def test_a_teams_chips_in_pools_of_one_shape_add_up_in_its_flavor():
    pools = {**g.POOLS, "v5e-more": replace(g.V5E_16_SPOT, slices=2)}
    team = g.VISION.model_copy(update={"nominal_chips": (("v5e", 16), ("v5e-more", 32), ("iron", 8))})
    assert queues.nominal_by_flavor(team, pools) == {g.flavor(g.V5E_16_SPOT): 48, g.flavor(g.TPU7X_8): 8}
    (cq,) = [o for o in queues.queue_objects([team], pools) if o["kind"] == "ClusterQueue"]
    quotas = {f["name"]: f["resources"][0]["nominalQuota"] for f in cq["spec"]["resourceGroups"][0]["flavors"]}
    assert quotas == {g.flavor(g.V5E_16_SPOT): 48, g.flavor(g.V6E_16_FLEX): 0, g.flavor(g.TPU7X_8): 8}


def test_priorities_and_each_teams_ceiling():
    assert [(p["metadata"]["name"], p["value"]) for p in by_kind("PriorityClass")] == list(queues.PRIORITIES)
    assert not any(p["globalDefault"] for p in by_kind("PriorityClass"))
    ceilings = {q["metadata"]["namespace"]: q["spec"] for q in by_kind("ResourceQuota")}
    assert ceilings["team-vision"]["scopeSelector"]["matchExpressions"][0]["values"] == ["very-high"]
    assert ceilings["team-nlp"]["scopeSelector"]["matchExpressions"][0]["values"] == ["high", "very-high"]
    assert all(c["hard"] == {"pods": "0"} for c in ceilings.values())
    top = g.VISION.model_copy(update={"priority": "very-high"})
    assert queues.priority_ceiling(top) is None  # never a zero-pod quota without a scope
