"""The VM agent's own environment, measured: the wheelhouse's size, a first boot's install from it and a
later boot's check of it (vm_agent/environment.py, as the start-up script runs it), and the agent's start
with google-cloud-storage from that environment: process start to the first object read, and process start
to ready (`python -m vm_agent` with a sandbox's settings, until it logs the storage library it reads objects
through: its settings read, its runs' isolation checked, its client made), on the sandbox's storage
emulator and metadata server.

Prints figures, asserts nothing. Every process is started afresh, with the image's Python (/usr/bin/python3
here) or the environment's, as the start-up script and the agent's unit start them.

python benchmarks/agent_environment.py [--wheelhouse build/agent-wheelhouse/<sha256>.tar.gz] [--repeat 5]
    [--python /usr/bin/python3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.packaging import agent_wheelhouse  # noqa: E402
from tools.standins.metadata import metadata_server  # noqa: E402
from tools.standins.storage import storage_emulator  # noqa: E402

IMAGE_PYTHON = "/usr/bin/python3"
BUCKET, OBJECT = "bench-status", "trainer-1/status.json"
# Process start to the first object's bytes, as the agent reads one on an emulator.
FIRST_READ = f"from vm_agent.gcs import Storage; Storage().read({BUCKET!r}, {OBJECT!r})"
READY = "objects through google-cloud-storage"


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    """Median wall seconds of `argv` run `repeat` times (one run first, untimed: the file cache)."""
    subprocess.run(argv, env=env, check=True, capture_output=True)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def until_ready(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds from starting the agent to its READY line; the agent is then stopped."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    try:
        for line in process.stdout:
            if READY in line:
                return time.perf_counter() - start
        raise RuntimeError(f"the agent exited {process.wait()} before it was ready")
    finally:
        process.terminate()
        process.wait(30)


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--wheelhouse", type=Path, help="the built archive (default: the pinned one, make agent-wheelhouse)"
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--python", default=IMAGE_PYTHON, help="the image's Python, with pip (default %(default)s)")
    args = parser.parse_args()
    wheelhouse = args.wheelhouse or agent_wheelhouse().built
    assert wheelhouse is not None
    sha256 = hashlib.sha256(wheelhouse.read_bytes()).hexdigest()
    print(f"wheelhouse archive: {wheelhouse.stat().st_size / 2**20:.2f} MiB ({sha256[:12]}...)")
    with tempfile.TemporaryDirectory() as scratch:
        env = Path(scratch) / "agent-env" / sha256
        ensure = [args.python, "-m", "vm_agent.environment", str(wheelhouse), str(env), sha256]
        installs, checks = [], []
        for _ in range(max(1, args.repeat // 2)):
            shutil.rmtree(env, ignore_errors=True)
            start = time.perf_counter()
            subprocess.run(ensure, check=True, capture_output=True, cwd=ROOT)
            installs.append(time.perf_counter() - start)
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run(ensure, check=True, capture_output=True, cwd=ROOT)
            checks.append(time.perf_counter() - start)
        print(
            f"first boot, the environment installed (venv, pip --no-index --require-hashes, its check): median "
            f"{statistics.median(installs):.2f} s over {len(installs)}; {folder_size(env) / 2**20:.1f} MiB installed"
        )
        print(f"later boot, the environment checked file by file: median {statistics.median(checks):.2f} s")
        python = str(env / "bin" / "python")
        with storage_emulator() as host, metadata_server({}) as metadata:
            from google.cloud import storage

            os.environ["STORAGE_EMULATOR_HOST"] = host
            client = storage.Client()
            client.create_bucket(BUCKET).blob(OBJECT).upload_from_string(b'{"state": "running"}')
            base = {"PATH": os.environ["PATH"], "STORAGE_EMULATOR_HOST": host, "HOME": scratch}
            agent_env = {**base, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
            bare = timed([args.python, "-c", "pass"], base, args.repeat)
            first_read = timed([python, "-c", FIRST_READ], agent_env, args.repeat)
            settings = {
                "TPU_PLATFORM_STACK": "bench",
                "TPU_PLATFORM_VM": "trainer-1",
                "TPU_PLATFORM_STATUS_DIR": f"gs://{BUCKET}/trainer-1",
                "TPU_PLATFORM_ROOT": str(Path(scratch) / "root"),
                "GCE_METADATA_HOST": metadata,
                "TPU_PLATFORM_METADATA_REDIRECT": "0",
                "TPU_PLATFORM_PYTHON": args.python,
            }
            ready = [
                until_ready([python, "-u", "-m", "vm_agent"], {**agent_env, **settings}) for _ in range(args.repeat)
            ]
        print(f"python3 -c pass: {bare * 1000:.0f} ms (the interpreter alone)")
        print(f"agent process start to its first object read (google-cloud-storage): {first_read * 1000:.0f} ms")
        print(f"agent start to ready (python -m vm_agent): median {statistics.median(ready) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
