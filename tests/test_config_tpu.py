"""TPU VM entries in the stack file: each mistake names the entry's key and says what to do."""

from __future__ import annotations

import pytest

from infra.config import parse_stack_config
from tests.support import fixture_config, with_object
from tests.test_config import problems_of


def vm_edit(**changes):
    def edit(vms):
        for key, value in changes.items():
            if value is None:
                vms[0].pop(key, None)
            else:
                vms[0][key] = value

    return edit


def vm_problems(stack: str = "small", **changes) -> str:
    return problems_of(with_object(fixture_config(stack), "tpuVms", vm_edit(**changes)), stack)


@pytest.mark.parametrize("name", ["Mnist", "mnist_v2", "-mnist", "9lives", "x" * 64])
def test_bad_vm_name(name):
    assert f"tpu-platform:tpuVms[0].name = {name!r}: 1-63 lowercase letters" in vm_problems(name=name)


def test_unknown_workload_lists_the_known_ones():
    assert "tpu-platform:tpuVms[small-v2].workload = 'bert': must be one of mnist" in vm_problems(workload="bert")


def test_missing_zone():
    assert "tpu-platform:tpuVms[small-v2].zone = (not set): required" in vm_problems(zone=None)


def test_duplicate_vm_names():
    raw = with_object(fixture_config("small"), "tpuVms", lambda vms: vms.append(dict(vms[0])))
    assert "tpu-platform:tpuVms[1].name = 'small-v2': another TPU VM of this stack has this name" in problems_of(raw)


def test_zone_without_that_tpu():
    message = vm_problems(
        "production", acceleratorType="v4-8", runtimeVersion="tpu-vm-tf-2.15.0-pjrt", zone="europe-west4-a"
    )
    assert (
        "tpuVms[on-demand-v5e].zone = 'europe-west4-a': "
        "v4-8 is not offered in europe-west4-a; zones that offer it: us-central2-b" in (message)
    )


def test_runtime_that_does_not_match_the_pinned_framework():
    message = vm_problems(runtimeVersion="tpu-vm-tf-2.13.0")
    assert "tpuVms[small-v2].runtimeVersion = 'tpu-vm-tf-2.13.0': the runtime carries TensorFlow 2.13.0" in message
    assert "set runtimeVersion: tpu-vm-tf-2.14.1, or set tpu-platform:workloads.mnist.frameworkVersion: 2.13.0" in (
        message
    )


def test_unknown_accelerator_type():
    assert "tpuVms[small-v2].acceleratorType = 'v2-16': not a v2 size; valid sizes: v2-8, v2-32" in vm_problems(
        acceleratorType="v2-16"
    )


def test_an_empty_accelerator_type_is_refused():
    assert "tpuVms[small-v2].acceleratorType = '': a TPU type like v5litepod-8" in vm_problems(acceleratorType="")


def test_a_time_zone_too_long_for_a_file_name_is_refused_not_a_crash():
    schedule = {"stop": "0 20 * * *", "timeZone": "a" * 600}
    assert "tpuVms[small-v2].schedule.timeZone = 'aaaa" in vm_problems(schedule=schedule)


def test_spot_vm_needs_checkpoints():
    raw = with_object(
        fixture_config("scheduled"), "workloads", lambda w: w["mnist"].update(bucketAccess={"checkpoints": "none"})
    )
    message = problems_of(raw, "scheduled")
    assert (
        "tpu-platform:tpuVms[office-v2].provisioning = 'spot': a spot TPU can be reclaimed at any time: its workload"
        in message
    )


def test_region_without_a_subnet():
    message = vm_problems(
        "production", acceleratorType="v6e-8", zone="europe-west4-a", runtimeVersion="tpu-vm-tf-2.15.0-pjrt"
    )
    assert (
        "europe-west4 has no subnet under tpu-platform:network.subnets; "
        "set tpu-platform:network.subnets.europe-west4: 10.0.0.0/20"
    ) in message


def test_reserved_and_bad_labels():
    message = vm_problems(labels={"owner": "someone-else", "Team": "x", "ok": "Not Valid"})
    assert "tpuVms[small-v2].labels.owner = 'someone-else': 'owner' is set by the platform" in message
    assert "tpuVms[small-v2].labels.Team = 'Team': label keys need" in message
    assert "tpuVms[small-v2].labels.ok = 'Not Valid': label values need" in message


def test_bad_provisioning_model():
    assert "provisioning = 'cheap': must be one of flex-start, on-demand, preemptible, reserved, spot" in vm_problems(
        provisioning="cheap"
    )


@pytest.mark.parametrize(
    ("cidr", "expected"),
    [
        ("10.30.0.1/20", "no host bits set"),
        ("8.8.8.0/24", "must be a private IPv4 range"),
        ("banana", "must be an IPv4 network"),
    ],
)
def test_bad_subnet_cidr(cidr, expected):
    raw = with_object(fixture_config("small"), "network", lambda n: n["subnets"].update({"us-central1": cidr}))
    assert f"tpu-platform:network.subnets.us-central1 = {cidr!r}: " in problems_of(raw)
    assert expected in problems_of(raw)


def test_overlapping_subnets():
    raw = with_object(
        fixture_config("small"), "network", lambda n: n["subnets"].update({"europe-west4": "10.30.8.0/24"})
    )
    assert "network.subnets.europe-west4 = '10.30.8.0/24': overlaps the subnet of us-central1" in problems_of(raw)


def test_unpinned_framework_version():
    raw = with_object(fixture_config("small"), "workloads", lambda w: w["mnist"].update(frameworkVersion="latest"))
    assert "workloads.mnist.frameworkVersion = 'latest': an exact release like 2.15.0" in problems_of(raw)


# --- capacity: queued requests, reservations, multislice, fallback zones, flex-start, maxRunHours


def prod_vm_problems(**changes) -> str:
    return vm_problems("production", **changes)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"reservationName": "team-a", "provisioning": "reserved"},
            "tpuVms[on-demand-v5e].reservationName = 'team-a': only a queued request names a reservation (TPU API v2); "
            "set capacity",
        ),
        (
            {"nodeCount": 2},
            "tpuVms[on-demand-v5e].nodeCount = 2: "
            "a multislice is a queued request; set capacity: queued, or remove nodeCount",
        ),
        (
            {"fallbackZones": ["us-west4-a"]},
            "tpuVms[on-demand-v5e].fallbackZones = ['us-west4-a']: a direct VM's zone is fixed",
        ),
        (
            {"provisioning": "flex-start", "runDurationHours": 4},
            "tpuVms[on-demand-v5e].provisioning = 'flex-start': flex-start exists only for queued requests",
        ),
        (
            {"capacity": "queued", "provisioning": "preemptible"},
            "tpuVms[on-demand-v5e].provisioning = 'preemptible': "
            "a queued request takes on-demand, spot, reserved or flex-start",
        ),
        (
            {"capacity": "queued", "reservationName": "team-a"},
            "tpuVms[on-demand-v5e].reservationName = 'team-a': "
            "only provisioning: reserved takes it; set provisioning: reserved",
        ),
        (
            {"capacity": "queued", "provisioning": "reserved", "reservationName": "team a"},
            "tpuVms[on-demand-v5e].reservationName = 'team a': a reservation's short name: letters, digits and '-'",
        ),
        (
            {
                "capacity": "queued",
                "provisioning": "reserved",
                "reservationName": "team-a",
                "fallbackZones": ["us-west4-a"],
            },
            "reservationName = 'team-a': a reservation belongs to one zone (us-central1-a), so a request for it falls "
            "back nowhere; remove fallbackZones",
        ),
        (
            {"capacity": "queued", "provisioning": "flex-start"},
            "tpuVms[on-demand-v5e].runDurationHours = (not set): flex-start needs how long the VM runs, in hours",
        ),
        (
            {"capacity": "queued", "runDurationHours": 4},
            "tpuVms[on-demand-v5e].runDurationHours = 4: only provisioning: flex-start",
        ),
        (
            {"capacity": "queued", "provisioning": "flex-start", "runDurationHours": 200},
            "tpuVms[on-demand-v5e].runDurationHours = 200: must be a number > 0 and <= 168",
        ),
        (
            {"capacity": "queued", "fallbackZones": ["us-central1-a"]},
            "tpuVms[on-demand-v5e].fallbackZones[0] = 'us-central1-a': is the VM's own zone",
        ),
        (
            {"capacity": "queued", "fallbackZones": ["us-central2-b"]},
            "tpuVms[on-demand-v5e].fallbackZones[0] = 'us-central2-b': v5litepod-8 is not offered in us-central2-b; "
            "zones that offer",
        ),
        (
            {"capacity": "queued", "fallbackZones": ["us-west4-a"]},
            "tpuVms[on-demand-v5e].fallbackZones[0] = 'us-west4-a': "
            "us-west4 has no subnet under tpu-platform:network.subnets; set "
            "tpu-platform:network.subnets.us-west4: 10.0.0.0/20",
        ),
        ({"nodeCount": 0}, "tpuVms[on-demand-v5e].nodeCount = 0: must be an integer >= 1 and <= 1024"),
        (
            {"maxRunHours": 24},
            "tpuVms[on-demand-v5e].maxRunHours = 24: bounds a run to completion, which keep never ends; set "
            "onCompletion: stop, or set onCompletion: delete, or remove maxRunHours",
        ),
    ],
)
def test_capacity_settings_are_checked_together(changes, expected):
    assert expected in prod_vm_problems(**changes)


def roomy_network(raw: dict[str, str]) -> dict[str, str]:
    """Subnets in the regions a test's zones are in."""
    more = {"us-west4": "10.31.0.0/20", "us-west1": "10.32.0.0/20", "us-south1": "10.33.0.0/20"}
    return with_object(raw, "network", lambda n: n["subnets"].update(more))


def test_flex_start_is_checked_against_googles_zones():
    flex = {"capacity": "queued", "provisioning": "flex-start", "runDurationHours": 4}
    west = with_object(roomy_network(fixture_config("production")), "tpuVms", vm_edit(**flex, zone="us-west1-c"))
    assert (
        "tpuVms[on-demand-v5e].zone = 'us-west1-c': "
        "flex-start v5e is offered only in us-central1-a (serving), us-west4-a" in (problems_of(west, "production"))
    )
    fallback = with_object(
        roomy_network(fixture_config("production")),
        "tpuVms",
        vm_edit(**flex, zone="us-west4-a", fallbackZones=["us-south1-a"]),
    )
    message = problems_of(fallback, "production")
    assert "tpuVms[on-demand-v5e].fallbackZones[0] = 'us-south1-a': flex-start v5e is offered only in" in message
    # Listed for serving only: the plan goes on, and says so.
    serving = parse_stack_config("production", with_object(fixture_config("production"), "tpuVms", vm_edit(**flex)))
    assert any("tpuVms[on-demand-v5e].zone" in w and "for serving, not for training" in w for w in serving.warnings)
    training = parse_stack_config(
        "production",
        with_object(roomy_network(fixture_config("production")), "tpuVms", vm_edit(**flex, zone="us-west4-a")),
    )
    assert not [w for w in training.warnings if "flex-start" in w]
    v5p = {"acceleratorType": "v5p-8", "zone": "us-east5-a", "runtimeVersion": "v2-alpha-tpuv5"}
    assert "tpuVms[on-demand-v5e].acceleratorType = 'v5p-8': v5p is not offered with flex-start" in vm_problems(
        "production", **flex, **v5p
    )


def test_a_queued_vm_is_never_stopped_only_deleted():
    """The guard and the schedules stop a node by its name and zone in the stack: a queued request may
    have landed in a fallback zone, a multislice's nodes are `<vm>-<i>`, and a request has no stop."""
    queued = {"capacity": "queued", "provisioning": "spot"}
    message = vm_problems(
        "scheduled",
        **queued,
        acceleratorType="v5litepod-8",
        zone="us-central1-a",
        runtimeVersion="tpu-vm-tf-2.15.0-pjrt",
        onCompletion="stop",
    )
    assert "tpuVms[office-v2].onCompletion = 'stop': a queued request's TPUs cannot be stopped, only deleted" in message
    assert (
        "tpuVms[office-v2].schedule = {'start': '0 8 * * 1-5', 'stop': '0 20 * * 1-5'}: a queued request's TPUs"
        in message
    )
    deleted = parse_stack_config(
        "production", with_object(fixture_config("production"), "tpuVms", vm_edit(**queued, onCompletion="delete"))
    )
    assert deleted.tpu_vms[0].queued


def test_a_multislices_node_names_are_its_own():
    """`ms` with two slices has nodes ms-0 and ms-1: no other VM of the stack may be called ms-1."""
    raw = with_object(
        fixture_config("production"),
        "tpuVms",
        lambda vms: vms.__setitem__(
            slice(None),
            [
                {
                    **vms[0],
                    "name": "ms",
                    "capacity": "queued",
                    "nodeCount": 2,
                    "provisioning": "spot",
                    "acceleratorType": "v5litepod-16",
                    "runtimeVersion": "tpu-vm-tf-2.15.0-pod-pjrt",
                },
                {**vms[1], "name": "ms-1"},
            ],
        ),
    )
    assert "tpuVms[ms-1].name = 'ms-1': its TPU nodes' names are taken by TPU VM ms" in problems_of(raw, "production")


def test_max_run_hours_needs_the_guards_periodic_check():
    raw = with_object(fixture_config("small"), "tpuVms", vm_edit(maxRunHours=24))
    assert (
        "tpuVms[small-v2].maxRunHours = 24: is enforced by the guard's periodic check; set "
        "tpu-platform:automation.recovery.everyMinutes: 10"
    ) in problems_of(raw)


def test_multislice_needs_a_type_the_catalog_marks_capable():
    message = vm_problems(capacity="queued", nodeCount=2, provisioning="spot")
    assert "tpuVms[small-v2].acceleratorType = 'v2-8': v2 is not offered through queued resources" in message


def test_a_queued_multislice_with_fallbacks_is_accepted():
    raw = with_object(
        fixture_config("production"), "network", lambda n: n["subnets"].update({"us-west4": "10.31.0.0/20"})
    )
    raw = with_object(
        raw,
        "tpuVms",
        vm_edit(
            capacity="queued",
            nodeCount=2,
            acceleratorType="v5litepod-16",
            runtimeVersion="tpu-vm-tf-2.15.0-pod-pjrt",
            fallbackZones=["us-west4-a"],
            provisioning="spot",
        ),
    )
    cfg = parse_stack_config("production", raw)
    assert (cfg.tpu_vms[0].zones, cfg.tpu_vms[0].node_count) == (("us-central1-a", "us-west4-a"), 2)


def test_max_run_hours_with_a_schedule_is_refused():
    """The guard counts a run from the node's creation, which a scheduled stop and start keeps."""
    message = vm_problems("scheduled", onCompletion="stop", maxRunHours=4)
    assert "counts from the node's creation, so a schedule's daily restarts would trip it" in message
