"""A training-like program under the run contract, stdlib and its one requirement only, fast.

Each step "trains" (sleeps STEP_SECONDS), then commits a checkpoint (one object: ckpt-<step>.json) to
TPU_PLATFORM_CHECKPOINT_DIR, says so ("checkpoint saved", with how long it took) and prints a JSON line
with step and loss. It resumes from the newest checkpoint. SIGTERM: finish the step, commit its
checkpoint, exit 75 (retry later). HOLD_AT_STEP=N: a session that started below step N waits after
committing step N until its SIGTERM, so a test that stops it finds it running, however slowly the
stop comes (a resumed session goes on). After --steps:
write model.json to TPU_PLATFORM_MODEL_DIR and exit 0. `--fail-with N` exits N at once (exit codes).
"""

import argparse
import json
import os
import signal
import sys
import time

import tinyckpt

CONTRACT = (
    "TPU_PLATFORM_RUN_ID",
    "TPU_PLATFORM_DATA",
    "TPU_PLATFORM_CHECKPOINT_DIR",
    "TPU_PLATFORM_MODEL_DIR",
    "TPU_PLATFORM_STATUS_DIR",
    "TPU_PLATFORM_WORKER_ID",
    "TPU_PLATFORM_WORKER_COUNT",
    "TPU_PLATFORM_COORDINATOR",
    "TPU_PLATFORM_GRACE_SECONDS",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-with", type=int, default=-1)
    args = parser.parse_args()
    if args.fail_with >= 0:
        print(json.dumps({"message": f"exiting {args.fail_with} as asked"}), flush=True)
        return args.fail_with
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    env = {name: os.environ.get(name) for name in CONTRACT}
    print(
        json.dumps(
            {
                "message": "contract",
                "env": env,
                "extra": os.environ.get("TRAINER_EXTRA"),
                "python": sys.executable,
                "tinyckpt": tinyckpt.__file__,
            }
        ),
        flush=True,
    )
    checkpoints = tinyckpt.Store(os.environ["TPU_PLATFORM_CHECKPOINT_DIR"])
    state = checkpoints.latest()
    step, loss = state.get("step", 0), state.get("loss", 1.0)
    if step:
        print(json.dumps({"message": "resumed from checkpoint", "step": step}), flush=True)
    pause = float(os.environ.get("STEP_SECONDS", "0.1"))
    hold = int(os.environ.get("HOLD_AT_STEP", "0"))
    held = step < hold  # this session holds at step `hold`
    while step < args.steps:
        time.sleep(pause)
        step, loss = step + 1, loss * 0.9
        saving = time.monotonic()
        checkpoints.write(f"ckpt-{step:08d}.json", {"step": step, "loss": loss})
        saved = round(time.monotonic() - saving, 6)
        print(json.dumps({"message": "checkpoint saved", "step": step, "seconds": saved}), flush=True)
        print(json.dumps({"step": step, "loss": round(loss, 6)}), flush=True)
        while held and step == hold and not stopping:
            time.sleep(0.05)
        if stopping:
            print(json.dumps({"message": "SIGTERM: checkpoint committed, exiting 75", "step": step}), flush=True)
            return 75
    model_dir = os.environ.get("TPU_PLATFORM_MODEL_DIR", "")
    if model_dir:
        tinyckpt.Store(model_dir).write("model.json", {"steps": step, "loss": loss})
    return 0


if __name__ == "__main__":
    sys.exit(main())
