"""vm_agent/runner.py: one run under the contract, against a real GCS emulator (tests/sandbox.py).

The folder is the trainer in tests/agent_sources (stdlib and one requirement, `tinyckpt`, served as a
local wheel since there is no index offline). The virtualenv is made by the local interpreter (the
system Python, standing in for the TPU image's).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from run_contract import completion_marker
from run_contract.spec import parse_run_spec
from tests.sandbox import storage_emulator, wait_for
from tests.vm_agent_support import (
    ARTIFACTS,
    CHECKPOINTS,
    MODELS,
    STATUS,
    agent_environ,
    pack,
    run_spec,
    trainer_folder,
)
from tools.standins.metadata import metadata_server
from vm_agent.gcs import Folder, Storage
from vm_agent.runner import Run
from vm_agent.settings import Settings

pytestmark = pytest.mark.slow  # a virtualenv and real processes against an emulator


@pytest.fixture(scope="module")
def bucket_env(tmp_path_factory):
    """The emulator with the stack's buckets and the trainer's archive uploaded; a VM root shared by the
    module's runs (one virtualenv per source digest, as on a VM)."""
    tmp = tmp_path_factory.mktemp("runner")
    with storage_emulator() as host, metadata_server({}) as metadata:
        storage = Storage(environ={"STORAGE_EMULATOR_HOST": host})
        for bucket in (ARTIFACTS, STATUS, CHECKPOINTS, MODELS):
            storage.client.create_bucket(bucket)
        archive, sha = pack(trainer_folder(tmp))
        storage.write(ARTIFACTS, f"sources/{sha}.tar.gz", archive, "application/gzip")
        env = agent_environ(tmp, metadata, host, TPU_PLATFORM_PYTHON="/usr/bin/python3")
        yield {"env": env, "storage": storage, "sha": sha, "tmp": tmp}


def make_run(bucket_env, run_id: str, command: list[str], sha: str = "", **fields: object) -> tuple[Run, list[str]]:
    settings = Settings.from_environ(bucket_env["env"])
    sha = sha or bucket_env["sha"]
    source = {"kind": "folder", "uri": f"gs://{ARTIFACTS}/sources/{bucket_env['sha']}.tar.gz", "sha256": sha}
    spec = parse_run_spec(run_spec(run_id, source, command, **fields), settings.allowed)
    logged: list[str] = []

    def log(message: str, **_: object) -> None:
        logged.append(message)

    shipped: list[str] = []
    run = Run(
        spec,
        settings,
        Folder(settings.status_dir, bucket_env["storage"]),
        bucket_env["storage"],
        log,
        lambda line, _spec: shipped.append(line),
    )
    return run, shipped


def status(bucket_env, run_id: str) -> dict:
    return json.loads(bucket_env["storage"].read(STATUS, f"trainer-1/runs/{run_id}/status.json"))


@pytest.fixture(autouse=True)
def environment(bucket_env, monkeypatch):
    for key in (
        "STORAGE_EMULATOR_HOST",
        "PIP_NO_INDEX",
        "PIP_FIND_LINKS",
        "UV_NO_INDEX",
        "UV_PYTHON_DOWNLOADS",
        "UV_FIND_LINKS",
        "PATH",
    ):
        monkeypatch.setenv(key, bucket_env["env"][key])


def test_a_finished_folder_run_writes_its_state_and_the_completion_marker(bucket_env):
    run, shipped = make_run(
        bucket_env,
        "dev/t/finish",
        ["python", "train.py", "--steps", "3"],
        env={"STEP_SECONDS": "0", "TRAINER_EXTRA": "x"},
        checkpointDir=f"gs://{CHECKPOINTS}/finish",
        modelDir=f"gs://{MODELS}/finish",
        completion=True,
    )
    run.start()
    assert run.wait(120)
    record = status(bucket_env, "dev/t/finish")
    assert (record["state"], record["exitCode"], record["attempt"]) == ("finished", 0, 1), record
    assert record["source"]["sha256"] == bucket_env["sha"] and record["requester"] == "stack"
    marker = json.loads(bucket_env["storage"].read(STATUS, "trainer-1/COMPLETE"))
    # The one schema the guard and infra/run_status.py read it with.
    assert completion_marker.problem(marker) is None and marker["writtenBy"] == "vm-agent"
    assert (marker["runId"], marker["steps"]) == ("dev/t/finish", 3)
    contract = next(json.loads(line) for line in shipped if '"contract"' in line)  # every line reached telemetry
    assert contract["env"]["TPU_PLATFORM_RUN_ID"] == "dev/t/finish"
    assert contract["env"]["TPU_PLATFORM_CHECKPOINT_DIR"] == f"gs://{CHECKPOINTS}/finish"
    assert contract["env"]["TPU_PLATFORM_STATUS_DIR"] == f"gs://{STATUS}/trainer-1"
    assert contract["env"]["TPU_PLATFORM_GRACE_SECONDS"] == "10"
    assert contract["extra"] == "x"
    # Its own requirement, from its own virtualenv (one per source digest, bounds, lock and requester).
    assert f"venvs/{bucket_env['sha'][:16]}-" in contract["python"] and "/venvs/" in contract["tinyckpt"]
    model = json.loads(bucket_env["storage"].read(MODELS, "finish/model.json"))
    assert model["steps"] == 3


def test_a_line_whose_step_is_not_an_integer_never_reaches_the_completion_marker(bucket_env):
    """`{"step": true}` is no step line (run_contract/timeline.py step_line): the marker the guard reads keeps
    the last integer step, and stays one its schema accepts."""
    program = "import json; print(json.dumps({'step': 2})); print(json.dumps({'step': True}))"
    run, _ = make_run(bucket_env, "dev/t/bool-step", ["python", "-c", program], completion=True)
    run.start()
    assert run.wait(120)
    assert status(bucket_env, "dev/t/bool-step")["state"] == "finished"
    marker = json.loads(bucket_env["storage"].read(STATUS, "trainer-1/COMPLETE"))
    assert completion_marker.problem(marker) is None and marker["steps"] == 2


def test_exit_78_fails_at_once_and_is_never_retried(bucket_env):
    run, _ = make_run(bucket_env, "dev/t/config", ["python", "train.py", "--fail-with", "78"])
    run.start()
    assert run.wait(60)
    record = status(bucket_env, "dev/t/config")
    assert (record["state"], record["exitCode"], record["attempt"]) == ("failed", 78, 1)
    assert "EX_CONFIG" in record["error"]


@pytest.mark.parametrize("code", [1, 75])
def test_other_exits_are_retried_at_most_max_retries_times(bucket_env, code):
    run, _ = make_run(bucket_env, f"dev/t/exit-{code}", ["python", "train.py", "--fail-with", str(code)])
    run.start()
    assert run.wait(60)
    record = status(bucket_env, f"dev/t/exit-{code}")
    # TPU_PLATFORM_MAX_RETRIES=2: the first attempt and two retries.
    assert (record["state"], record["exitCode"], record["attempt"]) == ("failed", code, 3), record
    assert "after 2 retries" in record["error"]


def test_a_source_whose_digest_differs_is_refused_and_nothing_of_it_runs(bucket_env):
    run, shipped = make_run(bucket_env, "dev/t/tampered", ["python", "train.py"], sha="0" * 64)
    run.start()
    assert run.wait(60)
    record = status(bucket_env, "dev/t/tampered")
    assert (record["state"], record["attempt"], record["exitCode"]) == ("failed", 0, None)
    assert f"has sha256 {bucket_env['sha']}, the run spec says {'0' * 64}: refused" in record["error"]
    assert shipped == []
    assert not (Path(bucket_env["env"]["TPU_PLATFORM_ROOT"]) / "opt/tpu-platform/sources" / ("0" * 64)).exists()


def test_stop_sends_sigterm_and_the_program_commits_a_checkpoint_and_exits_75(bucket_env):
    run, shipped = make_run(
        bucket_env,
        "dev/t/stop",
        ["python", "train.py", "--steps", "1000"],
        env={"STEP_SECONDS": "0.2"},
        checkpointDir=f"gs://{CHECKPOINTS}/stop",
        completion=True,
    )
    run.start()
    wait_for(lambda: any('"step": 2' in line for line in shipped), 60, "two steps")
    run.stop("the test asks")
    record = status(bucket_env, "dev/t/stop")
    assert (record["state"], record["exitCode"]) == ("stopped", 75), record
    assert any("SIGTERM: checkpoint committed" in line for line in shipped)
    assert bucket_env["storage"].list(CHECKPOINTS, "stop/ckpt-")


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace_period(bucket_env, tmp_path):
    settings = Settings.from_environ({**bucket_env["env"], "TPU_PLATFORM_GRACE_SECONDS": "1"})
    run, shipped = make_run(bucket_env, "dev/t/stubborn", ["python", "-c", "x"])
    run.settings = settings
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    run.spec = parse_run_spec(
        run_spec("dev/t/stubborn", run.spec.source.describe(), ["python", "-c", stubborn]), settings.allowed
    )
    run.start()
    wait_for(lambda: "up" in shipped, 60, "the program to start")
    stopper = threading.Thread(target=run.stop, args=("the test asks",))
    stopper.start()
    stopper.join(30)
    record = status(bucket_env, "dev/t/stubborn")
    assert (record["state"], record["exitCode"]) == ("stopped", -int(signal.SIGKILL)), record


def test_the_agents_own_settings_are_not_the_programs(bucket_env):
    printer = "import json, os; print(json.dumps(sorted(os.environ)))"
    run, shipped = make_run(bucket_env, "dev/t/env", ["python", "-c", printer])
    run.start()
    assert run.wait(60)
    names = set(json.loads(shipped[-1]))
    assert "TPU_PLATFORM_ARTIFACTS" not in names and "TPU_PLATFORM_MAX_RETRIES" not in names
    assert {"TPU_PLATFORM_RUN_ID", "TPU_PLATFORM_WORKER_COUNT", "TPU_RUNTIME_FLAG"} <= names
    assert os.environ["STORAGE_EMULATOR_HOST"]  # the rest of the VM's environment stays


def test_a_pinned_python_gets_a_uv_virtualenv_of_that_version(bucket_env, monkeypatch):
    """On a VM uv fetches the pinned Python; offline, uv finds the local 3.11 (UV_PYTHON_DOWNLOADS=never)."""
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
    tools = Path(__file__).resolve().parents[1] / ".venv" / "bin"  # where uv is here
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    run, shipped = make_run(
        bucket_env,
        "dev/t/pinned",
        ["python", "train.py", "--steps", "1"],
        python="3.11",
        env={"STEP_SECONDS": "0"},
        checkpointDir=f"gs://{CHECKPOINTS}/pinned",
    )
    run.start()
    assert run.wait(120)
    assert status(bucket_env, "dev/t/pinned")["state"] == "finished", shipped[-5:]
    contract = next(json.loads(line) for line in shipped if '"contract"' in line)
    assert f"venvs/{bucket_env['sha'][:16]}-" in contract["python"] and "-py3.11/" in contract["python"]
    assert "-py3.11/" in contract["tinyckpt"]


def test_the_frameworks_bounds_hold_when_a_run_installs_its_requirements(bucket_env, tmp_path):
    """TPU_PLATFORM_PIP_CONSTRAINTS (the catalog's bounds, e.g. protobuf<5 beside TensorFlow < 2.18) are
    checked against the folder's lock before anything is installed: a pin they forbid fails the run for
    good, with the reason, instead of installing what would break the image's framework."""
    env = {**bucket_env["env"], "TPU_PLATFORM_ROOT": str(tmp_path), "TPU_PLATFORM_PIP_CONSTRAINTS": "tinyckpt<0.1"}
    run, _ = make_run(
        {**bucket_env, "env": env}, "dev/t/bounded", ["python", "train.py", "--steps", "1"], env={"STEP_SECONDS": "0"}
    )
    run.start()
    assert run.wait(120)
    state = status(bucket_env, "dev/t/bounded")
    assert (state["state"], state["attempt"]) == ("failed", 0), state
    assert "tinyckpt==0.1 breaks tinyckpt<0.1" in state["error"], state
