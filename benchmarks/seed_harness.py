"""Run the seed's `tpu_mnist.py` (benchmarks/seed_tpu_mnist.py) unchanged, offline, on given data.

Usage: seed_harness.py DATA.npz EPOCHS. Three things differ from running the file on a VM, each the
least that makes it run here: `cloud_tpu_client` (imported by the script, never used, not installed)
is an empty module; `tf.keras.datasets.mnist.load_data` (a download) returns DATA.npz, the same
generated examples the workloads get; `Model.fit` is called with EPOCHS instead of the script's 5.
Keras' progress bar is kept (verbose=1, as the seed runs it).
"""

# pyright: reportMissingModuleSource=false
# (runs in .venv-workloads, which pyright does not see; TensorFlow resolves to stubs only)
from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path

import numpy as np
import tensorflow as tf

data_path, epochs = sys.argv[1], int(sys.argv[2])
sys.modules["cloud_tpu_client"] = types.SimpleNamespace(Client=None)  # type: ignore[assignment]


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    with np.load(data_path) as d:
        return (d["x_train"], d["y_train"]), (d["x_test"], d["y_test"])


tf.keras.datasets.mnist.load_data = load_data
fit = tf.keras.Model.fit
tf.keras.Model.fit = lambda self, *a, **kw: fit(self, *a, **{**kw, "epochs": epochs})  # type: ignore[method-assign]
runpy.run_path(str(Path(__file__).with_name("seed_tpu_mnist.py")), run_name="__main__")
