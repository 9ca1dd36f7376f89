"""What the loopback stand-ins share: a quiet request handler that reads a request's body and answers
JSON (or given bytes), and a server on a free 127.0.0.1 port, started for a `with` block and stopped
after it.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any


class Handler(http.server.BaseHTTPRequestHandler):
    """A stand-in's handler: `body()` reads the request's bytes, `answer()` sends one; no access log."""

    def body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        """`body` as JSON, or as it is when it is bytes (with only the `headers` given)."""
        if isinstance(body, bytes):
            data, extra = body, dict(headers or {})
        else:
            data, extra = json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(handler: type[http.server.BaseHTTPRequestHandler], **attributes: Any) -> Iterator[str]:
    """Serves `handler` (a subclass of it with `attributes` as class attributes: the stand-in's state)
    on a free loopback port; yields its base URL, `http://127.0.0.1:PORT`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type(handler.__name__, (handler,), attributes))
    # shutdown() waits for the serving loop's next poll: 0.5 s by default, half a second per test.
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
