"""jax_mnist run for real on the CPU: it trains, and its export loads and predicts without the program."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.workloads import WORKLOADS, run_workload, workloads_python

pytestmark = pytest.mark.slow

LOAD_AND_PREDICT = """
import json, sys
import numpy as np
from jax import export
sys.path.insert(0, {workloads!r})
import runlib
data = runlib.unpack(open({sample!r}, "rb").read())
predictor = export.deserialize(bytearray(open({blob!r}, "rb").read()))
logits = np.asarray(predictor.call(data["x_test"]))
print(json.dumps({{"shape": list(logits.shape), "accuracy": float(np.mean(logits.argmax(1) == data["y_test"]))}}))
"""


def test_trains_and_exports_a_model_that_predicts_on_the_cpu(tmp_path):
    sample = tmp_path / "mnist.npz"
    made = run_workload("sample_mnist.py", str(sample), "--train", "1024", "--test", "256", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    done = run_workload("jax_mnist.py", "--data", str(sample), "--epochs", "2", "--batch-size", "128",
                        "--model-dir", str(tmp_path / "models"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["val_accuracy"] > 0.8  # the data is learnable; chance is 10%
    # A fresh process with no jax_mnist code: only the exported file and the raw uint8 test images.
    script = LOAD_AND_PREDICT.format(workloads=str(WORKLOADS), sample=str(sample),
                                     blob=str(tmp_path / "models" / "mnist.jax_export"))  # fmt: skip
    loaded = subprocess.run([workloads_python(), "-c", script], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    predicted = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert predicted["shape"] == [256, 10]
    assert predicted["accuracy"] == pytest.approx(summary["val_accuracy"], abs=1e-3)  # the model it reported on
