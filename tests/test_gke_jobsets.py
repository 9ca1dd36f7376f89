"""A team's JobSet as the platform renders it: its queue, its identity, its slices, nothing privileged,
and what its team's queue and the schemas make of it."""

from __future__ import annotations

from infra import naming
from infra.gke.jobsets import team_jobset
from infra.gke.quota import pod_sets
from infra.gke.validation import platform_validator, validate_all
from tests import gke_objects as g


def render(**changes):
    return team_jobset(g.VISION, g.V5E_16_SPOT, "train-1", image=g.IMAGE, command=["python", "t.py"], **changes)


def test_one_pod_per_vm_of_each_slice_asking_for_the_vms_chips():
    (pods,) = pod_sets(render(slices=2))
    assert (pods.pods, pods.chips_per_pod, pods.chips) == (8, 4, 32)
    assert pods.node_selector == g.V5E_16_SPOT.node_labels


def test_it_runs_as_the_teams_account_in_its_queue_and_asks_for_nothing_privileged():
    jobset = render()
    assert jobset["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "vision"}
    assert jobset["metadata"]["namespace"] == "team-vision"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == naming.TEAM_SERVICE_ACCOUNT
    assert "hostNetwork" not in pod and "securityContext" not in pod
    (container,) = pod["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    assert render(queued=False)["metadata"]["labels"] == {}


def test_it_passes_the_schemas_and_its_queue_admits_it():
    report = validate_all(platform_validator(), [*g.queue_objects(), render()], g.SHAPES)
    assert report.ok, report.findings
    too_big = team_jobset(g.VISION, g.V5E_16_SPOT, "big", image=g.IMAGE, command=["x"], slices=2)
    found = [str(f) for f in validate_all(platform_validator(), [*g.queue_objects(), too_big], g.SHAPES).findings]
    assert found == [
        "JobSet/team-vision/big: spec.replicatedJobs: asks 32 TPU chips; ClusterQueue 'vision' can admit at most 16 "
        "(its nominal quota plus what it may borrow in its cohort)"
    ]
