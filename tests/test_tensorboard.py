"""The TensorBoard event file (vm_agent/tensorboard.py): its framing and its Event messages byte for byte as
TensorFlow's own writer and protobuf messages make them, its records read back by TensorFlow's own reader (the
workloads' environment), and its upload to a gs:// model dir (the real GCS emulator)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import google_crc32c
import pytest
from google.cloud import storage

from tests.sandbox import storage_emulator
from tests.test_requests import checking_proxy
from tests.test_telemetry import RunSpec, env_for
from tests.workloads import workloads_python
from tools.standins.metadata import SANDBOX_TOKEN, metadata_server, sandbox_credentials
from tools.standins.telemetry import google_apis
from vm_agent.telemetry import Telemetry, tensorboard_dir
from vm_agent.tensorboard import FILE_VERSION, METHODS, EventLog, event, masked_crc32c, record


def test_a_record_is_length_crc_data_crc_with_googles_crc32c():
    framed = record(b"abc")
    assert framed[:8] == (3).to_bytes(8, "little")
    assert framed[8:12] == masked_crc32c(framed[:8]).to_bytes(4, "little")
    assert framed[12:15] == b"abc"
    assert framed[15:] == masked_crc32c(b"abc").to_bytes(4, "little")
    crc = google_crc32c.value(b"123456789")
    assert crc == 0xE3069283  # CRC-32C check value (RFC 3720, B.4 / the Castagnoli catalogue)
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_worker_0_writes_next_to_the_model_and_others_below_it():
    assert tensorboard_dir("gs://b/mnist/model/", "0") == "gs://b/mnist/model/tensorboard"
    assert tensorboard_dir("gs://b/mnist/model", "3") == "gs://b/mnist/model/tensorboard/worker-3"


READ_BACK = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    out = []
    for event in tf.compat.v1.train.summary_iterator(sys.argv[1]):  # checks both CRCs of every record
        out.append({"step": event.step, "wall_time": event.wall_time, "file_version": event.file_version,
                    "values": {v.tag: v.simple_value for v in event.summary.value},
                    "scalars": [v.WhichOneof("value") for v in event.summary.value]})
    print(json.dumps(out))
    """
)
# TensorFlow's own record writer and Event message, for the same record and event as ours.
TF_WROTE = textwrap.dedent(
    """
    import sys
    import tensorflow as tf
    with tf.io.TFRecordWriter(sys.argv[1]) as writer:
        writer.write(b"an event's bytes")
    value = tf.compat.v1.Summary.Value(tag="loss", simple_value=0.0)
    message = tf.compat.v1.Event(wall_time=1.5, step=2**40, summary=tf.compat.v1.Summary(value=[value]))
    print(message.SerializeToString().hex())
    print(tf.compat.v1.Event(wall_time=1.5, file_version="brain.Event:2").SerializeToString().hex())
    """
)


@pytest.mark.slow
@pytest.mark.workloads
def test_records_and_events_are_byte_for_byte_tensorflows(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    path = tmp_path / "tf.tfrecord"
    done = subprocess.run(
        [workloads_python(), "-c", TF_WROTE, str(path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    scalar, first = done.stdout.strip().splitlines()[-2:]
    assert path.read_bytes() == record(b"an event's bytes")
    assert event(1.5, 2**40, scalars={"loss": 0.0}).hex() == scalar  # a 0.0 is still a scalar
    assert event(1.5, file_version=FILE_VERSION).hex() == first


@pytest.mark.slow
@pytest.mark.workloads
def test_tensorflow_reads_the_event_file_back(tmp_path):
    clock = iter(float(t) for t in range(1_800_000_000, 1_800_000_100))
    log = EventLog(str(tmp_path / "tensorboard"), "mnist-dev-w0", clock=lambda: next(clock))
    log.scalars(10, {"loss": 2.5, "steps_per_s": 4.0, "examples_per_s": 512.0})
    log.scalars(20, {"loss": 1.25})
    log.scalars(2**40, {"loss": 0.5})  # a step past 32 bits: a multi-byte varint
    log.scalars(30, {"loss": 0.0})  # a scalar of 0.0: present all the same
    log.close()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [workloads_python(), "-c", READ_BACK, str(log.path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = json.loads(done.stdout.strip().splitlines()[-1])
    assert events[0]["file_version"] == FILE_VERSION
    assert [(e["step"], e["values"]) for e in events[1:]] == [
        (10, {"loss": 2.5, "steps_per_s": 4.0, "examples_per_s": 512.0}),
        (20, {"loss": 1.25}),
        (2**40, {"loss": 0.5}),
        (30, {"loss": 0.0}),
    ]
    assert events[-1]["scalars"] == ["simple_value"]
    assert [e["wall_time"] for e in events] == [1_800_000_000 + i for i in range(1, 6)]
    assert log.path.name.startswith("events.out.tfevents.1800000000.mnist-dev-w0")  # what TensorBoard looks for

    # A corrupted byte is caught by TensorFlow's reader: the CRCs are really checked.
    data = bytearray(log.path.read_bytes())
    data[-6] ^= 0xFF
    log.path.write_bytes(bytes(data))
    broken = subprocess.run(
        [workloads_python(), "-c", READ_BACK, str(log.path)], capture_output=True, text=True, timeout=300, env=env
    )
    assert broken.returncode != 0
    assert "corrupt" in broken.stderr.lower() or "checksum" in broken.stderr.lower()


@pytest.mark.slow
def test_a_runs_scalars_reach_its_gs_model_dir(monkeypatch):
    """Through the agent's Cloud Storage client, whose every call is checked against storage.v1 and the methods
    the workload account is granted (a call the library makes on its own, such as a bucket lookup, included)."""
    with (
        storage_emulator() as host,
        checking_proxy(host) as (checked, seen),
        google_apis() as (api_url, received),
        metadata_server() as metadata,
    ):
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        client = storage.Client()
        client.create_bucket("acme-ml-sandbox-dev-models")
        env = {**env_for(api_url, metadata), "TPU_PLATFORM_WORKER_ID": "0", "STORAGE_EMULATOR_HOST": checked}
        shipper = Telemetry(env, flush_every_s=3600, credentials=sandbox_credentials())
        run = RunSpec("exp-42", model_dir="gs://acme-ml-sandbox-dev-models/mnist/exp-42/model")
        for step in (1, 2, 3):
            shipper.ship(json.dumps({"message": "training", "step": step, "loss": 1.0 / step}), run)
        shipper.close(10)

        (blob,) = client.list_blobs("acme-ml-sandbox-dev-models", prefix="mnist/exp-42/model/tensorboard/")
        (log,) = shipper._event_logs.values()  # the local file that was uploaded
        assert blob.name == f"mnist/exp-42/model/tensorboard/{log.name}"
        assert blob.download_as_bytes() == log.path.read_bytes()
        assert log.path.read_bytes().count(b"loss") == 3
        assert set(seen.methods) == set(METHODS) and not seen.violations
        assert seen.authorization == {f"Bearer {SANDBOX_TOKEN}"}
        assert not received.violations
