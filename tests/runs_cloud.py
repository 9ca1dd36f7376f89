"""The cloud of a self-service stack on loopback, as `tpu-runs` and the agent see it: the GCS emulator
with the stack's buckets, the TPU API stand-in with its VMs, the Cloud Logging stand-in and a metadata
server; the environment points `tpu-runs` at them, as a researcher, from the test's folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import pytest
import requests

from tests.logging_api import LoggingState, logging_standin
from tests.sandbox import storage_emulator
from tests.tpu_api import TpuState, tpu_api_standin
from tools.standins.metadata import MetadataHost, metadata_server


class RunsCloud:
    def __init__(
        self, storage: str, tpu: TpuState, logging: str, logs: LoggingState, metadata: MetadataHost, tmp: Path
    ):
        self.storage = storage  # the emulator's base URL (STORAGE_EMULATOR_HOST)
        self.tpu = tpu
        self.logging = logging  # the Logging stand-in's base URL
        self.logs = logs
        self.metadata = metadata  # no stack run: the VMs' capacity is the researchers'
        self.tmp = tmp  # the test's folder, also the working directory

    def read(self, bucket: str, name: str) -> bytes | None:
        answer = requests.get(
            f"{self.storage}/storage/v1/b/{bucket}/o/{quote(name, safe='')}", params={"alt": "media"}, timeout=10
        )
        return answer.content if answer.status_code == 200 else None

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        answer = requests.get(f"{self.storage}/storage/v1/b/{bucket}/o", params={"prefix": prefix}, timeout=10)
        return sorted(item["name"] for item in answer.json().get("items", []))


Cloud = TypeVar("Cloud", bound=RunsCloud)


@contextlib.contextmanager
def runs_cloud(
    kind: type[Cloud],
    monkeypatch: pytest.MonkeyPatch,
    tmp: Path,
    *,
    project: str,
    buckets: Iterable[str],
    vms: Iterable[str],
    requester: str,
) -> Iterator[Cloud]:
    """A `kind` (RunsCloud or a test's subclass of it) over the emulator and stand-ins, with `buckets`
    created and the TPU VMs `vms` READY in us-central1-a."""
    with (
        storage_emulator() as storage,
        tpu_api_standin() as (tpu_url, tpu),
        logging_standin() as (logging_url, logs),
        metadata_server({}) as metadata,
    ):
        for bucket in buckets:
            requests.post(
                f"{storage}/storage/v1/b", params={"project": project}, json={"name": bucket}, timeout=10
            ).raise_for_status()
        for vm in vms:
            tpu.add({"name": f"projects/{project}/locations/us-central1-a/nodes/{vm}", "state": "READY"})
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage)
        monkeypatch.setenv("TPU_API_ENDPOINT", tpu_url)
        monkeypatch.setenv("LOGGING_API_ENDPOINT", logging_url)
        monkeypatch.setenv("TPU_RUNS_REQUESTER", requester)
        monkeypatch.chdir(tmp)
        yield kind(storage, tpu, logging_url, logs, metadata, tmp)
