"""A real Cloud Storage emulator (gcp-storage-emulator, from PyPI) on loopback: what the tests' sandbox and
the benchmarks read and write objects through, as google-cloud-storage and the VM agent do when
STORAGE_EMULATOR_HOST names it.

It runs with two behaviours of Cloud Storage the emulator lacks: an upload's `ifGenerationMatch` precondition
(install_upload_preconditions), and the generation headers Cloud Storage sends on every object download.

Cloud Storage answers a media download (JSON API `objects.get?alt=media`, and the XML API's GET) with the
object's `x-goog-generation` and `x-goog-metageneration` headers ("HTTP headers and common query
string parameters", https://cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration).
TensorStore, which writes and reads Orbax's arrays, takes a read's generation from that header, 0 when it
is absent (tensorstore/kvstore/gcs_http/object_metadata.cc, SetObjectMetadataFromHeaders), and refuses
a later read or write of the object conditioned on generation 0 ("Malformed StorageGeneration":
gcs_key_value_store.cc, IsValidStorageGeneration wants a generation above 0). Without the header, an
Orbax save failed now and then on one host of the two-host test, where TensorStore had read an OCDBT
manifest back and then wrote it conditionally (tests/test_startup_e2e.py); the other host waited for
it at Orbax's commit barrier, and on a stop was killed after the grace period, its checkpoint unwritten.

`storage_emulator()` runs this file as a script, with the emulator's own command line
(`python storage.py start --port N ...`); the emulator's modules are imported only there.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any, cast

START_SECONDS = 30


@contextlib.contextmanager
def storage_emulator() -> Iterator[str]:
    """The emulator, in memory, on a free 127.0.0.1 port, with the generation headers; yields
    STORAGE_EMULATOR_HOST."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-I", __file__, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {START_SECONDS}s waiting for the storage emulator")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def install_generation_headers() -> None:
    """Serve downloads with the emulator's own download, then the object's generation headers on a 200 or
    206: on every route that names the emulator's download, and where `objects.get` hands an `alt=media`
    request on (it calls `objects.download` by name)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    emulators_download = objects.download

    def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        emulators_download(request, response, storage, *args, **kwargs)
        if response.status not in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            return
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except NotFound:  # deleted since: the body is the one read; its generation is unknown
            return
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])

    objects.download = download
    for _, handlers in server.HANDLERS:
        routes = cast(dict[str, Any], handlers)  # its methods' handlers, of several signatures
        for method, handler in routes.items():
            if handler is emulators_download:
                routes[method] = download


def install_upload_preconditions() -> None:
    """Refuse an upload whose `ifGenerationMatch` does not hold, with 412 as Cloud Storage does ("0": no live
    object of that name; https://cloud.google.com/storage/docs/request-preconditions). The emulator ignores
    the parameter and overwrites, so a create-only write (vm_agent/gcs.py `Storage.create`) would always
    seem to win."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    emulators_insert = objects.insert

    def insert(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
        wanted = request.query.get("ifGenerationMatch", [None])[0]
        name = request.query.get("name", [None])[0]
        if name is None and isinstance(request.data, dict):  # a multipart upload names it in its metadata
            name = (request.data.get("meta") or {}).get("name")
        if wanted is not None and name is not None:
            try:
                generation = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
            except NotFound:
                generation = "0"
            if generation != wanted:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(
                    {
                        "error": {
                            "code": 412,
                            "message": "At least one of the pre-conditions you specified did not hold.",
                        }
                    }
                )
                return
        emulators_insert(request, response, storage, *args, **kwargs)

    objects.insert = insert
    for _, handlers in server.HANDLERS:
        routes = cast(dict[str, Any], handlers)
        for method, handler in routes.items():
            if handler is emulators_insert:
                routes[method] = insert


if __name__ == "__main__":
    from gcp_storage_emulator import __main__ as emulator

    install_generation_headers()
    install_upload_preconditions()
    emulator.main()  # serves until stopped, then exits
