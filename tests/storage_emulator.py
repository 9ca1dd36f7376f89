"""gcp-storage-emulator as the sandbox runs it (tests/sandbox.py `storage_emulator`), with the generation
headers Cloud Storage sends on every object download and the emulator leaves out.

Cloud Storage answers a media download (JSON API `objects.get?alt=media`, and the XML API's GET) with
the object's `x-goog-generation` and `x-goog-metageneration` headers ("HTTP headers and common query
string parameters", https://cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration).
TensorStore, which writes and reads Orbax's arrays, takes a read's generation from that header, 0 when it
is absent (tensorstore/kvstore/gcs_http/object_metadata.cc, SetObjectMetadataFromHeaders), and refuses
a later read or write of the object conditioned on generation 0 ("Malformed StorageGeneration":
gcs_key_value_store.cc, IsValidStorageGeneration wants a generation above 0). Without the header, an
Orbax save failed now and then on one host of the two-host test, where TensorStore had read an OCDBT
manifest back and then wrote it conditionally (tests/test_startup_e2e.py); the other host waited for
it at Orbax's commit barrier, and on a stop was killed after the grace period, its checkpoint unwritten.

Run as a script, with the emulator's own command line: `python storage_emulator.py start --port N ...`.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, cast

from gcp_storage_emulator import __main__ as emulator
from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """The emulator's download, then the object's generation headers on a 200 or 206."""
    _download(request, response, storage, *args, **kwargs)
    if response.status not in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        return
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:  # deleted since: the body is the one read; its generation is unknown
        return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])


def install() -> None:
    """Serve downloads with `download`: on every route that names the emulator's own, and where
    `objects.get` hands an `alt=media` request on (it calls `objects.download` by name)."""
    objects.download = download
    for _, handlers in server.HANDLERS:
        routes = cast(dict[str, Any], handlers)  # its methods' handlers, of several signatures
        for method, handler in routes.items():
            if handler is _download:
                routes[method] = download


if __name__ == "__main__":
    install()
    emulator.main()  # serves until stopped, then exits
