"""How long deterministic packaging (infra/packaging.py) takes and how big the archives are.

Prints figures, asserts nothing. Not named packaging.py: a script's folder comes first on sys.path, and
that name would hide the `packaging` distribution from the other benchmarks.

python benchmarks/source_archives.py [--folder workloads] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.packaging import package  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", action="append", default=[], help="repository folder (repeatable)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for folder in args.folder or ["workloads"]:
        path = ROOT / folder
        times = []
        archive = package(path, within=ROOT)  # as the program packs a folder; warms the file cache, not timed
        for _ in range(args.repeat):
            start = time.perf_counter()
            archive = package(path, within=ROOT)
            times.append(time.perf_counter() - start)
        raw = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        print(
            f"{folder}: {archive.files} files, {raw / 1024:.1f} KiB -> {len(archive.data) / 1024:.1f} KiB tar.gz, "
            f"median {statistics.median(times) * 1000:.1f} ms over {args.repeat} runs, sha256 {archive.sha256[:12]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
