"""The metadata server as a run sees it: redirected to the agent, which answers only what a run needs.

Redirected, not closed: JAX finds a Cloud TPU slice's workers in the metadata server
(`agent-worker-number`, `worker-network-endpoints`; jax/_src/clusters/cloud_tpu_cluster.py, which honours
GCE_METADATA_IP), libtpu and torch_xla read `tpu-env` there unless TPU_SKIP_MDS_QUERY and the TPU_*
variables are set (pytorch/xla torch_xla/_internal/tpu.py `build_tpu_env_from_vars`; GKE's TPU device
plugin sets exactly these for a container, tpu-device-plugin pkg/tpu/util InitEnvs), and Google's client
libraries take their credentials from it (google-auth's compute_engine credentials, GCE_METADATA_HOST).

So a run is told GCE_METADATA_HOST/GCE_METADATA_IP = this proxy, the TPU_* variables of its VM, and
what asks 169.254.169.254 anyway is sent here by the firewall (vm_agent/firewall.py). The proxy serves:
- the ping (`/`, `/computeMetadata/v1/`), the slice's attributes (`agent-worker-number`,
  `worker-network-endpoints`, `accelerator-type`, `tpu-env`), the zone and the project's id and number,
  and the service account's email, aliases and scopes: forwarded from the real server;
- the account's token: the calling run's own downscoped token (vm_agent/credentials.py), never the VM's.
Everything else is refused (403): the VM's token, identity tokens (an ID token of the VM's account opens
Cloud Run and the like), the stack's own attributes (`startup-script`, `tpu-platform-env`,
`tpu-platform-run`), SSH keys, guest attributes, waits for changes. As the real server does, a request
without `Metadata-Flavor: Google`, or with `X-Forwarded-For`, is refused
(https://cloud.google.com/compute/docs/metadata/querying-metadata).

Who asks: the peer of each connection, looked up in /proc/net/tcp to the uid owning its socket (the
same network namespace), or, for a container of a single-host image run on the runs' Docker network,
its address there, which the agent gave it (vm_agent/firewall.py); only a run admitted by the agent,
while it lives, gets a token.

Standard library only.
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vm_agent.credentials import Downscoper
from vm_agent.gcs import StorageError

if TYPE_CHECKING:
    from google.auth.downscoped import CredentialAccessBoundary

PREFIX = "/computeMetadata/v1/"
ACCOUNT = re.compile(r"instance/service-accounts/([^/]+)/(.*)")
FORWARDED = frozenset(
    {
        "instance/attributes/agent-worker-number",
        "instance/attributes/worker-network-endpoints",
        "instance/attributes/accelerator-type",
        "instance/attributes/tpu-env",
        "instance/zone",
        "project/project-id",
        "project/numeric-project-id",
        "instance/service-accounts/",
    }
)
ACCOUNT_FORWARDED = frozenset({"", "email", "aliases", "scopes"})
QUERY_KEPT = ("alt", "recursive")
# tpu-env key -> what GKE sets for a container (InitEnvs) and torch_xla reads with TPU_SKIP_MDS_QUERY.
TPU_ENV = {
    "ACCELERATOR_TYPE": "TPU_ACCELERATOR_TYPE",
    "TOPOLOGY": "TPU_TOPOLOGY",
    "WRAP": "TPU_TOPOLOGY_WRAP",
    "ALT": "TPU_TOPOLOGY_ALT",
    "HOST_BOUNDS": "TPU_HOST_BOUNDS",
    "CHIPS_PER_HOST_BOUNDS": "TPU_CHIPS_PER_HOST_BOUNDS",
    "WORKER_ID": "TPU_WORKER_ID",
}
NEEDED_TO_SKIP = ("TPU_ACCELERATOR_TYPE", "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_WORKER_ID")


def _metadata(base_url: str, path: str, query: str = "", timeout: float = 10) -> tuple[int, str, bytes]:
    url = f"{base_url.rstrip('/')}/{path}" + (f"?{query}" if query else "")
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", "application/text"), response.read()
    except urllib.error.HTTPError as error:
        return error.code, "application/text", error.read()


def parse_tpu_env(text: str) -> dict[str, str]:
    """`tpu-env`: one `KEY: 'value'` per line (YAML; torch_xla loads it with yaml)."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Z_][A-Z0-9_]*)\s*:\s*'?(.*?)'?\s*", line)
        if match:
            found[match[1]] = match[2]
    return found


def tpu_environment(metadata_url: str, fetch: Callable[..., tuple[int, str, bytes]] = _metadata) -> dict[str, str]:
    """The TPU_* variables of this VM, as GKE gives a TPU container, from its metadata; TPU_SKIP_MDS_QUERY
    only when all that libtpu would otherwise ask for is known. {} off a TPU VM (the tests' sandbox)."""
    try:
        status, _, body = fetch(metadata_url, "instance/attributes/tpu-env")
    except (urllib.error.URLError, OSError):
        return {}
    if status != 200:
        return {}
    tpu = parse_tpu_env(body.decode(errors="replace"))
    env = {TPU_ENV[key]: value for key, value in tpu.items() if key in TPU_ENV and value}
    try:
        status, _, body = fetch(metadata_url, "instance/attributes/worker-network-endpoints")
    except (urllib.error.URLError, OSError):
        status = 0
    if status == 200 and body.strip():
        env["TPU_WORKER_HOSTNAMES"] = ",".join(e.split(":")[-1] for e in body.decode().strip().split(","))
    else:
        env["TPU_WORKER_HOSTNAMES"] = "localhost"
    if all(env.get(name) for name in NEEDED_TO_SKIP):
        env["TPU_SKIP_MDS_QUERY"] = "true"
    return env


def _proc_address(ip: str, port: int) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the address's 32 bits in host order, then the port."""
    number = struct.unpack("=I", socket.inet_aton(ip))[0]
    return f"{number:08X}:{port:04X}"


def caller_uid(peer: tuple[str, int], table: str = "/proc/net/tcp") -> int | None:
    """The uid owning the socket at `peer` (the client end of a connection to this proxy), or None."""
    wanted = _proc_address(*peer)
    try:
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if len(fields) > 7 and fields[1] == wanted:
                    return int(fields[7])
    except (OSError, StopIteration, ValueError):
        return None
    return None


class MetadataProxy:
    """A metadata server for runs, on loopback (see the module's docstring)."""

    def __init__(
        self, upstream: str, credentials: Any, sts_url: str, log: Callable[..., None], host: str = "127.0.0.1"
    ):
        """`credentials`: the VM account's (vm_agent/gcs.py vm_credentials), which each run's token is narrowed from."""
        self.upstream = upstream.rstrip("/")
        self.credentials = credentials
        self.sts_url = sts_url
        self.log = log
        self._runs: dict[int, Downscoper | None] = {}
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, content_type, body = proxy.answer(self.path, dict(self.headers), self.client_address)
                self.send_response(status)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._handler = Handler
        self._containers: dict[str, int] = {}  # a container's address on the runs' network -> its run's uid
        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.address = f"{host}:{self.server.server_address[1]}"
        self.servers = [self.server]
        self._serving: list[http.server.ThreadingHTTPServer] = []  # shutdown() waits forever on one never served
        self.bridge_address = ""  # where containers reach it (listen)

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, args=(0.2,), name="metadata-proxy", daemon=True).start()
        self._serving.append(self.server)

    def listen(self, host: str) -> str:
        """Serve containers too, on `host` (the gateway of the runs' Docker network): its address, once."""
        if not self.bridge_address:
            server = http.server.ThreadingHTTPServer((host, 0), self._handler)
            server.daemon_threads = True
            threading.Thread(
                target=server.serve_forever, args=(0.2,), name="metadata-proxy-images", daemon=True
            ).start()
            self.servers.append(server)
            self._serving.append(server)
            self.bridge_address = f"{host}:{server.server_address[1]}"
        return self.bridge_address

    def close(self) -> None:
        for server in self.servers:
            if server in self._serving:
                server.shutdown()
            server.server_close()

    def admit(self, uid: int, within: CredentialAccessBoundary | None) -> None:
        """The run of `uid` may ask for its token: one narrowed to `within` (none when it is None)."""
        with self._lock:
            self._runs[uid] = Downscoper(within, self.credentials, self.sts_url) if within is not None else None

    def admit_container(self, address: str, uid: int) -> None:
        """The container at `address` on the runs' network is the run of `uid` (vm_agent/firewall.py)."""
        with self._lock:
            self._containers[address] = uid

    def revoke(self, uid: int) -> None:
        with self._lock:
            self._runs.pop(uid, None)
            for address in [a for a, u in self._containers.items() if u == uid]:
                del self._containers[address]

    def environment(self) -> dict[str, str]:
        """What a run is told of its metadata server."""
        return {"GCE_METADATA_HOST": self.address, "GCE_METADATA_IP": self.address}

    def answer(self, raw_path: str, headers: dict[str, str], peer: tuple[str, int]) -> tuple[int, str, bytes]:
        lower = {k.lower(): v for k, v in headers.items()}
        if lower.get("metadata-flavor") != "Google" or "x-forwarded-for" in lower:
            return 403, "text/plain", b"Missing Metadata-Flavor:Google header, or a forwarded request.\n"
        path, _, query = raw_path.partition("?")
        if path in ("/", PREFIX.rstrip("/"), PREFIX):
            return 200, "application/text", b"computeMetadata/\n"
        if not path.startswith(PREFIX):
            return 404, "text/plain", b"Not found.\n"
        path = path[len(PREFIX) :]
        if "%" in path or any(part in (".", "..") for part in path.split("/")):
            # What is forwarded is chosen by name: a dot segment or an escape could name another path upstream
            # (`instance/service-accounts/../` is `instance/` to a server that resolves it, attributes and all).
            return 403, "text/plain", b"A path with dot segments or escapes is not served to a run.\n"
        account = ACCOUNT.fullmatch(path)
        if account and account[2] == "token":
            return self._token(peer)
        if path in FORWARDED or (account and account[2] in ACCOUNT_FORWARDED):
            kept = [(k, v) for k, v in urllib.parse.parse_qsl(query) if k in QUERY_KEPT]
            try:
                return _metadata(self.upstream, path, urllib.parse.urlencode(kept))
            except (urllib.error.URLError, OSError) as error:
                return 503, "text/plain", f"metadata server unreachable: {error}\n".encode()
        return 403, "text/plain", f"{path} is not served to a run (tpu-platform agent)\n".encode()

    def _token(self, peer: tuple[str, int]) -> tuple[int, str, bytes]:
        with self._lock:
            uid = self._containers.get(peer[0])
        if uid is None:
            uid = caller_uid(peer)
        with self._lock:
            admitted = uid is not None and uid in self._runs
            downscoper = self._runs.get(uid) if uid is not None else None
        if not admitted:
            self.log(f"metadata proxy: a token asked for by uid {uid}, which is no run's: refused", severity="WARNING")
            return 403, "text/plain", b"No token: only a running run of this VM gets one, narrowed to its objects.\n"
        if downscoper is None:
            return 403, "text/plain", b"No token: this run reaches no Cloud Storage object.\n"
        try:
            issued = downscoper.token()
        except StorageError as error:
            self.log(f"metadata proxy: {error}", severity="ERROR")
            return 503, "text/plain", b"The token exchange failed; ask again.\n"
        left = max(0, int(issued.expires_at - time.monotonic()))
        body = {"access_token": issued.token, "expires_in": left, "token_type": "Bearer"}
        return 200, "application/json", json.dumps(body).encode()
