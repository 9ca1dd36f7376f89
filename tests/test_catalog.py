"""The TPU catalog's rules: one accepted and one rejected case each, asserting on the advice given."""

from __future__ import annotations

import math

import pytest

from infra.catalog import AcceleratorType, load_catalog

catalog = load_catalog()


def accelerator(name: str) -> AcceleratorType:
    result = catalog.accelerator(name)
    assert isinstance(result, AcceleratorType), result
    return result


@pytest.mark.parametrize(
    ("name", "chips", "hosts", "multi_host"),
    [
        ("v2-8", 4, 1, False),
        ("v3-32", 16, 4, True),
        ("v4-8", 4, 1, False),
        ("v4-32", 16, 4, True),
        ("v5litepod-8", 8, 1, False),
        ("v5litepod-16", 16, 4, True),
        ("v5p-16", 8, 2, True),
        ("v6e-1", 1, 1, False),
        ("v6e-256", 256, 64, True),
    ],
)
def test_chips_and_hosts(name, chips, hosts, multi_host):
    acc = accelerator(name)
    assert (acc.chips, acc.hosts, acc.multi_host) == (chips, hosts, multi_host)


def test_unknown_size_lists_the_valid_ones():
    assert catalog.accelerator("v4-9") == (
        "not a v4 size; valid sizes: v4-8, v4-16, v4-32, v4-64, v4-128, v4-256, v4-512, v4-1024, v4-2048, v4-4096"
    )


def test_unknown_generation_shows_the_type_shapes():
    assert "types look like v2-N, v3-N, v4-N, v5litepod-N, v5p-N, v6e-N" in str(catalog.accelerator("v9-8"))


def test_tpu7x_is_refused_with_the_reason():
    assert "only through Compute Engine and GKE" in str(catalog.accelerator("tpu7x-8"))


def test_zone_rule():
    assert catalog.zone_problem(accelerator("v4-8"), "us-central2-b") is None
    assert catalog.zone_problem(accelerator("v4-8"), "europe-west4-a") == (
        "v4-8 is not offered in europe-west4-a; zones that offer it: us-central2-b"
    )


def test_zone_rule_by_size():
    assert catalog.zone_problem(accelerator("v2-8"), "us-central1-b") is None
    assert "zones that offer it: europe-west4-a, us-central1-a" in str(
        catalog.zone_problem(accelerator("v2-32"), "us-central1-b")
    )


def test_tensorflow_version_must_match_the_runtime():
    v3 = accelerator("v3-8")
    assert catalog.runtime_problem(v3, "tpu-vm-tf-2.13.0", "tensorflow", "2.13.0") is None
    why = catalog.runtime_problem(v3, "tpu-vm-tf-2.13.0", "tensorflow", "2.15.0")
    assert why == (
        "the runtime carries TensorFlow 2.13.0 but the workload is pinned to 2.15.0 (at run time: 'Failed to connect "
        "to remote TPU')"
    )
    # What an error may suggest: the runtime of the pinned version, or the version the runtime carries.
    assert catalog.runtime_choices(v3, "tpu-vm-tf-2.13.0", "tensorflow", "2.15.0") == (
        ("tpu-vm-tf-2.15.0-pjrt", "2.15.0"),
        ("tpu-vm-tf-2.13.0", "2.13.0"),
    )


def test_multi_host_needs_a_pod_runtime():
    assert catalog.runtime_problem(accelerator("v4-32"), "tpu-vm-tf-2.15.0-pod-pjrt", "tensorflow", "2.15.0") is None
    assert catalog.runtime_problem(accelerator("v4-32"), "tpu-vm-tf-2.15.0-pjrt", "tensorflow", "2.15.0") == (
        "v4-32 is a multi-host slice (4 VMs) and needs a -pod runtime"
    )
    assert catalog.runtime_choices(accelerator("v4-32"), "tpu-vm-tf-2.15.0-pjrt", "tensorflow", "2.15.0") == (
        ("tpu-vm-tf-2.15.0-pod-pjrt", "2.15.0"),
    )
    assert "must not use a -pod runtime" in str(
        catalog.runtime_problem(accelerator("v4-8"), "tpu-vm-tf-2.15.0-pod-pjrt", "tensorflow", "2.15.0")
    )


def test_pjrt_suffix_from_2_15_and_v4_suffix_until_2_10():
    v2 = accelerator("v2-8")
    assert catalog.runtime_problem(v2, "tpu-vm-tf-2.15.0-se", "tensorflow", "2.15.0") is None
    assert catalog.runtime_problem(v2, "tpu-vm-tf-2.15.0", "tensorflow", "2.15.0")
    assert catalog.runtime_choices(v2, "tpu-vm-tf-2.15.0", "tensorflow", "2.15.0") == (
        ("tpu-vm-tf-2.15.0-pjrt", "2.15.0"),
    )
    v4 = accelerator("v4-8")
    assert catalog.runtime_problem(v4, "tpu-vm-tf-2.10.0-v4", "tensorflow", "2.10.0") is None
    assert catalog.runtime_problem(v4, "tpu-vm-tf-2.10.0", "tensorflow", "2.10.0")
    assert catalog.runtime_choices(v4, "tpu-vm-tf-2.10.0", "tensorflow", "2.10.0") == (
        ("tpu-vm-tf-2.10.0-v4", "2.10.0"),
    )


def test_new_generations_need_a_recent_tensorflow():
    v5e = accelerator("v5litepod-8")
    assert catalog.runtime_problem(v5e, "tpu-vm-tf-2.15.0-pjrt", "tensorflow", "2.15.0") is None
    assert catalog.runtime_problem(v5e, "tpu-vm-tf-2.14.1", "tensorflow", "2.14.1") == (
        "v5e needs TensorFlow 2.15.0 or newer"
    )
    assert catalog.runtime_problem(v5e, "tpu-vm-tf-2.15.0-se", "tensorflow", "2.15.0")
    assert catalog.runtime_choices(v5e, "tpu-vm-tf-2.15.0-se", "tensorflow", "2.15.0") == (
        ("tpu-vm-tf-2.15.0-pjrt", "2.15.0"),
    )


def test_a_generation_that_takes_no_runtime_of_the_pinned_version_is_offered_the_oldest_it_takes():
    """A v5litepod-8 on v2-alpha-tpuv5-lite with a workload pinned to TF 2.14.1: no tpu-vm-tf-2.14.1
    runtime runs on v5e, so what is offered is TF 2.15.0 on its runtime, never tpu-vm-tf-2.14.1."""
    v5e = accelerator("v5litepod-8")
    why = catalog.runtime_problem(v5e, "v2-alpha-tpuv5-lite", "tensorflow", "2.14.1")
    assert why == (
        "not a TensorFlow runtime, which a workload pinned to TensorFlow 2.14.1 needs (v5e needs TensorFlow "
        "2.15.0 or newer)"
    )
    assert catalog.tf_runtime(v5e, "2.14.1") is None
    assert catalog.runtime_choices(v5e, "v2-alpha-tpuv5-lite", "tensorflow", "2.14.1") == (
        ("tpu-vm-tf-2.15.0-pjrt", "2.15.0"),
    )
    assert catalog.runtime_choices(v5e, "tpu-vm-tf-2.14.1", "tensorflow", "2.14.1") == (
        ("tpu-vm-tf-2.15.0-pjrt", "2.15.0"),
    )


@pytest.mark.parametrize("generation", sorted(catalog.generations))
@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
def test_every_runtime_choice_passes_the_checks_that_refused_the_old_one(generation, framework):
    """Whatever runtime and version a VM has, each choice offered passes runtime_problem and software_problem."""
    gen = catalog.generations[generation]
    versions = ["2.1.0", "2.10.0", "2.14.1", "2.15.0", "2.16.1"] if framework == "tensorflow" else ["0.4.35", "0.10.2"]
    shapes = {AcceleratorType(gen, size).multi_host: AcceleratorType(gen, size) for size in gen.sizes}
    tf_runtimes = {catalog.expected_tf_runtime(acc, v) for acc in shapes.values() for v in versions}
    runtimes = sorted({gen.jax_runtime, "tpu-ubuntu2204-base", *tf_runtimes})
    for acc in shapes.values():  # a single host and a multi-host slice: runtimes differ only by that
        for runtime in runtimes:
            for version in versions:
                choices = catalog.runtime_choices(acc, runtime, framework, version)
                broken = catalog.runtime_problem(acc, runtime, framework, version) or catalog.software_problem(
                    runtime, framework, version
                )
                assert choices or not broken, (acc.name, runtime, version)
                for new_runtime, new_version in choices:
                    assert catalog.runtime_problem(acc, new_runtime, framework, new_version) is None
                    assert catalog.software_problem(new_runtime, framework, new_version) is None


def test_jax_runtime_per_generation():
    assert catalog.runtime_problem(accelerator("v6e-8"), "v2-alpha-tpuv6e", "jax", "0.4.35") is None
    assert catalog.runtime_problem(accelerator("v6e-8"), "tpu-ubuntu2204-base", "jax", "0.4.35") == (
        "JAX on v6e runs on runtime v2-alpha-tpuv6e, not tpu-ubuntu2204-base"
    )


def test_every_offered_type_is_priced_in_the_region_of_each_zone_and_spot_is_cheaper():
    assert catalog.prices_date and catalog.prices_source
    for generation in catalog.generations.values():
        for size in generation.sizes:
            acc = AcceleratorType(generation, size)
            for zone in generation.zones_for(size):
                region = zone.rsplit("-", 1)[0]
                on_demand = catalog.price_per_chip_hour(acc, "on-demand", region)
                spot = catalog.price_per_chip_hour(acc, "spot", region)
                assert on_demand and spot, f"{acc.name} in {zone}: no price for {region}"
                assert 0 < spot < on_demand


def test_prices_are_each_regions_own_and_never_borrowed():
    # skypilot-catalog vms.csv @6f65ab5: v5litepod-8 9.6 on-demand in us-central1, 11.328 in us-south1.
    v5e = accelerator("v5litepod-8")
    assert catalog.price_per_chip_hour(v5e, "on-demand", "us-central1") == pytest.approx(9.6 / 8)
    assert catalog.price_per_chip_hour(v5e, "on-demand", "us-south1") == pytest.approx(11.328 / 8)
    assert catalog.price_per_chip_hour(v5e, "spot", "us-south1") == pytest.approx(4.5312 / 8)
    # v2 pods have no price in asia-east1 (the source has none): None, not us-central1's.
    assert catalog.price_per_chip_hour(accelerator("v2-32"), "on-demand", "asia-east1") is None
    assert catalog.price_per_chip_hour(accelerator("v2-8"), "preemptible", "asia-east1") == pytest.approx(1.566 / 4)


def test_topology_holds_the_slice_chips_and_hosts():
    for generation in catalog.generations.values():
        for size in generation.sizes:
            acc = AcceleratorType(generation, size)
            dims = [int(d) for d in acc.topology.split("x")]
            assert math.prod(dims) == acc.chips, acc.name
            assert acc.hosts * (generation.chips_per_host if acc.multi_host else acc.chips) == acc.chips
    assert accelerator("v5litepod-16").topology == "4x4" and accelerator("v4-32").topology == "2x2x4"


def test_capacity_capabilities_follow_googles_pages():
    # "Multislice is only supported on Cloud TPU v4 and later" (multislice-introduction).
    assert [g.name for g in catalog.generations.values() if g.multislice] == ["v4", "v5e", "v5p", "v6e"]
    assert catalog.capacity_problem(accelerator("v5litepod-16"), queued=True, node_count=2, flex=False) is None
    assert "v2 cannot be a multislice" in str(
        catalog.capacity_problem(accelerator("v2-32"), queued=False, node_count=2, flex=False)
    )
    assert "v4 is not offered with flex-start" in str(
        catalog.capacity_problem(accelerator("v4-8"), queued=True, node_count=1, flex=True)
    )


def test_flex_start_zones_are_googles_list():
    """request-using-flex-start, Limitations: v6e in asia-northeast1-b and us-east5-a (training and serving),
    v5e in us-west4-a (training) and us-central1-a (serving); no other generation."""
    offered = {g.name: g.flex_start for g in catalog.generations.values() if g.flex_start}
    assert offered == {
        "v5e": {"us-west4-a": "training", "us-central1-a": "serving"},
        "v6e": {"asia-northeast1-b": "training and serving", "us-east5-a": "training and serving"},
    }
    for generation in catalog.generations.values():  # each is a zone that offers the generation at all
        assert set(generation.flex_start) <= set(generation.zones), generation.name
    assert "v5p is not offered with flex-start" in str(
        catalog.capacity_problem(accelerator("v5p-8"), queued=True, node_count=1, flex=True)
    )
    assert catalog.flex_start_problem(accelerator("v5litepod-8"), "us-west4-a") is None
    assert "offered only in us-central1-a (serving), us-west4-a (training)" in str(
        catalog.flex_start_problem(accelerator("v5litepod-8"), "us-west1-c")
    )
    assert "for serving, not for training; zones for training: us-west4-a" in str(
        catalog.flex_start_warning(accelerator("v5litepod-8"), "us-central1-a")
    )
    assert catalog.flex_start_warning(accelerator("v6e-8"), "us-east5-a") is None


def test_runtime_images_record_what_google_documents_and_no_more():
    base = catalog.runtime_image("tpu-ubuntu2204-base")
    assert base and (base.os, base.framework, base.python) == ("Ubuntu 22.04", None, "3.10")
    tf = catalog.runtime_image("tpu-vm-tf-2.15.0-pod-pjrt")
    assert tf and (tf.os, tf.framework, tf.framework_version, tf.python) == (None, "tensorflow", "2.15.0", None)
    alpha = catalog.runtime_image("v2-alpha-tpuv6e")
    assert alpha and alpha.os is None and alpha.python is None  # undocumented: checked at boot
    assert catalog.runtime_image("tpu-vm-pt-2.0") is None
    # Every runtime a generation names for JAX is in the table.
    assert all(catalog.runtime_image(g.jax_runtime) for g in catalog.generations.values())


def test_jax_that_needs_a_newer_python_than_the_image_has_is_refused_with_the_fix():
    why = catalog.software_problem("tpu-ubuntu2204-base", "jax", "0.10.2")
    assert why == (
        "jax 0.10.2 needs Python 3.11 or newer, but runtime tpu-ubuntu2204-base is Ubuntu 22.04, whose python3 is 3.10"
    )
    # The fix: the last release before the first that needs a newer Python (jax 0.6.2, Requires-Python >=3.10).
    assert catalog.newest_for_image("tpu-ubuntu2204-base", "jax") == "0.6.2"
    assert catalog.runtime_choices(accelerator("v4-8"), "tpu-ubuntu2204-base", "jax", "0.10.2") == (
        ("tpu-ubuntu2204-base", "0.6.2"),
    )
    assert catalog.software_problem("tpu-ubuntu2204-base", "jax", "0.6.2") is None  # its lock: jax-0.6.2.lock
    no_lock = catalog.software_problem("tpu-ubuntu2204-base", "jax", "0.5.3")
    assert no_lock and no_lock.startswith("runtime tpu-ubuntu2204-base's image carries no jax, and the boot installs")


def test_each_framework_lock_pins_its_release_with_libtpu_every_file_by_hash():
    from infra.catalog import FRAMEWORK_LOCKS, framework_lock

    locks = sorted(FRAMEWORK_LOCKS.glob("*.lock"))
    assert [p.name for p in locks] == ["jax-0.10.2.lock", "jax-0.6.2.lock"]
    for path in locks:
        framework, version = path.stem.split("-", 1)
        lines = framework_lock(framework, version).splitlines()  # ValueError for a line without a hash
        names = {line.split("==")[0]: line.split("==")[1].split()[0] for line in lines}
        assert names[framework] == version and names["jaxlib"] == version and "libtpu" in names
        assert f"{framework}[tpu]=={version}" in path.with_suffix(".txt").read_text()
    assert catalog.software_problem("v2-alpha-tpuv5-lite", "jax", "0.10.2") is None  # unknown Python: boot checks


def test_what_the_start_up_script_may_install_next_to_a_framework():
    assert catalog.install_constraints("tensorflow", "2.15.0") == ("protobuf<5",)
    assert catalog.install_constraints("tensorflow", "2.18.0") == () == catalog.install_constraints("jax", "0.10.2")
    assert "first release there is 2.16.1" in str(catalog.install_problem("tensorflow", "2.15.0"))
    # On the index from 2.16.1, but installed at boot only by the hashes of a lock the catalog ships.
    assert "no lock for tensorflow 2.16.1" in str(catalog.install_problem("tensorflow", "2.16.1"))
    assert catalog.install_problem("jax", "0.10.2") is None  # infra/catalog/framework_locks/jax-0.10.2.lock


def test_tensorflow_runtime_environment():
    assert dict(catalog.runtime_environment("tpu-vm-tf-2.16.1-pjrt", "n")) == {
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
    }
    assert dict(catalog.runtime_environment("tpu-vm-tf-2.16.1-pod-pjrt", "n")) == {
        "TPU_NAME": "n",
        "TPU_LOAD_LIBRARY": "0",
    }
    assert (
        catalog.runtime_environment("v2-alpha-tpuv6e", "n")
        == ()
        == catalog.runtime_environment("tpu-vm-tf-2.14.1", "n")
    )


def test_the_plan_refuses_a_runtime_that_cannot_run_the_workload():
    from tests.support import fixture_config, with_object
    from tests.test_config import problems_of

    jax = {"program": "jax_mnist", "frameworkVersion": "0.10.2"}
    raw = with_object(fixture_config("small"), "workloads", lambda w: w["mnist"].update(jax))
    raw = with_object(raw, "tpuVms", lambda v: v[0].update(runtimeVersion="tpu-ubuntu2204-base"))
    assert (
        "tpu-platform:tpuVms[small-v2].runtimeVersion = 'tpu-ubuntu2204-base': jax 0.10.2 needs Python 3.11"
        in problems_of(raw)
    )


def test_an_image_whose_python_the_agent_is_not_served_for_is_refused_where_the_catalog_knows_it(monkeypatch):
    """The agent's wheelhouse holds wheels for the catalog's agent_pythons; an image with another Python
    (Ubuntu 20.04's 3.8, a documented OS here for the test) is refused at plan time with the stack, the key,
    the value and what is allowed. Today's documented images (Ubuntu 22.04: 3.10) pass; an image whose
    Python is unknown is checked at boot (tests/test_startup.py)."""
    import dataclasses

    from infra.config import parse_stack_config
    from infra.config.problems import ConfigError
    from tests.support import fixture_config, with_object

    assert catalog.agent_pythons == ("3.10", "3.11", "3.12")
    assert all(catalog.agent_problem(runtime) is None for runtime in catalog.images)
    old = dataclasses.replace(
        catalog,
        images={**catalog.images, "tpu-ubuntu2004-base": {"os": "Ubuntu 20.04", "framework": "none"}},
        os_python={**catalog.os_python, "Ubuntu 20.04": "3.8"},
    )
    assert old.agent_problem("tpu-ubuntu2004-base") == (
        "runtime tpu-ubuntu2004-base is Ubuntu 20.04, whose python3 is 3.8; the platform's agent runs on "
        "Python 3.10, 3.11, 3.12 (its own environment's wheels)"
    )
    monkeypatch.setattr("infra.config.rules.load_catalog", lambda: old)
    raw = with_object(
        fixture_config("scheduled"), "tpuVms", lambda v: v[0].update(runtimeVersion="tpu-ubuntu2004-base")
    )
    with pytest.raises(ConfigError) as caught:
        parse_stack_config("scheduled", raw)
    assert (
        "tpu-platform:tpuVms[office-v2].runtimeVersion = 'tpu-ubuntu2004-base': runtime tpu-ubuntu2004-base is "
        "Ubuntu 20.04, whose python3 is 3.8; the platform's agent runs on Python 3.10, 3.11, 3.12"
    ) in str(caught.value)
