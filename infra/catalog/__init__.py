"""The TPU catalog (`tpu.yaml` beside this file) and the rules that read it.

Pure: no Pulumi. Each `*_problem` function returns why a choice would fail on GCP, phrased as what
to do instead, or None when it is fine. These are the usual troubleshooting items of a hand-run TPU (no stock in the
zone, "Failed to connect to remote TPU" from a version mismatch) turned into plan-time checks.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CATALOG_FILE = Path(__file__).with_name("tpu.yaml")
# What the start-up script installs, by hash, when the image lacks the pinned framework: one lock per
# release, `<framework>-<version>.lock`, compiled by `make lock` from the `.txt` beside it.
FRAMEWORK_LOCKS = Path(__file__).with_name("framework_locks")
_LOCK_LINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+( --hash=sha256:[0-9a-f]{64})+")
TF_RUNTIME = re.compile(r"tpu-vm-tf-(?P<version>\d+\.\d+\.\d+)(?P<pod>-pod)?(?P<v4>-v4)?(?P<kind>-pjrt|-se)?")
PROVISIONING_MODELS = ("on-demand", "spot", "preemptible", "reserved", "flex-start")
RECLAIMABLE = ("spot", "preemptible")  # GCE may take them back at any time; both bill the spot price


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class PriceRow:
    sizes: frozenset[int] | None
    region: str
    on_demand: float
    spot: float


def price_in_region(rows: tuple[PriceRow, ...], size: int, provisioning: str, region: str) -> float | None:
    """USD per chip-hour of a type of `size` in `region` from a generation's price rows, or None when the
    source has none there. Spot and preemptible bill the spot price; every other model the on-demand one."""
    for row in rows:
        if row.region == region and (row.sizes is None or size in row.sizes):
            return row.spot if provisioning in RECLAIMABLE else row.on_demand
    return None


def chips_of(suffix: str, size: int) -> int:
    """The chips of a type `<prefix>-<size>`, whose number counts TensorCores (2 a chip) or chips."""
    return size // 2 if suffix == "cores" else size


def zones_offering(zones: dict[str, frozenset[int] | None], size: int) -> list[str]:
    """The zones (zone -> sizes offered there, None for all) that offer `size`."""
    return sorted(z for z, sizes in zones.items() if sizes is None or size in sizes)


@dataclass(frozen=True)
class Generation:
    name: str
    prefix: str
    suffix: str  # "cores" (2 per chip) or "chips"
    sizes: tuple[int, ...]
    single_host: frozenset[int]
    chips_per_host: int
    devices_per_chip: int
    hbm_gib_per_chip: float
    bf16_tflops_per_chip: float
    secure_boot: bool
    jax_runtime: str
    tf_min: str
    zones: dict[str, frozenset[int] | None]  # None: every size
    prices: tuple[PriceRow, ...]
    topologies: dict[int, str]  # size -> chip topology, like "2x4" or "2x2x1"
    queued: bool  # the TPU API's queued resources take it
    multislice: bool  # several slices in one queued request (nodeCount > 1)
    flex_start: dict[str, str]  # zone -> what Google offers flex-start for there ("training", "serving", …)

    def type_name(self, size: int) -> str:
        return f"{self.prefix}-{size}"

    def zones_for(self, size: int) -> list[str]:
        return zones_offering(self.zones, size)


@dataclass(frozen=True)
class AcceleratorType:
    generation: Generation
    size: int

    @property
    def name(self) -> str:
        return self.generation.type_name(self.size)

    @property
    def chips(self) -> int:
        return chips_of(self.generation.suffix, self.size)

    @property
    def multi_host(self) -> bool:
        return self.size not in self.generation.single_host

    @property
    def hosts(self) -> int:
        return max(1, self.chips // self.generation.chips_per_host) if self.multi_host else 1

    @property
    def topology(self) -> str:
        return self.generation.topologies.get(self.size, "")

    @property
    def devices(self) -> int:
        """Devices (replicas) a data-parallel step is sharded over."""
        return self.chips * self.generation.devices_per_chip


@dataclass(frozen=True)
class RuntimeImage:
    """What Google documents about one runtime image; None where it does not say."""

    runtime: str
    os: str | None
    framework: str | None  # the framework preinstalled ("tensorflow"), None for a base image
    framework_version: str | None
    python: str | None  # the OS's python3, when the OS is documented


@dataclass(frozen=True)
class TpuCatalog:
    generations: dict[str, Generation]
    unsupported: dict[str, str]
    prices_date: str
    prices_source: str
    tf_suffix_required_from: str
    tf_v4_suffix_until: str
    images: dict[str, dict[str, str]]
    os_python: dict[str, str]
    jax_python: tuple[tuple[str, str, str], ...]  # (from jax version, oldest Python, the last release before)
    tf_protobuf: tuple[tuple[str, str], ...]  # (before TF version, constraint)
    tf_tpu_from: str
    tf_environment: dict[str, dict[str, str]]  # pod | pjrt | other -> variables
    agent_pythons: tuple[str, ...]  # the Pythons the VM agent's wheelhouse serves ("3.10", ...)

    @property
    def agent_python_floor(self) -> str:
        """The oldest of `agent_pythons`: what vm_agent's code is held to."""
        return min(self.agent_pythons, key=lambda version: tuple(int(part) for part in version.split(".")))

    def runtime_image(self, runtime: str) -> RuntimeImage | None:
        """What the catalog knows of `runtime`; None for a runtime it does not know."""
        match = TF_RUNTIME.fullmatch(runtime)
        data = self.images.get("tensorflow" if match else runtime)
        if data is None:
            return None
        os_name = None if data["os"] == "unknown" else data["os"]
        framework = None if data["framework"] == "none" else data["framework"]
        return RuntimeImage(
            runtime=runtime,
            os=os_name,
            framework=framework,
            framework_version=match["version"] if match else None,
            python=self.os_python.get(os_name or ""),
        )

    def min_python(self, framework: str, version: str) -> str | None:
        """The oldest Python `framework`==`version` accepts, when the catalog knows it."""
        if framework != "jax":
            return None
        rows = [python for start, python, _ in self.jax_python if version_key(version) >= version_key(start)]
        return max(rows, key=version_key) if rows else None

    def software_problem(self, runtime: str, framework: str, version: str) -> str | None:
        """Why `framework`==`version` cannot run on `runtime`'s image, known before anything boots."""
        image = self.runtime_image(runtime)
        need = self.min_python(framework, version)
        if image and image.python and need and version_key(image.python) < version_key(need):
            return (
                f"{framework} {version} needs Python {need} or newer, but runtime {runtime} is {image.os}, "
                f"whose python3 is {image.python}"
            )
        if image and image.os and image.framework is None and (why := self.install_problem(framework, version)):
            return f"runtime {runtime}'s image carries no {framework}, and {why}"  # the boot would only refuse
        return None

    def agent_problem(self, runtime: str) -> str | None:
        """Why the VM agent cannot run on `runtime`'s image, known before anything boots: its Python, where
        the catalog knows it, is not one the agent's wheelhouse serves."""
        image = self.runtime_image(runtime)
        if image is None or image.python is None or image.python in self.agent_pythons:
            return None
        return (
            f"runtime {runtime} is {image.os}, whose python3 is {image.python}; the platform's agent runs on "
            f"Python {', '.join(self.agent_pythons)} (its own environment's wheels)"
        )

    def newest_for_image(self, runtime: str, framework: str) -> str | None:
        """The newest `framework` release `runtime`'s image can run, where the catalog bounds it (JAX on a
        documented OS): the last release before the first that needs a newer Python than the image's."""
        image = self.runtime_image(runtime)
        if framework != "jax" or image is None or image.python is None:
            return None
        python = version_key(image.python)
        newer = [(start, last) for start, need, last in self.jax_python if version_key(need) > python]
        return min(newer, key=lambda row: version_key(row[0]))[1] if newer else None

    def install_constraints(self, framework: str, version: str) -> tuple[str, ...]:
        """Bounds the start-up script keeps when it installs a program's extras next to the framework."""
        if framework != "tensorflow":
            return ()
        return tuple(c for before, c in self.tf_protobuf if version_key(version) < version_key(before))

    def install_problem(self, framework: str, version: str) -> str | None:
        """Why the start-up script could not install `framework`==`version` itself, or None."""
        if framework == "tensorflow" and version_key(version) < version_key(self.tf_tpu_from):
            return (
                f"tensorflow-tpu {version} is not on the package index (its first release there is "
                f"{self.tf_tpu_from}): the runtime image must carry TensorFlow {version}"
            )
        if not framework_lock(framework, version):
            return (
                f"the boot installs {framework} only by hash and the catalog has no lock for {framework} {version} "
                f"(infra/catalog/framework_locks/{framework}-{version}.txt, then make lock): the runtime image "
                f"must carry it, or pin a release with a lock"
            )
        return None

    def runtime_environment(self, runtime: str, node: str) -> tuple[tuple[str, str], ...]:
        """Environment the training process needs on `runtime` (TensorFlow runtimes), for node `node`."""
        match = TF_RUNTIME.fullmatch(runtime)
        if match is None:
            return ()
        kind = "pod" if match["pod"] else "pjrt" if match["kind"] == "-pjrt" else "other"
        return tuple((k, v.format(node=node)) for k, v in self.tf_environment[kind].items())

    def accelerator(self, name: str) -> AcceleratorType | str:
        """The accelerator type `name` (like `v5litepod-8`), or why it is not one."""
        prefix, _, size = name.rpartition("-")
        for unsupported, why in self.unsupported.items():
            if name.startswith(unsupported):
                return f"{why}; use another generation"
        by_prefix = {g.prefix: g for g in self.generations.values()}
        if prefix not in by_prefix:
            known = ", ".join(f"{g.prefix}-N" for g in self.generations.values())
            return f"unknown TPU type; types look like {known}"
        generation = by_prefix[prefix]
        if not size.isdigit() or int(size) not in generation.sizes:
            sizes = ", ".join(generation.type_name(s) for s in generation.sizes)
            return f"not a {generation.name} size; valid sizes: {sizes}"
        return AcceleratorType(generation, int(size))

    def meant(self, name: str) -> str | None:
        """The type an unknown `name` most likely means: a generation by its common name (`v5e-8` is
        `v5litepod-8`) or a near spelling of a prefix (`v5lite-8`), when that size exists; else None."""
        prefix, _, size = name.rpartition("-")
        by_name = {g.name: g for g in self.generations.values()}
        by_prefix = {g.prefix: g for g in self.generations.values()}
        near = difflib.get_close_matches(prefix, list(by_prefix), n=1, cutoff=0.7)
        generation = by_name.get(prefix) or (by_prefix[near[0]] if near else None)
        if generation is None or not size.isdigit() or int(size) not in generation.sizes:
            return None
        return generation.type_name(int(size))

    def zone_problem(self, accelerator: AcceleratorType, zone: str) -> str | None:
        zones = accelerator.generation.zones_for(accelerator.size)
        if zone not in zones:
            return f"{accelerator.name} is not offered in {zone}; zones that offer it: {', '.join(zones)}"
        return None

    def tf_runtime(self, accelerator: AcceleratorType, tf_version: str) -> str | None:
        """The runtime carrying TensorFlow `tf_version` that `accelerator` takes, or None when its generation
        takes no runtime of that version (older than its `tf_min`)."""
        if version_key(tf_version) < version_key(accelerator.generation.tf_min):
            return None
        return self.expected_tf_runtime(accelerator, tf_version)

    def expected_tf_runtime(self, accelerator: AcceleratorType, tf_version: str) -> str:
        """The name of the runtime_version that carries TensorFlow `tf_version` for this accelerator (whether
        or not its generation takes that version: `tf_runtime`)."""
        runtime = f"tpu-vm-tf-{tf_version}"
        if accelerator.multi_host:
            runtime += "-pod"
        if accelerator.generation.name == "v4" and version_key(tf_version) <= version_key(self.tf_v4_suffix_until):
            runtime += "-v4"
        if version_key(tf_version) >= version_key(self.tf_suffix_required_from):
            runtime += "-pjrt"
        return runtime

    def runtime_problem(
        self, accelerator: AcceleratorType, runtime: str, framework: str, framework_version: str
    ) -> str | None:
        """Why `runtime` would not run a `framework`==`framework_version` workload on `accelerator`."""
        generation = accelerator.generation
        if framework == "jax":
            if runtime != generation.jax_runtime:
                return f"JAX on {generation.name} runs on runtime {generation.jax_runtime}, not {runtime}"
            return None
        too_old = f"{generation.name} needs TensorFlow {generation.tf_min} or newer"
        also = f" ({too_old})" if self.tf_runtime(accelerator, framework_version) is None else ""
        match = TF_RUNTIME.fullmatch(runtime)
        if match is None:
            return f"not a TensorFlow runtime, which a workload pinned to TensorFlow {framework_version} needs{also}"
        version = match["version"]
        if version != framework_version:
            return (
                f"the runtime carries TensorFlow {version} but the workload is pinned to {framework_version} "
                f"(at run time: 'Failed to connect to remote TPU'){also}"
            )
        expected = self.tf_runtime(accelerator, version)
        if expected is None:
            return too_old
        allowed = {expected}
        if expected.endswith("-pjrt") and version_key(generation.tf_min) < version_key(self.tf_suffix_required_from):
            # Generations older than the PJRT cut-over also accept the StreamExecutor (-se) runtime.
            allowed.add(expected.removesuffix("-pjrt") + "-se")
        if runtime not in allowed:
            if accelerator.multi_host and not match["pod"]:
                why = f"{accelerator.name} is a multi-host slice ({accelerator.hosts} VMs) and needs a -pod runtime"
            elif match["pod"] and not accelerator.multi_host:
                why = f"{accelerator.name} is a single host and must not use a -pod runtime"
            else:
                why = f"the runtime's suffixes do not fit {accelerator.name} with TensorFlow {version}"
            return why
        return None

    def runtime_choices(
        self, accelerator: AcceleratorType, runtime: str, framework: str, version: str
    ) -> tuple[tuple[str, str], ...]:
        """(runtime, framework version) pairs that run a `framework` workload on `accelerator`, nearest to
        (`runtime`, `version`) first: a runtime for the pinned version; the version `runtime` carries; the
        newest version the image runs; the oldest version the generation takes. Each passes the checks
        above (`runtime_problem`, `software_problem`): these are what an error may suggest."""
        generation = accelerator.generation
        if framework == "jax":
            nearer = [(generation.jax_runtime, version)]
            farther = (generation.jax_runtime, self.newest_for_image(generation.jax_runtime, framework))
        else:
            carried = TF_RUNTIME.fullmatch(runtime)
            nearer = [(self.tf_runtime(accelerator, version), version), (runtime, carried and carried["version"])]
            farther = (self.tf_runtime(accelerator, generation.tf_min), generation.tf_min)

        def works(choice: tuple[str | None, str | None]) -> bool:
            new_runtime, new_version = choice
            return bool(
                new_runtime
                and new_version
                and choice != (runtime, version)
                and not self.runtime_problem(accelerator, new_runtime, framework, new_version)
                and not self.software_problem(new_runtime, framework, new_version)
            )

        out = list(dict.fromkeys(c for c in nearer if works(c)))
        if not out and works(farther):  # another version only when the pinned one cannot run here
            out.append(farther)
        return tuple((str(r), str(v)) for r, v in out)

    def memory_problem(self, accelerator: AcceleratorType, gib_per_chip: float) -> str | None:
        """Why a workload needing `gib_per_chip` of HBM would run out of memory."""
        have = accelerator.generation.hbm_gib_per_chip
        if gib_per_chip <= have:
            return None
        roomier = sorted(
            (g.hbm_gib_per_chip, g.name) for g in self.generations.values() if g.hbm_gib_per_chip >= gib_per_chip
        )
        options = ", ".join(f"{name} ({hbm:g} GiB)" for hbm, name in roomier) or "none: shard the model"
        return (
            f"needs {gib_per_chip:g} GiB of HBM per chip but {accelerator.generation.name} has {have:g}; "
            f"use a smaller batch or model, model parallelism, or a generation with more: {options}"
        )

    def batch_warning(self, accelerator: AcceleratorType, batch_size: int) -> str | None:
        """Advice when a global batch does not shard evenly over the TPU's devices."""
        if batch_size % accelerator.devices == 0:
            return None
        return (
            f"batch size {batch_size} does not split evenly over the {accelerator.devices} devices of "
            f"{accelerator.name}: use a multiple of {accelerator.devices}, ideally 128 per device"
        )

    def even_batch_sizes(self, accelerator: AcceleratorType, batch_size: int) -> tuple[int, ...]:
        """The multiples of the device count nearest `batch_size`, below and above it."""
        lower = batch_size - batch_size % accelerator.devices
        return tuple(b for b in (lower, lower + accelerator.devices) if b > 0 and b != batch_size)

    def price_per_chip_hour(self, accelerator: AcceleratorType, provisioning: str, region: str) -> float | None:
        """USD per chip-hour of `accelerator` in `region`, or None when the source has no price there.

        Spot and preemptible bill the spot price. The source has no reserved, committed-use or
        flex-start prices: those are priced at the on-demand list price, which the cost table marks
        as an assumption (infra/cost.py). Another region's price is never borrowed."""
        return price_in_region(accelerator.generation.prices, accelerator.size, provisioning, region)

    def capacity_problem(
        self, accelerator: AcceleratorType, *, queued: bool, node_count: int, flex: bool
    ) -> str | None:
        """Why `accelerator` cannot be asked for this way (queued, multislice, flex-start), or None."""
        generation = accelerator.generation

        def able(flag: str) -> str:
            return ", ".join(g.name for g in self.generations.values() if getattr(g, flag))

        if queued and not generation.queued:
            return f"{generation.name} is not offered through queued resources; generations that are: {able('queued')}"
        if node_count > 1 and not generation.multislice:
            return f"{generation.name} cannot be a multislice (v4 and later can); those that can: {able('multislice')}"
        if flex and not generation.flex_start:
            return f"{generation.name} is not offered with flex-start; generations that are: {able('flex_start')}"
        return None

    def flex_start_problem(self, accelerator: AcceleratorType, zone: str) -> str | None:
        """Why a flex-start request for `accelerator` cannot be made in `zone`, or None (Google lists the zones)."""
        zones = accelerator.generation.flex_start
        if zones and zone not in zones:
            listed = ", ".join(f"{z} ({purpose})" for z, purpose in sorted(zones.items()))
            return f"flex-start {accelerator.generation.name} is offered only in {listed}"
        return None

    def flex_start_warning(self, accelerator: AcceleratorType, zone: str) -> str | None:
        """Advice when Google offers flex-start `accelerator` in `zone` for serving, not for training."""
        offered = accelerator.generation.flex_start
        purpose = offered.get(zone, "")
        if purpose and "training" not in purpose:
            training = ", ".join(sorted(z for z, p in offered.items() if "training" in p)) or "none"
            return (
                f"Google offers flex-start {accelerator.generation.name} in {zone} for {purpose}, not for training; "
                f"zones for training: {training}"
            )
        return None


def price_rows(data: list[dict[str, Any]]) -> tuple[PriceRow, ...]:
    return tuple(
        PriceRow(
            sizes=frozenset(p["sizes"]) if "sizes" in p else None,
            region=p["region"],
            on_demand=float(p["on_demand"]),
            spot=float(p["spot"]),
        )
        for p in data
    )


def _generation(name: str, data: dict[str, Any]) -> Generation:
    return Generation(
        name=name,
        prefix=data["prefix"],
        suffix=data["suffix"],
        sizes=tuple(data["sizes"]),
        single_host=frozenset(data["single_host"]),
        chips_per_host=data["chips_per_host"],
        devices_per_chip=data["devices_per_chip"],
        hbm_gib_per_chip=float(data["hbm_gib_per_chip"]),
        bf16_tflops_per_chip=float(data["bf16_tflops_per_chip"]),
        secure_boot=bool(data["secure_boot"]),
        jax_runtime=data["jax_runtime"],
        tf_min=str(data["tf_min"]),
        zones={z: None if s == "all" else frozenset(s) for z, s in data["zones"].items()},
        prices=price_rows(data["prices"]),
        topologies={int(k): str(v) for k, v in (data.get("topologies") or {}).items()},
        queued=bool(data["queued"]),
        multislice=bool(data["multislice"]),
        flex_start={str(z): str(purpose) for z, purpose in (data["flex_start"] or {}).items()},
    )


@functools.cache
def framework_lock(framework: str, version: str) -> str:
    """The start-up script's lock for `framework`==`version`: one `name==version --hash=...` line per package,
    comments and continuations dropped; "" when the catalog has none. ValueError for a line that is not one."""
    path = FRAMEWORK_LOCKS / f"{framework}-{version}.lock"
    if not re.fullmatch(r"[a-z]+-[0-9][A-Za-z0-9.]*", path.stem) or not path.is_file():
        return ""
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    lines = [" ".join(line.split("#", 1)[0].split()) for line in joined.splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if not _LOCK_LINE.fullmatch(line):
            raise ValueError(f"{path}: {line[:80]!r} is not a pinned requirement with its hashes")
    return "".join(f"{line}\n" for line in lines)


@functools.cache
def catalog_data(path: Path = CATALOG_FILE) -> dict[str, Any]:
    """The catalog file as read, once for the TPU VM and GKE catalogs both (never mutate it): with
    libyaml's parser where PyYAML has it, ten times faster than its pure-Python one (0.02 s against 0.2 s)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def load_catalog(path: Path = CATALOG_FILE) -> TpuCatalog:
    data = catalog_data(path)
    return TpuCatalog(
        generations={name: _generation(name, g) for name, g in data["generations"].items()},
        unsupported=dict(data.get("not_in_cloud_tpu_api") or {}),
        prices_date=str(data["prices_date"]),
        prices_source=str(data["prices_source"]),
        tf_suffix_required_from=str(data["tensorflow"]["suffix_required_from"]),
        tf_v4_suffix_until=str(data["tensorflow"]["v4_suffix_until"]),
        images=dict(data["runtimes"]["images"]),
        os_python={str(k): str(v) for k, v in data["os_python"].items()},
        jax_python=tuple(
            (str(r["from"]), str(r["python"]), str(r["last_before"])) for r in data["packages"]["jax_python"]
        ),
        tf_protobuf=tuple((str(r["before"]), str(r["constraint"])) for r in data["packages"]["tensorflow_protobuf"]),
        tf_tpu_from=str(data["packages"]["tensorflow_tpu_from"]),
        agent_pythons=tuple(str(p) for p in data["packages"]["agent_pythons"]),
        tf_environment={
            k: {str(n): str(v) for n, v in (e or {}).items()} for k, e in data["tensorflow_environment"].items()
        },
    )
