"""Teams as Kueue sees them: a flavor per pool shape, a ClusterQueue per team in one cohort, a LocalQueue
in each team's namespace, and the priority classes. Pure functions: settings in, Kubernetes objects out.

- ResourceFlavor: one per pool shape, its node labels the ones GKE puts on that pool's nodes
  (`SliceShape.node_labels`: accelerator, topology, and the spot label on a Spot pool), so Kueue admits
  a JobSet only onto nodes that exist. Pools of one shape share a flavor: their chips add up.
- ClusterQueue per team: every flavor listed (a queue borrows only flavors it lists, cluster_queue.md),
  its nominal chips in each (0 where it has none; a team's chips are given per slice pool and add up
  per flavor), its borrowing limit in each; one cohort, so unused quota is lent; fair sharing (Kueue's
  configuration, `infra/gke/controllers.py`) shares what is borrowed; `reclaimWithinCohort: Any` lets a
  team take its own quota back from borrowers; `withinClusterQueue: LowerPriority` lets a team's urgent
  run displace its own lesser ones. The namespace selector admits only the team's namespace: another
  namespace's LocalQueue pointing at this queue admits nothing.
- LocalQueue: one per team, in its namespace, named like the team: what its JobSets name in the
  `kueue.x-k8s.io/queue-name` label.
- PriorityClasses: xpk's five (very-low 100 ... very-high 1000), none the cluster default. A team's
  `priority` is the highest its runs may use: a ResourceQuota in its namespace allows no pod of a higher
  class (Kubernetes "Resource Quotas", "Limit Priority Class consumption").

Kueue enforces chips, not money. A team's monthly money is not rendered here: the GKE engine's cost is
the pools', whoever uses them, and the stack's budget already alerts on it (docs/design-gke.md says
why a per-team budget is left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.config.model import PRIORITY_CLASSES, TeamSettings
from infra.gke.crds import KUEUE_API
from infra.gke.quota import TPU_RESOURCE
from infra.gke.specs import ACCELERATOR_LABEL, SPOT_LABEL, TOPOLOGY_LABEL, SliceShape

COHORT = "tpu-platform"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tpu-platform"}
TEAM_LABEL = "tpu-platform/team"
PRIORITIES = PRIORITY_CLASSES
PRIORITY_NAMES = tuple(name for name, _ in PRIORITIES)

Obj = dict[str, Any]


def flavor_name(labels: Mapping[str, str]) -> str:
    """`<accelerator>-<topology>[-spot]` from a pool's node labels: tpu-v5-lite-podslice-4x4-spot, tpu7x-2x2x2."""
    spot = ["spot"] if labels.get(SPOT_LABEL) == "true" else []
    return "-".join([labels[ACCELERATOR_LABEL], labels[TOPOLOGY_LABEL], *spot])


@dataclass(frozen=True)
class Flavor:
    name: str
    node_labels: Mapping[str, str]
    chips: int  # every slice of every pool of this shape


def flavors(shapes: Iterable[SliceShape]) -> tuple[Flavor, ...]:
    """One flavor per distinct set of node labels, in the order shapes first appear; pools of one shape add up."""
    found: dict[str, Flavor] = {}
    for shape in shapes:
        name = flavor_name(shape.node_labels)
        before = found.get(name)
        found[name] = Flavor(name, shape.node_labels, shape.chips + (before.chips if before else 0))
    return tuple(found.values())


def nominal_by_flavor(team: TeamSettings, pools: Mapping[str, SliceShape]) -> dict[str, int]:
    """The team's nominal chips per flavor: its chips in each slice pool, added up over pools of one shape."""
    out: dict[str, int] = {}
    for pool, chips in team.nominal_chips:
        if pool in pools:  # a pool the stack lacks is refused by the config's rules
            name = flavor_name(pools[pool].node_labels)
            out[name] = out.get(name, 0) + chips
    return out


def _meta(name: str, namespace: str | None = None, team: str | None = None) -> Obj:
    labels = {**MANAGED_BY, **({TEAM_LABEL: team} if team else {})}
    return {"name": name, **({"namespace": namespace} if namespace else {}), "labels": labels}


def resource_flavor(flavor: Flavor) -> Obj:
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": _meta(flavor.name),
        "spec": {"nodeLabels": dict(flavor.node_labels)},
    }


def cluster_queue(team: TeamSettings, all_flavors: Sequence[Flavor], nominal: Mapping[str, int]) -> Obj:
    def quota(flavor: Flavor) -> Obj:
        entry: Obj = {"name": TPU_RESOURCE, "nominalQuota": nominal.get(flavor.name, 0)}
        if team.borrowing_limit is not None:
            entry["borrowingLimit"] = team.borrowing_limit
        return {"name": flavor.name, "resources": [entry]}

    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": _meta(team.name, team=team.name),
        "spec": {
            "cohortName": COHORT,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "fairSharing": {"weight": 1},
            "preemption": {
                "reclaimWithinCohort": "Any",
                "borrowWithinCohort": {"policy": "Never"},
                "withinClusterQueue": "LowerPriority",
            },
            "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
            "resourceGroups": [{"coveredResources": [TPU_RESOURCE], "flavors": [quota(f) for f in all_flavors]}],
        },
    }


def local_queue(team: TeamSettings) -> Obj:
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": _meta(team.name, team.namespace, team.name),
        "spec": {"clusterQueue": team.name},
    }


def priority_classes() -> list[Obj]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": _meta(name),
            "value": value,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": f"tpu-platform runs: {name} ({value})",
        }
        for name, value in PRIORITIES
    ]


def priority_ceiling(team: TeamSettings) -> Obj | None:
    """No pod of a class above the team's priority in its namespace: a quota of zero such pods (None
    when the team may use every class)."""
    above = [name for name, _ in PRIORITIES[PRIORITY_NAMES.index(team.priority) + 1 :]]
    if not above:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _meta("priority-ceiling", team.namespace, team.name),
        "spec": {
            "hard": {"pods": "0"},
            "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": above}]},
        },
    }


def queue_objects(teams: Sequence[TeamSettings], pools: Mapping[str, SliceShape]) -> list[Obj]:
    """Everything the queues phase applies, in an order a reader follows: flavors, priorities, then
    per team its queue, its local queue and its priority ceiling. `pools`: each slice pool's shape by name."""
    all_flavors = flavors(pools.values())
    objs = [resource_flavor(f) for f in all_flavors] + priority_classes()
    for team in teams:
        ceiling = priority_ceiling(team)
        queue = cluster_queue(team, all_flavors, nominal_by_flavor(team, pools))
        objs += [queue, local_queue(team), *([ceiling] if ceiling else [])]
    return objs
