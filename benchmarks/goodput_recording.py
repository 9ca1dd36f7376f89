"""What the agent's run timeline costs the run: time per output line in the recorder (on the run's output
path, vm_agent/timeline.py `Recorder.line`), the record's write, and both as a share of step time.

    .venv/bin/python benchmarks/goodput_recording.py [--lines 50000] [--step-seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vm_agent import timeline
from vm_agent.gcs import Folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--step-seconds", type=float, default=0.5, help="a training step's time, for the share")
    args = parser.parse_args()
    n = args.lines
    lines = {
        "text line": "epoch 3/10: 1234/60000 examples, input pipeline 12 ms",
        "step line": json.dumps({"severity": "INFO", "message": "training", "step": 1, "loss": 0.12345}),
        "save line": json.dumps({"message": "checkpoint saved", "step": 1, "seconds": 0.25}),
    }
    for name, line in lines.items():
        with tempfile.TemporaryDirectory() as folder:
            recorder = timeline.Recorder("bench", "vm", True, Folder(folder), lambda *a, **k: None)
            recorder.record("programStart")
            start = time.perf_counter()
            for _ in range(n):
                recorder.line(line)
            per_line = (time.perf_counter() - start) / n
            print(
                f"{name}: {per_line * 1e6:.2f} us/line on the run's path; {per_line / args.step_seconds:.2e} of a "
                f"{args.step_seconds:g} s step at one line a step; {len(recorder.events)} events kept"
            )
    with tempfile.TemporaryDirectory() as folder:
        recorder = timeline.Recorder("bench", "vm", True, Folder(folder), lambda *a, **k: None)
        recorder.events = [timeline.Event("checkpoint", float(i), i, 0.25) for i in range(timeline.MAX_LINE_EVENTS)]
        start = time.perf_counter()
        recorder.record("exit", code=0)
        write = time.perf_counter() - start
        size = (Path(folder) / "runs" / "bench" / "timeline.json").stat().st_size
        print(
            f"the record's write at {timeline.MAX_LINE_EVENTS} events: {write * 1e3:.1f} ms, {size / 1000:.0f} kB "
            f"(to a local folder; at most one every {timeline.STEP_WRITE_S:g} s from step lines)"
        )


if __name__ == "__main__":
    main()
