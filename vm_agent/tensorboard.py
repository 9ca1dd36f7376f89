"""A TensorBoard event file of scalars (loss, steps/s, examples/s by step): TFRecord framing with Google's
CRC32C (google-crc32c) around `Event` messages protobuf encodes, both from the agent's own environment.

TensorBoard reads a folder of `events.out.tfevents.*` files. Each file is a sequence of TFRecords
(tensorflow/core/lib/io/record_writer.cc):

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

where masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32), crc32c being CRC-32C
(Castagnoli). Each record's data is one `Event` message (tensorflow/core/util/event.proto, summary.proto),
of which we write these fields, declared here by their numbers and encoded by protobuf:

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

They are declared with explicit presence (proto2 `optional`), as the originals' `oneof`s have it: a scalar of
0.0 is still a `simple_value` TensorBoard shows. The first event of a file carries
`file_version: "brain.Event:2"`.

Why not a TensorBoard writer library: tensorboardX, the smallest (protobuf, numpy, packaging), would grow the
agent's wheelhouse from 12.75 MiB to 60.14 MiB for its three Pythons (docs/performance.md), for three message
types; TensorFlow's or TensorBoard's own writer is larger still.

The run's model dir is a gs:// URI on a TPU VM: the file is written locally and uploaded whole to
`<model-dir>/tensorboard/<file name>` through the agent's Cloud Storage client (vm_agent/gcs.py Storage.write:
the workload account's `storage.objects.insert`/`delete` on its models prefix, infra/access/identities.py
WORKLOAD_METHODS) at most every UPLOAD_EVERY_S and when the run ends. A local model dir is written in place.
"""

from __future__ import annotations

import functools
import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vm_agent.gcs import StorageError, split_gs

if TYPE_CHECKING:
    from vm_agent.gcs import Storage

FILE_VERSION = "brain.Event:2"
# The REST method the upload calls, on the models bucket; reference/gcp-iam methods.json: it checks
# storage.objects.create, and storage.objects.delete when it overwrites (each re-upload does).
METHODS = ("storage.objects.insert",)
UPLOAD_EVERY_S = 30.0


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data` (the module docstring)."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


@functools.cache
def _event_class() -> Any:
    """The `Event` message class of the fields the module docstring lists, built by protobuf's message_factory
    from a descriptor declared here, in a pool of its own (proto2: explicit presence)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    schema = descriptor_pb2.FileDescriptorProto(name="tpu_platform/event.proto", package="tpu_platform.tb")
    messages = {
        "Value": (("tag", 1, field.TYPE_STRING, ""), ("simple_value", 2, field.TYPE_FLOAT, "")),
        "Summary": (("value", 1, field.TYPE_MESSAGE, ".tpu_platform.tb.Value"),),
        "Event": (
            ("wall_time", 1, field.TYPE_DOUBLE, ""),
            ("step", 2, field.TYPE_INT64, ""),
            ("file_version", 3, field.TYPE_STRING, ""),
            ("summary", 5, field.TYPE_MESSAGE, ".tpu_platform.tb.Summary"),
        ),
    }
    for name, fields in messages.items():
        message = schema.message_type.add(name=name)
        label = field.LABEL_REPEATED if name == "Summary" else field.LABEL_OPTIONAL
        for field_name, number, kind, type_name in fields:
            message.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name or None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tpu_platform.tb.Event"))


def event(
    wall_time: float, step: int = 0, *, file_version: str = "", scalars: Mapping[str, float] | None = None
) -> bytes:
    """The bytes of one Event message."""
    message = _event_class()(wall_time=wall_time)
    if step:
        message.step = step
    if file_version:
        message.file_version = file_version
    for tag, value in (scalars or {}).items():
        message.summary.value.add(tag=tag, simple_value=value)
    return message.SerializeToString()


class EventLog:
    """One event file in `directory` (local path or gs://), appended to as a run reports its steps."""

    def __init__(
        self,
        directory: str,
        host: str,
        *,
        storage: Callable[[], Storage] | None = None,
        warn: Callable[[str], None] = lambda message: None,
        clock: Callable[[], float] = time.time,
    ):
        """`storage`: the Cloud Storage client a gs:// `directory` is uploaded with (asked for at the first upload)."""
        self.directory = directory
        self.clock = clock
        self.name = f"events.out.tfevents.{int(clock()):010d}.{host}"
        self._storage = storage
        self._warn = warn
        self._remote = directory.startswith("gs://")
        if self._remote and storage is None:
            raise ValueError(f"{directory}: a gs:// folder needs a Cloud Storage client")
        folder = Path(tempfile.mkdtemp(prefix="tpu-platform-tb-")) if self._remote else Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / self.name
        self._uploaded_at = float("-inf")
        self._changed = False
        self._write(event(clock(), file_version=FILE_VERSION))

    def _write(self, data: bytes) -> None:
        with open(self.path, "ab") as file:
            file.write(record(data))
        self._changed = True

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._write(event(self.clock(), step, scalars=values))

    def sync(self, force: bool = False) -> None:
        """Upload the file to its gs:// folder when changed, at most every UPLOAD_EVERY_S unless forced."""
        if not self._remote or not self._changed:
            return
        now = time.monotonic()
        if not force and now - self._uploaded_at < UPLOAD_EVERY_S:
            return
        assert self._storage is not None
        try:
            bucket, name = split_gs(self.uri)
            self._storage().write(bucket, name, self.path.read_bytes(), content_type="application/octet-stream")
            self._uploaded_at, self._changed = now, False
        except (OSError, StorageError) as error:
            self._warn(f"TensorBoard event file upload to {self.uri} failed: {error} (retried later)")

    @property
    def uri(self) -> str:
        return f"{self.directory.rstrip('/')}/{self.name}"

    def close(self) -> None:
        self.sync(force=True)
