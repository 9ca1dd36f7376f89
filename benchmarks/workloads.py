#!/usr/bin/env python3
"""The seed's own MNIST script against tf_mnist and jax_mnist: the same job, side by side, on this CPU.

The job: the seed's model, batch 256, 60,000 generated MNIST-shaped training examples (10,000 test),
three epochs, the whole process timed from start to exit. All three read the same examples
(sample_mnist.py): the seed through benchmarks/seed_harness.py (its download replaced by the file),
the workloads from prepare_data.py's shards, with checkpoints every 200 steps (the stack setting's
default) and the model export on, as the platform runs them. `--compare DIR` also times the workloads
of another checkout (DIR/workloads; e.g. `git archive main workloads | tar -x -C DIR`) in the same
rounds: before and after a change, interleaved. Runs are interleaved, the order rotated each round, and the median of
the rounds reported, because the machine is shared. Prints wall time and CPU time (user + system,
which a busy neighbour disturbs less), each as a ratio to the seed's, and the workloads' own input
wait and checkpoint stall as shares of their training time, and their training loop's own seconds
(the rest of the process is start-up, data, evaluation and export). Not a test: figures for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"
PROGRAMS = ("seed", "tf_mnist", "jax_mnist")
CHECKPOINT_EVERY_STEPS = 200  # workloads.<name>.checkpointEverySteps' default


def timed(command: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, the child and its threads) and stdout of one run."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", default=str(ROOT / ".venv-workloads/bin/python"))
    parser.add_argument("--train", type=int, default=60000)
    parser.add_argument("--test", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="workloads: steps instead of epochs (quick checks)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare", type=Path, help="another checkout whose workloads run in the same rounds")
    args = parser.parse_args()
    programs = PROGRAMS + (tuple(f"{p}@before" for p in PROGRAMS[1:]) if args.compare else ())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sample, shards = folder / "mnist.npz", folder / "shards"
        subprocess.run(
            [
                args.python,
                str(WORKLOADS / "sample_mnist.py"),
                str(sample),
                "--train",
                str(args.train),
                "--test",
                str(args.test),
            ],
            check=True,
        )
        _, _, out = timed([args.python, str(WORKLOADS / "prepare_data.py"), str(sample), str(shards)], folder)
        prep = json.loads(out.strip().splitlines()[-1])
        rate = f"{prep['examples_per_second']:,} examples/s, {prep['megabytes_per_second']} MB/s, local disk"
        print(f"prepare_data: {prep['examples']} examples, {prep['megabytes']} MB in {prep['seconds']} s ({rate})")

        length = ["--steps", str(args.steps)] if args.steps else ["--epochs", str(args.epochs)]
        walls: dict[str, list[float]] = {p: [] for p in programs}
        cpus: dict[str, list[float]] = {p: [] for p in programs}
        shares: dict[str, list[dict]] = {p: [] for p in programs}
        for round_ in range(args.rounds):
            turn = round_ % len(programs)
            for program in programs[turn:] + programs[:turn]:
                if program == "seed":
                    epochs = str(args.epochs if not args.steps else 1)
                    command = [args.python, str(ROOT / "benchmarks" / "seed_harness.py"), str(sample), epochs]
                else:
                    name, _, before = program.partition("@")
                    workloads = args.compare.resolve() / "workloads" if before else WORKLOADS
                    run = folder / f"{name}-{before or 'now'}-{round_}"
                    command = [
                        args.python,
                        str(workloads / name / f"{name}.py"),
                        "--data",
                        str(shards),
                        *length,
                        "--batch-size",
                        str(args.batch_size),
                        "--checkpoint-dir",
                        str(run / "ckpt"),
                        "--model-dir",
                        str(run / "model"),
                        "--checkpoint-every-steps",
                        str(CHECKPOINT_EVERY_STEPS),
                    ]
                wall, cpu, out = timed(command, folder)
                walls[program].append(wall)
                cpus[program].append(cpu)
                if program != "seed":
                    shares[program].append(json.loads(out.strip().splitlines()[-1]))
                print(f"  round {round_ + 1} {program}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)

        seed_wall, seed_cpu = statistics.median(walls["seed"]), statistics.median(cpus["seed"])
        print(f"\nmedian of {args.rounds} round(s); ratios are to the guide's script (benchmarks/seed_tpu_mnist.py)")
        heads = ("wall s", "x seed", "CPU s", "x seed", "loop s")
        print(f"{'program':<17} " + " ".join(f"{h:>7}" for h in heads) + f" {'input wait':>11} {'ckpt stall':>11}")
        for program in programs:
            wall, cpu = statistics.median(walls[program]), statistics.median(cpus[program])
            wait = stall = loop = "-"
            if shares[program]:
                loop = f"{statistics.median(m['wall_seconds'] for m in shares[program]):.1f}"
                wait = f"{100 * statistics.median(m['input_wait_share'] for m in shares[program]):.2f}%"
                stall = f"{100 * statistics.median(m['checkpoint_stall_share'] for m in shares[program]):.2f}%"
            print(
                f"{program:<17} {wall:>7.1f} {wall / seed_wall:>7.2f} {cpu:>7.1f} {cpu / seed_cpu:>7.2f} "
                f"{loop:>7} {wait:>11} {stall:>11}"
            )


if __name__ == "__main__":
    main()
