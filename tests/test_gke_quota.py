"""The fit function: does a JobSet fit its team's quota now, borrowing in the cohort, and can it ever.

Property tests check it against Kueue's rule as its ClusterQueue page states it, written out here
independently: a pod set fits if its chips are at most the queue's unused nominal quota, or at most the
cohort's unused nominal quota and at most the queue's unused nominal quota plus borrowing limit.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from infra.config.model import TeamSettings
from infra.gke import queues
from infra.gke.quota import fits, never_admitted, pod_sets
from tests import gke_objects as g

SHAPE = g.V5E_16_SPOT  # 16 chips a slice
FLAVOR = g.flavor(SHAPE)
TEAM_NAMES = ("a", "b", "c")
POOLS = {"p": replace(SHAPE, slices=64)}


def objects(nominals: list[int], limits: list[int | None]):
    teams = [
        TeamSettings(
            name=name,
            members=("user:x@example.com",),
            namespace=f"team-{name}",
            nominal_chips=(("p", nominal),),
            borrowing_limit=limit,
            priority="medium",
        )
        for name, nominal, limit in zip(TEAM_NAMES, nominals, limits, strict=False)
    ]
    (flavor,) = queues.flavors(POOLS.values())
    cqs = [queues.cluster_queue(t, [flavor], queues.nominal_by_flavor(t, POOLS)) for t in teams]
    return teams, cqs, {flavor.name: queues.resource_flavor(flavor)}


def a_cohort(team_settings: tuple[list[int], list[int | None], list[int]], slices: int):
    """Team 0's JobSet of `slices` slices, the cohort's ClusterQueues and flavors, and each team's usage."""
    nominals, limits, used = team_settings
    teams, cqs, flavors = objects(nominals, limits)
    job = g.jobset(team=teams[0], shape=SHAPE, slices=slices)
    usage = {(t.name, FLAVOR): u for t, u in zip(teams, used, strict=True)}
    return job, cqs, flavors, usage


def kueue_rule(asked: int, nominals: list[int], limits: list[int | None], used: list[int]) -> tuple[bool, bool]:
    """(fits, borrows) for team 0, from the documented rule."""
    unused_own = max(nominals[0] - used[0], 0)
    if asked <= unused_own:
        return True, False
    cohort_unused = sum(max(n - u, 0) for n, u in zip(nominals, used, strict=True))
    limit_ok = limits[0] is None or asked <= nominals[0] + limits[0] - used[0]
    return (asked <= cohort_unused and limit_ok), True


teams_st = st.integers(min_value=1, max_value=3).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 96), min_size=n, max_size=n),
        st.lists(st.one_of(st.none(), st.integers(0, 64)), min_size=n, max_size=n),
        st.lists(st.integers(0, 96), min_size=n, max_size=n),
    )
)


@settings(max_examples=300, deadline=None)
@given(teams_st, st.integers(min_value=1, max_value=6))
def test_fit_is_kueues_rule(team_settings, slices):
    nominals, limits, used = team_settings
    job, cqs, flavors, usage = a_cohort(team_settings, slices)
    asked = sum(p.chips for p in pod_sets(job))
    assert asked == slices * 16
    fit = fits(job, cqs[0], cqs, flavors, usage)
    expected, borrows = kueue_rule(asked, nominals, limits, used)
    assert (fit is not None) == expected
    if fit is not None:
        assert (fit.flavor, fit.borrows) == (FLAVOR, borrows)


@settings(max_examples=200, deadline=None)
@given(teams_st, st.integers(min_value=1, max_value=6), st.data())
def test_less_usage_never_turns_a_fit_away(team_settings, slices, data):
    job, cqs, flavors, usage = a_cohort(team_settings, slices)
    less = {key: data.draw(st.integers(0, value)) for key, value in usage.items()}
    if fits(job, cqs[0], cqs, flavors, usage) is not None:
        assert fits(job, cqs[0], cqs, flavors, less) is not None


@settings(max_examples=200, deadline=None)
@given(teams_st, st.integers(min_value=1, max_value=6))
def test_never_admitted_is_no_fit_on_an_idle_cohort(team_settings, slices):
    job, cqs, flavors, _ = a_cohort(team_settings, slices)
    assert (never_admitted(job, cqs[0], cqs, flavors) is None) == (fits(job, cqs[0], cqs, flavors, {}) is not None)


def test_a_jobset_on_a_shape_its_queue_does_not_serve_never_fits():
    objs = g.queue_objects()
    cqs = [o for o in objs if o["kind"] == "ClusterQueue"]
    flavors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceFlavor"}
    job = g.jobset(shape=replace(g.V5E_16_SPOT, topology="8x8"))
    assert fits(job, cqs[0], cqs, flavors, {}) is None
    assert "no flavor" in (never_admitted(job, cqs[0], cqs, flavors) or "")


def test_borrowing_is_reported():
    objs = g.queue_objects()
    cqs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ClusterQueue"}
    flavors = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ResourceFlavor"}
    # The flex v6e pools (32 chips) are all nlp's nominal quota; vision, idle there, borrows them...
    job = g.jobset(team=g.VISION, shape=g.V6E_16_FLEX, slices=1)
    fit = fits(job, cqs["vision"], list(cqs.values()), flavors, {})
    assert fit is not None and fit.borrows and fit.flavor == g.flavor(g.V6E_16_FLEX)
    # ...but not once nlp uses its quota: its nominal is its own.
    assert fits(job, cqs["vision"], list(cqs.values()), flavors, {("nlp", fit.flavor): 32}) is None
