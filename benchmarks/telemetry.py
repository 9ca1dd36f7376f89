"""What the VM agent's telemetry costs the run: time per line in `ship` (on the run's output path),
lines per second through to a loopback Logging stand-in, and the event file's cost per training step.

    .venv/bin/python benchmarks/telemetry.py [--lines 20000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.standins.metadata import metadata_server, sandbox_credentials
from tools.standins.telemetry import google_apis
from vm_agent.telemetry import Telemetry
from vm_agent.tensorboard import EventLog, masked_crc32c


@dataclass(frozen=True)
class Run:
    run_id: str
    model_dir: str = ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    n = args.lines
    text = "epoch 3/10: 1234/60000 examples, input pipeline 12 ms"
    training = json.dumps({"severity": "INFO", "message": "training", "step": 1, "loss": 0.12345, "steps_per_s": 9.5})
    with google_apis() as (api_url, received), metadata_server() as metadata:
        env = {
            "TPU_PLATFORM_PROJECT": "bench",
            "TPU_PLATFORM_STACK": "dev",
            "TPU_PLATFORM_VM": "vm",
            "TPU_PLATFORM_LOGGING_URL": api_url,
            "TPU_PLATFORM_MONITORING_URL": api_url,
            "GCE_METADATA_HOST": metadata,
        }
        with tempfile.TemporaryDirectory() as model_dir:
            for name, line in (("text line", text), ("training JSON line", training)):
                shipper = Telemetry(env, flush_every_s=0.5, queue_size=n + 1, credentials=sandbox_credentials())
                run = Run("bench", model_dir)
                start = time.perf_counter()
                for _ in range(n):
                    shipper.ship(line, run)
                shipped = time.perf_counter() - start
                counts = shipper.close(120)
                total = time.perf_counter() - start
                print(
                    f"{name}: ship {shipped / n * 1e6:.1f} us/line on the run's path; "
                    f"{counts.entries_sent} entries sent in {total:.2f} s ({counts.entries_sent / total:,.0f} lines/s "
                    f"to a loopback Logging), {counts.points_sent} metric points, {counts.dropped_lines} dropped"
                )
        print(f"requests received: {len(received.calls)}")
    data = bytes(range(256)) * 4096  # 1 MiB
    start = time.perf_counter()
    masked_crc32c(data)
    print(f"crc32c (google-crc32c): {len(data) / (time.perf_counter() - start) / 2**20:.2f} MiB/s")
    with tempfile.TemporaryDirectory() as folder:
        log = EventLog(folder, "bench")
        start = time.perf_counter()
        for step in range(1, 1001):
            log.scalars(step, {"loss": 0.5, "steps_per_s": 9.5, "examples_per_s": 1216.0})
        per_step = (time.perf_counter() - start) / 1000
        size = log.path.stat().st_size
        print(f"event file: {per_step * 1e6:.0f} us and {size / 1000:.0f} bytes per step of 3 scalars")


if __name__ == "__main__":
    main()
