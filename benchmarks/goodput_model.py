#!/usr/bin/env python3
"""The checkpoint interval model against the simulation, over the grid of save times and preemption
rates the tests check (tools/offline/simulation.py GRID): the best interval by Young, Daly, the model
and the simulation of a month of a spot job with the guard's recovery, and the billed-to-useful ratio
both give at the model's best. Not a test: figures only (the test asserts the 10%).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.offline.simulation import GRID, compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1200, help="losses of work to simulate per interval")
    parser.add_argument("--cells", type=int, default=len(GRID), help="the first N cells of the grid")
    args = parser.parse_args()
    print(
        f"{'save s':>6} {'preempt h':>9} {'lost h':>6} {'Young s':>8} {'Daly s':>7} {'model s':>8} {'sim s':>7}"
        f" {'sim/model':>9} {'months':>6} {'losses':>6} {'billed/useful model':>19} {'sim':>7} {'s':>5}"
    )
    for cell in GRID[: args.cells]:
        start = time.perf_counter()
        row = compare(cell, events=args.events)
        lost = f"{cell.lost_hours:g}" if cell.lost_hours else "-"
        print(
            f"{cell.save_s:>6g} {cell.preemption_hours:>9g} {lost:>6} {row.young_s:>8.0f} {row.daly_s:>7.0f}"
            f" {row.model_s:>8.0f} {row.simulated.best_s:>7.0f} {row.simulated.best_s / row.model_s:>9.3f}"
            f" {row.simulated.months:>6} {row.simulated.events:>6} {row.model_billed_per_useful:>19.4f}"
            f" {row.simulated_billed_per_useful:>7.4f} {time.perf_counter() - start:>5.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
