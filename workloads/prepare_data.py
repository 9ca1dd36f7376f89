#!/usr/bin/env python3
"""Turn MNIST (an .npz in Keras' layout, or the four IDX files) into shards in the data bucket.

Writes `train-00000-of-000NN.npz` … and `test-…` shards (uint8 images `x`, labels `y`) under the
destination, a local folder or gs:// URL, uploading shards in parallel, and prints the throughput.
The workloads read such a folder with parallel shard reads, a local cache and prefetching.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import struct
import sys
import time
from pathlib import Path

import numpy as np
import runlib

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (optionally .gz): a magic number, the dimensions, then uint8 data."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_source(source: str) -> dict[str, np.ndarray]:
    path = Path(source)
    if path.is_dir():
        out = {}
        for key, stem in IDX_FILES.items():
            found = [p for p in (path / stem, path / f"{stem}.gz") if p.exists()]
            if not found:
                raise FileNotFoundError(f"{path} lacks {stem}(.gz)")
            out[key] = read_idx(found[0])
        return out
    return runlib.unpack(path.read_bytes())


def shard(x: np.ndarray, y: np.ndarray, split: str, count: int) -> dict[str, bytes]:
    width = max(5, len(str(count)))
    return {
        f"{split}-{i:0{width}d}-of-{count:0{width}d}.npz": runlib.pack({"x": xs, "y": ys})
        for i, (xs, ys) in enumerate(zip(np.array_split(x, count), np.array_split(y, count), strict=True))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("source", help="an MNIST .npz or a folder with the four IDX files")
    parser.add_argument("destination", help="local folder or gs://bucket/prefix")
    parser.add_argument("--train-shards", type=int, default=8)
    parser.add_argument("--test-shards", type=int, default=2)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    arrays = load_source(args.source)
    files = {
        **shard(arrays["x_train"], arrays["y_train"], "train", args.train_shards),
        **shard(arrays["x_test"], arrays["y_test"], "test", args.test_shards),
    }
    store = runlib.Store(args.destination)
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(lambda item: store.write(*item), files.items()))
    seconds = time.perf_counter() - started
    examples = len(arrays["y_train"]) + len(arrays["y_test"])
    size = sum(len(b) for b in files.values())
    print(
        json.dumps(
            {
                "shards": len(files),
                "examples": examples,
                "megabytes": round(size / 1e6, 2),
                "seconds": round(seconds, 3),
                "examples_per_second": round(examples / seconds),
                "megabytes_per_second": round(size / 1e6 / seconds, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
