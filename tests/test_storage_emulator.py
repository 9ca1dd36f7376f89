"""The sandbox's storage emulator (tools/standins/storage.py): a download carries the object's generation,
as Cloud Storage's does, and TensorStore (Orbax's array store) can read an object twice."""

from __future__ import annotations

import subprocess
import urllib.parse

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.workloads import workloads_python
from tools.standins.storage import storage_emulator


def test_a_download_carries_the_objects_generation_on_every_route():
    with storage_emulator() as host:
        client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": host})
        name = "a/b.json"
        blob = client.create_bucket("sandbox-bucket").blob(name)
        blob.upload_from_string(b"{}")
        name = urllib.parse.quote(name, safe="")
        for url in (
            f"{host}/storage/v1/b/sandbox-bucket/o/{name}?alt=media",  # JSON API (objects.get)
            f"{host}/download/storage/v1/b/sandbox-bucket/o/{name}?alt=media",  # the client libraries' route
        ):
            for headers in ({}, {"Range": "bytes=0-0"}):
                got = requests.get(url, headers=headers, timeout=10)
                assert got.ok, (url, got.status_code)
                assert got.headers["x-goog-generation"] == str(blob.generation), url
                assert got.headers["x-goog-metageneration"] == str(blob.metageneration), url
        assert requests.get(f"{host}/storage/v1/b/sandbox-bucket/o/none?alt=media", timeout=10).status_code == 404


# A read, then a read and a write conditioned on the generation it returned: what TensorStore does to an
# OCDBT manifest it has read back during one of Orbax's saves (revalidate it; replace it if unchanged).
READ_THEN_CONDITIONS = """
import os, sys
import tensorstore as ts
os.environ["TENSORSTORE_GCS_HTTP_URL"] = sys.argv[1]
store = ts.KvStore.open({"driver": "gcs", "bucket": "sandbox-bucket"}).result()
store.write("manifest.ocdbt", b"m").result()
first = store.read("manifest.ocdbt").result()
again = store.read("manifest.ocdbt", if_not_equal=first.stamp.generation).result()
store.write("manifest.ocdbt", b"n", if_equal=first.stamp.generation).result()
print(first.state, again.state, store.read("manifest.ocdbt").result().value.decode())
"""


@pytest.mark.slow
@pytest.mark.workloads
def test_tensorstore_reads_and_writes_an_object_by_the_generation_it_read():
    with storage_emulator() as host:
        client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": host})
        client.create_bucket("sandbox-bucket")
        env = {"GCE_METADATA_HOST": "127.0.0.1:9", "GOOGLE_CLOUD_PROJECT": "p", "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [workloads_python(), "-c", READ_THEN_CONDITIONS, host], capture_output=True, text=True, timeout=120, env=env
        )
    assert done.returncode == 0, done.stderr[-2000:]  # before: "Malformed StorageGeneration"
    # The emulator ignores conditions: Cloud Storage would answer the second read 304 (unspecified).
    assert done.stdout.split() == ["value", "value", "n"]


def test_an_upload_whose_generation_precondition_fails_is_refused_with_412():
    """As Cloud Storage does (request-preconditions): ifGenerationMatch=0 writes only a new object, and a
    generation that is not the live one's is refused; the emulator alone would overwrite."""
    from google.api_core.exceptions import PreconditionFailed

    with storage_emulator() as host:
        client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": host})
        bucket = client.create_bucket("b")
        bucket.blob("claim").upload_from_string(b"first", if_generation_match=0)
        with pytest.raises(PreconditionFailed):
            bucket.blob("claim").upload_from_string(b"second", if_generation_match=0)
        live = bucket.get_blob("claim")
        assert live is not None and live.generation is not None and live.download_as_bytes() == b"first"
        with pytest.raises(PreconditionFailed):
            bucket.blob("claim").upload_from_string(b"third", if_generation_match=live.generation + 1)
        bucket.blob("claim").upload_from_string(b"fourth", if_generation_match=live.generation)
        assert bucket.blob("claim").download_as_bytes() == b"fourth"
