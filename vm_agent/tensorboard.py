"""A TensorBoard event file of scalars (loss, steps/s, examples/s by step), written with the stdlib.

TensorBoard reads a folder of `events.out.tfevents.*` files. Each file is a sequence of TFRecords
(tensorflow/core/lib/io/record_writer.cc):

    uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

where masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32), crc32c being CRC-32C
(Castagnoli). Each record's data is one `Event` protobuf (tensorflow/core/util/event.proto):

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

The first event of a file carries `file_version: "brain.Event:2"`. We write only these fields, by hand
(field key = field_number << 3 | wire_type; wire types 0 varint, 1 fixed64, 2 length-delimited,
5 fixed32), which TensorBoard's own reader reads back.

The run's model dir is a gs:// URI on a TPU VM: the file is written locally and uploaded whole to
`<model-dir>/tensorboard/<file name>` through the agent's Cloud Storage client (vm_agent/gcs.py Storage.write:
the workload account's `storage.objects.insert`/`delete` on its models prefix, infra/access/identities.py
WORKLOAD_METHODS) at most every UPLOAD_EVERY_S and when the run ends. A local model dir is written in place.
"""

from __future__ import annotations

import struct
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from vm_agent.gcs import StorageError, split_gs

if TYPE_CHECKING:
    from vm_agent.gcs import Storage

FILE_VERSION = "brain.Event:2"
# The REST method the upload calls, on the models bucket; reference/gcp-iam methods.json: it checks
# storage.objects.create, and storage.objects.delete when it overwrites (each re-upload does).
METHODS = ("storage.objects.insert",)
UPLOAD_EVERY_S = 30.0


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 as protobuf writes it: two's complement, ten bytes when negative
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event(
    wall_time: float, step: int = 0, *, file_version: str = "", scalars: Mapping[str, float] | None = None
) -> bytes:
    """The bytes of one Event message."""
    out = _varint(1 << 3 | 1) + struct.pack("<d", wall_time)
    if step:
        out += _varint(2 << 3 | 0) + _varint(step)
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, summary)
    return out


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
