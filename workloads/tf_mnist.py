#!/usr/bin/env python3
"""MNIST on a Cloud TPU with TensorFlow (the seed guide's `tpu_mnist.py`, S8), runnable anywhere.

Uses TPUStrategy when the VM has a TPU, the default strategy on CPU/GPU. The model, optimizer, loss,
batch size and epochs are the guide's. Data comes from `--data` (a local path or gs:// URL of an
`.npz` with x_train, y_train, x_test, y_test, the layout of Keras' mnist.npz), or from Keras' MNIST
download on a VM with internet access. Prints the device, wall time and final validation accuracy,
and a last JSON line with the same figures for machines.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

SHUFFLE_BUFFER = 10_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="", help="path or gs:// URL of an MNIST .npz (default: download)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--checkpoint-dir", default="", help="where to back up training state (resumes from it)")
    parser.add_argument("--model-dir", default="", help="where to save the trained model (optional)")
    parser.add_argument("--tpu", choices=("auto", "local", "none"), default="auto", help="use a TPU: auto-detect")
    return parser.parse_args(argv)


def tpu_present() -> bool:
    """TPU VMs expose their chips as /dev/accel* (v2-v4) or VFIO devices (v5e and later)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")) or "TPU_NAME" in os.environ


def make_strategy(mode: str) -> tuple[tf.distribute.Strategy, str]:
    if mode == "local" or (mode == "auto" and tpu_present()):
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver), "TPU"
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    return tf.distribute.get_strategy(), device


def load_mnist(location: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    if not location:
        return tf.keras.datasets.mnist.load_data()
    with tf.io.gfile.GFile(location, "rb") as f:  # gs:// works through TensorFlow's GCS filesystem
        arrays = np.load(io.BytesIO(f.read()))
        return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def datasets(data: str, batch_size: int) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    (x_train, y_train), (x_test, y_test) = load_mnist(data)

    def prepare(x: np.ndarray) -> np.ndarray:
        return (x.astype("float32") / 255.0)[..., np.newaxis]  # [0, 1], with a channel axis

    train = (
        tf.data.Dataset.from_tensor_slices((prepare(x_train), y_train.astype("int64")))
        .shuffle(SHUFFLE_BUFFER, seed=0)
        # TPUs need static shapes: every batch full.
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    test = (
        tf.data.Dataset.from_tensor_slices((prepare(x_test), y_test.astype("int64")))
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, test


def build_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    strategy, device = make_strategy(args.tpu)
    print(f"Running on {device} with {strategy.num_replicas_in_sync} replica(s)", flush=True)
    train, test = datasets(args.data, args.batch_size)
    with strategy.scope():
        model = build_model()
    callbacks = [tf.keras.callbacks.BackupAndRestore(args.checkpoint_dir)] if args.checkpoint_dir else []

    started = time.perf_counter()
    history = model.fit(train, epochs=args.epochs, validation_data=test, callbacks=callbacks, verbose=2)
    wall = time.perf_counter() - started
    accuracy = float(history.history["val_accuracy"][-1])
    print(f"Training took {wall:.1f} s on {device}; final validation accuracy {accuracy:.4f}", flush=True)
    if args.model_dir:
        tf.io.gfile.makedirs(args.model_dir)
        path = args.model_dir.rstrip("/") + "/mnist.keras"
        model.save(path)
        print(f"Saved the model to {path}", flush=True)
    print(json.dumps({"device": device, "wall_seconds": round(wall, 3), "val_accuracy": round(accuracy, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
