"""The VM agent's own environment, measured: the wheelhouse's size, the boot's install from it, and what
google-cloud-storage costs the agent against its hand-written client (vm_agent/gcs.py) from process start
to the first object read, on the sandbox's storage emulator.

Prints figures, asserts nothing. Every process is started afresh, with the image's Python (/usr/bin/python3
here), as the agent's unit starts it.

python benchmarks/agent_environment.py [--wheelhouse build/agent-wheelhouse/<sha256>.tar.gz] [--repeat 5]
    [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.agent_wheelhouse import build  # noqa: E402
from tools.standins.storage import storage_emulator  # noqa: E402

IMAGE_PYTHON = "/usr/bin/python3"
BUCKET, OBJECT = "bench-status", "trainer-1/status.json"
# Process start to the first object's bytes, each client as the agent would use it on an emulator.
HAND_WRITTEN = f"from vm_agent.gcs import Storage; Storage().read({BUCKET!r}, {OBJECT!r})"
LIBRARY = f"from google.cloud import storage; storage.Client().bucket({BUCKET!r}).blob({OBJECT!r}).download_as_bytes()"


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    """Median wall seconds of `argv` run `repeat` times (one run first, untimed: the file cache)."""
    subprocess.run(argv, env=env, check=True, capture_output=True)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheelhouse", type=Path, help="a built archive (default: build it from the lock)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=IMAGE_PYTHON, help="the image's Python, with pip (default %(default)s)")
    args = parser.parse_args()
    python = args.python
    if args.wheelhouse is None:
        house, args.wheelhouse = build()
        print(f"wheelhouse: {len(house.wheels)} wheels for Pythons 3.10-3.12")
    print(f"wheelhouse archive: {args.wheelhouse.stat().st_size / 2**20:.2f} MiB ({args.wheelhouse.name[:12]}...)")
    with tempfile.TemporaryDirectory() as scratch:
        unpacked = Path(scratch) / "wheelhouse"
        start = time.perf_counter()
        with tarfile.open(args.wheelhouse) as tar:
            tar.extractall(unpacked)  # our own archive, just built
        unpack = time.perf_counter() - start
        lock = unpacked / "requirements.lock"
        version = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        ).stdout.strip()
        installs = []
        for attempt in range(max(1, args.repeat // 2)):
            target = Path(scratch) / f"env-{attempt}"
            argv = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index"]
            argv += ["--find-links", str(unpacked / "wheels"), "--require-hashes", "--no-deps", "--target", str(target)]
            start = time.perf_counter()
            subprocess.run([*argv, "-r", str(lock)], check=True, capture_output=True)
            installs.append(time.perf_counter() - start)
        env_folder = Path(scratch) / "env-0"
        print(
            f"boot install (Python {version}, pip --no-index --require-hashes --target): unpack {unpack:.2f} s, "
            f"install median {statistics.median(installs):.2f} s over {len(installs)}; "
            f"installed {folder_size(env_folder) / 2**20:.1f} MiB"
        )
        with storage_emulator() as host:
            from google.cloud import storage

            os.environ["STORAGE_EMULATOR_HOST"] = host
            client = storage.Client()
            client.create_bucket(BUCKET).blob(OBJECT).upload_from_string(b'{"state": "running"}')
            base = {"PATH": os.environ["PATH"], "STORAGE_EMULATOR_HOST": host, "HOME": scratch}
            bare = timed([python, "-c", "pass"], base, args.repeat)
            hand = timed([python, "-c", HAND_WRITTEN], {**base, "PYTHONPATH": str(ROOT)}, args.repeat)
            library = timed([python, "-c", LIBRARY], {**base, "PYTHONPATH": str(env_folder)}, args.repeat)
            imports = timed(
                [python, "-c", "import google.cloud.storage"], {**base, "PYTHONPATH": str(env_folder)}, args.repeat
            )
            agent = timed([python, "-c", "import vm_agent.agent"], {**base, "PYTHONPATH": str(ROOT)}, args.repeat)
        print(f"python3 -c pass: {bare * 1000:.0f} ms (the interpreter alone)")
        print(f"import vm_agent.agent (the whole stdlib agent): {agent * 1000:.0f} ms")
        print(f"start to first object read, hand-written vm_agent/gcs.py: {hand * 1000:.0f} ms")
        print(f"start to first object read, google-cloud-storage: {library * 1000:.0f} ms")
        print(f"import google.cloud.storage alone: {imports * 1000:.0f} ms")
        print(f"difference (library - hand-written), per agent start: {(library - hand) * 1000:+.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
