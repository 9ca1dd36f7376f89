#!/usr/bin/env python3
"""How the offline plan scales with the fleet: stacks of N TPU VMs, each planned in a fresh process.

Prints wall time, peak memory (max RSS of the planning process) and time per VM for each size, and
the marginal cost per extra VM between the smallest and largest fleet. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ZONES = ["us-central1-b", "us-central1-c"]  # v2-8 zones inside the dev stack's single region


def fleet_stack(count: int) -> dict:
    stack = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    config = stack["config"]
    template = config["tpu-platform:tpuVms"][0]
    config["tpu-platform:budget"].update(amount=10**9, failOverBudget=False)  # measure planning, not budgets
    config["tpu-platform:tpuVms"] = [
        {**template, "name": f"mnist-{i:04d}", "zone": ZONES[i % len(ZONES)]} for i in range(count)
    ]
    return stack


def plan_once(count: int, folder: Path) -> dict[str, float]:
    path = folder / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(fleet_stack(count)))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tools.offline", "plan", "--stack-file", str(path), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"the plan of {count} TPU VMs failed:\n{done.stderr}")
    wall = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    plan = json.loads(done.stdout)
    vms = plan["countByType"].get("gcp:tpu/v2Vm:V2Vm", 0)
    assert vms == count, f"planned {vms} VMs, expected {count}"
    return {
        "vms": count,
        "resources": plan["resourceCount"],
        "wall_s": wall,
        # ru_maxrss of children is the largest child so far; sizes run in ascending order.
        "peak_mib": max(peak_kib, before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 400])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sorted(args.sizes):
            rows.append(plan_once(size, Path(tmp)))
    print(f"{'TPU VMs':>8} {'resources':>10} {'wall s':>8} {'peak MiB':>9} {'ms per VM':>10}")
    for row in rows:
        print(
            f"{row['vms']:>8} {row['resources']:>10} {row['wall_s']:>8.2f} {row['peak_mib']:>9.0f}"
            f" {1000 * row['wall_s'] / row['vms']:>10.1f}"
        )
    # Constant marginal cost means planning is linear in the fleet: no per-VM work grows with its size.
    for smaller, larger in itertools.pairwise(rows):
        marginal = 1000 * (larger["wall_s"] - smaller["wall_s"]) / (larger["vms"] - smaller["vms"])
        print(f"marginal cost {smaller['vms']} -> {larger['vms']} VMs: {marginal:.1f} ms per extra TPU VM")


if __name__ == "__main__":
    main()
