"""A tiny checkpoint store for the agent's tests: JSON objects in a gs:// folder (Cloud Storage JSON
API with urllib; STORAGE_EMULATOR_HOST honoured, else a token from the metadata server) or a local one.
Shipped to the test folder source as a wheel: the folder's own requirement."""

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path

__version__ = "0.1"


def _api() -> tuple:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator:
        return (emulator if "://" in emulator else "http://" + emulator), {}
    metadata = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    request = urllib.request.Request(
        f"http://{metadata}/computeMetadata/v1/instance/service-accounts/default/token",
        headers={"Metadata-Flavor": "Google"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        token = json.loads(response.read())["access_token"]
    return "https://storage.googleapis.com", {"Authorization": "Bearer " + token}


class Store:
    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _split(self, name: str) -> tuple:
        bucket, _, prefix = self.url[len("gs://") :].partition("/")
        return bucket, f"{prefix}/{name}" if prefix else name

    def names(self) -> list:
        if not self.url.startswith("gs://"):
            root = Path(self.url)
            return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        base, headers = _api()
        bucket, prefix = self._split("")
        query = urllib.parse.urlencode({"prefix": prefix})
        request = urllib.request.Request(f"{base}/storage/v1/b/{bucket}/o?{query}", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            items = json.loads(response.read() or b"{}").get("items", [])
        return sorted(item["name"][len(prefix) :] for item in items)

    def read(self, name: str) -> dict:
        if not self.url.startswith("gs://"):
            return json.loads((Path(self.url) / name).read_text())
        base, headers = _api()
        bucket, key = self._split(name)
        url = f"{base}/storage/v1/b/{bucket}/o/{urllib.parse.quote(key, safe='')}?alt=media"
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return json.loads(response.read())

    def write(self, name: str, value: dict) -> None:
        data = json.dumps(value).encode()
        if not self.url.startswith("gs://"):
            path = Path(self.url) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        base, headers = _api()
        bucket, key = self._split(name)
        boundary = "tinyckpt"
        body = (
            f"--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode()
            + json.dumps({"name": key, "contentType": "application/json"}).encode()
            + f"\r\n--{boundary}\r\nContent-Type: application/json\r\n\r\n".encode()
            + data
            + f"\r\n--{boundary}--\r\n".encode()
        )
        headers = {**headers, "Content-Type": f"multipart/related; boundary={boundary}"}
        url = f"{base}/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        urllib.request.urlopen(request, timeout=30).close()

    def latest(self) -> dict:
        """The newest checkpoint (`ckpt-<step>.json`, written whole in one object write), or {}."""
        steps = [n for n in self.names() if n.startswith("ckpt-") and n.endswith(".json")]
        return self.read(max(steps, key=lambda n: int(n[5:-5]))) if steps else {}
