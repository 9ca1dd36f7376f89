"""A TPU VM's world in a network namespace of a test's own, where the agent's firewall is real.

tests/test_vm_agent_isolation.py runs it as `unshare --net python -m tests.isolation_world SCENARIO`: in
that namespace loopback is up and holds 169.254.169.254, where the metadata stand-in answers on port 80 as
Compute Engine's server does (the VM's token, the stack's attributes); the GCS emulator sits behind an
IAM front that authorises each call by its bearer token (tests/iam_standins.py: the VM account's grants
as the plan declares them, a downscoped token's boundary as the STS stand-in issued it); the STS and
Logging stand-ins listen on loopback. The real agent (`python -m vm_agent`, agent.env as the start-up
script writes it, TPU_PLATFORM_METADATA_REDIRECT=1) starts, installs its iptables rules here, runs the
stack's run and then a researcher's request, each a hostile program (tests/agent_sources/hostile). The
world waits for both to end, stops the agent, looks for anything the runs left, and prints what it saw
as one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import requests

from tests.iam_standins import Grant, IamFront, StsStandIn, serve, sts_handler
from tests.sandbox import storage_emulator, wait_for
from tests.vm_agent_support import agent_environ, start_agent
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server
from vm_agent.isolation import processes_of


def logging_handler(entries: list[dict[str, Any]]):
    """entries:write as Logging answers it: the VM account's token writes (roles/logging.logWriter); a
    downscoped token is worth nothing outside Cloud Storage ("Credential Access Boundaries are only
    available for Cloud Storage"), nor is no token."""

    def handle(method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        # Header names are case-insensitive (RFC 9110 5.1); google-auth's AuthorizedSession sends `authorization`.
        authorization = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        if authorization != f"Bearer {SANDBOX_TOKEN}":
            return 403, b'{"error": {"code": 403, "message": "permission denied"}}', "application/json"
        if path.endswith("/entries:write"):
            request = json.loads(body)
            defaults = {k: request[k] for k in ("logName", "resource") if k in request}
            entries.extend({**defaults, **entry} for entry in request.get("entries", []))
        return 200, b"{}", "application/json"

    return handle


def state(emulator: str, bucket: str, name: str) -> dict[str, Any]:
    answer = requests.get(
        f"{emulator}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}", params={"alt": "media"}, timeout=10
    )
    return answer.json() if answer.status_code == 200 else {}


def main(path: str) -> int:
    scenario = json.loads(Path(path).read_text())
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"], check=True)
    seen: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="isolation-world-"))
    with storage_emulator() as emulator:
        for bucket in scenario["buckets"]:
            requests.post(
                f"{emulator}/storage/v1/b", params={"project": "p"}, json={"name": bucket}, timeout=10
            ).raise_for_status()
        for bucket, name, file in scenario["objects"]:
            requests.post(
                f"{emulator}/upload/storage/v1/b/{bucket}/o",
                params={"uploadType": "media", "name": name},
                data=Path(file).read_bytes(),
                timeout=30,
            ).raise_for_status()
        sts = StsStandIn(frozenset({SANDBOX_TOKEN}))
        front = IamFront(
            emulator,
            {
                SANDBOX_TOKEN: [
                    Grant(g["bucket"], frozenset(g["permissions"]), g["condition"]) for g in scenario["grants"]
                ]
            },
            sts,
        )
        entries: list[dict[str, Any]] = []
        servers = [serve(sts_handler(sts)), serve(front.handle), serve(logging_handler(entries))]
        (_, sts_url), (_, front_url), (_, logging_url) = servers
        # The hostile programs' targets name the Logging stand-in, whose port is known only now.
        spec = json.dumps(scenario["spec"]).replace("@LOGGING@", logging_url)
        attributes = {**scenario["attributes"], "tpu-platform-run": spec}
        with metadata_server(attributes, ("169.254.169.254", 80)) as md:
            env = agent_environ(
                tmp,
                md,
                front_url,
                TPU_PLATFORM_METADATA_REDIRECT="1",
                TPU_PLATFORM_STS_URL=f"{sts_url}/v1/token",
                TPU_PLATFORM_LOGGING_URL=logging_url,
                TPU_PLATFORM_MONITORING_URL=logging_url,
                **scenario["agent_env"],
            )
            request_name, request = scenario["request"]
            requests.post(
                f"{emulator}/upload/storage/v1/b/{scenario['status_bucket']}/o",
                params={"uploadType": "media", "name": request_name},
                data=json.dumps(request).replace("@LOGGING@", logging_url).encode(),
                timeout=10,
            ).raise_for_status()
            log_path = tmp / "agent.log"
            agent = start_agent(env, log_path)
            try:
                for name in scenario["wait_for"]:  # each run's state, until it ended
                    wait_for(
                        lambda name=name: (
                            state(emulator, scenario["status_bucket"], name).get("state")
                            in ("finished", "failed", "stopped")
                        ),
                        240,
                        name,
                        interval=0.3,
                    )
                seen["firewall"] = subprocess.run(
                    ["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True
                ).stdout
            finally:
                agent.send_signal(signal.SIGTERM)
                seen["agent_exit"] = agent.wait(60)
            seen["states"] = {n: state(emulator, scenario["status_bucket"], n) for n in scenario["wait_for"]}
            seen["complete"] = state(emulator, scenario["status_bucket"], scenario["complete"])
        log = log_path.read_text()
        seen["agent_log"] = log
        seen["lines"] = [json.loads(line) for line in log.splitlines() if line.startswith('{"attack"')]
        uids = sorted({int(uid) for uid in re.findall(r"runs as uid (\d+)", log)})
        time.sleep(1)  # what a left-behind process would write meanwhile
        seen["uids"] = uids
        seen["left_processes"] = {uid: processes_of(uid) for uid in uids}
        nonce = scenario["nonce"]
        seen["left_files"] = [
            str(p) for folder in ("/tmp", "/var/tmp", "/dev/shm") for p in Path(folder).glob(f"{nonce}*")
        ]
        seen["run_folders"] = sorted(os.listdir(Path(env["TPU_PLATFORM_ROOT"]) / "var/lib/tpu-platform/runs"))
        seen["sts_violations"] = sts.violations
        seen["boundaries"] = list(sts.issued.values())
        seen["denied"] = front.denied
        seen["storage_violations"] = front.violations
        seen["entries"] = entries
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
