"""Budget notifications carried by the real Pub/Sub emulator into the guard's `on_budget`, served
by the real Functions Framework (the runtime Cloud Run functions use), acting on the TPU API
stand-in (which checks each request against tpu.v2) as the account a metadata server vouches for.

The emulator pushes each message to the function (a push subscription), as Eventarc does in the
cloud; the Functions Framework turns the push into the CloudEvent the function receives.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from infra.tpu_guard import source_files
from tests.sandbox import free_port, wait_for
from tests.test_tpu_guard import ACCOUNT, BUDGET, LISTING, OVER, PARENT, PROJECT
from tests.tpu_api import tpu_api_standin
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server

pytestmark = pytest.mark.slow

EMULATOR_PACKAGE = "google-cloud-cli-pubsub-emulator"


def _accepting(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def pubsub_emulator(tmp_path: Path) -> Iterator[str]:
    """gcloud's Pub/Sub emulator on loopback; yields its base URL. Fails (never skips) without it."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        pytest.fail(f"gcloud is not installed: install the Debian packages google-cloud-cli and {EMULATOR_PACKAGE}")
    port = free_port()
    (tmp_path / "pubsub").mkdir()
    log = (tmp_path / "pubsub-emulator.log").open("wb")
    process = subprocess.Popen(
        [
            gcloud,
            "beta",
            "emulators",
            "pubsub",
            "start",
            f"--host-port=127.0.0.1:{port}",
            f"--data-dir={tmp_path / 'pubsub'}",
            "--quiet",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: _accepting(port) or process.poll() is not None, 90, "the Pub/Sub emulator")
        if not _accepting(port):
            output = (tmp_path / "pubsub-emulator.log").read_text()[-2000:]
            pytest.fail(
                f"the Pub/Sub emulator did not start (it comes with the Debian package {EMULATOR_PACKAGE}):\n{output}"
            )
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # gcloud starts the emulator's Java as a child
        process.wait(30)
        log.close()


@contextlib.contextmanager
def function_server(target: str, env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`functions-framework` serving one entry point of the guard; yields its URL and its log."""
    port = free_port()
    log_path = tmp_path / f"{target}.log"
    log = log_path.open("wb")
    # The source as deployed: the guard's files with run_contract/ beside them (its source archive).
    source = tmp_path / "guard-source"
    for name, path in source_files().items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, source / name)
    binary = Path(sys.executable).with_name("functions-framework")
    process = subprocess.Popen(
        [
            str(binary),
            "--target",
            target,
            "--signature-type",
            "cloudevent",
            "--source",
            str(source / "main.py"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=source,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: _accepting(port) or process.poll() is not None, 60, f"functions-framework serving {target}")
        if process.poll() is not None:
            raise AssertionError(f"functions-framework exited: {log_path.read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}/", log_path
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def test_a_budget_notification_through_pubsub_stops_the_environments_tpus(tmp_path):
    with (
        pubsub_emulator(tmp_path) as pubsub,
        tpu_api_standin() as (tpu_url, tpu),
        metadata_server({}) as metadata_host,
    ):
        for listed in LISTING:
            tpu.add(listed)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
            "GCE_METADATA_HOST": metadata_host,
            "GCE_METADATA_IP": metadata_host,  # google.auth finds "GCE" here
            "PROJECT": PROJECT,
            "ENVIRONMENT": "prod",
            "ZONES": "us-central1-a",
            "BUDGET_ACTION": "stop",
            "BUDGET_AT_PERCENT": "100",
            "BILLING_ACCOUNT": ACCOUNT,
            "BUDGET_ID": BUDGET,
            "TPU_API_ENDPOINT": tpu_url,
            "PYTHONUNBUFFERED": "1",
        }
        with function_server("on_budget", env, tmp_path) as (function_url, function_log):
            topic = f"{pubsub}/v1/projects/{PROJECT}/topics/prod-budget-alerts"
            requests.put(topic, json={}, timeout=10).raise_for_status()
            subscription = {
                "topic": f"projects/{PROJECT}/topics/prod-budget-alerts",
                "pushConfig": {"pushEndpoint": function_url},
                "ackDeadlineSeconds": 10,
            }
            requests.put(
                f"{pubsub}/v1/projects/{PROJECT}/subscriptions/guard", json=subscription, timeout=10
            ).raise_for_status()

            def publish(attributes: dict[str, str]) -> None:
                data = base64.b64encode(json.dumps(OVER).encode()).decode()
                message = {"messages": [{"data": data, "attributes": attributes}]}
                requests.post(f"{topic}:publish", json=message, timeout=10).raise_for_status()

            # Anyone who may publish to the topic is not the billing service: not this budget, no action.
            publish({"billingAccountId": ACCOUNT, "budgetId": "not-ours", "schemaVersion": "1.0"})
            wait_for(lambda: "ignoring a message on the budget topic" in function_log.read_text(), 60, "the forgery")
            assert tpu.calls == []

            publish({"billingAccountId": ACCOUNT, "budgetId": BUDGET, "schemaVersion": "1.0"})
            wait_for(lambda: tpu.did("delete"), 60, "the budget action")
            assert tpu.did("stop") == ["trainer"] and tpu.did("delete") == ["slice"]
            assert tpu.nodes[f"{PARENT}/trainer"]["state"] == "STOPPED"
            assert tpu.violations == []
            assert set(tpu.authorization) == {f"Bearer {SANDBOX_TOKEN}"}  # as the guard's own account
