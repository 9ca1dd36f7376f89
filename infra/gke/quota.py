"""Kueue's quota arithmetic on rendered objects: what a JobSet asks, and whether a team's queue admits it.

Kueue's rules, as its ClusterQueue page states them (kueue v0.17.8 site/content/en/docs/concepts/
cluster_queue.md, "Flavors and Resources", "BorrowingLimit", "LendingLimit"): a pod set's requests fit
a flavor of a ClusterQueue if they are at most the queue's unused nominal quota; or, borrowing, at most
the unused nominal quota of the whole cohort *and* at most the queue's unused `nominalQuota +
borrowingLimit` (no limit: the cohort's). A queue borrows only flavors it lists; it lends at most its
`lendingLimit` of its unused quota. A flavor serves a pod set when its node labels agree with the pod
set's node selector (resource_flavor.md). A JobSet's pod set counts `replicas x min(parallelism,
completions)` pods (pkg/controller/jobs/jobset, `podsCount`); TPU chips are `google.com/tpu` per pod.

Kueue's real scheduler also weighs priorities, preemption and fair-sharing order; those only a cluster
shows. This answers the question a submitter asks first: does it fit my team's quota now, and can my
team's queue ever admit it?
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra import naming

TPU_RESOURCE = "google.com/tpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_KINDS = frozenset({"ClusterQueue", "LocalQueue", "ResourceFlavor", "Cohort", "WorkloadPriorityClass"})
# JobSet's webhook (v0.12.0 pkg/webhooks/jobset_webhook.go) checks the longest pod name with a 5-character
# suffix standing in for the one the Job controller adds.
POD_SUFFIX = "-abcde"

Obj = Mapping[str, Any]


def chips(quantity: object) -> int:
    """A TPU quantity as chips: Kueue and the device plugin count whole chips."""
    if isinstance(quantity, bool) or not isinstance(quantity, int | str) or not str(quantity).isdigit():
        raise ValueError(f"{quantity!r} is not a whole number of chips")
    return int(quantity)


@dataclass(frozen=True)
class PodSet:
    name: str
    pods: int
    chips_per_pod: int
    node_selector: Mapping[str, str]
    priority_class: str | None

    @property
    def chips(self) -> int:
        return self.pods * self.chips_per_pod


def pod_sets(jobset: Obj) -> tuple[PodSet, ...]:
    """The pod sets Kueue makes of a JobSet: one per replicated job."""
    found = []
    for rjob in jobset.get("spec", {}).get("replicatedJobs", ()):
        job = rjob.get("template", {}).get("spec", {})
        parallelism = job.get("parallelism", 1)
        pods = rjob.get("replicas", 1) * min(parallelism, job.get("completions", parallelism))
        pod = job.get("template", {}).get("spec", {})
        per_pod = 0
        for container in pod.get("containers", ()):
            resources = container.get("resources", {})
            wanted = {**resources.get("requests", {}), **resources.get("limits", {})}  # extended: limits = requests
            per_pod += chips(wanted.get(TPU_RESOURCE, 0))
        found.append(PodSet(rjob["name"], pods, per_pod, pod.get("nodeSelector", {}), pod.get("priorityClassName")))
    return tuple(found)


def priority_class_names(jobset: Obj) -> set[str]:
    return {p.priority_class for p in pod_sets(jobset) if p.priority_class}


def flavor_names(cq: Obj) -> list[str]:
    return [f["name"] for group in cq.get("spec", {}).get("resourceGroups", ()) for f in group.get("flavors", ())]


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None  # None: as much as the cohort lends
    lending_limit: int | None  # None: all of its unused quota


def tpu_quota(cq: Obj, flavor: str) -> Quota | None:
    """A ClusterQueue's TPU quota in one flavor, or None when it does not list the flavor."""
    for group in cq.get("spec", {}).get("resourceGroups", ()):
        for entry in group.get("flavors", ()):
            if entry["name"] != flavor:
                continue
            for resource in entry.get("resources", ()):
                if resource["name"] == TPU_RESOURCE:
                    limits = (resource.get("borrowingLimit"), resource.get("lendingLimit"))
                    return Quota(chips(resource["nominalQuota"]), *(None if x is None else chips(x) for x in limits))
    return None


def serves(flavor: Obj, node_selector: Mapping[str, str]) -> bool:
    """A flavor serves a pod set when the labels both name agree (resource_flavor.md)."""
    labels = flavor.get("spec", {}).get("nodeLabels") or {}
    return all(labels[key] == value for key, value in node_selector.items() if key in labels)


def cohort_of(cq: Obj, queues: Sequence[Obj]) -> list[Obj]:
    """The queue and the others of its cohort (a queue without a cohort is alone)."""
    cohort = cq.get("spec", {}).get("cohortName")
    if not cohort:
        return [cq]
    return [q for q in queues if q.get("spec", {}).get("cohortName") == cohort]


Usage = Mapping[tuple[str, str], int]  # (ClusterQueue, flavor) -> chips admitted now


@dataclass(frozen=True)
class Fit:
    flavor: str
    borrows: bool


def _room(cq: Obj, flavor: str, cohort: Sequence[Obj], usage: Usage) -> tuple[int, int] | None:
    """(chips it may take without borrowing, chips it may take at most) in one flavor, or None."""
    name = cq["metadata"]["name"]
    own = tpu_quota(cq, flavor)
    if own is None:
        return None
    used = usage.get((name, flavor), 0)
    unused_own = max(own.nominal - used, 0)
    lent_by_others = 0
    for other in cohort:
        other_name = other["metadata"]["name"]
        quota = tpu_quota(other, flavor)
        if other_name == name or quota is None:
            continue
        unused = max(quota.nominal - usage.get((other_name, flavor), 0), 0)
        lent_by_others += unused if quota.lending_limit is None else min(unused, quota.lending_limit)
    most = unused_own + lent_by_others  # the cohort's unused quota, as far as it reaches this queue
    if own.borrowing_limit is not None:
        most = min(most, max(own.nominal + own.borrowing_limit - used, 0))
    return unused_own, most


def fits(jobset: Obj, cq: Obj, queues: Sequence[Obj], flavors: Mapping[str, Obj], usage: Usage) -> Fit | None:
    """Where Kueue would admit the JobSet's TPU pod sets now, given what is admitted (None: it waits).

    Flavors are tried in the queue's order; the first that serves the pod set and has room wins. Every
    pod set of the JobSet must fit; together they count against the same quota."""
    cohort = cohort_of(cq, queues)
    taken: dict[tuple[str, str], int] = dict(usage)
    chosen: Fit | None = None
    for pod_set in pod_sets(jobset):
        if not pod_set.chips:
            continue
        placed = None
        for flavor in flavor_names(cq):
            if flavor not in flavors or not serves(flavors[flavor], pod_set.node_selector):
                continue
            room = _room(cq, flavor, cohort, taken)
            if room is not None and pod_set.chips <= room[1]:
                placed = Fit(flavor, borrows=pod_set.chips > room[0])
                break
        if placed is None:
            return None
        key = (cq["metadata"]["name"], placed.flavor)
        taken[key] = taken.get(key, 0) + pod_set.chips
        chosen = Fit(placed.flavor, borrows=(chosen.borrows if chosen else False) or placed.borrows)
    return chosen or Fit("", borrows=False)


def never_admitted(jobset: Obj, cq: Obj, queues: Sequence[Obj], flavors: Mapping[str, Obj]) -> str | None:
    """Why the queue cannot admit the JobSet even with the whole cohort idle (None: it can)."""
    if fits(jobset, cq, queues, flavors, {}) is not None:
        return None
    asked = sum(p.chips for p in pod_sets(jobset))
    sets = pod_sets(jobset)
    served = [f for f in flavor_names(cq) if f in flavors and all(serves(flavors[f], p.node_selector) for p in sets)]
    if not served:
        return f"asks {asked} TPU chips on nodes no flavor of ClusterQueue {cq['metadata']['name']!r} selects"
    most = max((_room(cq, f, cohort_of(cq, queues), {}) or (0, 0))[1] for f in served)
    return (
        f"asks {asked} TPU chips; ClusterQueue {cq['metadata']['name']!r} can admit at most {most} "
        f"(its nominal quota plus what it may borrow in its cohort)"
    )


def jobset_name_problems(jobset: Obj) -> list[str]:
    """JobSet's webhook rule: the names it generates for Jobs and Pods are DNS-1035 labels."""
    name = str(jobset.get("metadata", {}).get("name", ""))
    problems = []
    for rjob in jobset.get("spec", {}).get("replicatedJobs", ()):
        longest_job = f"{name}-{rjob['name']}-{rjob.get('replicas', 1) - 1}"
        if naming.resource_id_problem(longest_job):
            problems.append(f"Job name {longest_job!r} is not a DNS-1035 label of at most 63 characters")
        job = rjob.get("template", {}).get("spec", {})
        if job.get("completionMode") == "Indexed" and "completions" in job:
            longest_pod = f"{longest_job}-{job['completions'] - 1}{POD_SUFFIX}"
            if naming.resource_id_problem(longest_pod):
                problems.append(f"Pod name {longest_pod!r} is not a DNS-1035 label of at most 63 characters")
    return problems
