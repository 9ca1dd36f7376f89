#!/usr/bin/env python3
"""Training figures for each workload on this machine (CPU), on generated MNIST-shaped data.

For tf_mnist and jax_mnist: examples per second, checkpoint write and restore time, and the share
of step time spent waiting for input; plus the data-preparation throughput. Each workload runs
twice against one checkpoint folder: the first run trains and checkpoints, the second resumes
(restore time) and trains to the end (throughput, input wait). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"


def run(python: str, program: str, *args: str, cwd: Path) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([python, str(WORKLOADS / program), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv-workloads/bin/python"))
    parser.add_argument("--train", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sample = folder / "mnist.npz"
        subprocess.run([args.python, str(WORKLOADS / "sample_mnist.py"), str(sample), "--train", str(args.train)],
                       check=True)  # fmt: skip
        prep = run(args.python, "prepare_data.py", str(sample), str(folder / "shards"), cwd=folder)
        rate = f"{prep['examples_per_second']:,} examples/s, {prep['megabytes_per_second']} MB/s, local disk"
        print(f"prepare_data: {prep['examples']} examples, {prep['megabytes']} MB in {prep['seconds']} s ({rate})")
        print(f"{'workload':<10} {'examples/s':>11} {'ckpt write ms':>14} {'ckpt restore ms':>16} {'input wait':>11}")
        for program in ("tf_mnist.py", "jax_mnist.py"):
            common = ["--data", str(folder / "shards"), "--batch-size", str(args.batch_size),
                      "--checkpoint-dir", str(folder / program / "ckpt"), "--checkpoint-every-steps", "50"]  # fmt: skip
            run(args.python, program, *common, "--steps", str(args.steps // 3), cwd=folder)
            # Reopen the finished short run so the second run resumes it (a benchmark-only shortcut).
            (folder / program / "ckpt" / "COMPLETE").unlink()
            resumed = run(args.python, program, *common, "--steps", str(args.steps), cwd=folder)
            print(
                f"{program.removesuffix('.py'):<10} {resumed['examples_per_second']:>11,.0f}"
                f" {1000 * resumed['checkpoint_write_seconds']:>14.1f}"
                f" {1000 * resumed['checkpoint_restore_seconds']:>16.1f}"
                f" {100 * resumed['input_wait_share']:>10.1f}%"
            )


if __name__ == "__main__":
    main()
