"""Teams as Kueue sees them: a flavor per pool shape, a ClusterQueue per team in one cohort, a LocalQueue
in each team's namespace, and the priority classes. Pure functions: settings in, Kubernetes objects out.

- ResourceFlavor: one per pool shape, its node labels the ones GKE puts on that pool's nodes
  (`cloud.google.com/gke-tpu-accelerator`, `cloud.google.com/gke-tpu-topology`; Spot pools also
  `cloud.google.com/gke-spot: "true"`, GKE "Spot VMs"), so Kueue admits a JobSet only onto nodes that
  exist. Pools of one shape share a flavor: their chips add up.
- ClusterQueue per team: every flavor listed (a queue borrows only flavors it lists, cluster_queue.md),
  its nominal chips in each (0 where it has none), its borrowing limit in each; one cohort, so unused
  quota is lent; fair sharing (Kueue's configuration, `infra/gke/controllers.py`) shares what is
  borrowed; `reclaimWithinCohort: Any` lets a team take its own quota back from borrowers;
  `withinClusterQueue: LowerPriority` lets a team's urgent run displace its own lesser ones. The
  namespace selector admits only the team's namespace: another namespace's LocalQueue pointing at this
  queue admits nothing.
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
from typing import Any, Protocol

from infra.gke.quota import TPU_RESOURCE

KUEUE_API = "kueue.x-k8s.io/v1beta2"
COHORT = "tpu-platform"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tpu-platform"}
TEAM_LABEL = "tpu-platform/team"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
SPOT_LABEL = "cloud.google.com/gke-spot"
# xpk's priority classes (core/kueue_manager.py), lowest first.
PRIORITIES: tuple[tuple[str, int], ...] = (
    ("very-low", 100),
    ("low", 250),
    ("medium", 500),
    ("high", 750),
    ("very-high", 1000),
)
PRIORITY_NAMES = tuple(name for name, _ in PRIORITIES)

Obj = dict[str, Any]


class PoolShape(Protocol):
    """What a slice pool's shape says to Kueue (the cluster's pool settings keep the record)."""

    @property
    def accelerator(self) -> str: ...  # the GKE accelerator label value: tpu-v5-lite-podslice
    @property
    def topology(self) -> str: ...  # 4x4, 2x2x2
    @property
    def chips_per_vm(self) -> int: ...
    @property
    def vms_per_slice(self) -> int: ...
    @property
    def slices(self) -> int: ...
    @property
    def provisioning(self) -> str: ...  # on-demand | spot | reservation | flex-start


def node_labels(shape: PoolShape) -> dict[str, str]:
    labels = {ACCELERATOR_LABEL: shape.accelerator, TOPOLOGY_LABEL: shape.topology}
    if shape.provisioning == "spot":
        labels[SPOT_LABEL] = "true"
    return labels


def flavor_name(shape: PoolShape) -> str:
    """`<accelerator>-<topology>[-spot]`: tpu-v5-lite-podslice-4x4-spot, tpu7x-2x2x2."""
    return "-".join([shape.accelerator, shape.topology, *(["spot"] if shape.provisioning == "spot" else [])])


@dataclass(frozen=True)
class Flavor:
    name: str
    node_labels: Mapping[str, str]
    chips: int  # every slice of every pool of this shape


def flavors(shapes: Iterable[PoolShape]) -> tuple[Flavor, ...]:
    """One flavor per distinct shape, in the order shapes first appear; pools of one shape add up."""
    found: dict[str, Flavor] = {}
    for shape in shapes:
        name = flavor_name(shape)
        chips = shape.slices * shape.vms_per_slice * shape.chips_per_vm
        before = found.get(name)
        found[name] = Flavor(name, node_labels(shape), chips + (before.chips if before else 0))
    return tuple(found.values())


@dataclass(frozen=True)
class Team:
    name: str
    members: tuple[str, ...]  # user:alice@example.com, group:ml@example.com
    namespace: str
    nominal_chips: Mapping[str, int]  # flavor name -> chips the team is guaranteed
    borrowing_limit: int | None  # chips above nominal it may borrow in each flavor; None: what the cohort lends
    priority: str  # the highest priority class its runs may use


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


def cluster_queue(team: Team, all_flavors: Sequence[Flavor]) -> Obj:
    def quota(flavor: Flavor) -> Obj:
        entry: Obj = {"name": TPU_RESOURCE, "nominalQuota": team.nominal_chips.get(flavor.name, 0)}
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


def local_queue(team: Team) -> Obj:
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


def priority_ceiling(team: Team) -> Obj | None:
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


def namespace(team: Team) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(team.namespace, team=team.name)}


def queue_objects(teams: Sequence[Team], shapes: Sequence[PoolShape]) -> list[Obj]:
    """Everything the queues phase applies, in an order a reader follows: flavors, priorities, then
    per team its queue, its local queue and its priority ceiling."""
    all_flavors = flavors(shapes)
    objs = [resource_flavor(f) for f in all_flavors] + priority_classes()
    for team in teams:
        ceiling = priority_ceiling(team)
        objs += [cluster_queue(team, all_flavors), local_queue(team), *([ceiling] if ceiling else [])]
    return objs
