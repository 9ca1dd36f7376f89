"""The stack file's `gke` section: read with its defaults, and every bad setting named with its fix,
before anything is registered (one test per class of mistake)."""

from __future__ import annotations

import json

import pytest

from infra.config import parse_stack_config
from infra.config.model import TeamSettings
from tests.gke_objects import FOLDER_IMAGE
from tests.support import NS, fixture_config, replace_object, with_object
from tests.test_config import problems_of

BASE = fixture_config("gke")


def gke_problems(edit) -> str:
    return problems_of(with_object(BASE, "gke", edit), "gke")


def pool_problems(index: int = 0, **changes) -> str:
    def edit(gke):
        for key, value in changes.items():
            if value is None:
                gke["slicePools"][index].pop(key, None)
            else:
                gke["slicePools"][index][key] = value

    return gke_problems(edit)


def test_the_fixture_reads_with_the_defaults():
    gke = parse_stack_config("gke", BASE).gke
    assert gke is not None
    assert (gke.region, gke.release_channel, gke.tpu_pool_upgrades) == ("us-central1", "REGULAR", "end-of-support")
    assert (gke.maintenance.days, gke.maintenance.start_utc, gke.maintenance.hours) == (("SA", "SU"), "02:00", 8)
    assert (gke.system_machine_type, gke.system_nodes_per_zone) == ("e2-standard-4", 1)
    v5e, ironwood = gke.slice_pools
    assert (v5e.accelerator.name, v5e.provisioning, v5e.slices) == ("v5litepod-16", "spot", 1)
    assert (ironwood.accelerator.name, ironwood.provisioning) == ("tpu7x-16", "on-demand")
    assert gke.zones == ("us-central1-a", "us-central1-c")


def test_a_stack_without_the_section_has_no_gke_engine():
    assert parse_stack_config("gke", {k: v for k, v in BASE.items() if k != f"{NS}:gke"}).gke is None


@pytest.mark.parametrize(
    ("type_name", "message"),
    [
        ("v3-8", "'v3-8': TPU v3 is not offered as GKE node pools; GKE node pools take v4-N (v4)"),
        ("v5litepod-4", "'v5litepod-4': not a v5e size GKE node pools take; valid sizes: v5litepod-8"),
        ("tpu8-16", "'tpu8-16': unknown TPU type for GKE; types look like"),
        ("V5E", "'V5E': a TPU type GKE node pools take, like v5litepod-16"),
    ],
)
def test_a_type_gke_does_not_take(type_name, message):
    assert f"{NS}:gke.slicePools[v5e].acceleratorType = {message}" in pool_problems(acceleratorType=type_name)


def test_a_zone_without_that_type():
    assert (
        f"{NS}:gke.slicePools[ironwood].zone = 'us-central1-a': tpu7x-16 is not offered in us-central1-a; "
        "zones that offer it: us-central1-c"
    ) in pool_problems(1, zone="us-central1-a")


def test_a_zone_outside_the_clusters_region():
    message = pool_problems(zone="us-west4-a")
    assert (
        f"{NS}:gke.slicePools[v5e].zone = 'us-west4-a': is not in the cluster's region us-central1; set zone: "
        "us-central1-a"
    ) in message


def test_reservations_go_with_reserved():
    assert (
        f"{NS}:gke.slicePools[v5e].reservationName = (not set): a reserved pool names the reservation it consumes"
        in pool_problems(provisioning="reserved")
    )
    assert (
        f"{NS}:gke.slicePools[v5e].reservationName = 'res-1': only provisioning: reserved takes it; set "
        "provisioning: reserved, or remove reservationName" in pool_problems(reservationName="res-1")
    )


def test_flex_start_settings():
    assert f"{NS}:gke.slicePools[v5e].runDurationHours = 24: only provisioning: flex-start takes it" in pool_problems(
        runDurationHours=24
    )
    message = pool_problems(acceleratorType="v4-16", zone="us-central2-b", provisioning="flex-start")
    assert "v4 node pools are not offered with flex-start; generations that are: v5e, v6e, tpu7x" in message
    assert f"{NS}:gke.slicePools[v5e].runDurationHours = 200: must be a number > 0 and <= 168" in pool_problems(
        provisioning="flex-start", runDurationHours=200
    )


def test_preemptible_is_not_a_pool_provisioning():
    message = pool_problems(provisioning="preemptible")
    assert (
        f"{NS}:gke.slicePools[v5e].provisioning = 'preemptible': must be one of flex-start, on-demand, reserved, spot"
        in message
    )


def test_pool_names():
    assert "another slice pool of this stack has this name" in pool_problems(1, name="v5e")
    assert f"{NS}:gke.slicePools[{'x' * 25}].name = '{'x' * 25}': 1-24 lowercase letters" in pool_problems(
        name="x" * 25
    )
    assert f"{NS}:gke.slicePools[v5e].slices = 65: must be an integer" in pool_problems(slices=65)


def test_a_pool_given_twice_is_named_not_a_traceback():
    # A pool holds its catalog type, which cannot be hashed: the list's check for repeats once raised TypeError.
    assert "slicePools[2].name = 'v5e': another slice pool of this stack has this name" in gke_problems(
        lambda gke: gke["slicePools"].append(dict(gke["slicePools"][0]))
    )


def test_a_cluster_needs_a_slice_pool():
    assert f"{NS}:gke.slicePools = []: declare at least one slice pool" in gke_problems(
        lambda gke: gke.update(slicePools=[])
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("nodeCidr", "10.30.0.0/22", f"overlaps {NS}:network.subnets.us-central1"),
        ("serviceCidr", "10.40.0.0/24", f"overlaps {NS}:gke.nodeCidr"),
        ("podCidr", "8.8.0.0/16", "must be a private IPv4 range"),
        ("nodeCidr", "10.40.0.1/20", "must be an IPv4 network like 10.20.0.0/20, with no host bits set"),
    ],
)
def test_the_clusters_ranges(key, value, message):
    assert f"{NS}:gke.{key} = {value!r}: {message}" in gke_problems(lambda gke: gke.update({key: value}))


def test_the_maintenance_window_gives_gke_enough_time():
    short = gke_problems(lambda gke: gke.update(maintenanceWindow={"days": ["SU"], "hours": 4}))
    assert "GKE needs a window open at least 48 hours in any 32 days; this one is open 16: add days or hours" in short
    twice = gke_problems(lambda gke: gke.update(maintenanceWindow={"days": ["SA", "SU", "SA"]}))
    assert f"{NS}:gke.maintenanceWindow.days = ['SA', 'SU', 'SA']: must not repeat SA; set days: [SA, SU]" in twice
    assert f"{NS}:gke.maintenanceWindow.startUtc = '25:00': HH:MM" in gke_problems(
        lambda gke: gke.update(maintenanceWindow={"startUtc": "25:00"})
    )
    assert f"{NS}:gke.maintenanceWindow.hours = 2: must be an integer" in gke_problems(
        lambda gke: gke.update(maintenanceWindow={"hours": 2, "days": ["MO", "TU", "WE", "TH", "FR", "SA"]})
    )


def test_channel_and_upgrades_are_chosen_from_what_gke_has():
    assert "must be one of EXTENDED, RAPID, REGULAR, STABLE" in gke_problems(lambda g: g.update(releaseChannel="NONE"))
    assert "must be one of end-of-support, maintenance-window" in gke_problems(lambda g: g.update(tpuPoolUpgrades="x"))


def test_a_typo_is_refused_not_defaulted():
    assert f"{NS}:gke.slicePools[v5e].slice" in pool_problems(slice=2)
    assert f"{NS}:gke.systemPool.nodesPerzone" in gke_problems(lambda g: g.update(systemPool={"nodesPerzone": 2}))


def test_every_problem_is_reported_at_once():
    def edit(gke):
        gke["releaseChannel"] = "NONE"
        gke["slicePools"][0]["acceleratorType"] = "v3-8"
        gke["slicePools"][1]["zone"] = "us-central1-a"

    message = gke_problems(edit)
    assert message.startswith("stack 'gke': 3 invalid settings")


def test_gke_only_types_are_refused_as_tpu_vms():
    raw = replace_object(
        BASE,
        "tpuVms",
        [
            {
                "name": "iron",
                "acceleratorType": "tpu7x-16",
                "zone": "us-central1-c",
                "runtimeVersion": "x",
                "workload": "mnist",
            }
        ],
    )
    assert (
        f"{NS}:tpuVms[iron].acceleratorType = 'tpu7x-16': TPU7x (Ironwood) is offered only through Compute Engine and "
        "GKE, not the Cloud TPU API"
    ) in problems_of(raw, "gke")


def test_the_raw_section_is_json_like_pulumi_passes_it():
    assert json.loads(BASE[f"{NS}:gke"])["slicePools"][0]["name"] == "v5e"


# --- teams ---------------------------------------------------------------------------------------------


def team_problems(index: int = 0, **changes) -> str:
    def edit(gke):
        for key, value in changes.items():
            if value is None:
                gke["teams"][index].pop(key, None)
            else:
                gke["teams"][index][key] = value

    return gke_problems(edit)


def test_teams_read_with_their_defaults():
    gke = parse_stack_config("gke", BASE).gke
    assert gke is not None
    vision, nlp = gke.teams
    assert vision == TeamSettings(
        name="vision",
        members=("user:ada@example.com",),
        namespace="team-vision",
        nominal_chips=(("v5e", 16),),
        borrowing_limit=8,
        priority="high",
    )
    assert (nlp.namespace, nlp.borrowing_limit, nlp.priority) == ("team-nlp", None, "medium")
    assert gke.rbac_security_group == ""


@pytest.mark.parametrize(
    ("index", "changes", "message"),
    [
        (0, {"name": "Vision"}, "gke.teams[0].name = 'Vision': 1-30 lowercase letters"),
        (0, {"name": "v" * 31}, f"gke.teams[{'v' * 31}].name = '{'v' * 31}': 1-30 lowercase letters, digits and '-'"),
        (1, {"name": "vision"}, "gke.teams[1].name = 'vision': another team of this stack has this name"),
        (1, {"namespace": "team-vision"}, "gke.teams[nlp].namespace = 'team-vision': another team of this stack has"),
        (0, {"namespace": "kube-system"}, "gke.teams[vision].namespace = 'kube-system': a namespace of its own"),
        (0, {"namespace": "kueue-system"}, "gke.teams[vision].namespace = 'kueue-system': a namespace of its own"),
        (0, {"namespace": "default"}, "gke.teams[vision].namespace = 'default': a namespace of its own"),
        (0, {"namespace": "gke-managed-x"}, "gke.teams[vision].namespace = 'gke-managed-x': a namespace of its own"),
        (0, {"namespace": "Team_A"}, "gke.teams[vision].namespace = 'Team_A': 1-63 lowercase letters"),
        (0, {"members": []}, "gke.teams[vision].members = []: list at least one user: or group:"),
        (
            0,
            {"members": ["ada@example.com"]},
            "gke.teams[vision].members[0] = 'ada@example.com': an IAM member user:EMAIL",
        ),
        (
            0,
            {"members": ["serviceAccount:x@p.iam.gserviceaccount.com"]},
            "gke.teams[vision].members[0] = 'serviceAccount:",
        ),
        (
            0,
            {"nominalChips": {"v6e": 16}},
            "gke.teams[vision].nominalChips.v6e = 16: names no slice pool of this stack",
        ),
        (
            0,
            {"nominalChips": {"v5e": 8}},
            "gke.teams[vision].nominalChips.v5e = 8: a job takes whole slices: a multiple of 16",
        ),
        (0, {"nominalChips": {"v5e": 32}}, "gke.teams[vision].nominalChips.v5e = 32: pool v5e holds 16 chips"),
        (
            0,
            {"nominalChips": {"v5e": -16}},
            "gke.teams[vision].nominalChips.v5e = -16: a whole number of TPU chips, 0 or",
        ),
        (0, {"nominalChips": {"v5e": "16"}}, "gke.teams[vision].nominalChips.v5e = '16': a whole number of TPU chips"),
        (0, {"borrowingLimit": -1}, "gke.teams[vision].borrowingLimit = -1: must be an integer >= 0"),
        (0, {"borrowingLimit": "lots"}, "gke.teams[vision].borrowingLimit = 'lots': must be an integer"),
        (
            0,
            {"priority": "urgent"},
            "gke.teams[vision].priority = 'urgent': must be one of high, low, medium, very-high",
        ),
        (0, {"nominalChip": {"v5e": 16}}, "gke.teams[vision].nominalChip = {'v5e': 16}: unknown key"),
    ],
)
def test_a_bad_team_is_named_with_its_fix(index, changes, message):
    found = team_problems(index, **changes)
    assert f"{NS}:{message}" in found
    assert found.startswith("stack 'gke': 1 invalid setting")  # one mistake, one problem: nothing cascades


def test_groups_need_google_groups_for_rbac():
    message = team_problems(members=["group:vision@example.com"])
    assert (
        f"{NS}:gke.teams[vision].members = ['group:vision@example.com']: GKE resolves groups in RBAC only with Google "
        f"Groups for RBAC: set {NS}:gke.rbacSecurityGroup"
    ) in message

    def with_group(gke):
        gke["teams"][0]["members"] = ["group:vision@example.com"]
        gke["rbacSecurityGroup"] = "gke-security-groups@example.com"

    gke = parse_stack_config("gke", with_object(BASE, "gke", with_group)).gke
    assert gke is not None and gke.rbac_security_group == "gke-security-groups@example.com"
    assert "gke.rbacSecurityGroup = 'security@example.com': gke-security-groups@ followed by your domain" in (
        gke_problems(lambda g: g.update(rbacSecurityGroup="security@example.com"))
    )


def test_teams_are_guaranteed_at_most_the_chips_their_pools_hold():
    def both_want_v5e(gke):
        gke["teams"][1]["nominalChips"] = {"v5e": 16}

    assert (
        "the teams are guaranteed 32 chips of tpu-v5-lite-podslice-4x4-spot (pools v5e), which hold 16: a "
        "guarantee is chips that exist"
    ) in gke_problems(both_want_v5e)

    def two_pools_of_one_shape(gke):
        gke["slicePools"].append({**gke["slicePools"][0], "name": "v5e-more"})
        gke["teams"][1]["nominalChips"] = {"v5e-more": 16}

    assert parse_stack_config("gke", with_object(BASE, "gke", two_pools_of_one_shape)).gke is not None


@pytest.mark.parametrize(
    "image",
    [
        "gcr.io/google.com/cloudsdktool/google-cloud-cli:slim",  # a tag moves under a running stack
        "python@sha256:" + "c" * 63,
        "Python@sha256:" + "c" * 64,
        "gcr.io/google.com/cloudsdktool/google-cloud-cli@sha1:" + "c" * 40,
    ],
)
def test_the_folder_image_is_pinned_by_digest(image):
    message = gke_problems(lambda gke: gke.update(folderImage=image))
    allowed = "an image pinned by digest, like gcr.io/google.com/cloudsdktool/google-cloud-cli@sha256:<64 hex digits>"
    assert f"{NS}:gke.folderImage = {image!r}: {allowed}" in message


def test_the_folder_image_reads_pinned_and_defaults_to_none():
    assert parse_stack_config("gke", BASE).gke.folder_image == FOLDER_IMAGE  # type: ignore[union-attr]
    unset = parse_stack_config("gke", with_object(BASE, "gke", lambda g: g.pop("folderImage")))
    assert unset.gke is not None and unset.gke.folder_image == ""
    for image in (FOLDER_IMAGE, "us-docker.pkg.dev/acme/public/jax:0.6@sha256:" + "d" * 64):
        gke = parse_stack_config("gke", with_object(BASE, "gke", lambda g, i=image: g.update(folderImage=i))).gke
        assert gke is not None and gke.folder_image == image
