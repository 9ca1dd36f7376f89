#!/usr/bin/env python3
"""The seed's own MNIST script against tf_mnist and jax_mnist: the same job, side by side, on this CPU.

The job: the seed's model, batch 256, 60,000 generated MNIST-shaped training examples (10,000 test),
three epochs, the whole process timed from start to exit. All three read the same examples
(sample_mnist.py): the seed through benchmarks/seed_harness.py (its download replaced by the file),
the workloads from prepare_data.py's shards, with checkpoints every 200 steps (the stack setting's
default) and the model export on, as the platform runs them. `--compare DIR` also times the workloads
of another checkout (DIR/workloads; e.g. `git archive main workloads | tar -x -C DIR`) in the same
rounds: before and after a change, interleaved; `--programs tf_mnist` times only that one beside the
seed's. Runs are interleaved, the order rotated each round, and the median of the rounds reported,
because the machine is shared. Prints wall time and CPU time (user + system,
which a busy neighbour disturbs less), each as a ratio to the seed's, and the workloads' own input
wait and checkpoint stall as shares of their training time, and their training loop's own seconds
(the rest of the process is start-up, data, evaluation and export).

Each workload's output also goes, line by line, through the agent's run timeline (vm_agent/timeline.py
Recorder, as vm_agent/runner.py feeds it, its record written to a local folder) between its programStart
and exit, and is measured as the report measures it (run_contract/timeline.py measure): `first s` is
the firstStep category, the program's start to its first step line (no installs: the environment is
ready; imports, data, compilation and the steps before that line, runlib's first log at step 50);
`start-up s` is that less those steps at the loop's mean step time; `recording` is the recorder's own
time on the run's output path as a share of the training loop's time.
Not a test: figures for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from run_contract.timeline import measure  # noqa: E402
from vm_agent import timeline  # noqa: E402
from vm_agent.gcs import Folder  # noqa: E402

WORKLOADS = ROOT / "workloads"
PROGRAMS = ("seed", "tf_mnist", "jax_mnist")
CHECKPOINT_EVERY_STEPS = 200  # workloads.<name>.checkpointEverySteps' default


def timed(command: list[str], cwd: Path, recorder: timeline.Recorder | None = None) -> tuple[float, float, str, float]:
    """Wall seconds, CPU seconds (user + system, the child and its threads), stdout of one run, and the seconds
    `recorder` took over its output lines (each one as the agent's runner gives it), between programStart and exit."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    recording = 0.0
    with tempfile.TemporaryFile() as errors:
        if recorder:
            recorder.record("programStart")
        started = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert process.stdout is not None
        lines = []
        for raw in process.stdout:
            lines.append(raw)
            if recorder:
                mark = time.perf_counter()
                recorder.line(raw.rstrip("\n"))
                recording += time.perf_counter() - mark
        code = process.wait()
        wall = time.perf_counter() - started
        if recorder:
            recorder.record("exit", code=code)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if code:
            errors.seek(0)
            raise SystemExit(f"{' '.join(command)} failed:\n{errors.read().decode(errors='replace')[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, "".join(lines), recording


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
    parser.add_argument(
        "--programs", nargs="+", choices=PROGRAMS[1:], default=PROGRAMS[1:], help="workloads to time (default: both)"
    )
    args = parser.parse_args()
    programs = ("seed", *args.programs) + (tuple(f"{p}@before" for p in args.programs) if args.compare else ())
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
        _, _, out, _ = timed([args.python, str(WORKLOADS / "prepare_data.py"), str(sample), str(shards)], folder)
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
                recorder = None
                if program != "seed":
                    records = folder / f"records-{program}-{round_}"
                    records.mkdir()
                    recorder = timeline.Recorder(program, "bench", True, Folder(str(records)), lambda *a, **k: None)
                wall, cpu, out, recording = timed(command, folder, recorder)
                walls[program].append(wall)
                cpus[program].append(cpu)
                if recorder:
                    metrics = json.loads(out.strip().splitlines()[-1])
                    found = measure(recorder.events).seconds
                    line = next(e.step or 0 for e in recorder.events if e.kind == "firstStep")
                    per_step = metrics["wall_seconds"] / metrics["steps"]
                    metrics.update(
                        first_step=found["firstStep"],
                        start_up=found["firstStep"] - line * per_step,
                        recording_share=recording / metrics["wall_seconds"],
                    )
                    shares[program].append(metrics)
                print(f"  round {round_ + 1} {program}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)

        seed_wall, seed_cpu = statistics.median(walls["seed"]), statistics.median(cpus["seed"])
        print(f"\nmedian of {args.rounds} round(s); ratios are to the guide's script (benchmarks/seed_tpu_mnist.py)")
        heads = ("wall s", "x seed", "CPU s", "x seed", "loop s", "first s")
        shared = ("start-up s", "input wait", "ckpt stall", "recording")
        print(f"{'program':<17} " + " ".join(f"{h:>7}" for h in heads) + " " + " ".join(f"{h:>11}" for h in shared))
        for program in programs:
            wall, cpu = statistics.median(walls[program]), statistics.median(cpus[program])
            wait = stall = loop = first = start = recorded = "-"
            if shares[program]:
                runs = shares[program]
                loop = f"{statistics.median(m['wall_seconds'] for m in runs):.1f}"
                first = f"{statistics.median(m['first_step'] for m in runs):.1f}"
                start = f"{statistics.median(m['start_up'] for m in runs):.1f}"
                wait = f"{100 * statistics.median(m['input_wait_share'] for m in runs):.2f}%"
                stall = f"{100 * statistics.median(m['checkpoint_stall_share'] for m in runs):.2f}%"
                recorded = f"{100 * statistics.median(m['recording_share'] for m in runs):.4f}%"
            print(
                f"{program:<17} {wall:>7.1f} {wall / seed_wall:>7.2f} {cpu:>7.1f} {cpu / seed_cpu:>7.2f} "
                f"{loop:>7} {first:>7} {start:>11} {wait:>11} {stall:>11} {recorded:>11}"
            )


if __name__ == "__main__":
    main()
