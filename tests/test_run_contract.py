"""The run contract's one package (run_contract/): standard library only, the same bytes inside every
artefact that carries it (the agent's archive, the guard's source, the tpu-runs wheel, the runlib wheel),
and the run spec's JSON Schema in the docs generated from it."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import jsonschema
import pytest

import run_contract
from infra.config import parse_stack_config
from infra.tpu.metadata import agent_package, run_spec, source_digests
from infra.tpu_guard import source_files
from run_contract import lines, names, schema, spec
from tests.support import Writes, fixture_config
from tests.workloads import ENGINES, slice_environment, workloads_python

ROOT = Path(__file__).resolve().parents[1]
PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet"]


def _contract(names: dict[str, bytes], prefix: str = "run_contract/") -> dict[str, bytes]:
    """The package's modules in an artefact's files (what `run_contract.files()` names)."""
    found = {name[len(prefix) :]: data for name, data in names.items() if name.startswith(prefix)}
    return {name: data for name, data in found.items() if "/" not in name and name.endswith(".py")}


def _wheel(project: Path, out: Path) -> dict[str, bytes]:
    """Build the project's wheel for real (pip, the venv's setuptools, offline) from a copy of it, links
    followed as a checkout's build would follow them, and return its files."""
    subprocess.run([*PIP_WHEEL, "--wheel-dir", str(out), str(project)], check=True, capture_output=True)
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_contract_imports_only_the_standard_library():
    """It ships where nothing of this repository is importable (the guard, the agent, a researcher's venv)."""
    for name in run_contract.files():
        tree = ast.parse((run_contract.HOME / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {"." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
        assert imported <= set(sys.stdlib_module_names) | {"__future__", "run_contract", "."}, (name, imported)


def test_the_agent_archive_and_the_guard_source_carry_the_contract():
    with tarfile.open(fileobj=io.BytesIO(agent_package().data)) as tar:
        agent = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    guard = {name: path.read_bytes() for name, path in source_files().items()}
    expected = run_contract.digest()
    assert run_contract.digest(_contract(agent)) == expected
    assert run_contract.digest(_contract(guard)) == expected


@pytest.mark.slow  # two real wheel builds
def test_the_tpu_runs_and_runlib_wheels_carry_the_contract(tmp_path):
    project = tmp_path / "tpu-platform"
    project.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", project)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for folder in ("tpu_runs", "run_contract", "infra", "tools", "vm_agent"):
        shutil.copytree(ROOT / folder, project / folder, ignore=ignore)
    runlib = tmp_path / "runlib"
    shutil.copytree(ROOT / "workloads" / "lib", runlib, ignore=ignore)  # its link to run_contract/ followed

    tpu_runs = _wheel(project, tmp_path / "tpu-runs-wheel")
    runlib_wheel = _wheel(runlib, tmp_path / "runlib-wheel")
    assert "tpu_runs/cli.py" in tpu_runs and "runlib.py" in runlib_wheel
    expected = run_contract.digest()
    assert run_contract.digest(_contract(tpu_runs)) == expected
    assert run_contract.digest(_contract(runlib_wheel)) == expected


def test_a_line_and_its_newline_reach_the_stream_in_one_write(monkeypatch):
    """Unbuffered, a line and its newline written apart let other output land between them: a sandboxed jax_mnist
    run saw TensorStore's C++ log inside its first "checkpoint saved" entry, a clean-clone run a telemetry
    warning inside an agent's JSON entry."""
    out, err = Writes(), Writes()
    monkeypatch.setattr(sys, "stdout", out)
    lines.line('{"steps": 20}')
    lines.line("telemetry: Logging failed", err)
    assert out.writes == ['{"steps": 20}\n'] and err.writes == ["telemetry: Logging failed\n"]


def test_the_run_spec_schema_in_the_docs_is_the_generated_one():
    committed = (ROOT / "docs" / "run-spec.schema.json").read_text()
    assert committed == schema.render(), "regenerate: python -m run_contract.schema > docs/run-spec.schema.json"


def test_the_schema_names_every_key_the_parser_takes():
    properties = schema.run_spec_schema()["properties"]
    assert list(properties) == list(spec.SPEC_KEYS)
    (folder, image) = properties["source"]["oneOf"]
    assert set(folder["properties"]) == set(spec.FOLDER_KEYS) and set(image["properties"]) == set(spec.IMAGE_KEYS)


def test_the_program_renders_run_specs_that_the_schema_and_the_parser_accept():
    """The stack's real run specs are valid; what the parser refuses for its shape, the
    schema refuses too."""
    cfg = parse_stack_config("sources", fixture_config("sources"))
    validator = jsonschema.Draft202012Validator(schema.run_spec_schema())
    rendered = [run_spec(cfg, vm, source_digests(cfg)) for vm in cfg.tpu_vms]
    assert rendered and all(s["source"]["kind"] == "folder" for s in rendered)
    for good in rendered:
        assert not list(validator.iter_errors(good)), good
    good = rendered[0]
    for bad in (
        {**good, "unknown": 1},
        {**good, "env": {"TPU_PLATFORM_RUN_ID": "x"}},
        {**good, "runId": "/leading-slash"},
        {**good, "python": "2.7"},
        {**good, "source": {**good["source"], "sha256": "0" * 63}},
    ):
        assert list(validator.iter_errors(bad)), bad
        allowed = spec.Allowed(good["source"]["uri"].rsplit("/sources/", 1)[0], "")
        with pytest.raises(spec.SpecError):
            spec.parse_run_spec(json.dumps(bad), allowed)


@pytest.mark.parametrize("requester", ["user:o'brien@example.com", "group:ml(team)@example.com", "user:ada@example"])
def test_a_requester_outside_the_researcher_pattern_is_refused_by_the_parser_and_the_schema(requester):
    """A requester is "stack" or a member in the run contract's one researcher pattern (names.py RESEARCHER): an
    apostrophe or a parenthesis, which would end a CEL literal in a grant's condition, is refused with the key,
    the value and what is allowed, by the parser and by the schema that editors check a spec with."""
    cfg = parse_stack_config("sources", fixture_config("sources"))
    good = {**run_spec(cfg, cfg.tpu_vms[0], source_digests(cfg)), "completion": False}  # the stack's alone
    allowed = spec.Allowed(good["source"]["uri"].rsplit("/sources/", 1)[0], "")
    validator = jsonschema.Draft202012Validator(schema.run_spec_schema())
    for fine in ("stack", "user:ada.lovelace+ml@example.com", "group:ml-team@research.example.org"):
        assert not list(validator.iter_errors({**good, "requester": fine})), fine
        assert spec.parse_run_spec(json.dumps({**good, "requester": fine}), allowed).requester == fine
    bad = {**good, "requester": requester}
    assert [error.path[0] for error in validator.iter_errors(bad)] == ["requester"]
    with pytest.raises(spec.SpecError) as refused:
        spec.parse_run_spec(json.dumps(bad), allowed)
    assert refused.value.problems == [f"requester {requester!r}: {names.REQUESTER_RULE}"]
    assert "the address in letters, digits, '.', '_', '+' and '-'" in str(refused.value)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("worker", "count"), [(0, 1), (0, 2), (3, 4)])
def test_a_worker_finds_its_place_in_the_slice_from_either_engine(engine, worker, count):
    """The same place from a VM's start-up script and from what GKE injects into a TPU pod."""
    place = names.worker_place(slice_environment(engine, worker, count, 18482))
    assert place == (worker, count, "127.0.0.1:18482" if count > 1 else "")


def test_gke_s_workers_meet_at_the_first_host_on_jax_s_port():
    """As JAX's GkeTpuCluster: worker 0 is the first of TPU_WORKER_HOSTNAMES, the coordinator port 8482."""
    hosts = "run-slice-0-0.run,run-slice-0-1.run"
    assert names.worker_place({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": hosts}) == (1, 2, "run-slice-0-0.run:8482")
    assert names.worker_place({}) == (0, 1, "")  # a single-host pod: GKE injects nothing into one pod


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "a,b"}, "TPU_WORKER_ID=2 is not a worker of 2"),
        ({"TPU_WORKER_ID": "x", "TPU_WORKER_HOSTNAMES": "a,b"}, "TPU_WORKER_ID='x': a number from 0 to 4096"),
        ({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "a,,b"}, "TPU_WORKER_HOSTNAMES='a,,b': host names"),
        ({"TPU_PLATFORM_WORKER_ID": "1"}, "TPU_PLATFORM_WORKER_ID=1 is not a worker of 1"),
    ],
)
def test_a_place_that_is_not_one_is_named(environ, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        names.worker_place(environ)


def test_a_multislice_pod_finds_its_place_across_the_slices_as_jax_does():
    """As JAX's BaseTpuCluster: worker = slice id * workers per slice + TPU_WORKER_ID, every slice's workers one
    world, meeting at MEGASCALE_COORDINATOR_ADDRESS's host (a port dropped) on 8482."""
    environ = {
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "run-slice-1-0.run,run-slice-1-1.run",
        "MEGASCALE_NUM_SLICES": "3",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "run-slice-0-0.run:8081",
        "MEGASCALE_PORT": "8081",
    }
    assert names.worker_place(environ) == (3, 6, "run-slice-0-0.run:8482")
    assert names.worker_place({**environ, "MEGASCALE_NUM_SLICES": "1", "MEGASCALE_SLICE_ID": "0"}) == (
        1,
        2,
        "run-slice-0-0.run:8482",
    )


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"MEGASCALE_SLICE_ID": "3"}, "MEGASCALE_SLICE_ID=3 is not a slice of 3"),
        ({"MEGASCALE_COORDINATOR_ADDRESS": ""}, "MEGASCALE_NUM_SLICES=3 without MEGASCALE_COORDINATOR_ADDRESS"),
        ({"MEGASCALE_COORDINATOR_ADDRESS": "a b"}, "MEGASCALE_COORDINATOR_ADDRESS='a b': a host name"),
        ({"TPU_WORKER_ID": "2"}, "TPU_WORKER_ID=2 is not a worker of 2"),
    ],
)
def test_a_multislice_place_that_is_not_one_is_named(changes, problem):
    environ = {
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": "a,b",
        "MEGASCALE_NUM_SLICES": "3",
        "MEGASCALE_SLICE_ID": "0",
        "MEGASCALE_COORDINATOR_ADDRESS": "a",
    }
    with pytest.raises(ValueError, match=re.escape(problem)):
        names.worker_place({**environ, **changes})


# JAX's own reading of a GKE pod's environment (jax/_src/clusters/cloud_tpu_cluster.py, GkeTpuCluster), run in the
# workloads' environment: its process id, process count and coordinator, as JSON.
JAX_PLACE = """
import json
import os
from jax._src.clusters.cloud_tpu_cluster import GkeTpuCluster as cluster
print(json.dumps([cluster.get_process_id(), cluster.get_process_count(), cluster.get_coordinator_address(5, None)]))
"""


@pytest.mark.workloads
@pytest.mark.parametrize(("slice_id", "worker"), [(0, 0), (0, 1), (1, 0), (2, 1)])
def test_a_gke_pods_place_is_the_one_jax_computes(slice_id, worker):
    """The contract's place and JAX's for the same pod of a 3-slice, 2-host-per-slice run (host names that
    resolve on loopback: JAX waits until the coordinator's name resolves)."""
    environ = {
        "TPU_WORKER_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": "localhost,127.0.0.1",
        "MEGASCALE_NUM_SLICES": "3",
        "MEGASCALE_SLICE_ID": str(slice_id),
        "MEGASCALE_COORDINATOR_ADDRESS": "localhost",
        "MEGASCALE_PORT": "8081",
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
    answer = subprocess.run(
        [workloads_python(), "-c", JAX_PLACE], env={**clean, **environ}, capture_output=True, text=True, timeout=120
    )
    assert answer.returncode == 0, answer.stderr[-2000:]
    jax_id, jax_count, jax_coordinator = json.loads(answer.stdout.strip().splitlines()[-1])
    assert (
        names.worker_place(environ)
        == (jax_id, jax_count, jax_coordinator)
        == (slice_id * 2 + worker, 6, "localhost:8482")
    )
