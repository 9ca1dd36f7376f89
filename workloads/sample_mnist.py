#!/usr/bin/env python3
"""Write a small MNIST-shaped `.npz` (x_train, y_train, x_test, y_test; 28x28 uint8, labels 0-9).

For tests and offline demos where the real MNIST cannot be downloaded. Each class draws a stroke
in its own place plus noise, so a model that learns reaches high accuracy and one that does not
stays near 10%: a run's accuracy means something.
"""

from __future__ import annotations

import argparse

import numpy as np


def make(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count)
    images = rng.integers(0, 60, size=(count, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        row, col = divmod(int(label), 5)
        top, left = 3 + row * 12, 1 + col * 5
        images[i, top : top + 10, left : left + 4] = 255  # the class's stroke
    return images, labels.astype(np.uint8)


def write(path: str, train: int = 2048, test: int = 512, seed: int = 0) -> None:
    x_train, y_train = make(train, seed)
    x_test, y_test = make(test, seed + 1)
    np.savez_compressed(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--train", type=int, default=2048)
    parser.add_argument("--test", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.path, args.train, args.test, args.seed)


if __name__ == "__main__":
    main()
